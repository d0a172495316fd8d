"""Every way a process worker can end is survived: its batches are re-issued, every sample comes
once and in order, and the batches already handed out stay readable."""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import conveyor
from helpers import WORKERS, Snapshot, assert_no_leaks, pid_alive, wait_until

# 64 KB a sample: every batch travels in a shared-memory slot, not inside the message
WIDTH = 16384


class DiesOnce:
    """A map-style dataset whose worker ends itself (``how``) at sample ``at``, once: the first
    worker to reach it writes its pid to ``flag`` and dies; its replacement finds the flag."""

    def __init__(self, n: int, at: int, how: str, flag: str) -> None:
        self.n, self.at, self.how, self.flag = n, at, how, flag

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> np.ndarray:
        if i == self.at:
            try:
                fd = os.open(self.flag, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            except FileExistsError:
                pass
            else:
                os.write(fd, str(os.getpid()).encode())
                os.close(fd)
                die(self.how)
        return np.full(WIDTH, i, dtype=np.float32)


def die(how: str) -> None:
    if how == "sys.exit":
        sys.exit()
    if how == "sys.exit(3)":
        sys.exit(3)
    if how == "os._exit":
        os._exit(1)
    os.kill(os.getpid(), getattr(signal, how))


def _flagged_pid(flag: Path) -> int | None:
    try:
        text = flag.read_text()
    except OSError:
        return None
    return int(text) if text else None


@pytest.fixture
def hangup_at_default() -> Iterator[None]:
    """SIGHUP at its default in this process for the test: a run under ``nohup`` ignores it,
    and so, by design, do its workers (the hangup that ends nothing else must not end them),
    so a worker sent one would live on."""
    old = signal.signal(signal.SIGHUP, signal.SIG_DFL)
    try:
        yield
    finally:
        signal.signal(signal.SIGHUP, old)


HOWS = ["SIGTERM", "SIGHUP", "SIGINT", "sys.exit", "sys.exit(3)", "os._exit", "SIGKILL"]
CASES = [("fork", how) for how in HOWS] + [
    (method, how) for method in ("spawn", "forkserver") for how in ("SIGTERM", "sys.exit", "SIGKILL")]


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("method", "how"), CASES)
def test_a_worker_that_ends_itself_is_replaced_and_batches_sent_stay_readable(
        tmp_path: Path, method: str, how: str, hangup_at_default: None) -> None:
    # One worker, three batches ordered at once: when the worker reaches batch 2 it has sent
    # batch 1, which the main process has not read yet (the loop holds batch 0 until the worker
    # is gone). That batch's slot must still be there to read, and batch 2 on must come from
    # the replacement.
    if method == "forkserver":  # the server (and the pipe to it) lives on for the whole session
        import multiprocessing.forkserver

        multiprocessing.forkserver.ensure_running()
    before = Snapshot.take()
    flag = tmp_path / "died"
    ds = DiesOnce(24, 8, how, str(flag))
    loader = conveyor.DataLoader(ds, batch_size=4, num_workers=1, prefetch_factor=3,
                                 multiprocessing_context=method, **WORKERS)
    got = []
    for i, batch in enumerate(loader):
        got.append(batch)
        if i == 0:
            assert wait_until(lambda: _flagged_pid(flag) is not None, 60), "the worker never reached sample 8"
            pid = _flagged_pid(flag)
            if how != "SIGINT":  # a worker ignores SIGINT: Ctrl-C is the main process's to handle
                assert wait_until(lambda: not pid_alive(pid), 60), f"worker {pid} did not end"
    stats = loader.stats()
    loader.close()
    assert len(got) == 6
    for b, batch in enumerate(got):  # read after the worker's death and the loader's close
        rows = np.asarray(batch)
        assert rows.shape == (4, WIDTH), rows.shape
        assert (rows[:, 0] == np.arange(4 * b, 4 * b + 4)).all(), (b, rows[:, 0])
        assert (rows == rows[:, :1]).all()
    if how == "SIGINT":
        assert stats["restarts"] == 0, stats["deaths"]
    else:
        assert stats["restarts"] == 1, stats["deaths"]
    del got, batch, rows, loader
    assert_no_leaks(before)


# --------------------------------------------------------------------------- Ctrl-C in next()


class Rows:
    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> np.ndarray:
        return np.full(4, i, dtype=np.int64)


def _firsts(batches: list[Any]) -> list[int]:
    return [int(x) for b in batches for x in np.asarray(b)[:, 0]]


@pytest.mark.timeout(120)
def test_a_ctrl_c_after_poll_read_a_result_loses_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    # a Ctrl-C that lands in ProcessExecutor.poll() after a result was read from the pipe and
    # before it was recorded lost the result, and its worker stayed counted as holding it: with
    # prefetch_factor=1 round robin never gave that worker another batch, and the next epoch
    # waited for ever (here: until the loader's timeout)
    from conveyor.executors import processes

    made = processes._result
    fired = []

    def interrupted(fields: Any) -> Any:
        result = made(fields)
        if not fired and result.batch is not None:
            fired.append(result.seq)
            signal.raise_signal(signal.SIGINT)  # its handler runs at the next chance it gets
        return result

    monkeypatch.setattr(processes, "_result", interrupted)
    before = Snapshot.take()
    loader = conveyor.DataLoader(Rows(32), batch_size=2, num_workers=2, prefetch_factor=1,
                                 persistent_workers=True, timeout=30, **WORKERS)
    it = iter(loader)
    got: list[Any] = []
    batch = None
    with pytest.raises(KeyboardInterrupt):
        for batch in it:
            got.append(batch)
    assert fired
    got += list(it)  # the same epoch goes on where it was
    assert _firsts(got) == list(range(32))
    for _ in range(2):  # and later epochs are whole
        assert _firsts(list(loader)) == list(range(32))
    loader.close()
    del it, got, batch, loader
    assert_no_leaks(before)


@pytest.mark.timeout(300)
def test_ctrl_c_at_random_points_of_many_epochs_leaves_every_later_epoch_whole() -> None:
    # SIGINT at random moments while a persistent loader runs its epochs: an epoch cut short
    # raises KeyboardInterrupt, and every epoch after it (on the same workers) is whole
    import random
    import threading
    import time

    armed = [False]  # (one interrupt per epoch at most: the handler disarms itself)

    def on_sigint(signum: int, frame: Any) -> None:
        if armed[0]:
            armed[0] = False
            raise KeyboardInterrupt

    before = Snapshot.take()
    old = signal.signal(signal.SIGINT, on_sigint)
    stop = threading.Event()
    pace = random.Random(40)

    def storm() -> None:
        while not stop.is_set():
            time.sleep(10 ** pace.uniform(-3.0, -1.0))  # where the signal lands: random, not a synchronisation
            os.kill(os.getpid(), signal.SIGINT)

    thread = threading.Thread(target=storm, daemon=True)
    loader = conveyor.DataLoader(Rows(24), batch_size=2, num_workers=2, prefetch_factor=1,
                                 persistent_workers=True, timeout=30, **WORKERS)
    cut = whole = 0
    try:
        thread.start()
        # every other epoch may be cut; the ones between are whole however the storm falls.
        # Until 5 were cut, at most 400 armed epochs: how often a signal lands inside an epoch
        # depends on how fast the machine runs them (4 of 80 on an idle 2-core VM)
        for epoch in range(800):
            got: list[Any] = []
            try:
                armed[0] = epoch % 2 == 0
                for batch in loader:
                    got.append(batch)
                armed[0] = False
            except KeyboardInterrupt:
                cut += 1
                continue
            assert _firsts(got) == list(range(24))
            whole += 1
            if cut >= 5 and whole >= 5:
                break
        stop.set()
        thread.join()
        for _ in range(3):
            assert _firsts(list(loader)) == list(range(24))
    finally:
        stop.set()
        signal.signal(signal.SIGINT, old)
        loader.close()
    assert cut >= 5 and whole >= 5, (cut, whole)  # the storm did cut epochs, and some ran whole
    del loader, got
    assert_no_leaks(before)


# --------------------------------------------------------------------------- unpicklable samples


def _gen() -> Any:
    yield 1


class HoldsOdd:
    """Sample 5's ``meta`` holds something pickle refuses."""

    def __init__(self, odd: str) -> None:
        self.odd = odd

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> dict[str, Any]:
        import threading

        odd: Any = 0
        if i == 5 and self.odd == "lock":
            odd = threading.Lock()
        elif i == 5 and self.odd == "lambda":
            odd = lambda: i  # noqa: E731
        elif i == 5:
            odd = _gen()
        return {"x": np.full(3, i), "meta": [1, 2, odd]}


def keep_samples(batch: list[Any]) -> list[Any]:
    return batch


def collate_meta_apart(batch: list[dict[str, Any]]) -> dict[str, Any]:
    return {"x": np.stack([s["x"] for s in batch]), "meta": [s["meta"] for s in batch]}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("collate", ["samples", "collated", "no-batching"])
@pytest.mark.parametrize(("odd", "kind"), [("lock", "_thread.lock"), ("lambda", "function"),
                                           ("generator", "generator")])
def test_an_unpicklable_sample_is_named_at_once(odd: str, kind: str, collate: str) -> None:
    # the worker died in send() and was replaced max_worker_restarts times, and the loop heard
    # "exited unexpectedly ... often the out-of-memory killer"
    before = Snapshot.take()
    opts: dict[str, Any] = {"batch_size": None} if collate == "no-batching" else {
        "batch_size": 2, "collate_fn": keep_samples if collate == "samples" else collate_meta_apart}
    loader = conveyor.DataLoader(HoldsOdd(odd), num_workers=2, max_worker_restarts=40, **opts, **WORKERS)
    with pytest.raises(Exception) as info:
        for _ in loader:
            pass
    said = str(info.value) + " ".join(getattr(info.value, "__notes__", []))
    assert not isinstance(info.value, conveyor.WorkerDied), said
    assert "sample 5 at sample['meta'][2]" in said, said
    assert f"holds a {kind}," in said, said
    assert loader.stats()["restarts"] == 0
    loader.close()
    del loader, info
    assert_no_leaks(before)


# --------------------------------------------------------------------------- batch samplers


class Refilled:
    """A batch sampler that yields one list object, refilled in place for every batch."""

    def __init__(self, n: int, size: int, kind: str = "list") -> None:
        self.n, self.size, self.kind = n, size, kind

    def __len__(self) -> int:
        return -(-self.n // self.size)

    def __iter__(self) -> Any:
        if self.kind == "array":
            buf = np.zeros(self.size, dtype=np.int64)
            for start in range(0, self.n, self.size):
                buf[:] = np.arange(start, start + self.size) % self.n
                yield buf
            return
        buf: list[int] = []
        for start in range(0, self.n, self.size):
            buf.clear()
            buf.extend(range(start, min(start + self.size, self.n)))
            yield buf


@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", ["list", "array"])
@pytest.mark.parametrize("workers", ["process", "thread", "main"])
def test_a_batch_sampler_that_refills_one_list_gives_the_right_batches(workers: str, kind: str) -> None:
    # the tasks kept a reference to the sampler's list: process workers were sent what it held
    # by then, thread workers read it as it was refilled (IndexError at the last, short batch)
    opts: dict[str, Any] = {"num_workers": 0} if workers == "main" else {
        "num_workers": 2, "worker_type": workers, "prefetch_factor": 4, **WORKERS}
    loader = conveyor.DataLoader(Rows(30), batch_sampler=Refilled(30, 4, kind), **opts)
    with loader:
        for _ in range(2):
            got = [np.asarray(b)[:, 0].tolist() for b in loader]
            if kind == "list":
                expected = [list(range(s, min(s + 4, 30))) for s in range(0, 30, 4)]
            else:  # whole batches of 4: the last wraps round
                expected = [[(s + k) % 30 for k in range(4)] for s in range(0, 30, 4)]
            assert got == expected


# --------------------------------------------------------------------------- checkpoint thread


@pytest.mark.timeout(180)
@pytest.mark.parametrize("worker_type", ["process", "thread"])
def test_state_dict_from_a_checkpoint_thread_leaves_a_stream_loader_running(worker_type: str) -> None:
    # the checkpoint thread's state_dict() took the workers' results in itself, polling the
    # pipes at the same time as the training loop: "RuntimeError: concurrent poll() invocation"
    import threading

    from helpers import Stream

    loader = conveyor.DataLoader(Stream(400, "torch"), batch_size=2, num_workers=2, worker_type=worker_type,
                                 persistent_workers=True, **WORKERS)
    stop = threading.Event()
    errors: list[BaseException] = []
    saved = [0]

    def checkpoints() -> None:
        while not stop.is_set():
            try:
                loader.state_dict()
                saved[0] += 1
            except BaseException as exc:  # noqa: BLE001 - reported by the test
                errors.append(exc)
                return

    thread = threading.Thread(target=checkpoints, daemon=True)
    try:
        thread.start()
        for _ in range(3):
            got = sorted(int(row[0]) for b in loader for row in b)
            assert got == list(range(400))
    finally:
        stop.set()
        thread.join(30)
        loader.close()
    assert not errors, errors[0]
    assert saved[0] > 0


@pytest.mark.parametrize("value", [float("nan"), -1, -0.5, "1", True, 1.5, float("inf")])
def test_a_max_failures_that_is_no_count_or_fraction_is_named(value: Any) -> None:
    # nan said "cannot convert float NaN to integer" at the first failure
    with pytest.raises(ValueError, match=r"max_failures="):
        conveyor.DataLoader(Rows(4), batch_size=2, on_error="skip", max_failures=value)


STUCK_AT_EXIT = """
import sys, time
import numpy as np
import conveyor
from helpers import WORKERS

class Stuck:
    def __len__(self):
        return 64

    def __getitem__(self, i):
        if i >= 8:  # the batches after the second: each sample takes 4 s
            time.sleep(4)
            with open(sys.argv[1], "a") as f:
                f.write(f"{i}\\n")
        return np.full(4, i)

if __name__ == "__main__":
    loader = conveyor.DataLoader(Stuck(), batch_size=4, num_workers=2, **WORKERS)
    it = iter(loader)
    next(it), next(it)
    print("EXIT", flush=True)  # and the interpreter exits, the iterator alive, both workers in a sample
"""


@pytest.mark.timeout(120)
def test_interpreter_exit_does_not_wait_for_a_worker_in_a_sample(tmp_path: Path, script_env: dict[str, str]) -> None:
    # the loader's finalizer told its workers to stop and waited 5 s for them: one in a slow
    # sample finished it meanwhile (and the exit took 5 s longer than torch's, whose workers
    # multiprocessing's exit hook ends at once). Now they are ended without finishing it.
    import subprocess

    marks = tmp_path / "finished"
    script = tmp_path / "stuck.py"
    script.write_text(STUCK_AT_EXIT)
    proc = subprocess.run([sys.executable, str(script), str(marks)], capture_output=True, text=True,
                          env=script_env, timeout=100)
    assert proc.returncode == 0 and "EXIT" in proc.stdout, proc.stderr[-3000:]
    assert not marks.exists(), f"a worker finished a sample after the exit began: {marks.read_text()!r}"


@pytest.mark.timeout(120)
def test_a_ctrl_c_as_the_workers_start_leaves_nothing_running(monkeypatch: pytest.MonkeyPatch) -> None:
    # a Ctrl-C that came as the executor had started its workers, before the loader recorded
    # it, left an executor nothing closed: its workers ended unjoined, with their pipes open
    from conveyor.executors import processes

    made = processes.ProcessExecutor.__init__

    def interrupted(self: Any, *args: Any, **kw: Any) -> None:
        made(self, *args, **kw)
        signal.raise_signal(signal.SIGINT)  # handled at the next chance Python gets

    monkeypatch.setattr(processes.ProcessExecutor, "__init__", interrupted)
    before = Snapshot.take()
    loader = conveyor.DataLoader(Rows(16), batch_size=2, num_workers=2, **WORKERS)
    with pytest.raises(KeyboardInterrupt):
        next(iter(loader))
    loader.close()
    del loader
    assert_no_leaks(before)
