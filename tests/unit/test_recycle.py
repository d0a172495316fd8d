"""Recycler: large batches made in the main process reuse the memory of dropped ones."""

from __future__ import annotations

import gc
import threading

import numpy as np
import pytest
import torch

import conveyor
from conveyor.transport.recycle import PAGE, Recycler


def addr(a: np.ndarray | torch.Tensor) -> int:
    return a.data_ptr() if isinstance(a, torch.Tensor) else a.__array_interface__["data"][0]


def test_small_leaves_are_left_to_the_usual_allocator() -> None:
    r = Recycler(min_bytes=1024)
    assert r.alloc((4, 8), np.dtype(np.float32)) is None
    assert r.alloc((4, 64), np.dtype(np.float32)) is not None


def test_memory_comes_back_only_when_every_view_is_gone() -> None:
    r = Recycler(min_bytes=64)
    a = r.alloc((16, 16), np.dtype(np.float32))
    first = addr(a)
    part = a[3:5]  # a view the user keeps
    del a
    gc.collect()
    b = r.alloc((16, 16), np.dtype(np.float32))
    assert addr(b) != first, "memory still viewed must not be handed out again"
    second = addr(b)
    del part, b
    gc.collect()
    again = r.alloc((16, 16), np.dtype(np.float32))
    assert addr(again) in {first, second}, "dropped memory is handed out again"


def test_sizes_fit_within_a_quarter_and_idle_buffers_are_capped() -> None:
    r = Recycler(min_bytes=64, keep=2)
    bufs = [r.alloc((n, 64), np.dtype(np.uint8)) for n in (100, 200, 300, 400)]
    addrs = [addr(b) for b in bufs]
    while bufs:
        del bufs[0]  # dropped in order: 100, 200, 300, 400 rows; the last two are kept
    gc.collect()
    big = r.alloc((390, 64), np.dtype(np.uint8))  # fits the 400-row buffer, within 25%
    assert big.shape == (390, 64) and addr(big) == addrs[3]
    assert len(r.free) <= 2, "at most `keep` idle buffers are held"
    made = r.created
    small = r.alloc((150, 64), np.dtype(np.uint8))  # 300 rows is more than 25% too big
    assert r.created == made + 1 and len(small.base.base) == 150 * 64 + PAGE  # a page to align it
    r.clear()
    assert not r.free


def test_dropped_buffers_are_capped_before_the_next_batch_too() -> None:
    # returned buffers queued without limit until the next alloc(): a loader left alive after
    # the user dropped 300 batches of 2 MB held 617 MB of them
    r = Recycler(min_bytes=64, keep=2)
    bufs = [r.alloc((100, 64), np.dtype(np.uint8)) for _ in range(10)]
    del bufs
    gc.collect()
    assert len(r.returned) + len(r.free) <= 2


def test_buffers_start_on_a_page() -> None:
    # a bytearray's data starts 16 bytes past a page: copies into it straddle cache lines
    r = Recycler(min_bytes=64)
    first = [r.alloc((n, 64), np.dtype(np.float32)) for n in (10, 100, 1000)]
    assert all(addr(a) % PAGE == 0 for a in first)
    sizes = [a.shape for a in first]
    del first
    gc.collect()
    again = [r.alloc(shape, np.dtype(np.float32)) for shape in sizes]
    assert r.created == 3 and all(addr(a) % PAGE == 0 for a in again)


def test_threads_share_one_recycler() -> None:
    r = Recycler(min_bytes=64)
    errors: list[BaseException] = []

    def churn() -> None:
        try:
            for i in range(200):
                a = r.alloc((32, 32), np.dtype(np.float64))
                a[:] = i
                assert float(a.mean()) == i
                del a
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=churn) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors, errors


class Big(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.full((64, 1024), float(i))  # 256 KiB a sample, 2 MiB a batch of 8


@pytest.mark.timeout(60)
def test_main_process_batches_reuse_memory_and_held_ones_stay_intact() -> None:
    with conveyor.DataLoader(Big(), batch_size=8, num_workers=0) as loader:
        held = list(loader)  # every batch kept: none may be overwritten
        for k, b in enumerate(held):
            assert torch.equal(b[:, 0, 0], torch.arange(8 * k, 8 * k + 8, dtype=torch.float32)), k
        assert len({addr(b) for b in held}) == len(held)
        del held, b
        gc.collect()
        made = loader._recycler.created
        for b in loader:  # dropped batch by batch: the kept buffers serve the whole epoch
            assert torch.equal(b[:, 0, 0], b[:, -1, -1])
        assert loader._recycler.created == made, "no new memory once dropped batches came back"


class Growing(torch.utils.data.Dataset):
    """Samples of 16 bytes for the first ``small`` indices, 256 KiB after."""

    def __init__(self, small: int, n: int) -> None:
        self.small, self.n = small, n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.full((4,) if i < self.small else (64, 1024), float(i))


@pytest.mark.timeout(60)
def test_the_recycler_is_left_out_while_batches_are_small_and_back_once_they_grow() -> None:
    from conveyor.executors.fetcher import ALLOC_IDLE, ALLOC_RECHECK

    small_batches = ALLOC_IDLE + 8
    big_batches = 2 * ALLOC_RECHECK
    ds = Growing(8 * small_batches, 8 * (small_batches + big_batches))
    with conveyor.DataLoader(ds, batch_size=8, num_workers=0) as loader:
        it = iter(loader)
        for k in range(small_batches):
            assert next(it).shape == (8, 4)
        assert loader._recycler.asked == 0
        fetcher = it.pool.main.fetcher
        assert fetcher.allocator.idle >= ALLOC_IDLE, "no batch asked: the recycler is left out"
        for k in range(big_batches):
            b = next(it)
            assert torch.equal(b[:, 0, 0], torch.arange(8 * (small_batches + k), 8 * (small_batches + k + 1),
                                                        dtype=torch.float32)), k
            del b
        # the first recheck after the batches grew brought it back, and every batch since used it
        assert loader._recycler.asked >= big_batches - ALLOC_RECHECK
        assert fetcher.allocator.idle == 0
        assert loader._recycler.created < loader._recycler.asked, "buffers came back and were reused"
