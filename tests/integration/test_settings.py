"""A setting means what it says: ``num_workers=N`` runs N workers that make every batch.

Adaptation (batches made in the main process, workers started only when they pay) lives
under ``num_workers="auto"`` (and the ``adaptive=True`` opt-in); a fixed setting that is
slow is kept and reported, once.
"""

from __future__ import annotations

import os
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import get_worker_info as torch_get_worker_info

import conveyor
from conveyor.report import workers_lose
from helpers import children, run_script


class Who:
    """Each sample says which worker made it (torch's and conveyor's worker info) and its seed."""

    def __len__(self) -> int:
        return 24

    def __getitem__(self, i: int) -> tuple[int, int, int, int, int]:
        info, ours = torch_get_worker_info(), conveyor.get_worker_info()
        return (i, -1 if info is None else info.id, -1 if ours is None else ours.id,
                torch.initial_seed() % (1 << 31), os.getpid())


class WhoBatch(Who):
    def __getitems__(self, indices: list[int]) -> list[tuple[int, int, int, int, int]]:
        return [self[i] for i in indices]


@pytest.mark.parametrize("dataset", [Who, WhoBatch])
@pytest.mark.parametrize("persistent", [False, True])
def test_every_batch_of_num_workers_2_is_made_by_a_worker(dataset: type, persistent: bool) -> None:
    """Cheap samples too: no batch is made in the main process, each sample sees worker info
    and a seed that is not the main process's, and batch k comes from worker k % 2."""
    main_seed = torch.initial_seed() % (1 << 31)
    with conveyor.DataLoader(dataset(), batch_size=3, num_workers=2, persistent_workers=persistent,
                             collate_fn=list) as loader:
        for epoch in range(2):
            batches = list(loader)
            assert len(batches) == 8
            for k, batch in enumerate(batches):
                for i, tid, cid, seed, pid in batch:
                    assert tid == cid == k % 2, (epoch, k, i)
                    assert pid != os.getpid()
                    assert seed != main_seed
        assert loader.stats()["main_process_batches"] == 0


class Stream(torch.utils.data.IterableDataset):
    def __iter__(self):  # type: ignore[no-untyped-def]
        info = torch_get_worker_info()
        assert info is not None, "__iter__ ran outside a worker"
        yield from range(info.id, 12, info.num_workers)


def test_an_iterable_datasets_iter_runs_in_each_worker() -> None:
    with conveyor.DataLoader(Stream(), batch_size=None, num_workers=2) as loader:
        assert sorted(int(x) for x in loader) == list(range(12))


def test_worker_init_fn_runs_in_each_worker_before_its_first_sample(tmp_path: Path) -> None:
    def init(worker_id: int) -> None:
        (tmp_path / f"init-{worker_id}-{os.getpid()}").touch()

    with conveyor.DataLoader(Who(), batch_size=4, num_workers=2, worker_init_fn=init, collate_fn=list) as loader:
        pids = {(k % 2, pid) for k, batch in enumerate(loader) for *_, pid in batch}
    assert {p.name for p in tmp_path.iterdir()} == {f"init-{w}-{pid}" for w, pid in pids}


class Changing:
    def __init__(self) -> None:
        self.value = 0

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> int:
        return self.value


def test_persistent_workers_keep_the_dataset_copy_of_the_first_iter() -> None:
    """As torch's: a change made to the dataset between epochs is not seen by persistent workers."""
    ds = Changing()
    with conveyor.DataLoader(ds, batch_size=4, num_workers=2, persistent_workers=True, output="numpy") as loader:
        first = [b.tolist() for b in loader]
        ds.value = 7
        second = [b.tolist() for b in loader]
    assert first == second == [[0] * 4, [0] * 4]


def test_workers_are_running_after_two_batches() -> None:
    before = children()
    loader = conveyor.DataLoader(Who(), batch_size=2, num_workers=2, persistent_workers=True, collate_fn=list)
    try:
        it = iter(loader)
        next(it), next(it)
        assert len(children() - before) >= 2
    finally:
        loader.close()


def test_a_segfaulting_sample_kills_a_worker_not_the_training_process(tmp_path: Path) -> None:
    """The sample that crashes its process (a native decoder's segfault) is in a worker, so
    the training process lives to raise the worker's death, which names the signal."""
    script = (
        "import ctypes, sys, conveyor\n"
        "class Crash:\n"
        "    def __len__(self): return 8\n"
        "    def __getitem__(self, i):\n"
        "        if i == 5: ctypes.string_at(0)\n"
        "        return i\n"
        "try:\n"
        "    for b in conveyor.DataLoader(Crash(), batch_size=2, num_workers=2, max_worker_restarts=0,\n"
        "                                 output='numpy'): pass\n"
        "except Exception as exc:\n"
        "    print('RAISED', type(exc).__name__, exc)\n"
        "    sys.exit(3)\n"
    )
    done = run_script(tmp_path / "crash.py", script, dict(os.environ), timeout=120)
    assert done.returncode == 3, (done.returncode, done.stdout, done.stderr)
    assert "RAISED" in done.stdout and "SIGSEGV" in done.stdout, done.stdout


class Cheap:
    def __len__(self) -> int:
        return 256

    def __getitem__(self, i: int) -> np.ndarray:
        return np.full(4, i, dtype=np.float32)


def test_workers_that_lose_warn_once_and_keep_the_setting() -> None:
    """Microsecond batches: two workers that do not persist cost their start-up every epoch,
    far more than the main process would take. The setting stands; one warning says so."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with conveyor.DataLoader(Cheap(), batch_size=4, num_workers=2, output="numpy") as loader:
            for _ in range(3):
                assert len(list(loader)) == 64
            stats = loader.stats()
    slow = [w for w in caught if issubclass(w.category, conveyor.SlowSettingWarning)]
    assert len(slow) == 1, [str(w.message) for w in caught]
    text = str(slow[0].message)
    assert "num_workers=0" in text and "'auto'" in text
    assert stats["main_process_batches"] == 0 and stats["num_workers"] == 2
    assert sum(w["batches"] for k, w in stats["workers"].items() if int(k) >= 0) == 3 * 64
    # (the start-up each epoch, or the trips: which outweighs the rest depends on the machine)
    said = loader.report()
    assert "the workers cost more than they save" in said or "persistent_workers=True pays it once" in said, said


def test_auto_does_not_warn() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error", conveyor.SlowSettingWarning)
        with conveyor.DataLoader(Cheap(), batch_size=4, num_workers="auto", output="numpy") as loader:
            for _ in range(2):
                list(loader)


def _snap(wait: float, cost: float, batches: int = 20, **kw: object) -> dict[str, object]:
    half = batches // 2
    per = {"batches": half, "fetch_s": cost * half * 0.8, "collate_s": cost * half * 0.2}
    return {"batches": batches, "num_workers": 2, "wait_s": wait * batches, "first_waits_s": 0.0,
            "workers": {0: dict(per), 1: dict(per)}, **kw}


@pytest.mark.parametrize(("wait", "cost", "loses"), [
    (0.010, 0.001, True),    # 10x the cost
    (0.0014, 0.001, False),  # 1.4x: within the margin
    (0.0, 0.050, False),     # the step hides every batch
    (0.0002, 0.00001, False),  # 20x, but 4 ms over a run: no finding
])
def test_workers_lose_compares_the_wait_with_the_cost(wait: float, cost: float, loses: bool) -> None:
    assert (workers_lose(_snap(wait, cost)) is not None) == loses


def test_workers_lose_leaves_out_a_persistent_loaders_start_up_and_main_process_batches() -> None:
    snap = _snap(0.010, 0.001, persistent_workers=True)
    snap["first_waits_s"] = 0.010 * 20 - 0.0005 * 20  # all but 0.5 ms a batch was start-up
    assert workers_lose(snap) is None
    mixed = _snap(0.010, 0.001)
    mixed["workers"][-1] = {"batches": 4, "fetch_s": 0.0, "collate_s": 0.0}  # type: ignore[index]
    assert workers_lose(mixed) is None
    assert workers_lose(_snap(0.010, 0.001, fetch_threads=4)) is None
    assert workers_lose(_snap(0.010, 0.001, num_workers=0)) is None


def test_num_workers_must_be_a_count_or_auto() -> None:
    for bad in ("two", 2.5, None):
        with pytest.raises((TypeError, ValueError), match="num_workers"):
            conveyor.DataLoader(Cheap(), num_workers=bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="num_workers"):
        conveyor.DataLoader(Cheap(), num_workers=-1)
