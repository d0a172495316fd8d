"""Faults: errors keep their type and traceback, dead and hung workers are handled, bad samples skipped."""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
import traceback
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.utils.data as tud

import conveyor
from helpers import WORKERS, Failing, Snapshot, Squares, Stream, assert_no_leaks, children, drain, run_script

KINDS = {
    "process": {"num_workers": 2, "worker_type": "process", **WORKERS},
    "thread": {"num_workers": 2, "worker_type": "thread", **WORKERS},
    "inline": {"num_workers": 0},
}


# --------------------------------------------------------------------------- exceptions


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_exception_keeps_type_traceback_and_note(kind: str) -> None:
    loader = conveyor.DataLoader(Failing(16, 6), batch_size=4, **KINDS[kind])
    with pytest.raises(ValueError, match="bad sample 6") as info:
        drain(loader)
    exc = info.value
    if kind == "process":
        cause = str(exc.__cause__)
        assert 'raise self.exc(f"bad sample {i}")' in cause, cause
        assert "__getitem__" in cause
    else:  # raised in this process: the exception itself, with the dataset's frames
        assert "__getitem__" in [f.name for f in traceback.extract_tb(exc.__traceback__)]
    notes = " ".join(getattr(exc, "__notes__", []))
    assert re.search(r"\[4, 5, 6, 7\]", notes), notes
    if kind == "inline":
        assert "main process" in notes, notes
    else:
        assert re.search(r"worker [01]\b", notes), notes


class Unrebuildable(Exception):
    def __init__(self, a: int, b: int) -> None:
        super().__init__(f"needs two arguments: {a}, {b}")


class _RaisesUnrebuildable(tud.Dataset):
    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> torch.Tensor:
        if i == 5:
            raise Unrebuildable(i, 2 * i)
        return torch.tensor([i])


@pytest.mark.timeout(60)
def test_unrebuildable_exception_gives_worker_error() -> None:
    loader = conveyor.DataLoader(_RaisesUnrebuildable(), batch_size=2, **KINDS["process"])
    with pytest.raises(conveyor.WorkerError) as info:
        drain(loader)
    text = str(info.value) + str(info.value.__cause__)
    assert "Unrebuildable" in text and "needs two arguments" in text


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", ["inline", "thread"])
def test_exceptions_raised_in_this_process_are_raised_as_themselves(kind: str) -> None:
    # nothing crosses a process: the very exception, whatever its constructor, as torch's
    # num_workers=0 raises it (except clauses and post-mortem debuggers see the dataset's frame)
    loader = conveyor.DataLoader(_RaisesUnrebuildable(), batch_size=2, **KINDS[kind])
    with pytest.raises(Unrebuildable) as info:
        drain(loader)
    assert [f.name for f in traceback.extract_tb(info.value.__traceback__)][-1] == "__getitem__"
    assert "[4, 5]" in " ".join(info.value.__notes__)


@pytest.mark.timeout(60)
def test_a_failing_worker_init_is_noted_once_however_often_raised() -> None:
    loader = conveyor.DataLoader(Squares(), batch_size=2, worker_init_fn=_init_raises, **KINDS["thread"])
    for _ in range(3):
        with pytest.raises(KeyError) as info:
            next(iter(loader))
    assert len(info.value.__notes__) == 1
    loader.close()


class _StrFails(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no str")


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("kind", "how", "expected"), [
    ("thread", "sys.exit", SystemExit),  # as num_workers=0 would: the program is asked to exit
    ("thread", "str", _StrFails),
    ("process", "str", _StrFails),
])
def test_odd_exceptions_reach_the_loop(kind: str, how: str, expected: type[BaseException]) -> None:
    # a thread worker used to die silently on these (and the loop wait forever); a process
    # worker died formatting one whose __str__ fails
    loader = conveyor.DataLoader(_Exits(how), batch_size=2, max_worker_restarts=0, **KINDS[kind])
    with pytest.raises(expected):
        drain(loader)


def _init_raises(worker_id: int) -> None:
    raise KeyError(f"init failed in {worker_id}")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", ["process", "thread"])
def test_worker_init_fn_raising(kind: str) -> None:
    before = Snapshot.take()
    loader = conveyor.DataLoader(Squares(), batch_size=2, worker_init_fn=_init_raises, **KINDS[kind])
    with pytest.raises(KeyError, match="init failed") as info:
        drain(loader)
    assert "worker_init_fn" in " ".join(getattr(info.value, "__notes__", [])) + str(info.value.__cause__)
    del loader, info
    assert_no_leaks(before)


class _Exits(tud.Dataset):
    def __init__(self, how: str) -> None:
        self.how = how

    def __len__(self) -> int:
        return 12

    def __getitem__(self, i: int) -> torch.Tensor:
        if i == 5:
            if self.how == "sys.exit":
                sys.exit()
            if self.how == "str":
                raise _StrFails()
            os._exit(1)
        return torch.tensor([i])


@pytest.mark.timeout(60)
@pytest.mark.parametrize("how", ["sys.exit", "os._exit"])
def test_worker_exits(how: str) -> None:
    loader = conveyor.DataLoader(_Exits(how), batch_size=2, max_worker_restarts=1, **KINDS["process"])
    with pytest.raises(RuntimeError) as info:
        drain(loader)
    msg = str(info.value)
    assert "exit" in msg, msg
    if how == "os._exit":
        assert "exit code 1" in msg, msg
    assert "[4, 5]" in msg, msg


# --------------------------------------------------------------------------- dead workers


class _Slow(tud.Dataset):
    def __init__(self, n: int = 40, delay: float = 0.01) -> None:
        self.n = n
        self.delay = delay

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        time.sleep(self.delay)
        return torch.tensor([i])


def _kill_a_worker() -> int:
    kids = sorted(children())
    assert kids, "no worker process to kill"
    os.kill(kids[0], signal.SIGKILL)
    return kids[0]


@pytest.mark.timeout(90)
def test_sigkill_worker_is_replaced() -> None:
    loader = conveyor.DataLoader(_Slow(40), batch_size=2, **KINDS["process"])
    got = []
    killed = None
    for i, b in enumerate(loader):
        got.extend(b.flatten().tolist())
        if i == 3:
            killed = _kill_a_worker()
    loader_stats = loader.stats()
    loader.close()
    assert killed is not None
    assert got == list(range(40)), "every sample exactly once and in order"
    assert loader_stats["restarts"] >= 1
    assert any("SIGKILL" in d for d in map(str, loader_stats["deaths"]))


@pytest.mark.timeout(60)
def test_sigkill_without_restarts_raises_worker_died() -> None:
    loader = conveyor.DataLoader(_Slow(40, 0.05), batch_size=2, max_worker_restarts=0, **KINDS["process"])
    with pytest.raises(conveyor.WorkerDied) as info:
        try:
            for i, _ in enumerate(loader):
                if i == 1:
                    _kill_a_worker()
        finally:
            loader.close()
    msg = str(info.value)
    assert "SIGKILL" in msg, msg
    assert re.search(r"\[\d+, \d+\]", msg), msg


class _KilledOnceAtStart:
    """A worker_init_fn whose worker 1 is SIGKILLed (the OOM killer, say) once, while starting."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __call__(self, worker_id: int) -> None:
        if worker_id == 1 and not self.marker.exists():
            self.marker.write_text("killed once")
            os.kill(os.getpid(), signal.SIGKILL)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("restarts", [3, 0])
def test_a_worker_killed_while_starting_is_replaced_like_any_other(tmp_path: Path, restarts: int) -> None:
    # it raised "exited during start-up with exit code -9" whatever max_worker_restarts allowed
    loader = conveyor.DataLoader(_Slow(16), batch_size=2, max_worker_restarts=restarts,
                                 worker_init_fn=_KilledOnceAtStart(tmp_path / "marker"), **KINDS["process"])
    if restarts:
        assert [x for b in drain(loader) for x in b.flatten().tolist()] == list(range(16))
    else:
        with pytest.raises(conveyor.WorkerDied, match="SIGKILL"):
            drain(loader)


class _HangsOnce(tud.Dataset):
    """Index 5 hangs the first time it is fetched (a marker file says so), then answers."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __len__(self) -> int:
        return 12

    def __getitem__(self, i: int) -> torch.Tensor:
        if i == 5 and not self.marker.exists():
            self.marker.write_text("hung once")
            time.sleep(60)
        return torch.tensor([i])


class _KilledOnceThenInitHangs(_HangsOnce):
    """Worker 0 dies at index 7 once (a marker file says so); its replacement's
    worker_init_fn then hangs."""

    def __len__(self) -> int:
        return 32

    def __getitem__(self, i: int) -> torch.Tensor:
        if i == 7 and not self.marker.exists():
            self.marker.write_text("killed")
            os.kill(os.getpid(), signal.SIGKILL)
        return torch.tensor([i])


def _hang_once_replaced(marker: Path, worker_id: int) -> None:
    if marker.exists():
        time.sleep(60)


def _killed_while_replacing(marker: Path, times: int, worker_id: int) -> None:
    """A replacement's worker_init_fn (worker 0 died once): SIGKILLed ``times`` times in a row."""
    if marker.exists():
        count = marker.with_suffix(".inits")
        done = len(count.read_text()) if count.exists() else 0
        if done < times:
            count.write_text("x" * (done + 1))
            os.kill(os.getpid(), signal.SIGKILL)


@pytest.mark.timeout(90)
@pytest.mark.parametrize(("times", "budget"), [(1, 5), (3, 5), (4, 5), (3, 3)])
def test_a_replacement_killed_while_it_starts_is_replaced_again(tmp_path: Path, times: int, budget: int) -> None:
    # a replacement SIGKILLed before its hello ended the epoch ("replacement for worker 0 died
    # during start-up"), whatever max_worker_restarts allowed; an initial worker killed
    # there was already replaced. Each such death counts against max_worker_restarts (three in
    # a row ended the epoch, whatever it allowed); past it the replacement is given up on,
    # by its signal, and the message names the budget.
    import functools

    marker = tmp_path / "marker"
    before = Snapshot.take()
    loader = conveyor.DataLoader(_KilledOnceThenInitHangs(marker), batch_size=4, max_worker_restarts=budget,
                                 worker_init_fn=functools.partial(_killed_while_replacing, marker, times),
                                 **KINDS["process"])
    if 1 + times <= budget:
        assert [x for b in drain(loader) for x in b.flatten().tolist()] == list(range(32))
        assert loader.stats()["restarts"] == 1 + times
    else:
        with pytest.raises(RuntimeError, match=r"replacement for worker \d was killed by SIGKILL during start-up "
                                               rf"\({budget} replacements in a row; max_worker_restarts={budget} "
                                               r"allows no more\)"):
            drain(loader)
    del loader
    assert_no_leaks(before, grace=15)


@pytest.mark.timeout(60)
def test_a_replacement_that_does_not_start_is_given_up_on_after_timeout(tmp_path: Path) -> None:
    # it was waited for 60 s whatever timeout said
    import functools

    marker = tmp_path / "marker"
    before = Snapshot.take()
    loader = conveyor.DataLoader(_KilledOnceThenInitHangs(marker), batch_size=4, timeout=2, max_worker_restarts=3,
                                 worker_init_fn=functools.partial(_hang_once_replaced, marker), **KINDS["process"])
    with pytest.raises(RuntimeError, match="did not start within 2 s"):
        drain(loader)
    del loader
    assert_no_leaks(before, grace=15)


class _Hangs(tud.Dataset):
    def __len__(self) -> int:
        return 12

    def __getitem__(self, i: int) -> torch.Tensor:
        if i == 5:
            time.sleep(60)
        return torch.tensor([i])


@pytest.mark.timeout(60)
def test_hung_worker_times_out_with_its_stack() -> None:
    before = Snapshot.take()
    loader = conveyor.DataLoader(_Hangs(), batch_size=2, timeout=2, **KINDS["process"])
    with pytest.raises(RuntimeError) as info:
        drain(loader)
    msg = str(info.value)
    assert "worker" in msg and "[4, 5]" in msg, msg
    assert "sleep" in msg or "__getitem__" in msg, msg
    del loader, info
    assert_no_leaks(before, grace=15)


class _HangsUntil(tud.Dataset):
    """Index 5 waits for ``release`` (a sample whose read never returns, until the test ends)."""

    def __init__(self) -> None:
        self.release = threading.Event()

    def __len__(self) -> int:
        return 12

    def __getitem__(self, i: int) -> torch.Tensor:
        if i == 5:
            self.release.wait(60)
        return torch.tensor([i])


@pytest.mark.timeout(60)
@pytest.mark.parametrize("fetch_threads", [1, 2])
def test_a_seeded_thread_worker_given_up_on_does_not_hold_up_other_seeded_loaders(fetch_threads: int) -> None:
    # seeding holds the process's lock on the global RNGs while the sample runs: the stuck
    # thread held it for good, and every seeded loader after it hung (even made after close)
    stuck = _HangsUntil()
    try:
        loader = conveyor.DataLoader(stuck, batch_size=2, num_workers=1, worker_type="thread", seed=0, timeout=1,
                                     fetch_threads=fetch_threads, adaptive=False)
        with pytest.raises(RuntimeError, match="timed out"):
            drain(loader)
        got: list[Any] = []
        later = threading.Thread(target=lambda: got.extend(conveyor.DataLoader(Squares(), batch_size=2, seed=1)),
                                 daemon=True)
        later.start()
        later.join(20)
        assert not later.is_alive(), "a seeded loader in the main process waited for the stuck sample"
        assert len(got) == 12  # 23 samples in twos
    finally:
        stuck.release.set()


class _CountsAndHangs(_HangsUntil):
    def __init__(self) -> None:
        super().__init__()
        self.fetched: list[int] = []

    def __getitem__(self, i: int) -> torch.Tensor:
        self.fetched.append(i)
        return super().__getitem__(i)


@pytest.mark.timeout(60)
def test_a_closed_thread_worker_runs_none_of_the_tasks_queued_behind_a_stuck_one() -> None:
    ds = _CountsAndHangs()
    loader = conveyor.DataLoader(ds, batch_size=1, num_workers=1, worker_type="thread", prefetch_factor=4,
                                 timeout=1, adaptive=False)
    with pytest.raises(RuntimeError, match="timed out"):
        drain(loader)
    loader.close()
    ds.release.set()  # the stuck sample returns: its thread would go on to the queued ones
    time.sleep(1.0)
    assert max(ds.fetched) == 5, ds.fetched  # nothing after the stuck index was fetched


@pytest.mark.timeout(60)
def test_restart_hung_replaces_a_stuck_worker_and_loses_nothing(tmp_path: Path) -> None:
    before = Snapshot.take()
    loader = conveyor.DataLoader(_HangsOnce(tmp_path / "hung"), batch_size=2, timeout=2, restart_hung=True,
                                 **KINDS["process"])
    got = [b.tolist() for b in drain(loader)]
    assert got == [[[2 * k], [2 * k + 1]] for k in range(6)]
    stats = loader.stats()
    assert stats["restarts"] == 1 and "killed by the loader" in stats["deaths"][0], stats["deaths"]
    del loader
    assert_no_leaks(before, grace=15)


@pytest.mark.timeout(90)
def test_restart_hung_that_cannot_help_says_the_loader_killed_them_and_why() -> None:
    # a sample that hangs in every new worker spends the restart budget: the error names the
    # timeout and the batch, shows where it hung, and does not blame the out-of-memory killer
    before = Snapshot.take()
    loader = conveyor.DataLoader(_Hangs(), batch_size=2, timeout=1, restart_hung=True, max_worker_restarts=1,
                                 **KINDS["process"])
    with pytest.raises(conveyor.WorkerDied) as info:
        drain(loader)
    msg = str(info.value)
    assert "killed by the loader" in msg and "timeout=1" in msg and "[4, 5]" in msg, msg
    assert "out-of-memory" not in msg, msg
    assert "sleep" in msg or "__getitem__" in msg, msg
    assert all(d.cause is not None for d in info.value.deaths)
    del loader, info
    assert_no_leaks(before, grace=15)


class _SlowOnce(_HangsOnce):
    """Index 9 takes 5 s the first time (a marker file says so), then answers at once."""

    def __getitem__(self, i: int) -> torch.Tensor:
        if i == 9 and not self.marker.exists():
            self.marker.write_text("slow once")
            time.sleep(5)
        return torch.tensor([i])


@pytest.mark.timeout(90)
def test_a_timeout_behind_an_earlier_epochs_batch_names_it(tmp_path: Path) -> None:
    # persistent workers: epoch 1 times out on a slow batch the worker goes on making; the
    # next epoch's first batch waits behind it, and its timeout named nothing at all
    loader = conveyor.DataLoader(_SlowOnce(tmp_path / "slow"), batch_size=2, timeout=2, persistent_workers=True,
                                 **KINDS["process"])
    with loader:
        with pytest.raises(RuntimeError, match="timed out"):
            list(loader)
        with pytest.raises(RuntimeError, match=r"earlier epoch \(indices \[8, 9\]\)"):
            list(loader)
        time.sleep(1.5)  # the slow batch is done by now
        assert [b.flatten().tolist() for b in loader] == [[2 * k, 2 * k + 1] for k in range(6)]


class _LoadsInside(tud.Dataset):
    """Each sample iterates a loader of its own, with process workers."""

    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int) -> torch.Tensor:
        inner = conveyor.DataLoader(Squares(4), batch_size=2, num_workers=2, adaptive=False)
        return torch.tensor([i, len(list(inner))])


@pytest.mark.timeout(60)
def test_a_loader_inside_a_worker_says_to_use_threads_there() -> None:
    # worker processes are daemonic and cannot start processes: torch raises the same
    # AssertionError, naming no way out
    before = Snapshot.take()
    loader = conveyor.DataLoader(_LoadsInside(), batch_size=2, **KINDS["process"])
    with pytest.raises(AssertionError, match="daemonic") as info:
        drain(loader)
    assert any("worker_type='thread'" in note for note in getattr(info.value, "__notes__", [])), info.value
    del loader, info
    assert_no_leaks(before, grace=15)


class _HangsFirst(_Hangs):
    def __getitem__(self, i: int) -> torch.Tensor:
        return super().__getitem__(5 if i == 1 else i)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("workers", [2, "auto"])
def test_timeout_holds_for_the_first_batches_too(workers: int | str) -> None:
    # the first batches are the ones "adaptive" would make in the main process, where
    # nothing could time them out: with a timeout, workers make them
    before = Snapshot.take()
    loader = conveyor.DataLoader(_HangsFirst(), batch_size=2, timeout=2, num_workers=workers)
    with pytest.raises(RuntimeError, match="timed out") as info:
        drain(loader)
    assert "[0, 1]" in str(info.value)
    del loader, info
    assert_no_leaks(before, grace=15)


def _slow_start(worker_id: int) -> None:
    time.sleep(30)


@pytest.mark.timeout(60)
def test_a_timeout_while_a_worker_starts_says_so() -> None:
    # the message blamed batch 0, whose sample was never touched: the worker was still in
    # worker_init_fn (spawned ones: importing the main script), which the timeout counts
    before = Snapshot.take()
    loader = conveyor.DataLoader(list(range(8)), batch_size=2, timeout=1, num_workers=2, worker_init_fn=_slow_start)
    with pytest.raises(RuntimeError, match="timed out") as info:
        drain(loader)
    assert "from worker 0, which has not started yet after" in str(info.value), info.value
    assert "runs worker_init_fn before its first batch" in str(info.value), info.value
    loader = conveyor.DataLoader(_HangsFirst(), batch_size=2, timeout=2, num_workers=2)
    with pytest.raises(RuntimeError, match="timed out") as info:
        drain(loader)
    assert "has not started yet" not in str(info.value), info.value  # a started worker, stuck in a sample
    del loader, info
    assert_no_leaks(before, grace=15)


# --------------------------------------------------------------------------- skipping bad samples


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_a_fraction_weighs_the_batch_it_arrives_in(kind: str) -> None:
    # one bad sample in a first batch of 200 is 0.5%: within max_failures=0.01 (it used to be
    # weighed against the samples seen before its own batch: '1 of 1 failed')
    loader = conveyor.DataLoader(Failing(1000, {2}), batch_size=200, on_error="skip", max_failures=0.01,
                                 **KINDS[kind])
    assert sum(len(b) for b in drain(loader)) == 999
    # a fraction allows its share of the samples seen so far, rounded up: 2 of the first 20
    # at 5% (1 allowed) is over
    loader = conveyor.DataLoader(Failing(40, {3, 7}), batch_size=10, on_error="skip", max_failures=0.05,
                                 **KINDS[kind])
    with pytest.raises(conveyor.TooManyFailures, match="2 of 10 samples"):
        drain(loader)
    # 7 of 100 is 7%, exactly what 0.07 allows (0.07 * 100 is 7.000000000000001 in floats)
    loader = conveyor.DataLoader(Failing(100, set(range(7))), batch_size=100, on_error="skip", max_failures=0.07,
                                 **KINDS[kind])
    assert sum(len(b) for b in drain(loader)) == 93
    loader = conveyor.DataLoader(Failing(100, set(range(8))), batch_size=100, on_error="skip", max_failures=0.07,
                                 **KINDS[kind])
    with pytest.raises(conveyor.TooManyFailures, match="8 of 100"):
        drain(loader)
    # a batch sampler's batch whose samples all fail counts all of them as seen (it has no
    # batch_size: counted as one, 2 of 3 failing read "2 of 2", and [[0, 1], [5]] "2 of 1")
    loader = conveyor.DataLoader(Failing(6, {0, 1}), batch_sampler=[[5], [0, 1]], on_error="skip",
                                 max_failures=0.4, **KINDS[kind])
    assert [b.tolist() for b in drain(loader)] == [[[5]]]
    loader = conveyor.DataLoader(Failing(6, {0, 1}), batch_sampler=[[0, 1], [5]], on_error="skip",
                                 max_failures=0.5, **KINDS[kind])
    with pytest.raises(conveyor.TooManyFailures, match="2 of 2 samples"):
        drain(loader)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_skip_without_a_budget_allows_one_percent(kind: str) -> None:
    # on_error="skip" alone skips: a rare bad sample (1 in 400) is left out ...
    loader = conveyor.DataLoader(Failing(400, {150}), batch_size=20, on_error="skip", **KINDS[kind])
    assert sum(len(b) for b in drain(loader)) == 399
    assert [f["index"] for f in loader.stats()["failures"]] == [150]
    # ... and a pipeline whose samples keep failing (1 in 10) still stops, naming the default
    loader = conveyor.DataLoader(Failing(400, set(range(5, 400, 10))), batch_size=20, on_error="skip", **KINDS[kind])
    with pytest.raises(conveyor.TooManyFailures, match=r"max_failures=0\.01"):
        drain(loader)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", sorted(KINDS))
@pytest.mark.parametrize("budget", [2, 0.25])
def test_skip_within_budget(kind: str, budget: int | float) -> None:
    loader = conveyor.DataLoader(Failing(20, {13, 17}), batch_size=4, on_error="skip", max_failures=budget,
                                 **KINDS[kind])
    batches = [b.flatten().tolist() for b in drain(loader)]
    assert batches == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11], [12, 14, 15], [16, 18, 19]]
    failures = loader.stats()["failures"]
    assert sorted(f["index"] for f in failures) == [13, 17]
    assert all("bad sample" in f["error"] for f in failures)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", sorted(KINDS))
@pytest.mark.parametrize("budget", [1, 0.05])
def test_skip_over_budget(kind: str, budget: int | float) -> None:
    loader = conveyor.DataLoader(Failing(20, {13, 17}), batch_size=4, on_error="skip", max_failures=budget,
                                 **KINDS[kind])
    with pytest.raises(conveyor.TooManyFailures) as info:
        drain(loader)
    first = info.value.__cause__
    assert isinstance(first, ValueError) and "bad sample 13" in str(first), repr(first)


def _collate_bug(batch: list[torch.Tensor]) -> torch.Tensor:
    if any(int(b[0]) == 9 for b in batch):
        raise TypeError("bug in my collate_fn")
    return torch.stack(batch)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_skip_does_not_skip_a_collate_fn_bug(kind: str) -> None:
    # a collate_fn that raises is not a bad sample: its batch vanished, counted as 4 failed
    # samples "while fetching", and max_failures=10 hid the bug for good
    loader = conveyor.DataLoader(Failing(20, set()), batch_size=4, collate_fn=_collate_bug, on_error="skip",
                                 max_failures=10, **KINDS[kind])
    with pytest.raises(TypeError, match="bug in my collate_fn") as info:
        drain(loader)
    assert "while collating indices [8, 9, 10, 11]" in " ".join(getattr(info.value, "__notes__", []))
    assert loader.stats()["failure_count"] == 0


@pytest.mark.timeout(60)
def test_skip_does_not_skip_a_system_exit_in_a_thread_worker() -> None:
    # thread workers caught it as a failed batch: under skip its good samples went with it
    loader = conveyor.DataLoader(Failing(20, {9}, exc=SystemExit), batch_size=4, on_error="skip",
                                 max_failures=10, **KINDS["thread"])
    with pytest.raises(SystemExit):
        drain(loader)
    assert loader.stats()["failure_count"] == 0


class _Batched(Failing):
    """Fetched a batch at a time: one bad index fails the whole call."""

    def __getitems__(self, indices: list[int]) -> list[torch.Tensor]:
        return [self[i] for i in indices]


class _BatchedOnly(tud.Dataset):
    """Only __getitems__ (torch's Dataset.__getitem__ raises NotImplementedError)."""

    def __len__(self) -> int:
        return 12

    def __getitems__(self, indices: list[int]) -> list[torch.Tensor]:
        if 5 in indices:
            raise ValueError("bad sample 5")
        return [torch.tensor([i]) for i in indices]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_skip_with_getitems_leaves_out_only_the_bad_samples(kind: str) -> None:
    # a failed __getitems__ call left out its whole batch, good samples too
    loader = conveyor.DataLoader(_Batched(12, {5}), batch_size=4, on_error="skip", max_failures=3, **KINDS[kind])
    assert [b.flatten().tolist() for b in drain(loader)] == [[0, 1, 2, 3], [4, 6, 7], [8, 9, 10, 11]]
    assert [f["index"] for f in loader.stats()["failures"]] == [5]
    # without a __getitem__ of its own, the batch goes whole, as before
    loader = conveyor.DataLoader(_BatchedOnly(), batch_size=4, on_error="skip", max_failures=4, **KINDS[kind])
    assert [b.flatten().tolist() for b in drain(loader)] == [[0, 1, 2, 3], [8, 9, 10, 11]]


class _Heavy(ValueError):
    """A failure holding what its sample held (a decoded image, say): 1 MB."""

    def __init__(self, msg: str) -> None:
        super().__init__(msg)
        self.held = bytearray(1 << 20)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_skipped_failures_are_counted_without_keeping_their_exceptions(
        kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # each skipped failure kept its pickled (or live) exception in stats for the loader's
    # life: 20 failures holding 20 MB each kept 400 MB; plain ones grew without end
    from conveyor import stats

    monkeypatch.setattr(stats, "FAILURES_KEPT", 30)
    loader = conveyor.DataLoader(Failing(200, set(range(0, 200, 4)), exc=_Heavy), batch_size=8, on_error="skip",
                                 max_failures=1.0, **KINDS[kind])
    for _ in range(2):
        assert sum(len(b) for b in drain(loader)) == 150
    snap = loader.stats()
    assert snap["failure_count"] == 100 and len(snap["failures"]) == 30
    assert all(f.payload is None and f.original is None for f in loader._stats.incidents.failures)
    assert "100 sample(s) failed" in loader.report()


@pytest.mark.timeout(60)
def test_too_many_failures_counts_the_epoch_it_stops() -> None:
    # it said "4 of 28 samples failed so far (ValueError x10)": this epoch's count beside
    # every epoch's kinds, and an earlier epoch's failure chained
    ds = Failing(20, {1, 2, 3})
    loader = conveyor.DataLoader(ds, batch_size=4, on_error="skip", max_failures=3)
    for _ in range(2):
        drain(loader)
    ds.bad = {5, 6, 7, 8}
    said = r"4 of \d+ samples failed so far this epoch \(ValueError x4\)"
    with pytest.raises(conveyor.TooManyFailures, match=said) as info:
        drain(loader)
    assert "bad sample 5" in str(info.value.__cause__)


# --------------------------------------------------------------------------- start-up problems


class _Unpicklable(tud.Dataset):
    def __init__(self) -> None:
        self.fn = lambda i: i

    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int) -> int:
        return self.fn(i)


@pytest.mark.timeout(60)
def test_unpicklable_dataset_with_spawn() -> None:
    before = Snapshot.take()
    loader = conveyor.DataLoader(_Unpicklable(), batch_size=2, num_workers=2, multiprocessing_context="spawn",
                                 **WORKERS)
    with pytest.raises(Exception) as info:
        drain(loader)
    text = str(info.value) + " ".join(getattr(info.value, "__notes__", []))
    assert "pickl" in text.lower(), text
    del loader, info
    assert_no_leaks(before)


NO_GUARD = textwrap.dedent("""
    import conveyor
    from helpers import WORKERS, Squares

    loader = conveyor.DataLoader(Squares(), batch_size=2, num_workers=2, multiprocessing_context="spawn", **WORKERS)
    for batch in loader:
        pass
    print("DONE")
""")


@pytest.mark.timeout(90)
def test_spawn_without_main_guard(tmp_path: Path, script_env: dict[str, str]) -> None:
    proc = run_script(tmp_path / "no_guard.py", NO_GUARD, script_env, 75, cwd=tmp_path)
    assert proc.returncode != 0
    assert "__main__" in proc.stderr, proc.stderr[-3000:]
    # the worker's own RuntimeError is about the guard: no note about pickling beside it
    assert "must be picklable" not in proc.stderr, proc.stderr[-3000:]


CLASS_UNDER_GUARD = textwrap.dedent("""
    import sys
    import conveyor

    if __name__ == "__main__":
        class Rows:
            def __len__(self):
                return 8
            def __getitem__(self, i):
                return i

        loader = conveyor.DataLoader(Rows(), batch_size=2, num_workers=1, multiprocessing_context="spawn",
                                     adaptive=False)
        try:
            list(loader)
        except RuntimeError as e:
            print(e)
""")


@pytest.mark.timeout(90)
def test_a_dataset_class_under_the_main_guard_is_named_when_spawned_workers_cannot_find_it(
        tmp_path: Path, script_env: dict[str, str]) -> None:
    # the hint said to put the code under the guard, which it already was; the worker's
    # AttributeError (Can't get attribute 'Rows' on <module '__mp_main__'>) went to stderr only
    proc = run_script(tmp_path / "guarded.py", CLASS_UNDER_GUARD, script_env, 75, cwd=tmp_path)
    assert "The dataset's class Rows is defined under `if __name__" in proc.stdout, proc.stdout + proc.stderr[-3000:]
    proc = subprocess.run([sys.executable, "-"], input=CLASS_UNDER_GUARD, capture_output=True, text=True,
                          env=script_env, cwd=tmp_path, timeout=75)
    assert "has no file to import (a script read from stdin" in proc.stdout, proc.stdout + proc.stderr[-3000:]


RESOURCE_TRACKER = textwrap.dedent("""
    import os, threading
    from multiprocessing import resource_tracker
    import conveyor

    class Locked:
        def __init__(self):
            self.lock = threading.Lock()
        def __len__(self):
            return 8
        def __getitem__(self, i):
            return i

    if __name__ == "__main__":
        try:
            list(conveyor.DataLoader(Locked(), batch_size=2, num_workers=2, multiprocessing_context="spawn",
                                     adaptive=False))
        except TypeError:
            pass
        pid = resource_tracker._resource_tracker._pid
        print("tracker", "alive" if pid is not None and os.waitpid(pid, os.WNOHANG) == (0, 0) else pid)
""")


@pytest.mark.timeout(90)
def test_a_failed_spawn_leaves_multiprocessings_resource_tracker_alone(
        tmp_path: Path, script_env: dict[str, str]) -> None:
    # the first spawn starts the tracker before it pickles the worker's arguments; the
    # cleanup of a failed start killed every new child, the tracker too, and the next spawn
    # warned "resource_tracker: process died unexpectedly"
    proc = run_script(tmp_path / "tracker.py", RESOURCE_TRACKER, script_env, 75, cwd=tmp_path)
    assert "tracker alive" in proc.stdout, proc.stdout + proc.stderr[-3000:]


SPAWNED_EXIT = textwrap.dedent("""
    import atexit, os, sys
    import conveyor

    OUT = sys.argv[1]

    class Kept:
        def __del__(self, _open=open, path=os.path.join(OUT, f"teardown{os.getpid()}")):
            _open(path, "w").close()  # names bound now: a teardown has cleared the module's

    def note_exit(pid):
        open(os.path.join(OUT, f"atexit{pid}"), "w").close()

    def init(worker_id):
        globals()["kept"] = Kept()  # finalized only by an interpreter's teardown
        atexit.register(note_exit, os.getpid())
        sys.stdout.write(f"worker {worker_id} up;")  # no newline: still buffered at exit

    if __name__ == "__main__":
        loader = conveyor.DataLoader(list(range(8)), batch_size=2, num_workers=2, multiprocessing_context="spawn",
                                     worker_init_fn=init, adaptive=False)
        for epoch in range(2):
            assert [b.tolist() for b in loader] == [[0, 1], [2, 3], [4, 5], [6, 7]]
        print("DONE")
""")


@pytest.mark.timeout(120)
def test_spawned_workers_leave_without_a_teardown_but_run_their_exit_handlers(
        tmp_path: Path, script_env: dict[str, str]) -> None:
    # a spawned worker ran sys.exit: the teardown of all it imported, ~0.5 s with torch,
    # which close() waited for at the end of every epoch; it now ends as a forked one does
    out = tmp_path / "out"
    out.mkdir()
    (tmp_path / "spawned_exit.py").write_text(SPAWNED_EXIT)
    proc = subprocess.run([sys.executable, str(tmp_path / "spawned_exit.py"), str(out)], capture_output=True,
                          text=True, env=script_env, timeout=100, cwd=tmp_path)
    assert proc.returncode == 0 and "DONE" in proc.stdout, proc.stdout + proc.stderr[-3000:]
    names = sorted(p.name for p in out.iterdir())
    assert sum(n.startswith("atexit") for n in names) == 4, names  # 2 workers x 2 epochs: handlers ran
    assert not any(n.startswith("teardown") for n in names), names  # no interpreter teardown
    assert proc.stdout.count("up;") == 4, proc.stdout  # buffered output flushed


TORCH_HALF_IMPORTED = textwrap.dedent("""
    import sys
    import threading
    from conveyor import _torch, rng

    assert "torch" not in sys.modules
    importer = threading.Thread(target=lambda: __import__("torch"))
    importer.start()
    while "torch" not in sys.modules:  # the import has begun: torch is there, but half made
        pass
    rng.seed_all(5)  # a fetch thread seeding its sample meanwhile
    assert not _torch.is_tensor(1)
    importer.join()
    import torch
    assert torch.initial_seed() == 5, torch.initial_seed()
    print("OK")
""")


@pytest.mark.timeout(90)
def test_seeding_waits_for_torch_imported_by_another_thread(tmp_path: Path, script_env: dict[str, str]) -> None:
    proc = run_script(tmp_path / "half.py", TORCH_HALF_IMPORTED, script_env, 75)
    assert proc.returncode == 0 and "OK" in proc.stdout, proc.stderr[-3000:]


TORCH_LATE = textwrap.dedent("""
    import sys
    import numpy as np
    import conveyor

    class Threads:
        \"\"\"Sample i: [i, the worker's torch threads, or -1 before torch is imported].\"\"\"
        def __len__(self):
            return 48
        def __getitem__(self, i):
            torch = sys.modules.get("torch")
            seen = torch.get_num_threads() if torch is not None and hasattr(torch, "get_num_threads") else -1
            return np.array([i, seen], dtype=np.int64)

    if __name__ == "__main__":
        with conveyor.DataLoader(Threads(), batch_size=4, num_workers=1, fetch_threads=4, seed=1,
                                 multiprocessing_context=sys.argv[1], adaptive=False) as loader:
            got = list(loader)
        kinds = {type(b).__module__ + "." + type(b).__name__ for b in got}
        assert kinds == {"torch.Tensor"}, kinds  # as without workers, though main never imported torch
        rows = np.concatenate([b.numpy() for b in got])
        assert rows[:, 0].tolist() == list(range(48)), rows[:, 0]
        assert set(rows[:, 1].tolist()) == {1}, rows[:, 1]
        print("OK")
""")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_worker_imports_torch_before_fetching(tmp_path: Path, script_env: dict[str, str], context: str) -> None:
    # a script of numpy datasets that never imports torch: the worker's batches are still
    # tensors, so the worker imports torch before its fetch threads start (not in its first
    # collate, under them) and sets it up as usual (one intra-op thread), and the main
    # process hands them out as tensors
    (tmp_path / "late.py").write_text(TORCH_LATE)
    proc = subprocess.run([sys.executable, str(tmp_path / "late.py"), context], capture_output=True, text=True,
                          env=script_env, timeout=100, cwd=tmp_path)
    assert proc.returncode == 0 and "OK" in proc.stdout, proc.stderr[-3000:]


LAZY_TORCH_STREAM = textwrap.dedent("""
    import sys
    import numpy as np
    import conveyor

    class Stream:
        def __iter__(self):
            import torch.utils.data as tud  # a dataset module that imports torch only here
            info = tud.get_worker_info()
            start, step = (info.id, info.num_workers) if info is not None else (0, 1)
            for i in range(start, 40, step):
                yield np.array([i])

    def stack(batch):
        return np.stack(batch)

    if __name__ == "__main__":
        worker_type, batches = sys.argv[1:3]
        kw = {"collate": {"collate_fn": stack}, "numpy": {"output": "numpy"}, "tensors": {}}[batches]
        assert "torch" not in sys.modules
        with conveyor.DataLoader(Stream(), batch_size=4, num_workers=2, worker_type=worker_type, seed=1,
                                 **kw) as loader:
            got = sorted(int(x) for b in loader for x in b.flatten())
        assert got == list(range(40)), got
        print("OK")
""")


@pytest.mark.timeout(90)
@pytest.mark.parametrize("worker_type, batches", [("thread", "tensors"), ("thread", "collate"), ("thread", "numpy"),
                                                  ("process", "collate")])
def test_workers_answer_torchs_get_worker_info_for_a_dataset_importing_torch_late(
        tmp_path: Path, script_env: dict[str, str], worker_type: str, batches: str) -> None:
    # torch's get_worker_info() is routed to each thread worker when it starts, if torch is
    # there: a loader whose batches are tensors imports it before starting them. Where
    # nothing needs torch (a collate_fn of the user's, numpy output), the worker gives torch
    # its info the moment the dataset imports it (each worker read the whole stream before:
    # every sample twice)
    path = tmp_path / "lazy_stream.py"
    path.write_text(LAZY_TORCH_STREAM)
    proc = subprocess.run([sys.executable, str(path), worker_type, batches], capture_output=True, text=True,
                          env=script_env, timeout=75, cwd=tmp_path)
    assert proc.returncode == 0 and "OK" in proc.stdout, proc.stderr[-3000:]


SHM_FULL = textwrap.dedent("""
    import warnings
    import torch
    import conveyor
    import conveyor.transport.segment as seg
    from helpers import WORKERS, Images, expected_images

    def full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    seg.Segment.create = classmethod(lambda cls, *a, **k: full())
    if __name__ == "__main__":
        ds = Images(40)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            loader = conveyor.DataLoader(ds, batch_size=4, num_workers=2, **WORKERS)
            got = list(loader)
            loader.close()
        assert len(got) == 10
        for k, b in enumerate(got):
            assert torch.equal(b, expected_images(ds, list(range(4 * k, 4 * k + 4)))), k
        runtime = [w for w in caught if issubclass(w.category, RuntimeWarning)]
        print("WARNINGS", len(runtime), [str(w.message)[:80] for w in runtime])
""")


@pytest.mark.timeout(90)
def test_shm_full_falls_back_with_one_warning(tmp_path: Path, script_env: dict[str, str]) -> None:
    proc = run_script(tmp_path / "shm_full.py", SHM_FULL, script_env, 75)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("WARNINGS")]
    assert line and line[0].split()[1] == "1", proc.stdout


class _Survives(tud.IterableDataset):
    """A stream whose iterator raises at bad items and can still be asked for the next one."""

    def __init__(self, n: int, bad: set[int], generator: bool) -> None:
        self.n, self.bad, self.generator = n, bad, generator

    def __iter__(self) -> Any:
        if self.generator:
            return self._gen()
        return _SurvivingIterator(self)

    def _gen(self) -> Any:
        for i in range(self.n):
            if i in self.bad:
                raise ValueError(f"bad item {i}")
            yield torch.tensor([i])


class _SurvivingIterator:
    def __init__(self, ds: _Survives) -> None:
        self.ds, self.i = ds, 0

    def __next__(self) -> torch.Tensor:
        i = self.i
        if i >= self.ds.n:
            raise StopIteration
        self.i += 1
        if i in self.ds.bad:
            raise ValueError(f"bad item {i}")
        return torch.tensor([i])


@pytest.mark.timeout(60)
@pytest.mark.parametrize("batch_size", [2, 3])
@pytest.mark.parametrize("drop_last", [False, True])
def test_skip_in_a_stream_fills_its_batches(batch_size: int, drop_last: bool) -> None:
    # a batch goes on pulling items past its failures; only the stream's end ends the stream
    loader = conveyor.DataLoader(_Survives(10, {4, 5}, generator=False), batch_size=batch_size,
                                 drop_last=drop_last, on_error="skip", max_failures=5)
    good = [i for i in range(10) if i not in (4, 5)]
    expected = [good[k:k + batch_size] for k in range(0, len(good), batch_size)]
    if drop_last:
        expected = [b for b in expected if len(b) == batch_size]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the stream really ended: nothing to warn of
        warnings.simplefilter("ignore", conveyor.SlowSettingWarning)  # (a judgement of speed: a loaded machine may earn it)
        assert [b.flatten().tolist() for b in drain(loader)] == expected


@pytest.mark.timeout(60)
@pytest.mark.parametrize("workers", [0, 2])
def test_skip_in_a_stream(workers: int) -> None:
    # an iterator that survives its bad items goes on; the good items of a batch stay
    kw = {"batch_size": 4, "on_error": "skip", "max_failures": 5, "num_workers": workers}
    loader = conveyor.DataLoader(_Survives(20, {5, 11}, generator=False), **kw)
    got = sorted(int(x) for b in drain(loader) for x in b.flatten())
    # each replica streams everything (no sharding here)
    assert got == sorted([i for i in range(20) if i not in (5, 11)] * max(1, workers))
    assert len(loader.stats()["failures"]) == 2 * max(1, workers)
    # a generator is over once it raised: its batch keeps its good items, and a warning says why the stream stopped
    loader = conveyor.DataLoader(_Survives(20, {5}, generator=True), **kw)
    with pytest.warns(RuntimeWarning, match="generator is over once it has raised"):
        got = sorted(int(x) for b in drain(loader) for x in b.flatten())
    assert got == sorted([0, 1, 2, 3, 4] * max(1, workers))


@pytest.mark.timeout(60)
@pytest.mark.parametrize("workers", [0, 1])
@pytest.mark.parametrize("batch_size", [None, 2])
def test_a_generator_that_raised_ends_its_stream_as_torchs_does(workers: int, batch_size: int | None) -> None:
    # under on_error="raise" the loop that catches the error and asks again sees the stream
    # end, as with torch, and no word of on_error="skip"; under "skip" one warning a stream
    # (the tasks in flight behind its end warned again)
    def run(loader: Any) -> tuple[list[Any], list[str]]:
        got: list[Any] = []
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            it = iter(loader)
            while True:
                try:
                    got.append(next(it).flatten().tolist())
                except ValueError:
                    got.append("error")
                except StopIteration:
                    break
        return got, [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]

    ds = _Survives(6, {3}, generator=True)
    ref, _ = run(tud.DataLoader(ds, batch_size=batch_size, num_workers=workers))
    got, said = run(conveyor.DataLoader(ds, batch_size=batch_size, num_workers=workers))
    assert got == ref and "error" in got and said == []
    got, said = run(conveyor.DataLoader(ds, batch_size=batch_size, num_workers=workers, on_error="skip",
                                        max_failures=1))
    assert "error" not in got and len(said) == 1 and "generator is over once it has raised" in said[0]


@pytest.mark.timeout(60)
def test_forkserver_workers_idle_between_epochs_stay() -> None:
    # a forkserver worker's parent is the fork server, not the main process: idle workers
    # took that for the main process gone, left after 0.5 s, and were restarted each epoch
    # (counted against max_worker_restarts)
    with conveyor.DataLoader(Squares(), batch_size=4, num_workers=2, persistent_workers=True,
                             multiprocessing_context="forkserver", adaptive=False) as loader:
        first = [repr(b) for b in loader]
        time.sleep(1.5)
        assert [repr(b) for b in loader] == first
        stats = loader.stats()
    assert stats["restarts"] == 0 and not stats["deaths"], stats["deaths"]


class _SlowEven(tud.Dataset):
    """64 rows of 16 KiB (batches large enough for shared-memory slots); worker 0's batches (the even
    ones, batch size 4) take 0.05 s a row, worker 1's none."""

    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int) -> torch.Tensor:
        if (i // 4) % 2 == 0:
            time.sleep(0.05)
        return torch.full((64, 64), float(i))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("persistent", [False, True])
def test_a_worker_killed_while_its_finished_batches_wait_loses_none(persistent: bool) -> None:
    # worker 1's batches 1 and 3 wait in the main process behind worker 0's slow batch 2 when
    # worker 1 is killed: its slots were unlinked with it, and reading them later failed
    # (FileNotFoundError). Each kill also left the dead worker's slots mapped until close().
    loader = conveyor.DataLoader(_SlowEven(), batch_size=4, num_workers=2, persistent_workers=persistent, **WORKERS)
    with loader:
        for epoch in range(3):
            it = iter(loader)
            got = [next(it)]
            ex = loader._last_run.pool.executor
            deadline = time.monotonic() + 20
            while len(loader._last_run.reorder.buffer) < 1 and time.monotonic() < deadline:
                time.sleep(0.02)
                for ev in ex.poll(0):
                    loader._last_run._absorb([ev])
            os.kill(ex.workers[1].proc.pid, signal.SIGKILL)
            got += list(it)
            assert [int(b[0, 0, 0]) for b in got] == list(range(0, 64, 4)), epoch
            del got, it
            assert all(key[1] >= ex.gens[key[0]] for key in ex.views.segments), "a dead worker's slots stay mapped"
        assert loader.stats()["restarts"] == 3


@pytest.mark.timeout(60)
def test_a_stream_worker_that_died_in_an_epoch_broken_off_is_replaced_next_epoch() -> None:
    # a stream's worker cannot be replaced mid-epoch (it holds its place in the stream), but
    # one whose replica has handed out nothing this epoch starts over: the next epoch after
    # a break used to raise WorkerDied for a worker killed in the one broken off
    loader = conveyor.DataLoader(Stream(64, "torch"), batch_size=4, num_workers=2, persistent_workers=True,
                                 **WORKERS)
    with loader:
        for i, _ in enumerate(loader):
            if i == 3:
                os.kill(loader._persistent.executor.workers[0].proc.pid, signal.SIGKILL)
                break
        items = sorted(int(v) for b in loader for v in b[:, 0])
        assert items == list(range(64))
        assert loader.stats()["restarts"] == 1


@pytest.mark.timeout(60)
def test_a_stream_worker_that_died_mid_epoch_is_not_replaced() -> None:
    # its replica had handed out batches: a new worker would start the stream over and
    # repeat them, so the epoch ends with WorkerDied naming why
    loader = conveyor.DataLoader(Stream(400, "torch"), batch_size=4, num_workers=2, **WORKERS)
    with loader, pytest.raises(conveyor.WorkerDied, match="cannot be replaced"):
        for i, _ in enumerate(loader):
            if i == 3:
                os.kill(loader._last_run.pool.executor.workers[0].proc.pid, signal.SIGKILL)


@pytest.mark.timeout(60)
def test_a_thread_workers_result_lost_on_its_way_is_made_again() -> None:
    # a KeyboardInterrupt landing in poll() just after a result was taken off the queue lost
    # it, and next() then waited forever (the loop went on after the user caught the
    # interrupt). Here the next result poll() takes off the queue is dropped, the same loss
    # (taken off by hand, the test lost the race to the loader's poll when that had drained
    # every result in flight).
    loader = conveyor.DataLoader(Squares(), batch_size=2, num_workers=2, worker_type="thread", **WORKERS)
    with loader:
        it = iter(loader)
        got = [next(it)]
        ex = loader._last_run.pool.executor
        ex.results = LosesOne(ex.results)
        got += list(it)
        expected = list(tud.DataLoader(Squares(), batch_size=2))
        assert [b[1].tolist() for b in got] == [b[1].tolist() for b in expected]
        assert len(ex.results.lost) == 1 and ex.results.lost[0].seq in range(1, len(expected))


class LosesOne:
    """A result queue whose first result taken off is lost, as if an interrupt came between."""

    def __init__(self, q: Any) -> None:
        self.q = q
        self.lost: list[Any] = []

    def _take(self, r: Any) -> Any:
        if not self.lost:
            self.lost.append(r)
            raise queue.Empty
        return r

    def get(self, timeout: float | None = None) -> Any:
        return self._take(self.q.get(timeout=timeout))

    def get_nowait(self) -> Any:
        return self._take(self.q.get_nowait())

    def __getattr__(self, name: str) -> Any:
        return getattr(self.q, name)


class _DiesAt13(tud.Dataset):
    def __len__(self) -> int:
        return 40

    def __getitem__(self, i: int) -> torch.Tensor:
        if i == 13 and tud.get_worker_info() is not None:
            os._exit(3)  # a crash in the worker: conveyor replaces it
        time.sleep(0.002)
        return torch.full((4,), float(i))


@pytest.mark.timeout(60)
def test_a_ctrl_c_while_a_replacement_starts_leaves_close_working(monkeypatch: pytest.MonkeyPatch) -> None:
    # the dead worker was reaped (its process object closed) and still named as the worker:
    # after a Ctrl-C in the replacement's start, every close() raised "process object is
    # closed", before its sweep of slots and stack files
    from conveyor.executors import processes

    spawn = processes.ProcessExecutor._spawn

    def interrupted(self: Any, w: int) -> Any:
        if self.gens[w] > 0:  # a replacement
            raise KeyboardInterrupt
        return spawn(self, w)

    monkeypatch.setattr(processes.ProcessExecutor, "_spawn", interrupted)
    before = Snapshot.take()
    loader = conveyor.DataLoader(_DiesAt13(), batch_size=4, num_workers=2, adaptive=False)
    with pytest.raises(KeyboardInterrupt):
        for _ in loader:
            pass
    loader.close()
    assert_no_leaks(before)


class _Paced(tud.Dataset):
    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int) -> torch.Tensor:
        time.sleep(0.001)
        return torch.full((4,), float(i))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("workers", [2, "auto"])
def test_close_from_another_thread_ends_the_iterating_threads_epoch_quietly(workers: object) -> None:
    # the iterating thread's own epoch end closed the workers as close() did: both closed each
    # worker's doorbell ("Bad file descriptor", 1 in 3 runs), and a poll over a closed process
    # object raised "process object is closed" (1 in 5)
    before = Snapshot.take()
    for delay in (0.05, 0.1, 0.15, 0.2, 0.3, 0.4):
        loader = conveyor.DataLoader(_Paced(), batch_size=4, num_workers=workers)
        errors: list[BaseException] = []
        stop = threading.Event()

        def train() -> None:
            try:
                while not stop.is_set():
                    for _ in loader:
                        time.sleep(0.002)
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

        thread = threading.Thread(target=train)
        thread.start()
        time.sleep(delay)
        stop.set()
        loader.close()
        thread.join(30)
        assert not thread.is_alive()
        assert not errors, "".join(traceback.format_exception(errors[0]))
    assert_no_leaks(before)
