"""Device stages: pinning, slot registration and the prefetcher.

The logic of ``DevicePrefetcher`` (ordering, nesting, errors, shutdown, depth,
state) runs on ``device="cpu"`` here; the CUDA tests at the bottom check what
only a GPU can show (pinned results, stream waits, memory not reused early)
and skip without one.
"""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import textwrap
import threading
import time
import warnings
from collections import namedtuple
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from conveyor import DataLoader
from conveyor.device import DevicePrefetcher, SlotPinner, pin, register_pinned, to_device, unregister_pinned

CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
SRC = str(Path(__file__).resolve().parents[2] / "src")

Pair = namedtuple("Pair", ["image", "label"])


class Box:
    """A user batch type with ``.to()`` and ``.pin_memory()``."""

    def __init__(self, t: torch.Tensor) -> None:
        self.t = t
        self.moves: list[tuple[Any, bool]] = []

    def to(self, device: Any, non_blocking: bool = False) -> Box:
        out = Box(self.t.to(device, non_blocking=non_blocking))
        out.moves = [*self.moves, (device, non_blocking)]
        return out

    def pin_memory(self) -> Box:
        return Box(self.t.pin_memory())


class PlainTo:
    """A ``.to()`` that knows nothing of non_blocking."""

    def __init__(self, v: int) -> None:
        self.v = v

    def to(self, device: Any) -> PlainTo:
        return PlainTo(self.v + 1)


def nested(i: int) -> dict[str, Any]:
    return {
        "pair": Pair(torch.full((2, 2), i), torch.tensor(i)),
        "list": [torch.arange(i, i + 3), "text", i],
        "tuple": (np.full(2, i), None),
        "box": Box(torch.tensor([i, i])),
    }


def same(a: Any, b: Any) -> None:
    assert type(a) is type(b)
    if isinstance(a, torch.Tensor):
        assert torch.equal(a, b)
    elif isinstance(a, np.ndarray):
        np.testing.assert_array_equal(a, b)
    elif isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            same(a[k], b[k])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            same(x, y)
    elif isinstance(a, Box):
        same(a.t, b.t)
    else:
        assert a == b


def device_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "conveyor-device"]


def wait_for(cond: Any, deadline: float = 30.0) -> bool:
    end = time.monotonic() + deadline
    while not cond():
        if time.monotonic() > end:
            return False
        time.sleep(0.005)
    return True


class Counting:
    """A loader that records how many batches were pulled and whether its iterator was closed."""

    def __init__(self, n: int, fail_at: int | None = None, exc: BaseException | None = None) -> None:
        self.n = n
        self.fail_at = fail_at
        self.exc = exc
        self.pulled = 0
        self.closed = 0
        self.dataset = list(range(n))
        self.sampler = "the sampler"
        self.batch_size = 4
        self.extra = "passed through"

    def __len__(self) -> int:
        return self.n

    def __iter__(self) -> Iterator[torch.Tensor]:
        try:
            for i in range(self.n):
                if i == self.fail_at:
                    assert self.exc is not None
                    raise self.exc
                self.pulled += 1
                yield torch.tensor([i])
        finally:
            self.closed += 1


@pytest.fixture(autouse=True)
def no_thread_left() -> Iterator[None]:
    yield
    gc.collect()
    assert wait_for(lambda: not device_threads(), 10.0), "a conveyor-device thread outlived its test"


# -- pin / to_device ------------------------------------------------------------


@pytest.mark.skipif(CUDA, reason="checks the behaviour without CUDA")
def test_pin_without_cuda_returns_the_batch_unchanged() -> None:
    t = torch.ones(3)
    box = Box(torch.zeros(1))
    batch = {"a": [t, (box, "s")], "n": 1}
    out = pin(batch)
    assert out is batch or (out["a"][0] is t and out["a"][1][0] is box)


@pytest.mark.skipif(CUDA, reason="checks the behaviour without CUDA")
def test_slot_pinner_without_cuda_is_a_no_op() -> None:
    pinner = SlotPinner()
    buf = bytearray(1 << 16)
    assert pinner.register(buf) is False
    assert pinner.registered_bytes == 0
    batch = [torch.ones(2)]
    assert pinner(batch)[0] is batch[0]
    pinner.unregister(buf)
    pinner.close()
    assert register_pinned(np.zeros(16, np.uint8)) is None
    unregister_pinned(None)


def test_slot_pinner_covers_only_whole_ranges() -> None:
    pinner = SlotPinner()
    pinner.spans = {1: (1000, 100), 2: (5000, 50)}
    pinner._index()
    assert pinner.covers(1000, 100)
    assert pinner.covers(1050, 50)
    assert not pinner.covers(1050, 51)
    assert not pinner.covers(999, 2)
    assert pinner.covers(5010, 40)
    assert not pinner.covers(2000, 1)
    assert not pinner.covers(10, 1)


class Fence:
    """A stand-in for a CUDA event: passed once ``done`` is set."""

    def __init__(self) -> None:
        self.done = False

    def query(self) -> bool:
        return self.done


class FencingPinner:
    def __init__(self, fences: bool) -> None:
        self.made: list[Fence] = []
        self.fences = fences

    def register(self, segment: Any) -> bool:
        return True

    def unregister(self, segment: Any, *, sync: bool = False) -> None:
        pass

    def fence(self) -> Fence | None:
        if not self.fences:
            return None
        self.made.append(Fence())
        return self.made[-1]

    def __call__(self, batch: Any) -> Any:  # pinning each batch: nothing to do here
        return batch


@pytest.mark.parametrize("fences", [True, False])
def test_a_freed_slot_goes_back_only_once_its_fence_has_passed(fences: bool) -> None:
    from conveyor.transport import Views
    from conveyor.transport.segment import Segment, new_prefix

    segs = [Segment.create(new_prefix() + f"fence{i}", 1 << 16) for i in range(2)]
    pinner = FencingPinner(fences)
    views = Views(pinner)
    try:
        first = views.root((0, 0, 0), segs[0].name)
        assert views.take_freed() == []
        del first
        gc.collect()
        if not fences:  # no registered slot, no CUDA: back at once
            assert views.take_freed() == [(0, 0, 0)]
            return
        assert views.take_freed() == []  # a copy queued before this point may still read it
        second = views.root((0, 0, 1), segs[1].name)
        del second
        gc.collect()
        assert views.take_freed() == []
        assert len(pinner.made) == 2
        pinner.made[1].done = True
        assert views.take_freed() == []  # oldest first: the first fence holds the second
        pinner.made[0].done = True
        assert views.take_freed() == [(0, 0, 0), (0, 0, 1)]
        assert views.take_freed() == []
    finally:
        views.close()
        for seg in segs:
            seg.unlink()
            seg.close()


def test_to_device_keeps_structure_and_moves_every_kind_of_leaf() -> None:
    batch = nested(3)
    batch["plain"] = PlainTo(1)
    out = to_device(batch, torch.device("cpu"), non_blocking=True)
    assert type(out["pair"]) is Pair
    assert out["list"][1:] == ["text", 3]
    assert out["tuple"][0] is batch["tuple"][0]  # numpy stays numpy
    assert out["box"].moves == [(torch.device("cpu"), True)]
    assert out["plain"].v == 2
    assert to_device(batch, None) is batch


# -- the prefetcher on CPU --------------------------------------------------------


def test_prefetcher_yields_the_loaders_batches_nested() -> None:
    loader = [nested(i) for i in range(7)]
    with DevicePrefetcher(loader, "cpu") as pf:
        got = list(pf)
    assert len(got) == 7
    for a, b in zip(got, loader):
        same(a, b)
    assert got[0]["box"].moves == [(torch.device("cpu"), False)]  # off CUDA copies are blocking


def test_prefetcher_runs_one_epoch_per_iter() -> None:
    loader = DataLoader(list(range(10)), batch_size=3)
    pf = DevicePrefetcher(loader, "cpu")
    first = [b.tolist() for b in pf]
    second = [b.tolist() for b in pf]
    assert first == second == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9]]
    it = iter(pf)
    assert iter(it) is it
    next(it)
    again = iter(pf)  # a new epoch closes the running one
    with pytest.raises(StopIteration):
        next(it)
    assert [b.tolist() for b in again][0] == [0, 1, 2]
    pf.close()


class Boom(Exception):
    def __init__(self, code: int) -> None:
        super().__init__(f"boom {code}")
        self.code = code


def test_loader_exception_is_reraised_with_its_type() -> None:
    loader = Counting(10, fail_at=3, exc=Boom(7))
    pf = DevicePrefetcher(loader, "cpu")
    it = iter(pf)
    got = [next(it).item() for _ in range(3)]
    with pytest.raises(Boom) as info:
        next(it)
    assert got == [0, 1, 2]
    assert info.value.code == 7
    assert any("loading thread" in n for n in getattr(info.value, "__notes__", []))
    assert any(f.name == "__iter__" for f in __import__("traceback").extract_tb(info.value.__traceback__))
    with pytest.raises(StopIteration):
        next(it)
    assert wait_for(lambda: loader.closed == 1)


def test_conveyor_worker_error_keeps_its_type() -> None:
    class Bad:
        def __len__(self) -> int:
            return 8

        def __getitem__(self, i: int) -> int:
            if i == 5:
                raise KeyError(i)
            return i

    with DevicePrefetcher(DataLoader(Bad(), batch_size=2, num_workers=1, worker_type="thread"), "cpu") as pf:
        with pytest.raises(KeyError):
            list(pf)


def test_attributes_pass_through() -> None:
    loader = Counting(5)
    pf = DevicePrefetcher(loader, "cpu", track_state=False)
    assert len(pf) == 5
    assert pf.sampler == "the sampler"
    assert pf.dataset is loader.dataset
    assert pf.batch_size == 4
    assert pf.extra == "passed through"
    with pytest.raises(AttributeError):
        pf.missing  # noqa: B018
    it = iter(pf)
    assert len(it) == 5
    it.close()

    dl = DataLoader(list(range(10)), batch_size=4)
    pf2 = DevicePrefetcher(dl, "cpu")
    assert pf2.sampler is dl.sampler and pf2.dataset is dl.dataset and pf2.batch_size == 4 and len(pf2) == 3
    assert pf2.state_dict() == dl.state_dict()


def test_close_mid_epoch_ends_the_thread_and_closes_the_iterator() -> None:
    loader = Counting(1000)
    pf = DevicePrefetcher(loader, "cpu")
    it = iter(pf)
    next(it)
    assert device_threads()
    pf.close()
    assert not device_threads()
    assert loader.closed == 1
    with pytest.raises(StopIteration):
        next(it)
    pf.close()  # idempotent
    with pytest.raises(RuntimeError, match="closed"):
        iter(pf)


def test_context_manager_mid_epoch_ends_the_thread() -> None:
    loader = Counting(1000)
    with DevicePrefetcher(loader, "cpu") as pf:
        for i, _ in enumerate(pf):
            if i == 2:
                break
    assert not device_threads()
    assert loader.closed == 1


def test_garbage_collection_ends_the_thread() -> None:
    loader = Counting(1000)
    pf = DevicePrefetcher(loader, "cpu")
    it = iter(pf)
    next(it)
    assert device_threads()
    del it, pf
    gc.collect()
    assert wait_for(lambda: not device_threads(), 10.0)
    assert loader.closed == 1


@pytest.mark.timeout(60)
def test_conveyor_loader_with_processes_closes_cleanly_mid_epoch() -> None:
    dl = DataLoader(list(range(200)), batch_size=2, num_workers=2)
    pf = DevicePrefetcher(dl, "cpu")
    it = iter(pf)
    assert next(it).tolist() == [0, 1]
    pf.close()
    assert not device_threads()
    pool = dl._last_pool  # the epoch's workers: closing the prefetcher closed its iterator and them
    assert pool is not None and pool.dead
    dl.close()


@pytest.mark.parametrize("depth", [1, 2, 4])
def test_depth_bounds_how_far_the_thread_runs_ahead(depth: int) -> None:
    loader = Counting(30)
    pf = DevicePrefetcher(loader, "cpu", depth=depth)
    it = iter(pf)
    consumed = 0
    reached = []
    for _ in range(20):
        # let the thread run as far ahead as it may: it stops at consumed + depth + 1
        wait_for(lambda: loader.pulled >= consumed + depth + 1, 10.0)
        time.sleep(0.01)
        assert loader.pulled <= consumed + depth + 1
        reached.append(loader.pulled - consumed)
        next(it)
        consumed += 1
    assert max(reached) == depth + 1  # it does prefetch, up to the bound
    pf.close()
    with pytest.raises(ValueError):
        DevicePrefetcher(loader, "cpu", depth=0)


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.timeout(60)
def test_state_dict_reflects_what_the_consumer_received(workers: int) -> None:
    data = list(range(40))
    kw: dict[str, Any] = {"batch_size": 3, "shuffle": True, "seed": 5, "num_workers": workers}
    full = [b.tolist() for b in DataLoader(data, **kw)]
    dl = DataLoader(data, **kw)
    pf = DevicePrefetcher(dl, "cpu", depth=3)
    assert pf.state_dict()["batches"] == 0
    it = iter(pf)
    got = [next(it).tolist() for _ in range(4)]
    assert got == full[:4]
    wait_for(lambda: dl.state_dict()["batches"] >= 8, 10.0)  # the thread is ahead of the consumer
    state = pf.state_dict()
    assert state["batches"] == 4 and state["epoch"] == 0
    pf.close()
    assert pf.state_dict()["batches"] == 4  # closing keeps the consumer's position
    dl.close()

    dl2 = DataLoader(data, **kw)
    pf2 = DevicePrefetcher(dl2, "cpu")
    pf2.load_state_dict(state)
    rest = [b.tolist() for b in pf2]
    assert got + rest == full
    after = pf2.state_dict()
    assert after["epoch"] == 1 and after["batches"] == 0
    dl2.close()


def test_state_dict_near_the_end_of_an_epoch() -> None:
    dl = DataLoader(list(range(10)), batch_size=2)
    pf = DevicePrefetcher(dl, "cpu", depth=4)
    it = iter(pf)
    next(it)
    wait_for(lambda: dl._last_run is not None and dl._last_run.yielded == 5, 10.0)
    time.sleep(0.01)
    assert pf.state_dict()["batches"] == 1 and pf.state_dict()["epoch"] == 0
    list(it)
    assert pf.state_dict()["epoch"] == 1


def test_state_dict_without_tracking_passes_the_live_state() -> None:
    dl = DataLoader(list(range(30)), batch_size=2)
    pf = DevicePrefetcher(dl, "cpu", depth=2, track_state=False)
    it = iter(pf)
    next(it)
    wait_for(lambda: dl.state_dict()["batches"] == 4, 10.0)
    assert pf.state_dict() == dl.state_dict()
    it.close()
    with pytest.raises(ValueError):
        DevicePrefetcher([1], "cpu", track_state=True)
    with pytest.raises(TypeError):
        DevicePrefetcher([1], "cpu").state_dict()


def test_reset_ends_the_epoch_and_hands_state_back_to_the_loader() -> None:
    dl = DataLoader(list(range(30)), batch_size=2)
    pf = DevicePrefetcher(dl, "cpu")
    it = iter(pf)
    next(it)
    assert pf.state_dict()["batches"] == 1
    pf.reset()
    assert not device_threads()
    assert pf.state_dict() == dl.state_dict()
    assert [b.tolist() for b in pf][0] == [0, 1]  # still usable, unlike after close()


def test_wrap_prefetches_an_existing_iterator() -> None:
    pf = DevicePrefetcher([], "cpu")
    assert list(pf.wrap(iter([torch.tensor(1), torch.tensor(2)]))) == [torch.tensor(1), torch.tensor(2)]


@pytest.mark.skipif(CUDA, reason="checks the behaviour without CUDA")
def test_cuda_device_without_cuda_is_refused() -> None:
    with pytest.raises(RuntimeError, match="CUDA is not available"):
        DevicePrefetcher([1], "cuda")


@pytest.mark.skipif(CUDA, reason="checks the behaviour without CUDA")
def test_loader_to_a_cuda_device_without_cuda_is_refused_without_a_pin_memory_warning() -> None:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the user did not ask for pin_memory: no word of it
        with pytest.raises(RuntimeError, match="CUDA is not available"):
            DataLoader(list(range(8)), batch_size=2, device="cuda")
        assert DataLoader(list(range(8)), batch_size=2, device="cpu")._slot_pinner is None
    with pytest.warns(UserWarning, match="pin_memory"):
        DataLoader(list(range(8)), batch_size=2, device="cpu", pin_memory=True)


@pytest.mark.timeout(60)
def test_imports_and_works_without_torch() -> None:
    code = textwrap.dedent("""
        import importlib.abc, sys
        class Block(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path, target=None):
                if name == "torch" or name.startswith("torch."):
                    raise ModuleNotFoundError(name)
        sys.meta_path.insert(0, Block())
        import conveyor._torch
        conveyor._torch._available = False
        from conveyor.device import DevicePrefetcher, SlotPinner, pin
        assert pin({"a": [1]}) == {"a": [1]}
        assert SlotPinner().register(bytearray(8)) is False
        assert list(DevicePrefetcher([1, 2, 3], "cpu")) == [1, 2, 3]
        assert list(DevicePrefetcher([1, 2], None)) == [1, 2]
        assert "torch" not in sys.modules
        print("ok")
    """)
    out = subprocess.run([sys.executable, "-c", code], env={"PYTHONPATH": SRC}, capture_output=True, text=True,
                         timeout=50)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


# -- CUDA -------------------------------------------------------------------------


@needs_cuda
def test_pin_gives_pinned_tensors_and_keeps_pinned_ones() -> None:
    already = torch.ones(4).pin_memory()
    batch = {"x": Pair(torch.ones(3), already), "box": Box(torch.zeros(2)), "s": "a"}
    out = pin(batch)
    assert out["x"].image.is_pinned() and torch.equal(out["x"].image, batch["x"].image)
    assert out["x"].label is already
    assert out["box"].t.is_pinned()
    assert out["s"] == "a"


@needs_cuda
def test_slot_pinner_registers_a_segment_so_views_need_no_copy() -> None:
    from conveyor.transport.segment import Segment, new_prefix

    seg = Segment.create(new_prefix() + "pin", 1 << 20)
    pinner = SlotPinner()
    try:
        assert pinner.register(seg)
        root = np.frombuffer(seg.buf, dtype=np.uint8)
        view = torch.from_numpy(root[4096: 4096 + 1024].view(np.float32))
        view.fill_(2.0)
        assert view.is_pinned()
        loose = torch.ones(8)
        out = pinner({"v": view, "loose": loose})
        assert out["v"] is view  # inside the registered slot: no copy
        assert out["loose"] is not loose and out["loose"].is_pinned()
        gpu = view.to("cuda", non_blocking=True)
        torch.cuda.synchronize()
        assert torch.equal(gpu.cpu(), view)
        del view, gpu, root, out
        pinner.unregister(seg)
        assert pinner.registered_bytes == 0
    finally:
        pinner.close()
        seg.unlink()
        seg.close()


@needs_cuda
def test_cuda_prefetcher_moves_nested_batches() -> None:
    loader = [nested(i) for i in range(5)]
    with DevicePrefetcher(loader, "cuda") as pf:
        got = list(pf)
    for a, b in zip(got, loader):
        assert a["pair"].image.is_cuda and a["list"][0].is_cuda and a["box"].t.is_cuda
        assert isinstance(a["tuple"][0], np.ndarray)
        same(to_device(a, "cpu"), b)


class SlowCopy:
    """A batch whose ``.to()`` first keeps the copying stream busy: a late copy shows."""

    def __init__(self, t: torch.Tensor) -> None:
        self.t = t

    def to(self, device: Any, non_blocking: bool = False) -> SlowCopy:
        torch.cuda._sleep(50_000_000)  # on the side stream, before the copy
        return SlowCopy(self.t.to(device, non_blocking=non_blocking))


@needs_cuda
def test_consumer_stream_waits_for_the_copy() -> None:
    n = 1 << 22
    loader = [SlowCopy(torch.full((n,), float(i)).pin_memory()) for i in range(1, 5)]
    with DevicePrefetcher(loader, "cuda", depth=2) as pf:
        sums = [b.t.sum() for b in pf]  # enqueued on the current stream right away
    torch.cuda.synchronize()
    assert [s.item() for s in sums] == [float(i * n) for i in range(1, 5)]


@needs_cuda
def test_batch_memory_is_not_reused_while_the_consumer_stream_uses_it() -> None:
    n = 1 << 22
    loader = [torch.full((n,), float(i)).pin_memory() for i in range(1, 9)]
    outs = []
    with DevicePrefetcher(loader, "cuda", depth=2) as pf:
        for b in pf:
            torch.cuda._sleep(20_000_000)  # the consumer stream is busy ...
            outs.append(b * 1)  # ... so this reads b well after the next copies start
            del b  # without record_stream the next batch could land in b's memory first
    torch.cuda.synchronize()
    assert [o[0].item() for o in outs] == [float(i) for i in range(1, 9)]
    assert all(bool((o == o[0]).all()) for o in outs)


@needs_cuda
def test_cuda_prefetcher_pins_pageable_batches_and_shuts_down() -> None:
    loader = Counting(1000)
    pf = DevicePrefetcher(loader, "cuda")
    it = iter(pf)
    first = next(it)
    assert first.is_cuda and first.item() == 0
    del it, pf
    gc.collect()
    assert wait_for(lambda: not device_threads(), 10.0)
    assert loader.closed == 1


@needs_cuda
def test_cuda_prefetcher_reraises_and_keeps_state() -> None:
    loader = Counting(10, fail_at=2, exc=Boom(1))
    with DevicePrefetcher(loader, "cuda") as pf:
        with pytest.raises(Boom):
            list(pf)
    dl = DataLoader(list(range(20)), batch_size=2, pin_memory=True)
    with DevicePrefetcher(dl, "cuda") as pf:
        it = iter(pf)
        next(it), next(it)
        assert pf.state_dict()["batches"] == 2


@pytest.mark.timeout(120)
def test_slots_held_by_fences_cost_new_slots_not_batches() -> None:
    # the loader with its pinner stood in by one whose fences pass only when the test says:
    # while the "device" lags, the worker gets no slot back and makes new ones; every batch
    # arrives whole and in order, and once the fences pass the slots are reused again
    pinner = FencingPinner(True)
    loader = DataLoader(Filled(96), batch_size=4, num_workers=1, adaptive=False, prefetch_factor=2)
    loader._slot_pinner = pinner  # read when the epoch's workers start
    got, slots = [], []
    for i, batch in enumerate(loader):
        got.append(first_values(batch))
        del batch
        slots.append(len(loader._last_pool.executor.views.segments))
        if i >= 9:  # the device catches up, and then keeps up
            for fence in pinner.made:
                fence.done = True
    assert got == [[float(4 * b + j) for j in range(4)] for b in range(24)]
    assert slots[9] >= 10  # none of the first ten batches' slots came back while fenced
    assert max(slots[12:]) <= slots[12]  # reused again: no new slot after the fences passed
    loader.close()


class Filled:
    """Sample i: ``width`` float32 values, all equal to i (a batch of 4 is 1 MiB: it travels in a slot)."""

    def __init__(self, n: int, width: int = 1 << 16) -> None:
        self.n = n
        self.width = width

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> np.ndarray:
        return np.full(self.width, i, dtype=np.float32)


def first_values(batch: torch.Tensor) -> list[float]:
    assert bool((batch == batch[:, :1]).all()), "a sample mixes values of two batches"
    return batch[:, 0].tolist()


@needs_cuda
@pytest.mark.timeout(120)
def test_worker_batches_arrive_pinned_in_registered_slots() -> None:
    ds = Filled(48)
    # adaptive=False: batches this cheap would otherwise be made in the main process
    loader = DataLoader(ds, batch_size=4, num_workers=2, pin_memory=True, persistent_workers=True, adaptive=False)
    pinner = loader._slot_pinner
    for _ in range(2):
        got = []
        for batch in loader:
            assert batch.is_pinned()
            storage = batch.untyped_storage()
            assert pinner.covers(storage.data_ptr(), storage.nbytes()), "pinned by a copy, not in its slot"
            got.append(first_values(batch))
        assert got == [[float(4 * b + j) for j in range(4)] for b in range(12)]
    assert pinner.registered_bytes > 0
    loader.close()
    assert pinner.registered_bytes == 0


@needs_cuda
@pytest.mark.timeout(120)
def test_a_slot_is_not_rewritten_while_a_queued_copy_still_reads_it() -> None:
    # the GPU runs far behind: each copy waits behind a sleep kernel while the loop drops
    # the host batch and asks for the next, and the worker refills whatever slot it gets back
    loader = DataLoader(Filled(64), batch_size=4, num_workers=1, pin_memory=True, prefetch_factor=2, adaptive=False)
    outs = []
    for batch in loader:
        torch.cuda._sleep(20_000_000)
        outs.append(batch.to("cuda", non_blocking=True))
        del batch
    torch.cuda.synchronize()
    assert [first_values(o.cpu()) for o in outs] == [[float(4 * b + j) for j in range(4)] for b in range(16)]
    loader.close()


@needs_cuda
@pytest.mark.timeout(120)
@pytest.mark.parametrize("pin_memory", [True, False])
def test_loader_with_cuda_device_and_workers_matches_the_host_batches(pin_memory: bool) -> None:
    args: dict[str, Any] = {"batch_size": 4, "num_workers": 2, "shuffle": True, "persistent_workers": True,
                            "adaptive": False}
    loader = DataLoader(Filled(40), pin_memory=pin_memory, device="cuda",
                        generator=torch.Generator().manual_seed(3), **args)
    # the same loader without the device stage (persistent workers draw epochs as torch's do, so
    # a loader without workers is no reference after the first)
    host = DataLoader(Filled(40), generator=torch.Generator().manual_seed(3), **args)
    for _ in range(2):
        got = []
        for batch in loader:
            assert batch.is_cuda
            torch.cuda._sleep(5_000_000)  # the consumer stream lags behind the side stream's copies
            got.append(first_values((batch * 1).cpu()))
        assert got == [first_values(b) for b in host]
        # copied from the slots themselves, pinned once: pin_memory or not
        assert loader._slot_pinner.registered_bytes > 0
    loader.close()
    host.close()
    assert loader._slot_pinner.registered_bytes == 0


_FORKING_THREADS: list[list[str]] = []  # the threads that forked, while a test listens


def _note_forking_thread() -> None:
    for heard in _FORKING_THREADS:
        heard.append(threading.current_thread().name)


os.register_at_fork(before=_note_forking_thread)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("persistent", [False, True])
def test_with_a_device_stage_workers_fork_from_the_callers_thread(persistent: bool) -> None:
    # as torch's loader forks its workers in iter(): not from the device thread while the
    # caller's thread trains (a fork from a thread leaves the other threads' locks behind)
    heard: list[str] = []
    _FORKING_THREADS.append(heard)
    try:
        loader = DataLoader(Filled(32, width=4), batch_size=4, num_workers=2, adaptive=False, device="cpu",
                            persistent_workers=persistent)
        assert [len(list(loader)) for _ in range(2)] == [8, 8]
        loader.close()
    finally:
        _FORKING_THREADS.remove(heard)
    assert heard and set(heard) == {threading.main_thread().name}, heard


def test_two_live_iterators_with_device_stay_independent() -> None:
    # without persistent workers two iterators of one loader are independent, as torch's
    loader = DataLoader(list(range(20)), batch_size=4, device="cpu")
    pairs = list(zip(loader, loader))
    assert [(a.tolist(), b.tolist()) for a, b in pairs] == [([4 * i + j for j in range(4)],) * 2 for i in range(5)]
    loader.close()


def test_load_state_dict_with_device_refuses_a_running_iterator_and_keeps_it() -> None:
    loader = DataLoader(list(range(20)), batch_size=2, device="cpu")
    it = iter(loader)
    head = [next(it).tolist() for _ in range(2)]
    with pytest.raises(ValueError):
        loader.load_state_dict({"version": 99})
    with pytest.raises(RuntimeError, match="running"):
        loader.load_state_dict(loader.state_dict())
    assert head + [b.tolist() for b in it] == [[2 * i, 2 * i + 1] for i in range(10)]
    loader.close()


@pytest.mark.timeout(60)
def test_prefetcher_leaves_torchs_persistent_workers_alone() -> None:
    # the end of an epoch is the loader's own: shutting a torch iterator's persistent
    # workers down broke every epoch after the first
    tl = torch.utils.data.DataLoader(list(range(12)), batch_size=4, num_workers=2, persistent_workers=True)
    pf = DevicePrefetcher(tl, "cpu")
    epochs = [[b.tolist() for b in pf] for _ in range(3)]
    assert epochs == [[[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]] * 3
    assert [b.tolist() for b in tl][0] == [0, 1, 2, 3]
    pf.close()


def test_pin_memory_device_is_deprecated_as_in_torch() -> None:
    # it was taken and ignored silently, where torch warns that the current accelerator is used
    with pytest.warns(UserWarning, match="pin_memory_device is deprecated"):
        iter(torch.utils.data.DataLoader(list(range(4)), batch_size=2, pin_memory=True,
                                         pin_memory_device="cuda:0"))
    with pytest.warns(UserWarning, match="pin_memory_device is deprecated"):
        DataLoader(list(range(4)), batch_size=2, pin_memory=True, pin_memory_device="cuda:0")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no pinning asked: nothing said
        DataLoader(list(range(4)), batch_size=2, pin_memory_device="cuda:0")
