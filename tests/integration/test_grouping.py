"""Tiny batches travel in groups between the main process and a process worker
(executors/grouping.py): one order and one message back carry several batches, and every
guarantee of single batches holds (order, exactly once, errors, deaths, resume, seeds)."""

from __future__ import annotations

import os
import re
import signal
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.utils.data as tud

import conveyor
from conveyor.executors import grouping, task
from helpers import WORKERS, Failing, Images, Squares, key, same_epochs
from resume_harness import resumes_exactly

PROCESS = {"num_workers": 2, "worker_type": "process", "persistent_workers": True, **WORKERS}


@pytest.fixture
def grouped(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Any small batch is grouped (however slow this machine makes it), and the result
    messages the main process reads are counted: [single results, groups, results in groups]."""
    monkeypatch.setattr(grouping, "BUDGET_S", 100.0)
    counts = [0, 0, 0]
    main = os.getpid()
    take = task.Inbox.take

    def counting(self: task.Inbox) -> list[Any]:
        msgs = take(self)
        if os.getpid() == main:
            for m in msgs:
                if type(m) is list:
                    counts[1] += 1
                    counts[2] += len(m)
                elif type(m) is tuple:
                    counts[0] += 1
        return msgs

    monkeypatch.setattr(task.Inbox, "take", counting)
    return counts


@pytest.mark.timeout(90)
def test_tiny_batches_travel_in_groups_and_match_the_main_process(grouped: list[int]) -> None:
    ds = Squares(203)
    with conveyor.DataLoader(ds, batch_size=3, shuffle=True, seed=7, **PROCESS) as loader:
        epochs = [list(loader) for _ in range(3)]
    with conveyor.DataLoader(ds, batch_size=3, shuffle=True, seed=7, num_workers=0) as here:
        want = [list(here) for _ in range(3)]
    same_epochs(epochs, want)
    singles, groups, in_groups = grouped
    assert groups > 0, f"no group of results came back ({singles} single results)"
    assert in_groups >= 2 * groups
    assert singles + in_groups == 3 * len(epochs[0]), "every batch arrives exactly once"


@pytest.mark.timeout(120)
@pytest.mark.parametrize("generator", [False, True])
def test_a_shuffle_without_a_generator_groups_and_keeps_torchs_orders(grouped: list[int], generator: bool) -> None:
    # shuffle=True with no generator draws one seed from torch's global RNG at its first
    # read and the rest from a generator of its own: reading it ahead (groups) changes
    # nothing anyone sees, also with an epoch left early. With the user's generator the
    # sampler draws its next permutation from it when read to its end: no groups then (the
    # seed a loader takes from a generator let them form, and an epoch left 7 batches early
    # ran the generator's sampler out: the next epochs' orders differed from torch's).
    ds = Squares(96)

    def epochs(make: Any) -> list[list[Any]]:
        torch.manual_seed(11)
        gen = torch.Generator().manual_seed(5) if generator else None
        loader = make(ds, batch_size=2, shuffle=True, generator=gen, num_workers=2, persistent_workers=True)
        got = []
        for e in range(3):
            batches = []
            for k, b in enumerate(loader):
                batches.append(key(b))
                if e == 0 and k == 40:  # an epoch left 7 batches before its end
                    break
            got.append(batches)
        got.append([torch.randint(0, 10**9, ()).item()])  # the global RNG goes on as torch's
        if hasattr(loader, "close"):
            loader.close()
        return got

    got = epochs(lambda *a, **k: conveyor.DataLoader(*a, **k, **WORKERS))
    want = epochs(tud.DataLoader)
    assert got == want
    singles, groups, _ = grouped
    if generator:
        assert groups == 0, "a shuffle from the user's generator is read no further than torch reads it"
    else:
        assert groups > 0, f"no group of results came back ({singles} single results)"


@pytest.mark.timeout(60)
def test_large_batches_keep_groups_of_one(grouped: list[int]) -> None:
    with conveyor.DataLoader(Images(96), batch_size=16, **PROCESS) as loader:
        for _ in loader:
            pass
    assert grouped[1] == 0, "batches of shared-memory size must not wait for each other"


@pytest.mark.timeout(60)
def test_an_error_inside_a_group_names_its_sample_and_worker(grouped: list[int]) -> None:
    loader = conveyor.DataLoader(Failing(400, 301), batch_size=2, **PROCESS)
    got: list[int] = []
    with pytest.raises(ValueError, match="bad sample 301") as info:
        for b in loader:
            got.extend(b.flatten().tolist())
    loader.close()
    assert got == list(range(300)), "every batch before the failing one, in order"
    notes = " ".join(getattr(info.value, "__notes__", []))
    assert re.search(r"\[300, 301\]", notes), notes
    assert re.search(r"worker 0\b", notes), notes  # batch 150 is worker 150 % 2's
    assert grouped[1] > 0


class _KillsItselfOnce(tud.Dataset):
    """Index ``at`` SIGKILLs its worker the first time it is fetched (a flag file says so)."""

    def __init__(self, n: int, at: int, flag: Path) -> None:
        self.n, self.at, self.flag = n, at, str(flag)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        if i == self.at and not os.path.exists(self.flag):
            open(self.flag, "w").close()
            os.kill(os.getpid(), signal.SIGKILL)
        return torch.tensor([i])


@pytest.mark.timeout(90)
def test_a_worker_killed_inside_a_group_is_replaced_and_nothing_is_lost(grouped: list[int], tmp_path: Path) -> None:
    ds = _KillsItselfOnce(600, 457, tmp_path / "killed")
    loader = conveyor.DataLoader(ds, batch_size=2, **PROCESS)
    got = [int(x) for b in loader for x in b.flatten().tolist()]
    stats = loader.stats()
    loader.close()
    assert (tmp_path / "killed").exists()
    assert got == list(range(600)), "every sample exactly once and in order"
    assert stats["restarts"] == 1
    assert grouped[1] > 0


@pytest.mark.timeout(90)
def test_resume_inside_grouped_batches_gives_the_rest_of_the_epoch(grouped: list[int]) -> None:
    ds = Squares(301)
    opts = {"batch_size": 4, "shuffle": True, "seed": 3, **PROCESS}
    resumes_exactly(lambda: conveyor.DataLoader(ds, **opts), 29, via=None, convert=key)
    assert grouped[1] > 0


class _Niceness(tud.Dataset):
    """Each sample is the niceness of the process that fetched it."""

    def __len__(self) -> int:
        return 12

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.tensor([os.getpriority(os.PRIO_PROCESS, 0)])


@pytest.mark.timeout(60)
def test_a_worker_lowers_its_priority_only_after_its_first_batch() -> None:
    from conveyor.executors import serve as worker

    if not worker.WORKER_NICE:
        pytest.skip("CONVEYOR_WORKER_NICE=0 here")
    base = os.getpriority(os.PRIO_PROCESS, 0)
    with conveyor.DataLoader(_Niceness(), batch_size=1, num_workers=1, prefetch_factor=1, **WORKERS) as loader:
        seen = [int(b) for b in loader]
    assert seen[0] == base, "the first batch, which the loop waits for, is made at the loop's priority"
    assert seen[-1] == min(19, base + worker.WORKER_NICE), seen
