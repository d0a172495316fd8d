"""Spawned and forkserver workers map a dataset's numpy buffers; they are not pickled to them.

conveyor's containers move their large arrays into shared memory the first time such a
worker starts (an array mapped from a file travels as its path), and a user's own dataset's
arrays are copied there once for all the workers of a pool. Each worker's start then pickles
a few kilobytes, whatever the data's size, and every process reads the same pages. The
segments have no name (nothing in /dev/shm to leave behind): what is checked after each way
of stopping is that no process, descriptor or mapping of them is left.
"""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import conveyor
from conveyor.report import report
from conveyor.transport import move, share, spans
from helpers import Snapshot, assert_no_leaks, pid_alive, shm_entries, wait_until
from shared_data import ROWS, ForkRows, Plain, Raises, buffers_of, where, zoo

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/<pid>/maps")

METHODS = ["spawn", "forkserver"]


def loader(dataset: Any, method: str, **kw: Any) -> conveyor.DataLoader[Any]:
    kw.setdefault("num_workers", 1)
    kw.setdefault("batch_size", 64)
    return conveyor.DataLoader(dataset, multiprocessing_context=method, adaptive=False, **kw)


def memfd_maps(pid: int | str = "self") -> list[str]:
    """The mappings of anonymous shared segments (memfd) in a process."""
    try:
        with open(f"/proc/{pid}/maps") as f:
            return [line for line in f if "memfd:conveyor" in line]
    except OSError:
        return []


@pytest.mark.timeout(180)
@pytest.mark.parametrize("method", METHODS)
def test_each_container_reaches_the_worker_by_reference(method: str, tmp_path: Path) -> None:
    ds = zoo(str(tmp_path))
    size = sum(b.nbytes for c in ds.containers.values() for b in buffers_of(c) if b.nbytes >= share.MIN_BYTES)
    with loader(ds, method) as dl:
        batches = list(dl)
        assert share.settle(30)  # (the pool's copy of the user's array is heard of once whole)
        stats = dl.stats()
    assert len(batches) == ROWS // 64
    # the user's array (no container's) was copied once, for both workers, and that is counted
    # apart from the pickling, for report() to name
    plain = ds.containers["plain"].big
    assert stats["dataset_copies"] == 1 and stats["dataset_copied_bytes"] == plain.nbytes, stats
    assert stats["dataset_copied_s"] > 0
    # the start pickled the small arrays (the labels), not the 6 MiB of large buffers, which
    # went by reference
    assert stats["dataset_pickles"] == 1
    assert stats["dataset_pickle_bytes"] < size // 16, (stats["dataset_pickle_bytes"], size)
    assert stats["dataset_shared_bytes"] >= size, (stats["dataset_shared_bytes"], size)
    assert stats["dataset_moved_s"] > 0  # timed apart: report() does not call the move pickling
    worker = {b["pid"][0].item() for b in batches}
    assert worker and os.getpid() not in worker
    first = batches[0]
    for name, c in ds.containers.items():
        here = where(buffers_of(c)[0])
        there = first[f"{name}_at"][0]
        if name == "plain":
            # the user's array stays theirs; the worker maps the pool's copy of it
            assert here is None and there != "None", (name, here, there)
        else:
            # the container now reads the very pages (or file) the worker reads
            assert here is not None and there == str(here), (name, here, there)
    mapped = ds.containers["mapped"].arrays[0]
    assert isinstance(mapped, np.memmap) and share.located(mapped) is None  # read where it is, not copied
    rows = np.arange(ROWS * 1024, dtype=np.uint8).reshape(ROWS, 1024)
    got = {k: np.concatenate([np.asarray(b[k]) for b in batches]) for k in ("array", "mapped", "tensors", "plain")}
    np.testing.assert_array_equal(got["array"], rows)
    np.testing.assert_array_equal(got["mapped"], rows + 1)
    np.testing.assert_array_equal(got["tensors"], rows + 2)
    np.testing.assert_array_equal(got["plain"], rows + 3)
    strings = [s for b in batches for s in b["strings"]]
    assert strings == list(ds.containers["strings"])
    csv = np.concatenate([np.asarray(b["csv"]) for b in batches])
    np.testing.assert_array_equal(csv, ds.containers["csv"].features[:ROWS])


@pytest.mark.timeout(180)
@pytest.mark.parametrize("method", METHODS)
def test_a_replacement_worker_maps_the_same_buffers(method: str, tmp_path: Path) -> None:
    ds = zoo(str(tmp_path))
    with loader(ds, method, max_worker_restarts=1, persistent_workers=True) as dl:
        it = iter(dl)
        first = next(it)
        pid = first["pid"][0].item()
        assert share.settle(30)  # the copies into shared memory, made while the workers start, are whole
        before = spans.live()
        os.kill(pid, signal.SIGKILL)
        rest = list(it)
        stats = dl.stats()
        now = spans.live()  # (the pool keeps its copy for the plain dataset while it persists)
    assert stats["restarts"] == 1
    assert len(rest) == ROWS // 64 - 1
    later = {b["pid"][0].item() for b in rest[-2:]}
    assert pid not in later
    for name in ds.containers:
        # the same segment (or file) as the first worker mapped, no new copy made for it
        assert rest[-1][f"{name}_at"][0] == first[f"{name}_at"][0], name
    # no new shared copy was made for the replacement (a mapping of the first start's may have
    # been collected meanwhile: the copy a container read while it was made, for one)
    assert set(now.items()) <= set(before.items()), (now, before)
    assert stats["dataset_pickles"] == 2 and stats["dataset_pickle_bytes"] < 256 << 10


def _iterate(ds: Any, how: str) -> None:
    dl = loader(ds, "spawn")
    it = iter(dl)
    next(it)
    if how == "close":
        dl.close()
    elif how == "del":
        del it, dl
    elif how == "exception":
        with pytest.raises(KeyError):
            list(it)
        del it, dl


@pytest.mark.timeout(120)
@pytest.mark.parametrize("how", ["close", "del", "exception"])
def test_nothing_is_left_after_close_del_or_an_error(how: str) -> None:
    before = Snapshot.take()
    mapped = len(memfd_maps())

    def run() -> None:
        ds = Raises(bad=ROWS - 5 if how == "exception" else -1)
        ds.plain = Plain(np.ones((ROWS, 1024), dtype=np.uint8))  # a copy the pool holds
        _iterate(ds, how)
        # the container's data is in shared memory now, mapped here until it goes
        assert share.located(ds.rows.arrays[0]) is not None
        assert len(memfd_maps()) > mapped

    run()
    gc.collect()
    assert_no_leaks(before)  # workers, threads, descriptors (each segment's), /dev/shm
    assert wait_until(lambda: len(memfd_maps()) == mapped, 5), memfd_maps()


CTRL_C = textwrap.dedent("""
    import gc, os, signal, sys
    import psutil
    import conveyor
    from shared_data import Raises

    def maps():
        with open("/proc/self/maps") as f:
            return sum("memfd:conveyor" in line for line in f)

    class Interrupts(Raises):
        def __init__(self):
            super().__init__(-1)
            self.main = os.getpid()

        def __getitem__(self, i):
            if i == 64 * 3:
                os.kill(self.main, signal.SIGINT)  # Ctrl-C in the main process, mid-epoch
            return super().__getitem__(i)

    def interrupted():
        dl = conveyor.DataLoader(Interrupts(), batch_size=64, num_workers=2, adaptive=False,
                                 multiprocessing_context=sys.argv[1])
        try:
            for _ in dl:
                pass
        except KeyboardInterrupt:
            print("INTERRUPTED", flush=True)
        return maps()

    if __name__ == "__main__":
        print("PID", os.getpid(), flush=True)
        during = interrupted()
        gc.collect()
        print("MAPS", during, maps(), flush=True)
        dl = conveyor.DataLoader(Raises(-1), batch_size=64, num_workers=2, adaptive=False,
                                 multiprocessing_context=sys.argv[1])
        it = iter(dl)
        next(it)
        workers = []
        for p in psutil.Process().children(recursive=True):
            with open(f"/proc/{p.pid}/maps") as f:
                if "memfd:conveyor" in f.read():
                    workers.append(p.pid)
        print("WORKERS", *workers, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
""")


@pytest.mark.timeout(150)
@pytest.mark.parametrize("method", METHODS)
def test_nothing_is_left_after_ctrl_c_or_the_main_process_killed(method: str, tmp_path: Path,
                                                                  script_env: dict[str, str]) -> None:
    script = tmp_path / "ctrl_c.py"
    script.write_text(CTRL_C)
    proc = subprocess.run([sys.executable, str(script), method], capture_output=True, text=True,
                          env=script_env, timeout=140)
    words = proc.stdout.split()
    assert "INTERRUPTED" in words, proc.stdout + proc.stderr[-3000:]
    i = words.index("MAPS")
    during, after = int(words[i + 1]), int(words[i + 2])
    assert during >= 1 and after == 0, (during, after)  # mapped while the dataset lived, then gone
    assert proc.returncode == -signal.SIGKILL, proc.stdout + proc.stderr[-3000:]
    workers = [int(w) for w in words[words.index("WORKERS") + 1:]]
    assert len(workers) == 2, proc.stdout
    # the main process killed: its workers notice and end, and the segments go with them
    assert wait_until(lambda: not any(pid_alive(w) for w in workers), 15), workers
    main = int(words[words.index("PID") + 1])
    assert wait_until(lambda: not shm_entries(main), 20), shm_entries(main)  # the workers' slots too


def test_report_names_the_time_spent_pickling_the_dataset() -> None:
    snap = {"batches": 100, "steps": 99, "wait_fraction": 0.02, "step_per_batch_s": 0.01, "num_workers": 2,
            "workers": {0: {"batches": 50, "busy_s": 0.2}, 1: {"batches": 50, "busy_s": 0.2}},
            "dataset_pickles": 2, "dataset_pickle_s": 1.6, "dataset_pickle_bytes": 480_000_000,
            "dataset_shared_bytes": 0}
    said = report(snap, cores=2)
    assert "spent 1.60 s pickling the dataset (2 start(s), up to 480 MB each" in said, said
    assert "ArrayDataset" in said and "multiprocessing_context='fork'" in said, said
    small = dict(snap, dataset_pickle_s=0.004, dataset_pickle_bytes=20_000)
    assert "pickling" not in report(small, cores=2)


def test_report_names_the_copies_of_a_users_arrays() -> None:
    # a user's own dataset's arrays are copied into shared memory by every pool (each epoch's,
    # without persistent workers), and its workers wait for them whole
    snap = {"batches": 100, "steps": 99, "wait_fraction": 0.02, "step_per_batch_s": 0.01, "num_workers": 2,
            "workers": {0: {"batches": 50, "busy_s": 0.2}, 1: {"batches": 50, "busy_s": 0.2}},
            "dataset_pickles": 4, "dataset_pickle_s": 0.002, "dataset_pickle_bytes": 8_000,
            "dataset_shared_bytes": 300_000_000, "dataset_copies": 2, "dataset_copied_s": 0.8,
            "dataset_copied_bytes": 600_000_000, "persistent_workers": False}
    said = report(snap, cores=2)
    assert "spent 0.80 s copying the dataset's own numpy arrays into shared memory (600 MB in 2 copies" in said, said
    assert "persistent_workers=True makes once" in said and "ArrayDataset" in said, said
    assert "multiprocessing_context='fork'" in said and "pickling" not in said, said
    assert "persistent_workers" not in report(dict(snap, persistent_workers=True), cores=2).split("copies")[1]
    small = dict(snap, dataset_copied_s=0.01, dataset_copied_bytes=2_000_000)
    assert "copying" not in report(small, cores=2)


class Objects:
    """What shared memory cannot carry: a large list of Python objects."""

    def __init__(self, n: int) -> None:
        self.items = [(i, str(i)) for i in range(n)]

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> int:
        return self.items[i][0]


@pytest.mark.timeout(120)
def test_what_cannot_be_shared_is_counted_as_pickled() -> None:
    with loader(Objects(200_000), "spawn", batch_size=4096) as dl:
        assert len(list(dl)) == -(-200_000 // 4096)
        stats = dl.stats()
    assert stats["dataset_pickles"] == 1
    assert stats["dataset_pickle_bytes"] > 2_000_000  # the list went through the pipe
    assert stats["dataset_shared_bytes"] == 0
    assert stats["dataset_pickle_s"] > 0


@pytest.mark.timeout(120)
def test_forked_workers_read_the_containers_without_copying_them() -> None:
    # fork shares the main process's pages: reading the rows writes none of them, so no
    # worker ends up with a copy of its own (the containers' arrays are never written)
    ds = ForkRows()
    with loader(ds, "fork", batch_size=4096) as dl:
        batches = list(dl)
    assert sum(int(b[0].sum()) for b in batches) == ds.rows.arrays[0].size
    copied = max(int(b[1].max()) for b in batches)
    assert 0 <= copied < ds.rows.arrays[0].nbytes // 16, copied  # every row read, (almost) none copied
    assert share.located(ds.rows.arrays[0]) is None  # fork needs no shared segment


def test_pickled_elsewhere_the_containers_carry_their_data() -> None:
    # only a worker's start passes buffers by reference: pickle.dumps (to a file, to another
    # machine) still holds the data, also for arrays already moved into shared memory
    import pickle

    rows = np.arange(ROWS * 1024, dtype=np.uint8).reshape(ROWS, 1024)
    ds = conveyor.ArrayDataset(rows)
    ds.arrays = (share.place(ds.arrays[0]),)
    strings = share.adopt((np.frombuffer(b"x" * (2 << 20), dtype=np.uint8),))[0]
    assert share.located(ds.arrays[0]) is not None and share.located(strings) is not None
    data = pickle.dumps(ds)
    assert len(data) > rows.nbytes
    np.testing.assert_array_equal(pickle.loads(data).arrays[0], rows)
    assert pickle.loads(pickle.dumps(strings)).tobytes() == b"x" * (2 << 20)


def _resident(address: int) -> int:
    """Bytes of this process's mapping at ``address`` that are resident (its page-table
    entries), from /proc/self/smaps."""
    inside = False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split(None, 1)[0]
            if "-" in head and not head.endswith(":"):
                lo, hi = (int(x, 16) for x in head.split("-"))
                inside = lo <= address < hi
            elif inside and head == "Rss:":
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no mapping at {address:#x}")


def test_a_move_into_shared_memory_does_not_fault_the_copy_into_the_main_process() -> None:
    # the bytes go in through the descriptor (the kernel allocates the pages as it writes):
    # a copy through the mapping faulted in every page of it, a fault each 4 KiB (2 GB: 0.7 s
    # of the move's 1.8 s), and left the main process's page tables holding all of them
    rows = np.arange(64 << 16, dtype=np.uint32).reshape(64, -1).astype(np.uint8)  # 4 MiB
    for a in (rows, np.asfortranarray(rows), rows[::2, 1::3]):
        placed = share.place(a)
        at = int(placed.__array_interface__["data"][0])
        assert share.located(placed) is not None
        assert _resident(at) < rows.nbytes // 8, (a.strides, _resident(at))
        assert placed.flags.f_contiguous == (a.flags.f_contiguous and not a.flags.c_contiguous)
        np.testing.assert_array_equal(placed, a)  # (read after the check: reading faults it in)


def _maps_torch(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/maps") as f:
            return "libtorch_cpu" in f.read()
    except OSError:
        return False


@pytest.mark.timeout(180)
@pytest.mark.parametrize("method", METHODS)
def test_workers_gathering_numpy_arrays_do_not_import_torch(method: str) -> None:
    # torch is ~1.4 s of a spawned worker's start and ~150 MB of its memory: a worker whose
    # batches are gathered from numpy arrays sends them as arrays the main process makes
    # tensors of (pytest's main module, re-run in each spawned worker, imports no torch)
    import psutil
    import torch

    rows = np.arange(ROWS * 1024, dtype=np.uint8).reshape(ROWS, 1024)
    labels = np.arange(ROWS).astype(">i4")  # a byte order torch lacks: made native, as gather does
    with loader(conveyor.ArrayDataset(rows, labels), method, num_workers=2) as dl:
        it = iter(dl)
        batches = [next(it) for _ in range(4)]  # (both workers have made batches)
        kids = psutil.Process().children(recursive=True)
        assert len(kids) >= 2
        assert not any(_maps_torch(p.pid) for p in kids), [(p.pid, p.name()) for p in kids]
        batches += list(it)
    assert len(batches) == ROWS // 64
    for k, (x, y) in enumerate(batches):
        assert type(x) is torch.Tensor and type(y) is torch.Tensor
        assert x.dtype == torch.uint8 and y.dtype == torch.int32
        np.testing.assert_array_equal(x.numpy(), rows[k * 64:(k + 1) * 64])
        np.testing.assert_array_equal(y.numpy(), np.arange(k * 64, (k + 1) * 64))


@pytest.mark.timeout(180)
def test_a_worker_that_imports_torch_late_gets_it_set_up_and_seeded() -> None:
    # torch imported by the dataset's own code in such a worker: seeded with the worker's
    # seed (as at a start, else every worker drew the same numbers) and one thread
    from shared_data import ImportsTorch

    rows = np.arange(ROWS * 1024, dtype=np.uint8).reshape(ROWS, 1024)
    with loader(ImportsTorch(rows), "spawn", num_workers=2) as dl:
        batches = list(dl)
    said = np.concatenate([b[1].numpy() for b in batches])
    np.testing.assert_array_equal(np.concatenate([b[0].numpy() for b in batches]), rows)
    assert (said[:, 0] == said[:, 2]).all(), said[::64]  # torch's seed is the worker's seed
    assert (said[:, 1] == 1).all(), said[::64]  # set_num_threads(1)
    assert len(set(said[:, 2])) == 2  # both workers made batches, with seeds of their own


def _holds_fd_to_memfd(pid: int) -> bool:
    try:
        return any("memfd:conveyor" in os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return False


def _has_imported_numpy(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/maps") as f:
            return "_multiarray_umath" in f.read()
    except OSError:
        return False


class _Hold:
    """A test's hold on the copy into shared memory (``move.on_chunk``): chunks from ``at`` on
    wait for ``release`` unless a task wants them (the dispatcher's rows come first)."""

    def __init__(self, at: int) -> None:
        import threading

        self.at = at
        self.gate = threading.Event()
        self.held = 0  # times a chunk was put off
        self.main: bool | None = None
        self.polls = 0

    def __call__(self, m: Any, k: int, wanted: bool) -> bool:
        import threading

        self.main = threading.current_thread() is threading.main_thread()
        if wanted or k < self.at or self.gate.is_set():
            return True
        self.held += 1
        self.polls += 1
        if self.polls > 60_000:  # ~5 minutes: the test has failed (its timeout says so)
            raise RuntimeError("the copy was held too long")
        return self.gate.wait(0.005)


def _distinct_rows(n: int) -> np.ndarray:
    """n rows of 1 KiB, no two alike and no zero byte (a row not yet written reads as zeros)."""
    rng = np.random.default_rng(7)
    return rng.integers(1, 256, size=(n, 1024), dtype=np.uint8)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("shuffle", [False, True], ids=["sequential", "shuffled"])
@pytest.mark.parametrize("method", METHODS)
def test_a_worker_reads_the_rows_copied_before_the_copy_is_whole(method: str, shuffle: bool,
                                                                 monkeypatch: Any) -> None:
    # the copy goes in chunks; a container's read in a worker waits only for the chunks its
    # rows lie in, and the rows of the first tasks are copied first: held at its 5th chunk
    # (of 1,024: 4 rows a chunk, so a few shuffled batches want a fraction of them), the copy
    # still gives the first batch, shuffled too, with every byte right
    hold = _Hold(at=4)
    monkeypatch.setattr(move, "CHUNK", 4 << 10)
    monkeypatch.setattr(move, "on_chunk", hold)
    rows = _distinct_rows(ROWS * 4)
    ds = conveyor.ArrayDataset(rows, np.arange(len(rows)))
    try:
        with loader(ds, method, num_workers=2, batch_size=64, shuffle=shuffle,
                    seed=3) as dl:
            it = iter(dl)
            first = next(it)
            # the chunks past the 4th that no task wants wait for the gate: the copy is not whole
            still_held = (not hold.gate.is_set(), ds.arrays[0] is rows)
            hold.gate.set()
            batches = [first, *it]
    finally:
        hold.gate.set()
    assert hold.main is False  # written by a thread of its own, not the one starting workers
    assert still_held == (True, True)  # the first batch came while the copy was held, not whole
    got = np.concatenate([np.asarray(b[0]) for b in batches])
    index = np.concatenate([np.asarray(b[1]) for b in batches])
    np.testing.assert_array_equal(got, rows[index])  # every row whole: none read half-written
    assert sorted(index.tolist()) == list(range(len(rows)))
    assert move.settle(30) and share.located(ds.arrays[0]) is not None  # the dataset took the copy


@pytest.mark.timeout(60)
def test_a_read_of_a_row_not_copied_yet_waits_for_it(monkeypatch: Any) -> None:
    # the worker's side of a segment still being copied, in this process: rows written read at
    # once, a row whose chunk is not written waits until it is, then reads right
    import threading

    from conveyor.transport import guard

    hold = _Hold(at=2)
    monkeypatch.setattr(move, "CHUNK", 64 << 10)
    monkeypatch.setattr(move, "on_chunk", hold)
    rows = _distinct_rows(ROWS)
    out, m = move.copy_soon(rows)
    move.start([m], None)
    try:
        fd, ready = os.dup(m.fd), os.dup(m.ready)
        try:
            mm = guard.attach(fd, m.size, ready, m.layout())
        finally:
            os.close(fd)
        view = np.ndarray(rows.shape, dtype=rows.dtype, buffer=mm)
        assert guard.copying
        guard.rows((view,), [0, 63, 64, 127])  # chunks 0 and 1: written (or soon: not held)
        np.testing.assert_array_equal(view[[0, 63, 64, 127]], rows[[0, 63, 64, 127]])
        late = 64 * 10 + 5  # in chunk 10, held
        waited = guard.waits
        got: list[np.ndarray] = []
        reader = threading.Thread(target=lambda: (guard.rows((view,), [late]), got.append(view[late].copy())))
        reader.start()
        assert wait_until(lambda: guard.waits > waited, 30)  # it waits: the chunk is not written
        assert not got and hold.held > 0
        hold.gate.set()
        reader.join(30)
        np.testing.assert_array_equal(got[0], rows[late])
        assert move.settle(30)
        guard.rows((view,), [0])
        assert not guard.copying  # whole: reads check nothing any more
        np.testing.assert_array_equal(view, rows)
    finally:
        hold.gate.set()
        move.settle(30)
    del out, view, mm
    gc.collect()


@pytest.mark.timeout(180)
@pytest.mark.parametrize("method", METHODS)
def test_a_users_dataset_reads_its_arrays_only_once_they_are_whole(method: str, monkeypatch: Any) -> None:
    # a user's class holding a numpy array reads it where conveyor cannot check its reads: the
    # worker maps the segment at once, and waits for every byte of the array before unpickling
    # its dataset further (no batch comes while the copy is held)
    import threading

    import psutil

    hold = _Hold(at=2)
    monkeypatch.setattr(move, "CHUNK", 64 << 10)
    monkeypatch.setattr(move, "on_chunk", hold)

    def release() -> None:
        def waiting() -> list[int]:
            return [p.pid for p in psutil.Process().children(recursive=True)
                    if _holds_fd_to_memfd(p.pid) and _has_imported_numpy(p.pid)]

        # the worker has the segment and is unpickling its dataset: a worker that did not
        # wait would send its batch meanwhile
        if wait_until(lambda: bool(waiting()), 90):
            hold.gate.wait(1.0)
        hold.gate.set()

    rows = _distinct_rows(ROWS * 2)
    helper = threading.Thread(target=release)
    helper.start()
    try:
        with loader(Plain(rows), method, batch_size=256) as dl:
            it = iter(dl)
            first = next(it)
            released_first = hold.gate.is_set()
            got = np.concatenate([np.asarray(b) for b in [first, *it]])
    finally:
        hold.gate.set()
        helper.join(60)
    assert hold.held > 0 and released_first
    np.testing.assert_array_equal(got, rows)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("at", [0, 8], ids=["first-chunk", "later-chunk"])
def test_a_failed_copy_reaches_the_user_and_no_worker_reads_it(at: int, monkeypatch: Any) -> None:
    import errno

    from conveyor.errors import StartupError

    def fails(m: Any, k: int, wanted: bool) -> bool:
        if k >= at:
            raise OSError(errno.ENOSPC, "No space left on device (test)")
        return True

    before = Snapshot.take()
    monkeypatch.setattr(move, "CHUNK", 64 << 10)
    monkeypatch.setattr(move, "on_chunk", fails)
    rows = np.ones((ROWS * 2, 1024), dtype=np.uint8)
    ds = conveyor.ArrayDataset(rows)
    dl = loader(ds, "spawn", num_workers=2)
    with pytest.raises(StartupError) as caught:
        list(dl)
    dl.close()
    err = caught.value
    assert isinstance(err.__cause__, OSError) and err.__cause__.errno == errno.ENOSPC, repr(err.__cause__)
    assert "could not copy the dataset's arrays into shared memory" in str(err), str(err)
    assert ds.arrays[0] is rows  # the dataset keeps its own arrays
    monkeypatch.undo()
    del dl, err, caught
    gc.collect()
    assert_no_leaks(before)


def test_the_rows_of_tasks_sent_while_copying_are_copied_first(monkeypatch: Any) -> None:
    # the dispatcher tells the copy each task's rows (lists or numpy arrays of indices) before
    # sending it: their chunks come next, task by task, before the chunks in order
    from conveyor.executors.task import Task

    monkeypatch.setattr(move, "CHUNK", 4 << 10)  # 4 rows a chunk
    rows = _distinct_rows(ROWS)
    ds = conveyor.ArrayDataset(rows)
    out, m = move.copy_soon(rows)  # (as adopt makes it, its thread not started yet)
    move.track(rows, out)
    try:
        move.prefer(ds, [Task(0, 0, np.array([1001, 9])), Task(1, 0, [400, 401, 402])])
        assert list(m.wanted) == [2, 250, 100]
        assert m.next_chunk() == (2, True)
    finally:
        move.start([m], None)
        assert move.settle(30)
    np.testing.assert_array_equal(out, rows)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("method", METHODS)
def test_the_copy_writes_only_wanted_chunks_until_a_worker_has_started(method: str, monkeypatch: Any) -> None:
    # on few cores the copy would take a core from the starting workers: until one has
    # started it writes only the chunks the tasks sent want (what the first batches read)
    monkeypatch.setattr(move, "HOLD_S", 60.0)
    monkeypatch.setattr(move, "CHUNK", 64 << 10)
    seen: list[tuple[bool, bool]] = []

    def hook(m: Any, k: int, wanted: bool) -> bool:
        seen.append((wanted, move.workers_started()))
        return True

    monkeypatch.setattr(move, "on_chunk", hook)
    rows = _distinct_rows(ROWS * 2)
    with loader(conveyor.ArrayDataset(rows), method, num_workers=2, batch_size=64) as dl:
        got = np.concatenate([np.asarray(b[0]) for b in dl])
    np.testing.assert_array_equal(got, rows)
    assert any(not wanted for wanted, _ in seen)  # (the rest, in order, once one had started)
    assert all(wanted or started for wanted, started in seen), seen


@pytest.mark.timeout(60)
def test_a_string_array_read_while_copied_waits_for_its_strings_bytes(monkeypatch: Any) -> None:
    # a StringArray's read in a worker checks the chunks of the offsets and of the bytes its
    # strings lie in: the early strings read at once, a late one waits for its bytes
    import threading

    from conveyor.datasets import StringArray
    from conveyor.datasets.strings import _from_buffers
    from conveyor.transport import guard

    hold = _Hold(at=2)
    monkeypatch.setattr(move, "CHUNK", 4 << 10)
    monkeypatch.setattr(move, "on_chunk", hold)
    words = [f"{i:06d}" * (1 + i % 7) for i in range(40_000)]  # ~1.1 MB of bytes, 320 KB of offsets
    sa = StringArray(words)
    data, offsets = np.ascontiguousarray(sa.data), np.ascontiguousarray(sa.offsets)
    moves, views = [], []
    for a in (data, offsets):
        out, m = move.copy_soon(a)
        moves.append((out, m))
    for _, m in moves:
        move.start([m], None)  # (a thread each: the hold on one leaves the other going)
    try:
        for (out, m), a in zip(moves, (data, offsets)):
            fd, ready = os.dup(m.fd), os.dup(m.ready)
            try:
                mm = guard.attach(fd, m.size, ready, m.layout())
            finally:
                os.close(fd)
            views.append(np.ndarray(a.shape, dtype=a.dtype, buffer=mm))
        worker_side = _from_buffers(views[0], views[1])
        assert worker_side[0] == words[0] and worker_side.take([1, 0]).tolist() == words[1::-1]
        late = len(words) - 3  # its offsets and bytes lie in chunks the copy holds
        waited = guard.waits
        got: list[str] = []
        reader = threading.Thread(target=lambda: got.append(worker_side[late]))
        reader.start()
        assert wait_until(lambda: guard.waits > waited, 30)
        assert not got
        hold.gate.set()
        reader.join(30)
        assert got == [words[late]]
        assert move.settle(30)
        assert worker_side.tolist() == words
    finally:
        hold.gate.set()
        move.settle(30)
