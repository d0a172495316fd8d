"""torch's wording where users and tools match on it: worker errors and deaths, the
too-many-workers warning, exceptions that pickle, and DataPipe shuffles under torch.manual_seed."""

from __future__ import annotations

import os
import pickle
import re
import signal
from typing import Any

import pytest
import torch
import torch.utils.data as tud

import conveyor
from conveyor.errors import Failure, RemoteTraceback, WorkerError, capture
from conveyor.executors.processes import StartupError
from conveyor.executors.task import Death, Task
from helpers import WORKERS, Failing, Snapshot, assert_no_leaks, drain


# --------------------------------------------------------------------------- worker errors


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", ["process", "thread", "inline"])
def test_a_worker_error_keeps_its_type_and_message_and_adds_torch_s_line(kind: str) -> None:
    kw = {"inline": {"num_workers": 0}}.get(kind, {"num_workers": 2, "worker_type": kind, **WORKERS})
    with pytest.raises(KeyError) as info:
        drain(conveyor.DataLoader(Failing(16, 6, KeyError), batch_size=4, **kw))
    exc = info.value
    assert exc.args == ("bad sample 6",)  # its own message and arguments, as raised
    notes = "\n".join(getattr(exc, "__notes__", []))
    if kind == "process":
        assert re.search(r"^Caught KeyError in DataLoader worker process [01]\.$", notes, flags=re.MULTILINE), notes
    elif kind == "thread":
        assert "Caught KeyError in DataLoader worker thread" in notes, notes
    else:  # the main process: torch adds nothing there either
        assert "Caught" not in notes, notes
    assert "[4, 5, 6, 7]" in notes  # conveyor's detail stays


@pytest.mark.timeout(60)
def test_pytest_match_finds_torch_s_line() -> None:
    loader = conveyor.DataLoader(Failing(8, 3), batch_size=2, num_workers=1, **WORKERS)
    with pytest.raises(ValueError, match=r"Caught ValueError in DataLoader worker process 0"):
        drain(loader)


# --------------------------------------------------------------------------- worker deaths


class _Dies(tud.Dataset):
    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> torch.Tensor:
        if i == 3:
            os.kill(os.getpid(), signal.SIGKILL)
        return torch.tensor([i])


@pytest.mark.timeout(90)
def test_a_worker_death_starts_as_torch_s_message_and_keeps_conveyor_s_detail() -> None:
    before = Snapshot.take()
    loader = conveyor.DataLoader(_Dies(), batch_size=2, num_workers=2, max_worker_restarts=0, **WORKERS)
    with pytest.raises(conveyor.WorkerDied, match=r"^DataLoader worker \(pid \d+\) is killed by signal: Killed\. ") as info:
        drain(loader)
    text = str(info.value)
    assert "(pid" in text and "SIGKILL" in text and "max_worker_restarts=0" in text, text
    assert "[2, 3]" in text, text  # the batch it held
    assert_no_leaks(before)


def test_death_words() -> None:
    task = Task(0, 0, [4, 5])
    assert Death(1, 77, -signal.SIGSEGV, (task,)).torch_words() == \
        "DataLoader worker (pid 77) is killed by signal: Segmentation fault."
    assert Death(0, 9, 3).torch_words() == "DataLoader worker (pid 9) exited unexpectedly with exit code 3."
    assert Death(0, 9, None).torch_words() == "DataLoader worker (pid 9) stopped responding."
    assert Death(0, 9, -9, cause="hung").torch_words() == "DataLoader worker (pid 9) was killed by the loader."


class _ExitsAtStart:
    def __call__(self, worker_id: int) -> None:
        os._exit(3)


@pytest.mark.timeout(90)
def test_a_worker_that_exits_while_starting_is_named_as_torch_names_it() -> None:
    before = Snapshot.take()
    loader = conveyor.DataLoader(list(range(8)), batch_size=2, num_workers=1, max_worker_restarts=0,
                                 worker_init_fn=_ExitsAtStart(), output="numpy", **WORKERS)
    with pytest.raises(StartupError, match=r"^DataLoader worker \(pid \d+\) exited unexpectedly during start-up"):
        drain(loader)
    assert_no_leaks(before)


# --------------------------------------------------------------------------- pickling


def _round_trip(exc: BaseException) -> BaseException:
    back = pickle.loads(pickle.dumps(exc))
    assert type(back) is type(exc) and str(back) == str(exc)
    return back


def test_every_public_exception_pickles_and_round_trips() -> None:
    err = _round_trip(WorkerError("ValueError: bad", type_name="x.Bad", worker_id=2, indices=[1, 2]))
    assert (err.type_name, err.worker_id, err.indices) == ("x.Bad", 2, [1, 2])  # type: ignore[attr-defined]

    deaths = [Death(1, 1234, -9, (Task(3, 0, [6, 7]),), None, "stack")]
    died = _round_trip(conveyor.WorkerDied("DataLoader worker (pid 1234) is killed by signal: Killed.", deaths))
    assert died.deaths == deaths  # type: ignore[attr-defined]

    try:
        raise ValueError("bad sample 6")
    except ValueError as e:
        failure = capture(e, 1, [6])
    many = _round_trip(conveyor.TooManyFailures("3 samples failed", [failure]))
    got = many.failures[0]  # type: ignore[attr-defined]
    assert (got.type_name, got.message, got.worker_id, got.indices) == ("builtins.ValueError", "bad sample 6", 1, [6])
    assert isinstance(got, Failure)

    trace = _round_trip(RemoteTraceback("Traceback (most recent call last):\n  ..."))
    assert trace.text.startswith("Traceback")  # type: ignore[attr-defined]
    _round_trip(StartupError("worker 0 (pid 5) exited during start-up with exit code 1."))


@pytest.mark.timeout(90)
def test_the_errors_a_loader_raises_pickle() -> None:
    # as raised, with their notes and tags: a trainer may send them to another process
    with pytest.raises(ValueError) as info:
        drain(conveyor.DataLoader(Failing(8, 3), batch_size=2, num_workers=1, **WORKERS))
    back = pickle.loads(pickle.dumps(info.value))
    assert str(back) == "bad sample 3" and back.__notes__ == info.value.__notes__
    with pytest.raises(conveyor.WorkerDied) as died:
        drain(conveyor.DataLoader(_Dies(), batch_size=2, num_workers=1, max_worker_restarts=0, **WORKERS))
    back = pickle.loads(pickle.dumps(died.value))
    assert str(back) == str(died.value) and len(back.deaths) == 1
    with pytest.raises(conveyor.TooManyFailures) as many:
        drain(conveyor.DataLoader(Failing(8, {1, 2, 3}), batch_size=2, on_error="skip", max_failures=1))
    back = pickle.loads(pickle.dumps(many.value))
    assert str(back) == str(many.value) and len(back.failures) == len(many.value.failures)


# --------------------------------------------------------------------------- warnings


def test_too_many_workers_warning_says_torch_s_phrase() -> None:
    with pytest.warns(UserWarning, match="excessive worker creation might get DataLoader running slow or even freeze"):
        conveyor.DataLoader(list(range(4)), num_workers=(os.cpu_count() or 1) + 64)


# --------------------------------------------------------------------------- DataPipes


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.timeout(90)
@pytest.mark.parametrize("workers, persistent", [(0, False), (2, False), (2, True)])
def test_manual_seed_before_each_epoch_repeats_a_datapipe_s_shuffle(workers: int, persistent: bool) -> None:
    datapipes = pytest.importorskip("torch.utils.data.datapipes.iter")
    orders = {}
    for make in (tud.DataLoader, conveyor.DataLoader):
        kw = WORKERS if make is conveyor.DataLoader and workers else {}
        loader = make(datapipes.IterableWrapper(range(24)).shuffle().sharding_filter(), batch_size=4, shuffle=True,
                      num_workers=workers, persistent_workers=persistent, **kw)
        epochs = []
        for _ in range(2):
            torch.manual_seed(11)
            epochs.append([int(v) for b in loader for v in b])
        unseeded = [int(v) for b in loader for v in b]
        assert epochs[0] == epochs[1], make
        assert unseeded != epochs[0] and sorted(unseeded) == list(range(24))
        orders[make] = epochs[0]
        if hasattr(loader, "close"):
            loader.close()
    assert orders[tud.DataLoader] == orders[conveyor.DataLoader]


@pytest.mark.parametrize("cls", [conveyor.WorkerDied, conveyor.TooManyFailures, conveyor.WorkerError])
def test_a_public_exception_is_rebuilt_from_its_message_alone(cls: type) -> None:
    # torch's ExceptionWrapper re-raises as exc_type(message), and so do tools that add
    # context to an error: the same type comes back, with its message (torch's own
    # test_segfault reads a worker death this way)
    rebuilt = cls("DataLoader worker (pid 1) is killed by signal: Segmentation fault.")
    assert type(rebuilt) is cls
    assert str(rebuilt).startswith("DataLoader worker (pid 1)")
