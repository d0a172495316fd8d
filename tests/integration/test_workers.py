"""Workers and the zero-copy transport: batches in shared memory, never overwritten, the pool breathing."""

from __future__ import annotations

import gc
import os
import platform
import sys
from typing import Any, NamedTuple

import numpy as np
import pytest
import torch
import torch.utils.data as tud

import conveyor
from helpers import WORKERS, Images, Mixed, expected_images, same, same_epochs, shm_entries, wait_until

PROCESS = {"num_workers": 2, "worker_type": "process", **WORKERS}


def shm_ranges() -> list[tuple[int, int, str]]:
    """Address ranges of this process mapped from /dev/shm/conveyor_* files."""
    out = []
    with open("/proc/self/maps") as f:
        for line in f:
            if "/dev/shm/conveyor_" in line:
                lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
                out.append((lo, hi, line.split()[-1] if "(deleted)" not in line else line.split()[-2]))
    return out


def in_shm(t: torch.Tensor) -> bool:
    ptr = t.untyped_storage().data_ptr()
    return any(lo <= ptr < hi for lo, hi, _ in shm_ranges())


@pytest.mark.timeout(60)
def test_large_batches_are_views_of_shared_memory() -> None:
    ds = Images(128)
    with conveyor.DataLoader(ds, batch_size=64, **PROCESS) as loader:
        it = iter(loader)
        batch = next(it)
        assert batch.dtype == torch.uint8 and batch.shape == (64, 3, 64, 64)
        assert torch.equal(batch, expected_images(ds, list(range(64))))
        assert shm_entries(), "a held batch should have its /dev/shm/conveyor_* segment"
        assert in_shm(batch), "the batch's storage should be a mapping of a conveyor segment"
        rest = list(it)
        assert len(rest) == 1


def torch_collate_with_labels(samples: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """A user's collate_fn that calls torch's own default_collate (and says where it put it)."""
    images = tud.default_collate(samples)
    return images, torch.tensor([int(s[0, 0, 0]) for s in samples]), images.is_shared()


@pytest.mark.timeout(60)
def test_torch_default_collate_in_a_worker_writes_into_the_slot() -> None:
    # torch's default_collate, called by a user's collate_fn inside a worker, would put each
    # batch in a fresh torch shared-memory segment; conveyor's workers route it into the slot
    ds = Images(128)
    with conveyor.DataLoader(ds, batch_size=64, collate_fn=torch_collate_with_labels, **PROCESS) as loader:
        batches = list(loader)
    assert len(batches) == 2
    for k, (images, labels, torch_shared) in enumerate(batches):
        assert not torch_shared, "torch's default_collate made a torch shared-memory segment in the worker"
        want = list(range(64 * k, 64 * k + 64))
        assert torch.equal(images, tud.default_collate([ds[i] for i in want]))
        assert labels.tolist() == [i % 251 for i in want]
        assert in_shm(images), "torch's default_collate should have stacked into conveyor's slot"
    # the main process's table is torch's own
    from torch.utils.data._utils import collate as torch_collate
    assert torch_collate.default_collate_fn_map[torch.Tensor] is torch_collate.collate_tensor_fn


@pytest.mark.timeout(60)
def test_held_batches_are_never_overwritten() -> None:
    ds = Images(160)
    with conveyor.DataLoader(ds, batch_size=8, **PROCESS) as loader:
        held = list(loader)
        assert len(held) == 20
        for k, b in enumerate(held):
            assert torch.equal(b, expected_images(ds, list(range(8 * k, 8 * k + 8)))), f"batch {k} was overwritten"


@pytest.mark.timeout(60)
def test_pool_grows_and_shrinks() -> None:
    ds = Images(400)
    base = len(shm_entries())
    with conveyor.DataLoader(ds, batch_size=8, **PROCESS) as loader:
        it = iter(loader)
        held = [next(it) for _ in range(20)]
        while_held = len(shm_entries()) - base
        assert while_held >= 20, f"20 held batches should need at least 20 segments, saw {while_held}"
        del held
        gc.collect()
        after = None
        for k, b in enumerate(it):
            del b
            if k == 25:
                after = len(shm_entries()) - base
        assert after is not None
        assert after < while_held, f"the pool did not shrink: {while_held} segments held, {after} after release"


@pytest.mark.timeout(60)
def test_a_worker_that_fails_to_fork_is_not_left_counted(monkeypatch: pytest.MonkeyPatch) -> None:
    # grow() counted the new worker before forking it: a fork refused (EAGAIN under memory
    # pressure, where "auto" grows) left a phantom worker that the next submit asserted on
    import errno

    with conveyor.DataLoader(list(range(64)), batch_size=4, num_workers=1, worker_type="process",
                             adaptive=False, persistent_workers=True, output="numpy") as loader:
        it = iter(loader)
        first = [next(it) for _ in range(2)]
        executor = loader._last_pool.executor

        def refused(w: int) -> Any:
            raise OSError(errno.EAGAIN, "Resource temporarily unavailable")

        monkeypatch.setattr(executor, "_spawn", refused)
        with pytest.raises(OSError):
            executor.grow(2)
        monkeypatch.undo()
        assert executor.num_workers == len(executor.workers) == len(executor.ledger.held) == 1
        rest = list(it)
    assert np.array_equal(np.concatenate(first + rest), np.arange(64))


@pytest.mark.timeout(60)
def test_batches_larger_than_the_first() -> None:
    ds = Images(40, side=16, variable=True)  # sides 16, 32, ... 80: each batch outgrows the last
    with conveyor.DataLoader(ds, batch_size=8, **PROCESS) as loader:
        got = list(loader)
    assert [b.shape[-1] for b in got] == [16, 32, 48, 64, 80]
    for k, b in enumerate(got):
        assert torch.equal(b, expected_images(ds, list(range(8 * k, 8 * k + 8))))


class Record(NamedTuple):
    image: np.ndarray
    label: int
    name: str


class Nested(tud.Dataset):
    def __len__(self) -> int:
        return 24

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {
            "rec": Record(np.full((32, 32, 3), i, dtype=np.float32), i, f"n{i}"),
            "list": [np.arange(5000, dtype=np.int64) + i, f"s{i}", i * 1.5],
            "small": np.int16(i),
        }


def _nested_reference(kw: dict[str, Any], batch_size: int | None) -> list[Any]:
    return list(tud.DataLoader(Nested(), batch_size=batch_size, **kw))


@pytest.mark.timeout(60)
@pytest.mark.parametrize("batch_size", [None, 6])
def test_nested_batches_round_trip(batch_size: int | None) -> None:
    expected = _nested_reference({}, batch_size)
    with conveyor.DataLoader(Nested(), batch_size=batch_size, **PROCESS) as loader:
        same_epochs(list(loader), expected)


@pytest.mark.timeout(60)
def test_nested_custom_collate_round_trip() -> None:
    def keep(batch: list[Any]) -> list[Any]:
        return batch  # arrays, strings and ints exactly as the dataset made them

    with conveyor.DataLoader(Nested(), batch_size=4, collate_fn=keep, **PROCESS, multiprocessing_context="fork") as c:
        got = list(c)
    expected = [[Nested()[i] for i in range(k, k + 4)] for k in range(0, 24, 4)]
    same_epochs(got, expected)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("workers", [0, 2])
def test_numpy_output(workers: int) -> None:
    kw = PROCESS if workers else {}
    with conveyor.DataLoader(Mixed(), batch_size=4, output="numpy", **kw) as loader:
        got = list(loader)
    expected = list(conveyor.DataLoader(Mixed(), batch_size=4))
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        assert isinstance(g["t"], np.ndarray) and isinstance(g["a"], np.ndarray)
        assert isinstance(g["nt"].x, np.ndarray)
        np.testing.assert_array_equal(g["t"], e["t"].numpy())
        np.testing.assert_array_equal(g["a"], e["a"].numpy())
        assert list(g["s"]) == list(e["s"])
    big = list(conveyor.DataLoader(Images(16), batch_size=8, output="numpy", **(PROCESS if workers else {})))
    assert all(isinstance(b, np.ndarray) and b.dtype == np.uint8 and b.shape == (8, 3, 64, 64) for b in big)
    np.testing.assert_array_equal(big[1], expected_images(Images(16), list(range(8, 16))).numpy())


@pytest.mark.timeout(60)
@pytest.mark.parametrize("make", [lambda: Images(40, side=32), Mixed, Nested])
def test_threads_and_inline_match_processes(make: Any) -> None:
    runs = []
    for kw in (PROCESS, {"num_workers": 2, "worker_type": "thread", **WORKERS}, {"num_workers": 0}):
        with conveyor.DataLoader(make(), batch_size=5, shuffle=True, generator=torch.Generator().manual_seed(3),
                                 **kw) as loader:
            runs.append([list(loader), list(loader)])
    for other in runs[1:]:
        for e in range(2):
            same_epochs(other[e], runs[0][e])
    same(runs[0][0][0], runs[1][0][0])


def test_closing_stuck_thread_workers_waits_once_for_all(monkeypatch: pytest.MonkeyPatch) -> None:
    # close() gave each stuck thread its own 5 s (4 threads: 20 s, at exit too); one deadline
    # now covers them all. The threads here are stand-ins that never finish, on a fake clock.
    from conveyor.executors import threads as threads_mod

    now = [0.0]
    waited: list[float] = []

    class Stuck:
        ident = None

        def join(self, timeout: float | None = None) -> None:
            waited.append(timeout or 0.0)
            now[0] += timeout or 0.0

        def is_alive(self) -> bool:
            return True

    monkeypatch.setattr(threads_mod.time, "monotonic", lambda: now[0])
    def close(hung: set[int]) -> list[float]:
        waited.clear()
        ex = threads_mod.ThreadExecutor.__new__(threads_mod.ThreadExecutor)
        ex.closed, ex.pid, ex.queues, ex.threads = False, os.getpid(), [], [Stuck() for _ in range(4)]
        ex.hung, ex.fetchers = hung, {}
        ex.close(timeout=5.0)
        return list(waited)

    assert sum(close(set())) == pytest.approx(5.0)
    # a worker a timeout found stuck is not waited for: the 5 s are the others'
    got = close({0})
    assert got[0] == 0.0 and sum(got) == pytest.approx(5.0)


class Counted(tud.Dataset):
    """Counts every sample fetched, in any process (a shared counter made before the fork)."""

    def __init__(self, n: int, counter: Any) -> None:
        self.n = n
        self.counter = counter

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        with self.counter.get_lock():
            self.counter.value += 1
        return torch.tensor([i])


def _counted_loader(n: int, workers: int, prefetch: int, worker_type: str) -> tuple[conveyor.DataLoader, Any]:
    """A loader of batches of 2 over ``Counted(n)`` (``adaptive=False``), and its shared counter."""
    import multiprocessing as mp

    ctx = mp.get_context("fork")
    counter = ctx.Value("i", 0)
    loader = conveyor.DataLoader(Counted(n, counter), batch_size=2, num_workers=workers, prefetch_factor=prefetch,
                                 worker_type=worker_type, multiprocessing_context=ctx if worker_type == "process" else None,
                                 adaptive=False)
    return loader, counter


@pytest.mark.timeout(60)
@pytest.mark.parametrize("worker_type", ["process", "thread"])
def test_workers_run_at_most_prefetch_batches_ahead_of_a_slow_consumer(worker_type: str) -> None:
    # torch's bound: prefetch_factor x num_workers batches ahead of the one handed out, whether
    # still in a worker or finished and waiting. Results collected early used to free their
    # place, and the workers ran further ahead with every next(): shared memory and CPU taken
    # from the training step.
    import time

    loader, counter = _counted_loader(200, 2, 2, worker_type)
    most = 0
    with loader:
        it = iter(loader)
        for handed in range(1, 16):
            batch = next(it)
            assert batch.flatten().tolist() == [2 * handed - 2, 2 * handed - 1]
            time.sleep(0.05)  # a training step: the workers finish whatever they hold meanwhile
            with counter.get_lock():
                fetched = counter.value
            most = max(most, fetched // 2 - handed)
    assert most <= 2 * 2, f"the workers ran {most} batches ahead (prefetch_factor x num_workers = 4)"
    assert most >= 2  # they did run ahead: the bound is what held them


@pytest.mark.timeout(60)
@pytest.mark.parametrize("worker_type", ["process", "thread"])
def test_a_worker_is_given_its_next_batch_when_one_is_handed_out(worker_type: str) -> None:
    # one worker, prefetch_factor=1: the next task went out only at the next next(), so the
    # worker idled through every training step (10 ms loads, 10 ms steps: 22 ms a step against
    # torch's 13)
    import time

    loader, counter = _counted_loader(40, 1, 1, worker_type)
    with loader:
        it = iter(loader)
        for handed in range(1, 6):
            assert next(it).flatten().tolist() == [2 * handed - 2, 2 * handed - 1]
            # no next() yet: the worker makes the batch after the one handed out meanwhile ...
            assert wait_until(lambda: counter.value >= 2 * (handed + 1)), (handed, counter.value)
            time.sleep(0.05)
            assert counter.value == 2 * (handed + 1)  # ... and no more (prefetch_factor x num_workers = 1)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("worker_type", ["process", "thread"])
@pytest.mark.parametrize("on_error", ["raise", "skip"])
def test_fetch_threads_fetch_each_unbatched_sample_once(worker_type: str, on_error: str) -> None:
    # batch_size=None: the fetch threads fetched each sample ahead of its turn, then the
    # worker fetched it again itself (twice the reads, and nothing overlapped)
    import multiprocessing as mp

    ctx = mp.get_context("fork")
    counter = ctx.Value("i", 0)
    loader = conveyor.DataLoader(Counted(40, counter), batch_size=None, num_workers=2, fetch_threads=4,
                                 worker_type=worker_type, adaptive=False, on_error=on_error,
                                 multiprocessing_context=ctx if worker_type == "process" else None)
    with loader:
        got = [int(b) for b in loader]
    assert got == list(range(40))
    assert counter.value == 40


class _SlowBatches(tud.Dataset):
    """4 ms a sample: each batch of 4 is clearly worth a worker, and 24 batches an epoch
    outweigh starting them (the loop's wait for their batches, start-up included, is timed
    against a batch made here: with 8 batches a loaded machine's start-up tipped it)."""

    def __len__(self) -> int:
        return 96

    def __getitem__(self, i: int) -> torch.Tensor:
        import time

        time.sleep(0.004)
        return torch.tensor([i])


@pytest.mark.timeout(60)
def test_workers_that_paid_off_start_at_once_in_later_epochs() -> None:
    # workers that do not persist: each epoch's pool probed anew in the main process,
    # serially, before forking (3 MB samples: 1.14-1.20x torch's time over two epochs)
    with conveyor.DataLoader(_SlowBatches(), batch_size=4, num_workers=2, shuffle=True, seed=5) as loader:
        first = [b.flatten().tolist() for b in loader]
        here = loader.stats()["workers"].get(-1, {}).get("batches", 0)
        second = [b.flatten().tolist() for b in loader]
        assert loader.stats()["workers"].get(-1, {}).get("batches", 0) == here  # none made here
    with conveyor.DataLoader(_SlowBatches(), batch_size=4, num_workers=2, shuffle=True, seed=5,
                             adaptive=False) as plain:
        assert [first, second] == [[b.flatten().tolist() for b in plain] for _ in range(2)]


def _malloc_churn(cycles: int = 8, size: int = 3 << 20, chunks: int = 3) -> list[int]:
    """Page faults of each cycle that mallocs ``chunks`` blocks of ``size``, writes them and
    frees them (a batch a collate_fn allocates with torch.stack, then drops). Left to its
    dynamic thresholds glibc hands the freed blocks back to the kernel here (~1500 faults a
    cycle, every cycle); with the thresholds fixed they are reused."""
    import ctypes
    import resource

    libc = ctypes.CDLL(None)
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    first = libc.malloc(size)  # the first large block is mmap'd: freeing it raises the thresholds
    ctypes.memset(first, 1, size)
    libc.free(first)
    faults = []
    for _ in range(cycles):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        blocks = [libc.malloc(size) for _ in range(chunks)]
        for b in blocks:
            ctypes.memset(b, 1, size)
        for b in reversed(blocks):
            libc.free(b)
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    return faults


class MallocChurn(tud.Dataset):
    """Each sample: the fewest page faults of a malloc churn run in whichever process fetches it."""

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.tensor([min(_malloc_churn()[1:])])

    def __len__(self) -> int:
        return 2


glibc = pytest.mark.skipif(sys.platform != "linux" or platform.libc_ver()[0] != "glibc",
                           reason="glibc's malloc thresholds")


@glibc
@pytest.mark.timeout(60)
def test_process_workers_keep_freed_batch_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    # detection-style collates allocate each batch with malloc; a worker that hands the
    # freed batch back to the kernel faults all of the next one in again
    for var in ("MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_", "GLIBC_TUNABLES"):
        monkeypatch.delenv(var, raising=False)
    pages = 3 * (3 << 20) // os.sysconf("SC_PAGE_SIZE")
    with conveyor.DataLoader(MallocChurn(), batch_size=1, num_workers=1, adaptive=False,
                             multiprocessing_context="fork") as loader:
        faults = [int(b) for b in loader]
    assert max(faults) < pages // 10, f"{faults} page faults a cycle in a worker (of {pages} pages written)"


@glibc
def test_steady_malloc_is_off_when_the_user_tuned_malloc(monkeypatch: pytest.MonkeyPatch) -> None:
    from conveyor._platform.malloc import steady_malloc

    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "131072")
    assert steady_malloc() is False
    monkeypatch.delenv("MALLOC_TRIM_THRESHOLD_")
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.trim_threshold=131072")
    assert steady_malloc() is False
    monkeypatch.delenv("GLIBC_TUNABLES")
    assert steady_malloc(0) is False  # CONVEYOR_WORKER_HEAP_KEEP_MB=0


@glibc
@pytest.mark.timeout(60)
def test_the_main_process_keeps_glibcs_own_thresholds() -> None:
    # the thresholds are set in conveyor's worker processes only, never in the user's: a fresh
    # interpreter that runs a loader with workers still trims (the churn faults every cycle)
    import subprocess

    code = ("import conveyor, torch, test_workers as t\n"
            "with conveyor.DataLoader(t.MallocChurn(), batch_size=1, num_workers=1, adaptive=False) as l:\n"
            "    list(l)\n"
            "print(min(t._malloc_churn()[1:]))\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "GLIBC_TUNABLES"}
    env["PYTHONPATH"] = os.pathsep.join([os.path.dirname(__file__), env.get("PYTHONPATH", "")])
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=50, env=env, check=True)
    assert int(out.stdout.split()[-1]) > 1000, out.stdout


BIG_ORDERS = """
import sys
import numpy as np
import conveyor


class Rows:
    # 2**20 rows of 32 features and a 2-wide label: at batch 16384 the label leaf (128 KB)
    # travels in the result message, and an order of shuffled indices is ~80 KB
    def __len__(self):
        return 1 << 20

    def __getitem__(self, i):
        return np.full(32, i, np.float32), np.full(2, i, np.float32)

    def __getitems__(self, idx):
        return [self[i] for i in idx]


if __name__ == "__main__":
    loader = conveyor.DataLoader(Rows(), batch_size=16384, shuffle=True, num_workers=1, adaptive=False,
                                 output="numpy", timeout=60)
    for i, (x, y) in enumerate(loader):
        assert (x[:, 0] == y[:, 0]).all()
        if i == 5:
            break
    loader.close()
    print("done", i)
"""


@pytest.mark.timeout(180)
def test_orders_and_results_larger_than_a_pipe_do_not_wait_on_each_other(tmp_path: Any) -> None:
    # the main process wrote an order bigger than the room in the worker's pipe, and waited;
    # the worker, busy with a batch, then wrote a result bigger than the room in its own pipe,
    # and waited: for ever, timeout= included (the loop stopped after its first batch)
    from helpers import run_script

    out = run_script(tmp_path / "big.py", BIG_ORDERS, dict(os.environ), timeout=150)
    assert out.returncode == 0 and out.stdout.split() == ["done", "5"], out.stderr[-2000:]


@pytest.mark.timeout(60)
@pytest.mark.skipif(not os.path.exists("/proc/self/smaps_rollup"), reason="needs Linux's smaps_rollup")
def test_a_forked_workers_memory_is_what_it_adds_not_what_it_shares() -> None:
    # a forked worker's resident set counts the training process's pages it shares: with a
    # parent of 3 GB each worker read 3 GB, and "auto" capped its workers on memory
    from conveyor.executors.serve import _Rss

    held = np.ones(256 << 17)  # 256 MB, touched
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: what it adds (a little), what is resident (all that it shares)
        try:
            os.close(r)
            mine = _Rss()() or -1
            resident = int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
            os.write(w, f"{mine} {resident}".encode())
        finally:
            os._exit(0)
    os.close(w)
    try:
        mine, resident = map(int, os.read(r, 100).split())
    finally:
        os.close(r)
        os.waitpid(pid, 0)
    assert resident > held.nbytes
    assert 0 < mine < held.nbytes // 4
