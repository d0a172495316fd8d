"""conveyor.DataLoader is torch.utils.data.DataLoader's subclass when torch is installed: what
trainers test with isinstance, rebuild with their own sampler, and probe, stays conveyor's."""

from __future__ import annotations

import copy
import multiprocessing
import pickle
import subprocess
import sys
import textwrap
from typing import Any

import numpy as np
import pytest
import torch
import torch.utils.data as tud

import conveyor
from conveyor import DataLoader
from conveyor.epoch import Run as _Run
from helpers import Snapshot, assert_no_leaks
from resume_harness import resumes_exactly


def epochs(loader: Any, n: int = 2) -> list[list[list[int]]]:
    return [[b.tolist() for b in loader] for _ in range(n)]


def test_is_a_torch_dataloader() -> None:
    loader = DataLoader(list(range(10)), batch_size=3, output="numpy")
    assert isinstance(loader, tud.DataLoader)
    assert issubclass(conveyor.DataLoader, tud.DataLoader)
    assert conveyor.DataLoader is conveyor.loader.DataLoader
    assert type(loader).__name__ == "DataLoader" and type(loader).__module__ == "conveyor.loader"
    assert conveyor.DataLoader[int] is not None  # generic, as torch's


def test_torch_properties_and_methods_are_conveyor_s() -> None:
    loader = DataLoader(list(range(10)), batch_size=3, num_workers=1, multiprocessing_context="fork",
                        worker_type="process", output="numpy")
    # torch's read-only properties hold conveyor's values
    assert isinstance(loader.multiprocessing_context, multiprocessing.context.BaseContext)
    assert loader.multiprocessing_context.get_start_method() == "fork"
    assert loader._auto_collation is True and loader._index_sampler is loader.batch_sampler
    loader.multiprocessing_context = "spawn"  # checked and made a context, as torch's setter does
    assert loader.multiprocessing_context.get_start_method() == "spawn"
    with pytest.raises(ValueError, match="should specify a valid start method"):
        loader.multiprocessing_context = "nonsense"
    with pytest.raises(ValueError, match="batch_size attribute should not be set after DataLoader is initialized"):
        loader.batch_size = 4
    unbatched = DataLoader(list(range(4)), batch_size=None, output="numpy")
    assert unbatched._auto_collation is False and unbatched._index_sampler is unbatched.sampler
    it = loader._get_iterator()
    assert isinstance(it, _Run)  # never torch's own iterator
    assert [b.tolist() for b in it] == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9]]
    assert len(loader) == 4
    loader.close()


def test_iterator_has_torch_s_private_names() -> None:
    before = Snapshot.take()
    with DataLoader(list(range(12)), batch_size=2, num_workers=2, output="numpy", adaptive=False) as loader:
        it = iter(loader)
        next(it)
        assert it._num_workers == 2 and it._num_yielded == 1 and not it._shutdown
        assert len(it._workers) == 2 and all(w.is_alive() for w in it._workers)
        pids = [w.pid for w in it._workers]
        assert len(set(pids)) == 2
        assert it._dataset is loader.dataset and it._index_sampler is loader.batch_sampler
        assert it._dataset_kind == 0 and it._auto_collation and not it._persistent_workers
        assert isinstance(it._base_seed, int)
        it._shutdown_workers()
        assert it._shutdown
    assert_no_leaks(before)
    with DataLoader(list(range(4)), batch_size=2, num_workers=2, worker_type="thread", output="numpy") as loader:
        it = iter(loader)
        next(it)
        assert it._workers == []  # thread workers are no processes


def test_pickle_and_copies_keep_the_class_and_its_arguments() -> None:
    loader = DataLoader(list(range(10)), batch_size=3, shuffle=True, seed=4, output="numpy", fetch_threads=2,
                        on_error="skip", worker_type="thread", num_workers=1)
    clones = (pickle.loads(pickle.dumps(loader)), copy.copy(loader), copy.deepcopy(loader))
    want = epochs(loader, 1)
    for clone in clones:
        assert type(clone) is type(loader) and isinstance(clone, tud.DataLoader)
        assert (clone.seed, clone.output, clone.fetch_threads, clone.on_error, clone.worker_type) == \
            (4, "numpy", 2, "skip", "thread")
        assert clone._auto_collation and clone.multiprocessing_context is None
        assert epochs(clone, 1) == want
        clone.close()
    loader.close()


@pytest.mark.parametrize("workers, persistent", [(0, False), (2, False), (2, True)])
@pytest.mark.parametrize("probe", ["dropped", "closed", "loader closed"])
def test_an_iterator_dropped_before_its_first_batch_uses_up_no_epoch(workers: int, persistent: bool,
                                                                    probe: str) -> None:
    def make() -> Any:
        return DataLoader(list(range(20)), batch_size=4, shuffle=True, seed=3, num_workers=workers,
                          persistent_workers=persistent, output="numpy")

    with make() as plain:
        want = epochs(plain)
    with make() as probed:
        it = iter(probed)  # a trainer's probe (Lightning calls iter() once on loaders it does not know)
        if probe == "closed":
            it.close()
        elif probe == "loader closed":
            probed.close()
        del it
        assert epochs(probed) == want  # epoch 0, then 1, as if never probed
    assert want[0] != want[1]


def test_an_iterator_that_handed_out_a_batch_keeps_its_epoch() -> None:
    with DataLoader(list(range(20)), batch_size=4, shuffle=True, seed=3, output="numpy") as loader:
        first = [b.tolist() for b in loader]
        with DataLoader(list(range(20)), batch_size=4, shuffle=True, seed=3, output="numpy") as other:
            it = iter(other)
            assert next(it).tolist() == first[0]
            del it
            assert [b.tolist() for b in other] != first  # epoch 1: the broken-off epoch 0 counts
    # two live iterators (zip(loader, loader)) are two epochs
    with DataLoader(list(range(20)), batch_size=4, shuffle=True, seed=3, output="numpy") as loader:
        a, b = zip(*[(x.tolist(), y.tolist()) for x, y in zip(loader, loader)])
        assert list(a) == first and list(b) != first


def test_a_probe_after_load_state_dict_keeps_the_resumed_position() -> None:
    def make() -> Any:
        return DataLoader(list(range(20)), batch_size=4, shuffle=True, seed=3, output="numpy")

    resumes_exactly(make, 2, via=None, after_load=iter)  # after the load: an iterator probed, dropped


NO_TORCH = textwrap.dedent("""
    import sys
    sys.modules["torch"] = None  # blocks every import of torch
    import conveyor
    from conveyor import DataLoader
    assert [c.__module__ for c in DataLoader.__mro__] == ["conveyor.loader", "typing", "builtins"], DataLoader.__mro__
    loader = DataLoader(list(range(10)), batch_size=4, shuffle=True, seed=1, output="numpy")
    got = [b.tolist() for b in loader]
    assert sorted(sum(got, [])) == list(range(10)), got
    with DataLoader(list(range(10)), batch_size=4, num_workers=2, worker_type="thread", output="numpy") as threads:
        assert [b.tolist() for b in threads] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    import pickle
    assert [b.tolist() for b in pickle.loads(pickle.dumps(loader))] != []
    assert type(pickle.loads(pickle.dumps(loader))) is DataLoader
    print("OK")
""")


@pytest.mark.timeout(90)
def test_numpy_only_install_works_without_torch(script_env: dict[str, str]) -> None:
    proc = subprocess.run([sys.executable, "-c", NO_TORCH], capture_output=True, text=True, env=script_env,
                          timeout=80)
    assert proc.returncode == 0 and "OK" in proc.stdout, proc.stderr[-3000:]


@pytest.mark.timeout(60)
def test_import_conveyor_does_not_import_torch(script_env: dict[str, str]) -> None:
    code = ("import sys, conveyor\nassert 'torch' not in sys.modules\n"
            "conveyor.DataLoader\nassert 'torch' in sys.modules\nprint('OK')")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=script_env, timeout=50)
    assert proc.returncode == 0 and "OK" in proc.stdout, proc.stderr[-3000:]


# ---------------------------------------------------------------- trainers that rebuild loaders


def test_lightning_rebuilds_it_as_a_conveyor_loader_with_its_arguments() -> None:
    pytest.importorskip("lightning")
    from lightning.pytorch.utilities.data import _update_dataloader
    from lightning.fabric.utilities.data import _replace_dunder_methods

    sampler = tud.DistributedSampler(list(range(20)), num_replicas=2, rank=1, shuffle=False)
    # made outside a LightningModule's hooks (its attributes are read) and inside (its arguments
    # are recorded as it is made)
    plain = DataLoader(list(range(20)), batch_size=4, shuffle=True, seed=7, output="numpy", num_workers=2,
                       worker_type="thread", fetch_threads=2, on_error="skip", max_failures=3)
    with _replace_dunder_methods(tud.DataLoader, "dataset"):
        recorded = DataLoader(list(range(20)), batch_size=4, shuffle=True, seed=7, output="numpy", num_workers=2,
                              worker_type="thread", fetch_threads=2, on_error="skip", max_failures=3)
    for loader in (plain, recorded):
        rebuilt = _update_dataloader(loader, sampler)
        assert type(rebuilt) is type(loader)
        assert (rebuilt.worker_type, rebuilt.output, rebuilt.seed, rebuilt.fetch_threads, rebuilt.on_error,
                rebuilt.max_failures, rebuilt.num_workers) == ("thread", "numpy", 7, 2, "skip", 3, 2)
        assert rebuilt._default_collate  # its collate_fn given back is still the default (fast paths)
        got = sorted(int(i) for b in rebuilt for i in b)
        assert got == list(range(1, 20, 2))  # rank 1's half
        rebuilt.close()
        loader.close()


def test_torch_s_dataloader_tests_of_subclasses_hold() -> None:
    # torch's test_dataloader checks a subclass may set its own attributes after __init__
    class Sub(DataLoader):  # type: ignore[misc, valid-type]
        def __init__(self, *a: Any, **kw: Any) -> None:
            super().__init__(*a, **kw)
            self.extra = 1

    loader = Sub(np.arange(6), batch_size=2, output="numpy")
    assert loader.extra == 1 and [b.tolist() for b in loader] == [[0, 1], [2, 3], [4, 5]]
