"""num_workers / fetch_threads / prefetch_factor = "auto": the loader tunes itself and says so."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import conveyor.executors.fetcher
import conveyor.loader
import conveyor.placement.probe
import conveyor.placement.rules
import conveyor.pool
import conveyor.epoch
import conveyor.here
import conveyor.placement.machine
import conveyor.placement.tuner
from conveyor import DataLoader
from conveyor.executors.task import Result, Task
from conveyor.placement import Decision, Tuner
from helpers import children


def _burn(seconds: float, clock: Callable[[], float] = time.thread_time) -> None:
    """Compute for ``seconds`` of ``clock`` (this thread's CPU time by default)."""
    end = clock() + seconds
    while clock() < end:
        pass

class Tiny:
    """Samples cost next to nothing: the main process should keep them."""

    def __len__(self) -> int:
        return 512

    def __getitem__(self, i: int) -> np.ndarray:
        return np.full(2, i, dtype=np.int64)


class Waits:
    """Each sample waits on 'storage' (sleeps) and uses almost no CPU."""

    def __len__(self) -> int:
        return 16 * 24

    def __getitem__(self, i: int) -> np.ndarray:
        time.sleep(0.004)
        return np.full(2, i, dtype=np.int64)


@pytest.fixture
def probed(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The seq of every probing batch the main process makes; "cheap" is a generous 50 ms,
    so that a busy machine does not decide these tests."""
    monkeypatch.setattr(conveyor.placement.rules, "INLINE_MAX_S", 0.05)
    seen: list[int] = []
    probe = conveyor.placement.probe.Probe._probe

    def counting(self: object, task: object) -> object:
        seen.append(task.seq)  # type: ignore[attr-defined]
        return probe(self, task)  # type: ignore[arg-type]

    monkeypatch.setattr(conveyor.placement.probe.Probe, "_probe", counting)
    return seen


def _all(loader: DataLoader) -> np.ndarray:
    return np.concatenate([b[:, 0] for b in loader])


@pytest.mark.timeout(60)
def test_cheap_samples_stay_in_the_main_process(monkeypatch: pytest.MonkeyPatch) -> None:
    # "cheap" is a measured cost; a generous bar keeps this independent of how busy the machine is
    monkeypatch.setattr(conveyor.placement.rules, "INLINE_MAX_S", 0.05)
    with DataLoader(Tiny(), batch_size=16, num_workers="auto", output="numpy") as loader:
        got = _all(loader)
        stats = loader.stats()
        decision = loader.tuning()
    assert np.array_equal(got, np.arange(512))
    assert decision is not None and decision["num_workers"] == 0, decision
    assert stats["main_process_batches"] == 512 // 16
    assert not stats["workers_started"]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("workers", ["auto", 2])
def test_two_cheap_probing_batches_are_enough(probed: list[int], workers: object) -> None:
    # each probing batch snapshots the global RNGs (~0.15 ms): two cheap batches decide
    with DataLoader(Tiny(), batch_size=16, num_workers=workers, adaptive=True, persistent_workers=True, output="numpy") as loader:
        got = _all(loader)
        stats = loader.stats()
    assert np.array_equal(got, np.arange(512))
    assert probed == [0, 1]
    assert stats["main_process_batches"] == 512 // 16 and not stats["workers_started"]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("worker_type", ["process", "thread"])
def test_waiting_samples_get_workers_and_fetch_threads(worker_type: str) -> None:
    with DataLoader(Waits(), batch_size=16, num_workers="auto", fetch_threads="auto",
                    worker_type=worker_type, output="numpy") as loader:
        got = _all(loader)
        stats = loader.stats()
        decision = loader.tuning()
    assert np.array_equal(got, np.arange(16 * 24))  # every sample once, in order, while settings changed
    assert stats["workers_started"]
    assert decision is not None and decision["num_workers"] >= 1
    assert stats["fetch_threads"] > 1, stats["fetch_threads"]
    assert decision["reason"]


@pytest.mark.timeout(60)
def test_the_tuner_hears_what_a_fetch_took_alone_when_waiting_samples_start_the_workers() -> None:
    # the first batch's samples, one by one in the main process, say what a fetch takes with
    # no other running: the tuner reads threads crowding each other against it
    with DataLoader(Waits(), batch_size=16, num_workers="auto", output="numpy") as loader:
        assert np.array_equal(_all(loader), np.arange(16 * 24))
        stats = loader.stats()
        alone = loader._tuner._alone
    assert stats["workers_started"] and stats["fetch_threads"] > 1
    assert alone is not None and 0.004 <= alone < 1.0, alone


class _Watched:
    """A main-process fetcher on a given CPU clock (``clock["cpu"]``) whose batch took ``cpu``
    seconds by that clock, and whose watch fires once while it runs, as a slow probing
    batch's does."""

    def __init__(self, cpu: float, clock: dict[str, float], fires: bool = True) -> None:
        self.cpu, self.clock, self.fires, self.watch = cpu, clock, fires, None

    def cpu_clock(self) -> float:
        return self.clock["cpu"]

    def schedule(self, task: Task) -> None:
        pass

    def run(self, task: Task) -> Result:
        if self.fires:
            assert self.watch is not None, "a probing batch made under a watch"
            assert self.watch[1]() is None, "the watch starts the workers"
        return Result(task.seq, -1, batch=np.zeros(2), start=0.0, fetched=0.001, end=0.001, cpu=self.cpu)


def _probe_on(pool: Any, fetcher: _Watched, task: Task) -> tuple[Result, float]:
    """``pool``'s probe makes ``task`` with ``fetcher`` standing in for the main process's."""
    real, pool.main._fetcher = pool.main._fetcher, fetcher
    try:
        return pool.probe._run_probe(task, watch=True)  # type: ignore[no-any-return]
    finally:
        pool.main._fetcher = real


@pytest.mark.timeout(60)
@pytest.mark.parametrize("workers", ["auto", 2])
def test_a_batch_the_workers_were_forked_in_does_not_count_the_fork_as_its_cpu(workers: object) -> None:
    # the workers start from a probing batch's watch, in the thread making the batch: fork
    # took ~27 ms of that thread's CPU, which the batch read as its own (35 ms of CPU against
    # 8 ms of work, and the tuner took such fetches for CPU-bound). Given measurements: the
    # batch took 1 s of its fetcher's clock, of which the workers' start took 0.25 s
    with DataLoader(Tiny(), batch_size=2, num_workers=workers, adaptive=True, output="numpy") as loader:
        next(iter(loader))
        pool = loader._last_pool
        assert pool is not None and not pool.launched
        pool.probe.inline_costs[:] = [0.001]  # not the very first batch: the watch starts them at once
        clock = {"cpu": 10.0}
        started: list[float] = []

        def start(busy: float = 1.0) -> None:
            started.append(busy)
            clock["cpu"] += 0.25

        setattr(pool.probe, "_start_early_auto" if workers == "auto" else "_start_early", start)
        result, _ = _probe_on(pool, _Watched(1.0, clock), Task(7, 0, [0, 1]))
    assert len(started) == 1
    assert result.cpu == pytest.approx(0.75), result.cpu


@pytest.mark.timeout(60)
def test_auto_workers_tune_threads_left_unset() -> None:
    # num_workers="auto" alone: fetch_threads and prefetch_factor, left unset, are tuned too
    with DataLoader(Waits(), batch_size=16, num_workers="auto", output="numpy") as loader:
        assert loader._auto == {"num_workers": True, "fetch_threads": True, "prefetch_factor": True}
        got = _all(loader)
        stats = loader.stats()
    assert np.array_equal(got, np.arange(16 * 24))
    assert stats["workers_started"]
    assert stats["fetch_threads"] > 1, stats["fetch_threads"]


def test_fetch_threads_default_to_one_and_can_be_pinned_under_auto() -> None:
    assert DataLoader(Tiny(), num_workers=2).fetch_threads == 1
    pinned = DataLoader(Tiny(), num_workers="auto", fetch_threads=3, prefetch_factor=2)
    assert pinned._auto == {"num_workers": True, "fetch_threads": False, "prefetch_factor": False}
    assert pinned.fetch_threads == 3
    pinned.close()


@pytest.mark.timeout(60)
class Sleeps:
    """64 samples of 2 ms each, spent waiting."""

    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int) -> np.ndarray:
        time.sleep(0.002)
        return np.full(2, i, dtype=np.int64)


def test_a_waiting_first_batch_starts_the_workers_before_it_ends() -> None:
    # 8 samples of 2 ms: the first batch (~16 ms in the main process, under the 25 ms a first
    # batch may take for one-time costs) mostly waits, so the workers start a few ms into it
    # instead of after it; the next batches come from them
    with DataLoader(Sleeps(), batch_size=8, num_workers=2, adaptive=True, output="numpy") as loader:
        it = iter(loader)
        first = next(it)
        assert loader.stats()["workers_started"], "the workers should start during the first batch"
        rest = list(it)
        stats = loader.stats()
    assert np.array_equal(np.concatenate([first[:, 0]] + [b[:, 0] for b in rest]), np.arange(64))
    assert stats["main_process_batches"] == 1


def test_an_early_start_that_fails_leaves_the_batch_and_the_next_dispatch_starts_them(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # the workers' start inside a waiting probe batch fails once: the batch is still made
    # here, nothing of the failed start is kept (no executor, nothing for close() to stop
    # twice), and the next dispatch starts them for the rest
    start = conveyor.pool.Launcher.start
    calls: list[int] = []

    def fails_once(self: Any, *args: Any, **kw: Any) -> Any:
        calls.append(1)
        if len(calls) == 1:
            self.closers.append(object())  # what a start records before it fails
            raise OSError("no more processes")
        return start(self, *args, **kw)

    monkeypatch.setattr(conveyor.pool.Launcher, "start", fails_once)
    with DataLoader(Sleeps(), batch_size=8, num_workers=2, adaptive=True, output="numpy") as loader:
        it = iter(loader)
        first = next(it)
        assert len(calls) == 1 and not loader.stats()["workers_started"]
        rest = list(it)
        stats = loader.stats()
    assert np.array_equal(np.concatenate([first[:, 0]] + [b[:, 0] for b in rest]), np.arange(64))
    assert len(calls) == 2 and stats["workers_started"]


def _off_core_is_preemption(monkeypatch: pytest.MonkeyPatch) -> None:
    """For a dataset that only computes (never blocks): count every moment the main thread
    spends off its core as waiting for one, so the probe reads such batches as computing
    whatever the machine's schedule. A hypervisor's steal is in no clock the guest keeps per
    thread: on a shared VM a first batch of 1 ms samples read as waiting and forked the
    workers after its first sample. Set before the loader is built (a fetcher binds its clock)."""
    monkeypatch.setattr(conveyor.placement.probe, "_runqueue_wait", lambda: time.perf_counter() - time.thread_time())
    # thread CPU + time off the core = wall time
    monkeypatch.setattr(conveyor.executors.fetcher, "thread_demand", time.perf_counter)


class Computes:
    """64 samples, each burning 1 ms of CPU; notes (index, live workers) of those made here."""

    def __init__(self) -> None:
        self.seen: list[tuple[int, int]] = []

    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int) -> np.ndarray:
        import multiprocessing as mp

        _burn(0.001)
        if conveyor.get_worker_info() is None:
            self.seen.append((i, len(mp.active_children())))
        return np.full(2, i, dtype=np.int64)


@pytest.mark.timeout(60)
def test_a_computing_first_batch_starts_the_workers_for_the_second(monkeypatch: pytest.MonkeyPatch) -> None:
    # each sample burns 1 ms of CPU: the first batch (8 ms, under the 25 ms a first batch may
    # take for one-time costs) is made here as a probe. Preemption cannot make a batch burn
    # CPU, so the workers are forked as the second probe starts and make the batches after it
    # while it is made here, not after it has ended.
    _off_core_is_preemption(monkeypatch)
    ds = Computes()
    with DataLoader(ds, batch_size=8, num_workers=2, adaptive=True, output="numpy") as loader:
        got = _all(loader)
        stats = loader.stats()
    assert np.array_equal(got, np.arange(64))
    assert stats["workers_started"]
    first = [live for i, live in ds.seen if i < 8]
    second = [live for i, live in ds.seen if 8 <= i < 16]
    assert first == [0] * 8, ds.seen  # the first probe: no workers yet
    assert second and min(second) == 2, ds.seen  # the second: both workers already forked


@pytest.mark.timeout(60)
def test_the_worker_held_back_for_a_probing_batch_gets_work_as_that_batch_is_handed_out() -> None:
    # the second probing batch stands in for worker 1 (its RNG), so while it is made here
    # only worker 0 is handed a batch. Once it is made, worker 1 must get its batches before
    # next() returns, not at the next call, a training step later.
    with DataLoader(Computes(), batch_size=8, num_workers=2, adaptive=True, output="numpy") as loader:
        run = iter(loader)
        next(run)
        next(run)
        holders = {w for w, _ in run.inflight.values()}
        rest = [b[:, 0] for b in run]
        stats = loader.stats()
    assert stats["workers_started"]
    assert holders == {0, 1}, holders
    assert np.array_equal(np.concatenate(rest), np.arange(16, 64))


def test_time_a_probing_batch_spent_preempted_is_not_waiting(monkeypatch: pytest.MonkeyPatch) -> None:
    # 8 ms of wall, 2 ms of CPU: waiting, unless 6 ms of it the thread sat on a run queue
    # (a busy machine), in which case it computed the whole time it ran
    clock = {"wall": 0.0, "cpu": 0.0, "rq": 0.0}
    fake = type("FakeTime", (), {"perf_counter": staticmethod(lambda: clock["wall"]),
                                 "process_time": staticmethod(lambda: clock["cpu"])})
    monkeypatch.setattr(conveyor.placement.probe, "time", fake)
    monkeypatch.setattr(conveyor.placement.probe, "_runqueue_wait", lambda: clock["rq"])
    started: list[float] = []
    for rq, expect_start in ((0.006, False), (0.0, True)):
        started.clear()
        clock.update(wall=0.0, cpu=0.0, rq=0.0)
        check = conveyor.placement.probe.Probe._early_check(started.append, 0.0, 0.0, 0.0, first=True)
        clock.update(wall=0.008, cpu=0.002, rq=rq)
        again = check()
        if expect_start:
            assert again is None and started == [pytest.approx(0.25)]
        else:
            assert started == [] and again == pytest.approx(conveyor.placement.rules.EARLY_START_S - 0.002)
    # without schedstat (None) the wall time is all there is
    started.clear()
    check = conveyor.placement.probe.Probe._early_check(started.append, 0.0, 0.0, None, first=True)
    assert check() is None and started == [pytest.approx(0.25)]


@pytest.mark.timeout(60)
def test_a_first_batch_that_copies_memory_does_not_fork_the_workers(monkeypatch: pytest.MonkeyPatch) -> None:
    # 16 MB a batch gathered from memory burns milliseconds of CPU, copying and faulting in
    # new pages: that is no sign of work a worker would do better (it would copy once more)
    monkeypatch.setattr(conveyor.placement.rules, "INLINE_RATE", 2e8)  # "copying" whatever the machine's load

    class InMemory:
        def __init__(self) -> None:
            self.images = np.ones((96, 512, 1024), dtype=np.uint8)

        def __len__(self) -> int:
            return len(self.images)

        def __getitem__(self, i: int) -> np.ndarray:
            return self.images[i]

    ds = InMemory()
    with DataLoader(ds, batch_size=32, num_workers=2, adaptive=True, output="numpy") as loader:
        batches = list(loader)  # a loop that only iterates (summing each would be a step to hide copies behind)
        stats = loader.stats()
    sums = [int(b.sum()) for b in batches]
    assert sums == [32 * 512 * 1024] * 3
    assert not stats["workers_started"]
    assert stats["main_process_batches"] == 3


class _InMemory:
    def __init__(self, rows: int) -> None:
        self.images = np.ones((rows, 512, 1024), dtype=np.uint8)

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, i: int) -> np.ndarray:
        return self.images[i]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("workers", [2, "auto"])
def test_copies_a_training_step_would_hide_go_to_the_workers(monkeypatch: pytest.MonkeyPatch,
                                                             workers: object) -> None:
    # batches made at memory speed stay in the main process while the loop only iterates;
    # where it trains between them (5 ms steps), making them here adds each to a step,
    # and workers make them beside it (19 MB batches, 20 ms steps: 6.5-10 s against 4.2 s)
    monkeypatch.setattr(conveyor.placement.rules, "INLINE_RATE", 2e8)  # "copying" whatever the machine's load
    # and worth a trip from a worker whatever the machine's speed, had it not been copying
    monkeypatch.setattr(conveyor.placement.rules, "INLINE_MAX_S", 1e-5)
    monkeypatch.setattr(conveyor.placement.rules, "trip_s", lambda batch, output: 1e-7)
    with DataLoader(_InMemory(16 * 12), batch_size=16, num_workers=workers, adaptive=True, output="numpy") as loader:
        sums = []
        for b in loader:
            sums.append(int(b.sum()))
            time.sleep(0.005)
        stats = loader.stats()
    assert sums == [16 * 512 * 1024] * 12
    assert stats["workers_started"] and stats["main_process_batches"] < 12


def test_workers_hold_enough_batches_to_keep_their_threads_busy() -> None:
    def depth(**kw: object) -> int:
        loader = DataLoader(Tiny(), batch_size=32, num_workers=2, adaptive=True, **kw)
        pool = conveyor.pool.Pool(loader, 0)
        try:
            return pool.depth()
        finally:
            pool.close()
            loader.close()

    assert depth() == 2  # prefetch_factor's default, as torch
    assert depth(prefetch_factor=5) == 5
    # 64 threads, batches of 32: 2 running, 1 to go on with, 1 finished and waiting its turn
    assert depth(fetch_threads=64) == 4
    assert depth(fetch_threads=16, prefetch_factor=4) == 4


def test_auto_prefetch_needs_workers() -> None:
    with pytest.raises(ValueError, match="prefetch_factor"):
        DataLoader(Tiny(), num_workers=0, prefetch_factor="auto")


@pytest.mark.timeout(60)
def test_the_choice_can_be_pinned() -> None:
    with DataLoader(Waits(), batch_size=16, num_workers="auto", fetch_threads="auto", output="numpy") as loader:
        _all(loader)
        decision = loader.tuning()
    assert decision is not None
    pinned = {k: decision[k] for k in ("num_workers", "fetch_threads", "prefetch_factor")}
    if pinned["num_workers"] == 0:
        pinned["prefetch_factor"] = None
    with DataLoader(Waits(), batch_size=16, output="numpy", **pinned) as again:
        assert np.array_equal(_all(again), np.arange(16 * 24))
        assert again.stats()["fetch_threads"] == pinned["fetch_threads"]


class _Told(conveyor.placement.Tuner):
    """A real tuner (its thread steering included) whose model says what the test tells it."""

    def __init__(self) -> None:
        super().__init__(cpu=2, ram=None)
        self.wanted = 64

    @property
    def measuring(self) -> bool:
        return False

    def decision(self) -> "conveyor.placement.Decision":
        return conveyor.placement.Decision(2, self.wanted, 2, "told", False)


def test_a_thread_cut_that_costs_throughput_is_undone(monkeypatch: pytest.MonkeyPatch) -> None:
    loader = DataLoader(Tiny(), batch_size=16, num_workers="auto")
    pool = conveyor.pool.Pool(loader, 0)
    applied: list[int] = []
    monkeypatch.setattr(pool, "apply", lambda w, t, p: (applied.append(t), setattr(pool, "threads", t)))
    pool.tuner = told = _Told()
    pool.threads = 64
    clock = iter(float(x) for x in range(100))
    monkeypatch.setattr(conveyor.placement.tuner.time, "perf_counter", lambda: next(clock))
    try:
        told.wanted = 8  # the model asks for fewer threads, twice: the second time it is tried
        pool.probe.retune({"batches": 8})     # first window: no rate yet; one vote for fewer
        pool.probe.retune({"batches": 16})    # 8 batches/s; two votes: cut to 32 (at most half)
        assert applied[-1] == 32
        pool.probe.retune({"batches": 20})    # 4 batches/s after the cut: undone, and a floor set
        assert applied[-1] == 64 and told.thread_steer.floor == 64
        pool.probe.retune({"batches": 28})
        pool.probe.retune({"batches": 36})
        assert applied[-1] == 64, "no cut below the floor"
    finally:
        pool.close()
        loader.close()


@pytest.mark.timeout(60)
def test_a_settled_choice_carries_to_the_next_epoch_without_persistent_workers(probed: list[int]) -> None:
    # workers that do not persist are new every epoch; what "auto" settled on is not probed again
    with DataLoader(Tiny(), batch_size=16, num_workers="auto", output="numpy") as loader:
        first = _all(loader)
        chosen = loader.tuning()
        pool = loader._last_pool
        second = _all(loader)
        kept = loader.tuning()
        stats = loader.stats()
    assert np.array_equal(first, np.arange(512)) and np.array_equal(second, np.arange(512))
    assert probed == [0, 1]  # the first epoch's two probing batches, none after
    assert chosen is not None and chosen["num_workers"] == 0 and kept == chosen
    # no workers, pinned: one main-process pool serves both epochs, as without "auto"
    assert loader._last_pool is pool
    assert stats["main_process_batches"] == 2 * (512 // 16) and not stats["workers_started"]


@pytest.mark.timeout(60)
def test_the_next_epoch_starts_from_the_workers_chosen_before() -> None:
    # an epoch of 24 batches is too short to settle: the next one goes on from there
    with DataLoader(Waits(), batch_size=16, num_workers="auto", output="numpy") as loader:
        first = _all(loader)
        chosen = loader.tuning()
        assert chosen is not None and chosen["num_workers"] >= 1
        tuner = loader._tuner
        it = iter(loader)
        pool = it.pool  # type: ignore[attr-defined]
        start = (pool.num_workers, pool.threads, pool.prefetch, pool.mode.value)
        second = np.concatenate([b[:, 0] for b in it])
        stats = loader.stats()
    assert np.array_equal(first, np.arange(16 * 24)) and np.array_equal(second, np.arange(16 * 24))
    assert pool.tuner is tuner
    assert start == (chosen["num_workers"], chosen["fetch_threads"], chosen["prefetch_factor"], "workers")
    assert stats["workers_started"] and stats["main_process_batches"] == 0


def test_the_next_epoch_starts_from_the_threads_that_ran_not_the_wish() -> None:
    # ThreadSteer may keep more threads than the model asks (a cut it undid, or one vote
    # for fewer): the next epoch goes on with the threads that ran, which tuning() reports
    tuner = Tuner(cpu=2, warmup=4, start=Decision(1, 8, 2, "I/O-bound", False))
    tuner.observed.seen = 24  # past its warm-up: the decision is no placeholder
    tuner.threads_run = 16
    with DataLoader(Waits(), batch_size=16, num_workers="auto", output="numpy") as loader:
        loader._tuner = tuner
        it = iter(loader)
        pool = it.pool  # type: ignore[attr-defined]
        start = (pool.num_workers, pool.threads, pool.mode.value)
        del it
    assert start == (1, 16, "workers")


def test_tuning_says_why_other_threads_run_than_its_reason_argues_for() -> None:
    # tuning() reported the threads that ran (64) beside a reason arguing for the model's
    # wish ("32 threads a worker keep its core busy"), and said nothing of the difference
    tuner = Tuner(cpu=2, warmup=4)
    tuner.pin(Decision(1, 8, 2, "I/O-bound: 8 threads a worker keep its core busy", False))
    tuner.threads_run = 16
    with DataLoader(Waits(), batch_size=16, num_workers="auto", output="numpy") as loader:
        loader._tuner = tuner
        it = iter(loader)
        next(it)
        said = loader.tuning()
        del it
    assert said is not None and said["fetch_threads"] == 16, said
    assert "16 threads run, not 8" in said["reason"], said


def test_the_next_epoch_starts_from_the_workers_that_ran_not_the_wish() -> None:
    # workers are not stopped mid-run, so tuning() names those that ran though the tuner
    # came to wish fewer: the next epoch starts them all, as pinning tuning() would
    tuner = Tuner(cpu=2, warmup=4, start=Decision(1, 1, 2, "CPU-bound", False))
    tuner.observed.seen = 24
    tuner.workers_run = 2
    with DataLoader(Waits(), batch_size=16, num_workers="auto", output="numpy") as loader:
        loader._tuner = tuner
        it = iter(loader)
        pool = it.pool  # type: ignore[attr-defined]
        start = (pool.num_workers, pool.mode.value)
        batches = len(list(it))
        chosen = loader.tuning()
    assert start == (2, "workers") and batches == 24
    assert chosen is not None and chosen["num_workers"] == 2


def _position(loader: DataLoader) -> dict:
    state = loader.state_dict()
    del state["base_seed"]  # drawn afresh by every loader
    return state


def _lean_and_general(monkeypatch: pytest.MonkeyPatch, **kw: object) -> list[tuple[list[int], dict, dict, list]]:
    """The same iteration (two epochs, the second broken off after 5 batches) through the
    lean path and, with it switched off, through the general one: batches, the state
    after each, the stats and the trace's kinds and rows."""
    out = []
    for lean in (True, False):
        if not lean:
            monkeypatch.setattr(conveyor.here, "go_lean", lambda run, fetcher: None)
        with DataLoader(Tiny(), batch_size=8, output="numpy", **kw) as loader:
            got, states = [], []
            for b in loader:
                got.append(b[:, 0].tolist())
                states.append(_position(loader))
            it = iter(loader)
            for _ in range(5):
                got.append(next(it)[:, 0].tolist())
                states.append(_position(loader))
            assert it.here.lean is lean  # type: ignore[attr-defined]
            stats = loader.stats()
            trace = [(kind, worker) for kind, worker, _, _ in loader._stats.trace]
        keep = ("batches", "samples", "steps", "epochs", "main_process_batches", "num_workers")
        out.append((got, states, {k: stats[k] for k in keep} | {"made_here": stats["workers"][-1]["batches"]},
                    trace))
    return out


def test_the_lean_path_hands_out_what_the_general_one_does(monkeypatch: pytest.MonkeyPatch) -> None:
    # batches made in the main process with nothing else to do take a shorter path in
    # __next__: same batches, positions, stats and trace, with and without workers asked for
    def cheap() -> None:
        # Tiny is cheap however busy the machine: neither its costs, nor a preempted batch's
        # watch (2 ms), nor a first batch's CPU (a full collection in it) start the workers
        # in one of the two runs and not in the other
        monkeypatch.setattr(conveyor.placement.rules, "INLINE_MAX_S", 0.05)
        monkeypatch.setattr(conveyor.placement.rules, "SLOW_S", 0.5)
        monkeypatch.setattr(conveyor.placement.rules, "FIRST_SLOW_S", 0.5)

    cheap()
    for kw in ({}, {"num_workers": 2, "adaptive": True}):
        lean, general = _lean_and_general(monkeypatch, **kw)
        assert lean == general and len(lean[0]) == 64 + 5
        monkeypatch.undo()
        cheap()


@pytest.mark.timeout(60)
def test_batches_that_get_costly_leave_the_lean_path_for_the_workers() -> None:
    # the first 24 batches are cheap (made here, by the lean path); from batch 24 on each
    # burns 4 ms of CPU: the main process reads its costs in windows of 16 batches, and
    # within two windows the workers take over; every batch arrives, in order
    class Costly:
        def __len__(self) -> int:
            return 8 * 64

        def __getitem__(self, i: int) -> np.ndarray:
            if i >= 8 * 24:
                _burn(0.0005)
            return np.full(2, i, dtype=np.int64)

    with DataLoader(Costly(), batch_size=8, num_workers=2, adaptive=True, output="numpy") as loader:
        it = iter(loader)
        got = [next(it)[:, 0] for _ in range(20)]
        assert it.here.lean  # type: ignore[attr-defined]
        got += [b[:, 0] for b in it]
        stats = loader.stats()
        assert not it.here.lean  # type: ignore[attr-defined]
    assert np.array_equal(np.concatenate(got), np.arange(8 * 64))
    assert stats["workers_started"] and stats["main_process_batches"] <= 24 + 32


class CheapThenCostly:
    """The first 24 batches of 8 cost next to nothing; from batch 24 on each sample burns
    2 ms of CPU (a dataset whose first samples are cached, or sorted by size)."""

    costly_from = 8 * 24

    def __len__(self) -> int:
        return 8 * 64

    def __getitem__(self, i: int) -> np.ndarray:
        if i >= self.costly_from:
            _burn(0.002)
        return np.full(2, i, dtype=np.int64)


@pytest.fixture
def cheap_below_4ms(monkeypatch: pytest.MonkeyPatch) -> None:
    """A bar that a busy machine does not move the cheap batches past, nor the costly ones
    (16 ms of CPU) under; and no batch is slow enough to start the workers from its watch
    (a cheap probing batch preempted on a machine at load 12 on 2 cores read past 2 ms)."""
    monkeypatch.setattr(conveyor.placement.rules, "INLINE_MAX_S", 0.004)
    monkeypatch.setattr(conveyor.placement.rules, "SLOW_S", 0.5)


@pytest.mark.timeout(90)
@pytest.mark.parametrize("persistent", [True, False])
@pytest.mark.parametrize("seed", [None, 1])
@pytest.mark.usefixtures("cheap_below_4ms")
def test_auto_that_settled_on_no_workers_starts_them_when_batches_get_costly(persistent: bool,
                                                                               seed: int | None) -> None:
    # the probe pins "no workers" on the cheap first batches; the costly ones that follow are
    # timed as they are made (by the lean path without a seed, by the task path with one),
    # and the workers take over within two windows of 16, with the tuner choosing again
    with DataLoader(CheapThenCostly(), batch_size=8, num_workers="auto", seed=seed, output="numpy",
                    persistent_workers=persistent) as loader:
        it = iter(loader)
        got = [next(it)[:, 0] for _ in range(20)]
        pinned = loader.tuning()
        got += [b[:, 0] for b in it]
        stats = loader.stats()
        tuned = loader.tuning()
        between = children()  # workers that do not persist end with their epoch
        again = _all(loader)
    assert np.array_equal(np.concatenate(got), np.arange(8 * 64)) and np.array_equal(again, np.arange(8 * 64))
    assert pinned is not None and pinned["num_workers"] == 0 and pinned["reason"].startswith("fixed")
    assert stats["workers_started"] and stats["main_process_batches"] <= 24 + 32
    assert tuned is not None and not tuned["reason"].startswith("fixed") and tuned["num_workers"] >= 1
    assert bool(between) == persistent
    assert not children()


@pytest.mark.timeout(90)
@pytest.mark.usefixtures("cheap_below_4ms")
def test_workers_the_shared_main_process_pool_starts_end_with_their_epoch() -> None:
    # an epoch of cheap batches: "auto" settles on no workers and the pool serves the next
    # epochs too; samples get costly in the second: its workers start, and as workers that do
    # not persist they end with it (the shared pool is closed), the third starts its own
    ds = CheapThenCostly()
    with DataLoader(ds, batch_size=8, num_workers="auto", output="numpy") as loader:
        ds.costly_from = len(ds)
        first = _all(loader)
        shared = loader._inline
        ds.costly_from = 8 * 24
        it = iter(loader)
        second = [b[:, 0] for b in it]
        assert it.pool is shared and shared is not None  # type: ignore[attr-defined]
        between = children()
        ended = shared.dead and loader._inline is None
        third = _all(loader)
        stats = loader.stats()
    for got in (first, np.concatenate(second), third):
        assert np.array_equal(got, np.arange(8 * 64))
    assert ended and not between
    assert stats["workers_started"] and stats["num_workers"] >= 1
    assert not children()


class SlowStream:
    """An iterable dataset that waits on 'storage' for each sample, sharded by worker."""

    def __iter__(self):  # type: ignore[no-untyped-def]
        from conveyor import get_worker_info

        info = get_worker_info()
        start, step = (info.id, info.num_workers) if info is not None else (0, 1)
        for i in range(start, 96, step):
            time.sleep(0.002)
            yield np.full(2, i, dtype=np.int64)


@pytest.mark.timeout(60)
def test_an_iterable_dataset_under_auto_reports_the_one_thread_it_runs() -> None:
    # one iterator a worker: fetch threads cannot run, so "auto" neither tunes nor reports them
    with DataLoader(SlowStream(), batch_size=8, num_workers="auto", output="numpy") as loader:
        got = sorted(int(x) for b in loader for x in b[:, 0])
        tuning = loader.tuning()
        stats = loader.stats()
    assert got == list(range(96))
    assert tuning is not None and tuning["fetch_threads"] == 1, tuning
    assert stats["fetch_threads"] == 1
    # a reason that argues for threads says why they do not run (on a busy machine the
    # stream's waits for a core read as CPU, and the reason is "CPU-bound", which asks none)
    assert "iterable" in tuning["reason"] or "threads" not in tuning["reason"], tuning["reason"]


@pytest.mark.parametrize("threads", [4, "auto"])
def test_fetch_threads_on_an_iterable_dataset_is_refused(threads: object) -> None:
    with pytest.raises(ValueError, match="fetch_threads needs a map-style dataset"):
        DataLoader(SlowStream(), batch_size=8, num_workers=2, adaptive=True, fetch_threads=threads)


def test_fetch_threads_auto_needs_workers_to_tune() -> None:
    # without workers nothing would tune it: an error, as prefetch_factor='auto' gives
    with pytest.raises(ValueError, match="fetch_threads='auto'"):
        DataLoader(Waits(), batch_size=8, fetch_threads="auto")


@pytest.mark.timeout(60)
def test_tuning_reports_the_settings_the_user_fixed_as_they_are() -> None:
    # fetch_threads tuned, num_workers and prefetch_factor fixed: tuning() must not name
    # values the tuner would like for those but may not apply
    with DataLoader(Waits(), batch_size=8, num_workers=2, adaptive=True, fetch_threads="auto", prefetch_factor=3,
                    output="numpy") as loader:
        _all(loader)
        chosen = loader.tuning()
        stats = loader.stats()
    assert chosen is not None
    assert chosen["num_workers"] == 2 and chosen["prefetch_factor"] == 3
    assert chosen["fetch_threads"] >= 1 and stats["prefetch_factor"] == 3


class Burns:
    """Each sample burns 0.2 ms of CPU: 1.6 ms a batch of 8, between INLINE_MAX_S and SLOW_S."""

    def __len__(self) -> int:
        return 8 * 24

    def __getitem__(self, i: int) -> np.ndarray:
        _burn(0.0002)
        return np.full(2, i, dtype=np.int64)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("trip", [1e-6, 0.01])
def test_a_batch_is_worth_a_worker_only_above_the_trips_it_costs(monkeypatch: pytest.MonkeyPatch,
                                                                  trip: float) -> None:
    # a batch above INLINE_MAX_S still stays in the main process while it costs under TRIPS
    # trips from a worker, as timed on this machine: on a machine slow enough that a trip
    # costs 10 ms, a batch of 1.6 ms is kept here; where a trip is nearly free, workers make it
    monkeypatch.setattr(conveyor.placement.rules, "INLINE_MAX_S", 0.0005)
    monkeypatch.setattr(conveyor.placement.rules, "SLOW_S", 0.5)  # only the trips decide, however busy the machine
    timed: list[object] = []

    def trip_s(batch: object, output: str) -> float:
        timed.append(batch)
        return trip

    monkeypatch.setattr(conveyor.placement.rules, "trip_s", trip_s)
    with DataLoader(Burns(), batch_size=8, num_workers=2, adaptive=True, output="numpy") as loader:
        got = _all(loader)
        stats = loader.stats()
    assert np.array_equal(got, np.arange(8 * 24))
    assert len(timed) == 1  # timed once, on a probing batch
    assert stats["workers_started"] == (trip < 0.001)
    assert (stats["main_process_batches"] == 24) == (trip > 0.001)


class ColdStart:
    """Samples below ``slow_below`` burn ``burn`` seconds of CPU each, the rest nothing: a
    dataset whose first batches pay one-time costs its later ones do not."""

    def __init__(self, slow_below: int, burn: float) -> None:
        self.slow_below, self.burn = slow_below, burn

    def __len__(self) -> int:
        return 8 * 40

    def __getitem__(self, i: int) -> np.ndarray:
        if i < self.slow_below:
            _burn(self.burn)
        return np.full(2, i, dtype=np.int64)


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("made_here", "forks"), [(1, False), (2, True)])
def test_a_costly_first_batch_alone_does_not_fork_the_workers(made_here: int, forks: bool) -> None:
    # a first batch of 3.2 ms of CPU (past SLOW_S, under FIRST_SLOW_S) then batches of
    # microseconds: one-time costs of a first batch are no reason to fork (the workers would
    # be slower than the main process for every batch after it), so the second probe does
    # not start them; after two such batches it does. Given measurements: run for real, a
    # busy machine (load 12 on 2 cores) made the first batch 16 ms of wall, which started
    # the workers by its wall cost whatever its CPU
    with DataLoader(Tiny(), batch_size=8, num_workers=2, adaptive=True, output="numpy") as loader:
        next(iter(loader))
        pool = loader._last_pool
        assert pool is not None and not pool.launched
        pool.probe.inline_costs[:] = [0.0032] * made_here
        pool.probe.inline_rates[:] = [1e6] * made_here  # bytes a second: computing, not copying memory
        pool.probe.probe_cpu, pool.probe.copying = 0.0032, False
        started: list[float] = []
        pool.probe._start_early = lambda busy=1.0: started.append(busy)  # type: ignore[method-assign]
        _probe_on(pool, _Watched(1e-5, {"cpu": 0.0}, fires=False), Task(made_here, 0, [0, 1]))
    assert bool(started) == forks, (made_here, started)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("slow_batches", [3, 40])
def test_probing_batches_that_read_high_do_not_fork_the_workers(monkeypatch: pytest.MonkeyPatch,
                                                                  slow_batches: int) -> None:
    # three probing batches of 1.6 ms and a fourth of microseconds: the cheapest says what a
    # batch costs (the quick path times them again later); when every batch costs 1.6 ms,
    # the workers make them
    monkeypatch.setattr(conveyor.placement.rules, "INLINE_MAX_S", 0.0005)
    monkeypatch.setattr(conveyor.placement.rules, "SLOW_S", 0.5)  # only the costs decide, however busy the machine
    monkeypatch.setattr(conveyor.placement.rules, "trip_s", lambda batch, output: 1e-6)
    with DataLoader(ColdStart(8 * slow_batches, 0.0002), batch_size=8, num_workers=2, adaptive=True, output="numpy") as loader:
        got = _all(loader)
        stats = loader.stats()
    assert np.array_equal(got, np.arange(8 * 40))
    assert stats["workers_started"] == (slow_batches == 40)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("workers", [2, "auto"])
def test_the_probes_own_bookkeeping_is_not_a_batchs_cost(monkeypatch: pytest.MonkeyPatch, workers: object) -> None:
    # batches of microseconds, probed with 1 ms of bookkeeping each around them (here: the
    # run-queue reading the watch starts from): a batch kept in the main process would not
    # pay it, so it is no reason to fork, nor to time a trip
    real = conveyor.placement.probe._runqueue_wait

    def slow_census() -> float | None:
        _burn(0.001)
        return real()

    trips: list[int] = []

    def trip(batch: object, output: str) -> float:
        trips.append(1)
        return 1e-6  # 11 trips: under INLINE_MAX_S, so only the costs decide

    monkeypatch.setattr(conveyor.placement.probe, "_runqueue_wait", slow_census)
    monkeypatch.setattr(conveyor.placement.rules, "SLOW_S", 0.5)  # however busy the machine
    monkeypatch.setattr(conveyor.placement.rules, "trip_s", trip)
    monkeypatch.setattr(conveyor.placement.rules, "INLINE_MAX_S", 0.0005)
    with DataLoader(ColdStart(0, 0.0), batch_size=8, num_workers=workers, adaptive=True, output="numpy") as loader:
        got = _all(loader)
        stats = loader.stats()
    assert np.array_equal(got, np.arange(8 * 40))
    assert not stats["workers_started"]
    assert stats["main_process_batches"] == 40
    assert not trips


def test_a_trip_is_timed_for_every_kind_of_leaf() -> None:
    # the stand-in batch keeps the tree, each array's dtype and rank, and every other leaf
    torch = pytest.importorskip("torch")
    batch = {"x": torch.ones(32, 8), "y": np.zeros((32, 1, 2), np.float16), "flag": np.bool_(True),
             "label": torch.tensor(3), "names": ["a", "b"], "n": 7, "boxes": [torch.zeros(2, 4)]}
    for output in ("torch", "numpy"):
        took = conveyor.placement.rules.trip_s(batch, output)
        assert 0 < took < float("inf")
    # a batch that cannot make the trip (here: a lambda does not pickle) is not timed, and not an error
    assert conveyor.placement.rules.trip_s({"x": torch.ones(2), "f": lambda: 0}, "torch") == 0.0


@pytest.mark.parametrize("num_workers", [2, "auto"])
def test_main_process_batches_keep_a_bounded_record_of_their_rates(monkeypatch: pytest.MonkeyPatch,
                                                                   num_workers: int | str) -> None:
    # each batch made in the main process appended its bytes per second, for good: a list
    # growing by a float a batch over a run of millions. (Bars a busy machine does not move
    # these microsecond batches past: at load 14 on 2 cores "auto" started workers for them.)
    monkeypatch.setattr(conveyor.placement.rules, "INLINE_MAX_S", 0.05)
    monkeypatch.setattr(conveyor.placement.rules, "SLOW_S", 0.5)
    monkeypatch.setattr(conveyor.placement.rules, "FIRST_SLOW_S", 0.5)
    with DataLoader(np.arange(600, dtype=np.float32), batch_size=None, num_workers=num_workers, adaptive=True) as loader:
        assert sum(1 for _ in loader) == 600
        assert loader._last_pool is not None and loader._last_pool.mode.value == "inline"
        assert len(loader._last_pool.probe.inline_rates) <= 16


@pytest.mark.timeout(60)
def test_tuning_names_the_workers_that_run(monkeypatch: pytest.MonkeyPatch) -> None:
    # the tuner may settle on fewer workers than it started, and workers are not stopped
    # mid-run: tuning() named the smaller count, which pinned ran another (slower) setup
    with DataLoader(np.arange(256, dtype=np.float32), batch_size=8, num_workers="auto", output="numpy") as loader:
        it = iter(loader)
        next(it)
        pool = loader._last_pool
        assert pool is not None
        pool.apply(2, pool.threads, pool.prefetch)  # two running, whatever the probe chose
        wish = Decision(1, 1, 2, "fewer would do", True)
        monkeypatch.setattr(pool.tuner, "decision", lambda: wish)
        assert sum(len(b) for b in it) == 248
        said = loader.tuning()
        assert said["num_workers"] == loader.stats()["num_workers"] == 2
        # ... and its reason, which argues for the wish, says why two run
        assert said["reason"].startswith("fewer would do; 2 workers run, not 1"), said


@pytest.mark.timeout(60)
def test_fixed_workers_with_auto_threads_keep_cheap_batches_here_and_tune_to_valid_settings() -> None:
    # num_workers=2, fetch_threads="auto": tuning() read num_workers=0 beside prefetch_factor=2
    # while adaptive kept the cheap batches here (the constructor refuses that), and the first
    # retune started the workers anyway
    with DataLoader(list(range(4000)), batch_size=4, num_workers=2, adaptive=True, fetch_threads="auto", output="numpy") as loader:
        it = iter(loader)
        for _ in range(3):
            next(it)
        early = loader.tuning()
        for _ in range(60):
            next(it)
        later = loader.tuning()
        pool = loader._last_pool
        del it
    assert pool is not None and not pool.launched and pool.mode.value == "inline"
    for said in (early, later):
        assert said is not None and said["num_workers"] == 2, said
        pinned = {k: said[k] for k in ("num_workers", "fetch_threads", "prefetch_factor")}
        DataLoader(list(range(8)), **pinned).close()  # accepted as it is


@pytest.mark.timeout(60)
def test_fixed_workers_with_auto_threads_start_wide_for_batches_that_wait() -> None:
    # num_workers=2, fetch_threads="auto", samples that sleep: the workers started with one
    # thread each and kept it until the tuner's first say, ten batches later
    with DataLoader(Waits(), batch_size=16, num_workers=2, adaptive=True, fetch_threads="auto", output="numpy") as loader:
        it = iter(loader)
        first = np.concatenate([next(it) for _ in range(2)])
        pool = loader._last_pool
        assert pool is not None and pool.launched and pool.mode.value == "workers"
        started = (pool.num_workers, pool.threads)
        rest = np.concatenate(list(it))
        del it
    assert started[0] == 2 and started[1] > 1, started
    got = np.concatenate([first, rest])[:, 0]
    assert (got == np.arange(len(Waits()))).all()  # the same batches, in order


class KeepsFile:
    """Samples read from a file the dataset opens on first use and keeps open; each waits 4 ms."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.handle: Any = None

    def __len__(self) -> int:
        return 16 * 24

    def __getitem__(self, i: int) -> np.ndarray:
        if self.handle is None:
            self.handle = open(self.path, "rb")  # noqa: SIM115 - kept open, as h5py or lmdb keep theirs
        time.sleep(0.004)
        return np.full(2, i, dtype=np.int64)


@pytest.mark.timeout(60)
def test_a_dataset_keeping_files_open_gets_one_thread_and_workers_advised(tmp_path: Any) -> None:
    # the threads of a worker would share the handle: "auto" keeps one, and report() advised
    # fetch_threads all the same
    path = tmp_path / "data.bin"
    path.write_bytes(b"x" * 64)
    dataset = KeepsFile(str(path))
    try:
        with DataLoader(dataset, batch_size=16, num_workers="auto", output="numpy") as loader:
            for _ in loader:
                time.sleep(0.01)
            said, text = loader.tuning(), loader.report()
    finally:
        if dataset.handle is not None:
            dataset.handle.close()
    assert said is not None and said["fetch_threads"] == 1, said
    assert "fetch_threads=" not in text.replace("then use fetch_threads", ""), text


@pytest.mark.timeout(60)
def test_files_opened_after_threads_rose_bring_them_back_to_one(tmp_path: Any) -> None:
    # the census turned true after the threads were raised: retune stopped steering them and
    # left 64 running on the shared handles, and tuning() said to pin 64
    with DataLoader(Waits(), batch_size=16, num_workers="auto", output="numpy") as loader:
        it = iter(loader)
        for _ in range(4):
            next(it)
        pool = loader._last_pool
        assert pool is not None and pool.launched and pool.threads > 1, (pool.threads, pool.mode.value)
        handle = open(tmp_path / "late.bin", "wb")  # noqa: SIM115 - a file the "dataset" opened late
        try:
            got = np.concatenate([np.concatenate(list(it))])
            threads, said = pool.threads, loader.tuning()
        finally:
            handle.close()
    assert len(got) == len(Waits()) - 4 * 16
    assert threads == 1 and said is not None and said["fetch_threads"] == 1, (threads, said)


class ShortEpoch:
    """24 samples of 2 ms of CPU work each."""

    def __len__(self) -> int:
        return 24

    def __getitem__(self, i: int) -> np.ndarray:
        end = time.thread_time() + 0.002
        while time.thread_time() < end:
            pass
        return np.full(2, i)


@pytest.mark.timeout(60)
def test_epochs_of_fewer_batches_than_a_window_still_feed_the_tuner() -> None:
    # the tuner was fed every 4th batch of an epoch: epochs of 3 never fed it, and tuning()
    # said "not measured yet" after 12 epochs (with prefetch_factor=None beside 2 workers)
    with DataLoader(ShortEpoch(), batch_size=8, num_workers="auto", persistent_workers=True, output="numpy") as loader:
        for _ in range(12):
            for _ in loader:
                time.sleep(0.005)
        said = loader.tuning()
    assert said is not None and said["reason"] != "not measured yet" and not said["reason"].startswith("measuring")
    assert said["num_workers"] >= 1 and said["prefetch_factor"] is not None, said


@pytest.mark.timeout(60)
def test_the_ram_budget_is_read_before_any_worker_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    # read at the tuner's first choice, after the early start forked a worker per core: their
    # memory was missing from what was free, and then charged to the budget once more
    from helpers import children

    reads: list[int] = []

    def budget(fraction: float = 0.5) -> int:
        reads.append(len(children()))  # (multiprocessing's own helpers left out)
        return 8 << 30

    monkeypatch.setattr(conveyor.placement.machine, "ram_budget", budget)
    with DataLoader(Waits(), batch_size=16, num_workers="auto", output="numpy") as loader:
        assert sum(len(b) for b in loader) == len(Waits())
        started = loader.stats()["workers_started"]
    assert started and reads and reads[0] == 0, reads


def _epochs(loader: DataLoader, n: int) -> tuple[list[np.ndarray], list[bool]]:
    """``n`` epochs' batches, each epoch's concatenated, and whether each started workers."""
    epochs, started = [], []
    for _ in range(n):
        epochs.append(np.concatenate(list(loader)))
        started.append(loader.stats()["workers_started"])
    return epochs, started


class Pids:
    """Samples of 1.5 ms of computing: ``[index, the pid that made it]``."""

    def __init__(self, n: int = 16) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> np.ndarray:
        _burn(0.0015, time.perf_counter)
        return np.array([i, os.getpid()])


@pytest.mark.timeout(120)
@pytest.mark.parametrize("workers,persistent", [(1, False), ("auto", False), (1, True)])
def test_workers_that_cost_more_to_start_than_an_epoch_takes_are_not_started_again(
        workers: object, persistent: bool) -> None:
    # spawned workers import afresh (~1 s with torch): for an epoch the main process makes
    # in 24 ms, every epoch paid that start-up again
    me = os.getpid()
    with DataLoader(Pids(), batch_size=2, num_workers=workers, adaptive=True, multiprocessing_context="spawn",
                    persistent_workers=persistent, output="numpy") as loader:
        epochs, started = _epochs(loader, 3)
        chosen = loader.tuning()
        said = loader.report()
        makers = [set(got[:, 1].tolist()) for got in epochs]
        if persistent:  # started once, for every epoch: once they are ready, they make the batches
            assert started == [True, True, True], started
            deadline = time.monotonic() + 60
            while makers[-1] == {me} and time.monotonic() < deadline:
                makers.append(set(np.concatenate(list(loader))[:, 1].tolist()))
            assert makers[-1] != {me}, makers
    for got in epochs:
        assert np.array_equal(got[:, 0], np.arange(16))
    # the first epoch's workers were started, and timed (the main process made the batches
    # while they imported: with torch, longer than this whole epoch takes)
    assert started[0], started
    if not persistent:
        assert started[1:] == [False, False], started
        assert makers[1] == makers[2] == {me}, makers
        # report() says why, rather than advising the workers that were not started
        assert "starting the workers took longer" in said and "persistent_workers=True" in said, said
    if workers == "auto":
        assert chosen is not None and chosen["num_workers"] == 0, chosen
        assert "starting the workers took longer" in chosen["reason"], chosen


@pytest.mark.timeout(60)
def test_ranks_that_leave_no_core_start_workers_only_for_batches_that_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    # 4 DDP ranks on 2 cores, a computing dataset: "auto" started a worker a rank, which took
    # the training loop's core (1.02-1.08 s where no workers took 0.81)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", str(2 * conveyor.placement.usable_cores()))
    with monkeypatch.context() as computing:
        _off_core_is_preemption(computing)
        with DataLoader(Computes(), batch_size=8, num_workers="auto", output="numpy") as loader:
            got = _all(loader)
            chosen = loader.tuning()
            started = loader.stats()["workers_started"]
    assert np.array_equal(got, np.arange(64))
    assert not started and chosen is not None and chosen["num_workers"] == 0, chosen
    assert "training processes share this machine's" in chosen["reason"], chosen
    with DataLoader(Waits(), batch_size=16, num_workers="auto", output="numpy") as loader:
        got = _all(loader)  # waiting on storage takes no core: workers (and threads) still help
        assert loader.stats()["workers_started"]
    assert np.array_equal(got, np.arange(16 * 24))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("persistent", [False, True])
def test_the_main_process_makes_the_batches_while_spawned_workers_start(persistent: bool) -> None:
    # batches handed to a spawned worker waited for its start-up (importing afresh: ~1 s with
    # torch), the training loop standing still meanwhile; now the main process makes them
    # until the workers are ready. 4 ms batches: the first dozen cannot come from a worker
    me = os.getpid()
    with DataLoader(Pids(n=400), batch_size=2, num_workers=1, adaptive=True, multiprocessing_context="spawn",
                    persistent_workers=persistent, output="numpy") as loader:
        got = np.concatenate(list(loader))
        assert loader.stats()["workers_started"]
    assert np.array_equal(got[:, 0], np.arange(400))
    makers = got[::2, 1]
    assert (makers[:12] == me).all(), makers[:12]


@pytest.mark.timeout(120)
def test_later_epochs_give_slowly_starting_workers_a_head_start_too(monkeypatch: pytest.MonkeyPatch) -> None:
    # with a worker per core, the main process made no batch while later epochs' workers
    # started (forked ones, in ~20 ms, would only lose a core to it); spawned ones took ~1 s
    # to import, every epoch, the training loop standing still meanwhile
    monkeypatch.setattr(conveyor.placement.probe, "cpu_share", lambda: 1)
    me = os.getpid()
    with DataLoader(Pids(n=800), batch_size=2, num_workers=1, adaptive=True, multiprocessing_context="spawn",
                    output="numpy") as loader:
        # as an earlier epoch found them (timed here, a loaded machine's start-up outlasted the
        # epoch, and workers were rightly not started again): worth starting, and slow to
        found = loader._findings
        found.workers_paid, found.batch_s, found.start_s, found.stop_s = True, 0.003, 0.5, 0.02
        got = np.concatenate(list(loader))
        assert loader.stats()["workers_started"]
    assert np.array_equal(got[:, 0], np.arange(800))
    makers = got[::2, 1]
    assert (makers[:12] == me).all(), makers[:12]


def test_the_findings_weigh_a_start_up_against_the_batches() -> None:
    from conveyor.placement.rules import Findings as _Findings, start_words as _start_words

    spawned = _Findings(batch_s=0.01, start_s=1.2, stop_s=0.03)
    assert spawned.slow_start()  # 120 batches' time
    assert not _Findings(batch_s=0.001, start_s=0.05, stop_s=0.01).slow_start()  # forked: 50 ms
    assert not _Findings(batch_s=0.05, start_s=0.3).slow_start()  # 6 batches' time
    assert not _Findings(batch_s=0.01).slow_start()  # not timed yet
    assert "takes 1.23 s an epoch, more than the epoch's 100 batches" in _start_words(spawned, 0.001, 100)
    spawned.unready = True
    said = _start_words(spawned, 0.001, 100)
    assert "took longer than the epoch's 100 batches take in the main process (0.10 s)" in said, said


class SlowerInWorkers:
    """1 ms of computing a sample in the main process, 10 in a worker (a worker's cold cache,
    a machine busy elsewhere): ``[index, the pid that made it]``."""

    def __len__(self) -> int:
        return 120

    def __getitem__(self, i: int) -> np.ndarray:
        _burn(0.010 if conveyor.get_worker_info() is not None else 0.001, time.perf_counter)
        return np.array([i, os.getpid()])


@pytest.mark.timeout(120)
@pytest.mark.parametrize("workers", [2, "auto"])
def test_workers_the_loop_waited_longer_for_than_batches_made_here_take_are_not_started_again(
        workers: object) -> None:
    # an epoch's workers that do not persist were started again every epoch once a probe
    # found batches costly enough, however long the training loop then waited for them
    me = os.getpid()
    with DataLoader(SlowerInWorkers(), batch_size=4, num_workers=workers, adaptive=True, output="numpy") as loader:
        epochs, started = _epochs(loader, 3)
        chosen = loader.tuning()
        said = loader.report()
    for got in epochs:
        assert np.array_equal(got[:, 0], np.arange(120))
    assert started == [True, False, False], started
    assert set(epochs[0][:, 1].tolist()) != {me}  # the workers made batches: timed
    assert set(epochs[1][:, 1].tolist()) == set(epochs[2][:, 1].tolist()) == {me}
    assert "the training loop waited" in said and "persistent_workers=True" in said, said
    if workers == "auto":
        assert chosen is not None and chosen["num_workers"] == 0, chosen
        assert "the training loop waited" in chosen["reason"], chosen


class Costs:
    """Samples computing ``here_s`` in the main process and ``worker_s`` in a worker (a worker's
    cold cache, a machine busy elsewhere): ``[index, the pid that made it]``."""

    def __init__(self, n: int, here_s: float, worker_s: float) -> None:
        self.n, self.here_s, self.worker_s = n, here_s, worker_s

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> np.ndarray:
        _burn(self.worker_s if conveyor.get_worker_info() is not None else self.here_s, time.perf_counter)
        return np.array([i, os.getpid()])


class EveryFourthSlow:
    """Batches of 4: every fourth batch computes 40 ms, the others 1 ms (a typical batch is
    cheap, the epoch is not): ``[index, the pid that made it]``."""

    def __len__(self) -> int:
        return 96

    def __getitem__(self, i: int) -> np.ndarray:
        _burn(0.010 if (i // 4) % 4 == 0 else 0.00025, time.perf_counter)
        return np.array([i, os.getpid()])


@pytest.mark.timeout(120)
def test_an_epoch_made_here_on_an_estimate_is_timed_and_the_faster_way_kept() -> None:
    # probing timed a typical batch at 1 ms, blind to the slow ones; the workers' epoch fed
    # the loop a batch every 5 ms. The next epoch is made here on that estimate, and timed:
    # ~11 ms a batch. The one after has workers again.
    me = os.getpid()
    with DataLoader(EveryFourthSlow(), batch_size=4, num_workers=2, adaptive=True, output="numpy") as loader:
        found = loader._findings
        found.workers_paid, found.batch_s, found.start_s, found.stop_s = True, 0.001, 0.02, 0.0
        found.fed_s, found.fed_batches = 0.12, 24
        trial = np.concatenate(list(loader))
        measured = found.here_s, found.here_batches
        after = np.concatenate(list(loader))
        said = loader.report()
    assert np.array_equal(trial[:, 0], np.arange(96)) and np.array_equal(after[:, 0], np.arange(96))
    assert (trial[:, 1] == me).all()
    assert measured[1] == 24 and measured[0] is not None and measured[0] / 24 > 0.005, measured
    assert (after[:, 1] != me).any()
    assert "the training loop waited" not in said, said


@pytest.mark.timeout(120)
def test_auto_takes_workers_up_again_when_batches_made_here_grow_costly_in_a_later_epoch() -> None:
    # "auto" settled on the main process (its workers fed the loop more slowly than batches
    # made here); a later epoch's batches cost 30x more here, more than the workers took. With
    # more than one fetch thread each epoch has a pool of its own, and the pool of that epoch
    # started no workers however costly its batches grew. (Margins are wide: two threads
    # burning wall time in one process overlap their samples, and the loop then waits for the
    # GIL up to a switch interval a batch, so batches made here cost 4-10 ms, not 4.)
    me = os.getpid()
    ds = Costs(192, 0.001, 0.020)
    with DataLoader(ds, batch_size=4, num_workers="auto", fetch_threads=2, output="numpy") as loader:
        first = np.concatenate(list(loader))
        # other jobs on both cores slow the main process's short probing batches far more than
        # the workers' long ones (4 ms of work read 62-69 ms with 3 busy loops on 2 cores, the
        # workers' 80 ms batches fed the loop every 29 ms): the estimate is what it is idle
        found = loader._findings
        found.batch_s = min(found.batch_s or 0.004, 0.004)
        second = np.concatenate(list(loader))
        chosen = loader.tuning()
        ds.here_s = 0.030
        third = np.concatenate(list(loader))
    for got in (first, second, third):
        assert np.array_equal(got[:, 0], np.arange(192))
    assert chosen is not None and chosen["num_workers"] == 0 and "the training loop waited" in chosen["reason"], chosen
    assert (second[:, 1] == me).all()
    assert (third[:, 1] != me).any()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("make", [Tiny, Waits])
def test_tuning_gives_the_settings_in_a_form_that_passes_back(make: Callable[[], Any],
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    # tuning() holds ``reason`` and ``settled`` beside the settings: DataLoader(**tuning())
    # fails on them, so ``kwargs`` holds the settings alone
    monkeypatch.setattr(conveyor.placement.rules, "INLINE_MAX_S", 0.05)  # Tiny is cheap however busy the machine
    with DataLoader(make(), batch_size=16, num_workers="auto", output="numpy") as loader:
        first = _all(loader)
        chosen = loader.tuning()
    assert chosen is not None and chosen["reason"]
    kwargs = chosen["kwargs"]
    assert kwargs == {name: chosen[name] for name in ("num_workers", "fetch_threads", "prefetch_factor")}
    with DataLoader(make(), batch_size=16, output="numpy", **kwargs) as again:
        assert (again.num_workers, again.fetch_threads) == (kwargs["num_workers"], kwargs["fetch_threads"])
        assert np.array_equal(_all(again), first)
        assert again.tuning() is None  # nothing left to tune
