"""FetchPool: the fetch threads inside a worker (fetch_threads=N)."""

from __future__ import annotations

import threading
import time

import pytest

from conveyor.executors.fetchpool import FetchPool


def _threads() -> set[str]:
    return {t.name for t in threading.enumerate() if t.name.startswith("conveyor-fetch")}


@pytest.mark.timeout(30)
def test_results_come_back_in_item_order_while_running_at_once() -> None:
    pool = FetchPool(8)
    together = threading.Barrier(8, timeout=10)  # broken unless all eight run at once
    try:
        def slow(i: int, epoch: int) -> tuple[int, int]:
            together.wait()
            time.sleep(0.01 * (8 - i))  # later items finish first
            return i, epoch

        assert pool.submit(slow, list(range(8)), 3).results() == [(i, 3) for i in range(8)]
    finally:
        pool.close()


@pytest.mark.timeout(30)
def test_the_first_failure_in_item_order_is_raised_as_it_was() -> None:
    pool = FetchPool(4)

    def fetch(i: int, epoch: int) -> int:
        if i == 2:
            time.sleep(0.05)
            raise KeyError(f"sample {i}")
        if i == 3:
            raise ValueError("later item, earlier failure")
        return i

    try:
        batch = pool.submit(fetch, [0, 1, 2, 3], 0)
        with pytest.raises(KeyError, match="sample 2") as info:
            batch.results()
        assert any(f.name == "fetch" for f in info.traceback), "the sample's own frame is in the traceback"
    finally:
        pool.close()


@pytest.mark.timeout(30)
def test_wait_times_out_then_completes_and_batches_queue_in_order() -> None:
    pool = FetchPool(2)
    gate = threading.Event()
    order: list[int] = []

    def fetch(i: int, epoch: int) -> int:
        order.append(i)  # the order items start in
        gate.wait(10)
        return i

    try:
        first = pool.submit(fetch, [0, 1], 0)
        second = pool.submit(fetch, [2, 3], 0)
        assert not first.wait(0.05)  # still gated
        gate.set()
        assert first.results() == [0, 1] and second.results() == [2, 3]
        assert sorted(order[:2]) == [0, 1], "a later batch's items never start before an earlier one's"
        assert sorted(order[2:]) == [2, 3]
        assert pool.map(lambda x: x * 2, [5, 6]) == [10, 12]
        assert pool.submit(fetch, [], 0).results() == []
    finally:
        pool.close()


@pytest.mark.timeout(30)
def test_close_stops_every_thread_and_cancel_drops_queued_items() -> None:
    before = _threads()
    pool = FetchPool(3)
    assert len(_threads() - before) == 3
    ran: list[int] = []
    gate = threading.Event()

    def fetch(i: int, epoch: int) -> int:
        gate.wait(10)
        ran.append(i)
        return i

    batch = pool.submit(fetch, list(range(30)), 0)
    time.sleep(0.05)  # three items are running, the rest queued
    closer = threading.Thread(target=pool.close, kwargs={"wait": True, "cancel": True})
    closer.start()
    time.sleep(0.05)
    gate.set()
    closer.join(10)
    assert not closer.is_alive()
    assert _threads() == before, "every fetch thread has exited"
    assert len(ran) <= 6, f"queued items should be dropped, {len(ran)} ran"
    with pytest.raises(RuntimeError, match="closed"):
        batch.results()


@pytest.mark.timeout(60)
def test_close_gives_up_on_a_fetch_that_never_returns() -> None:
    # a read of storage that hangs held close() for ever (a Ctrl-C in the main process's
    # fetches too): the join has a deadline, and the thread still inside it is named
    pool = FetchPool(2)
    gate, inside = threading.Event(), threading.Event()

    def fetch(i: int, epoch: int) -> int:
        if i == 0:
            inside.set()
            gate.wait(50)
        return i

    pool.submit(fetch, [0, 1, 2], 0)
    assert inside.wait(10)
    stuck = pool.close(wait=True, cancel=True, timeout=0.2)
    try:
        assert len(stuck) == 1 and stuck[0].is_alive()
    finally:
        gate.set()
    stuck[0].join(10)
    assert not stuck[0].is_alive()


def test_a_pool_nobody_holds_ends_its_threads() -> None:
    import gc

    pool = FetchPool(3, name="conveyor-test-orphan")
    assert pool.map(lambda x: x + 1, [1, 2]) == [2, 3]
    del pool
    gc.collect()
    deadline = time.monotonic() + 5
    while any(t.name.startswith("conveyor-test-orphan") for t in threading.enumerate()) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not any(t.name.startswith("conveyor-test-orphan") for t in threading.enumerate())
