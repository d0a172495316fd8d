"""Errors that cross a process boundary and come back whole.

A worker that fails captures the exception as a :class:`Failure` (type,
pickled exception when possible, formatted traceback, worker id, indices).
The main process calls :func:`rebuild` and raises the *original* exception
type, with the worker's traceback chained as ``__cause__`` and a note naming
the worker and the batch's indices. When the type cannot be rebuilt (an
unpicklable exception, or a class that only exists in the worker), the user
gets a :class:`WorkerError` carrying the same information.
"""

from __future__ import annotations

import pickle
import traceback
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .executors.task import Death

__all__ = ["Failure", "RemoteTraceback", "SlowSettingWarning", "StartupError", "TooManyFailures", "WorkerDied",
           "WorkerError", "capture", "rebuild"]


class WorkerError(RuntimeError):
    """A worker failed with an exception that could not be rebuilt here.

    >>> raise WorkerError("ValueError: bad sample")  # doctest: +SKIP
    """

    def __init__(self, message: str, *, type_name: str = "", worker_id: int | None = None,
                 indices: Any = None) -> None:
        super().__init__(message)
        self.type_name = type_name
        self.worker_id = worker_id
        self.indices = indices

    def __reduce__(self) -> Any:  # (Exception's pickles args alone: the keywords would be lost)
        return type(self), (str(self),), self.__dict__


class WorkerDied(RuntimeError):
    """Worker processes died and could not (or may no longer) be replaced."""

    def __init__(self, message: str, deaths: list[Death] | None = None) -> None:
        # ``deaths`` may be left out: code that re-raises an exception as ``type(e)(message)``
        # (torch's ExceptionWrapper does, and so do tools adding context) gets this type back
        super().__init__(message)
        self.deaths = [] if deaths is None else deaths

    def __reduce__(self) -> Any:  # (Exception's pickles args alone, and deaths is required)
        return type(self), (str(self), self.deaths), self.__dict__


class StartupError(RuntimeError):
    """A worker process could not start."""


class TooManyFailures(RuntimeError):
    """More samples failed than ``max_failures`` allows under ``on_error="skip"``."""

    def __init__(self, message: str, failures: list[Failure] | None = None) -> None:
        super().__init__(message)  # (failures optional, as WorkerDied's deaths: type(e)(message) works)
        self.failures = [] if failures is None else failures

    def __reduce__(self) -> Any:  # (Exception's pickles args alone, and failures is required)
        return type(self), (str(self), self.failures), self.__dict__


class SlowSettingWarning(UserWarning):
    """A setting the user chose measurably slows loading (conveyor keeps it, and says so once).

    Filter it like any warning: ``warnings.simplefilter("ignore", SlowSettingWarning)``.
    """


class RemoteTraceback(Exception):
    """The traceback of an exception raised in a worker, as text."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text

    def __str__(self) -> str:
        return "\n\n" + self.text

    def __reduce__(self) -> Any:
        return type(self), (self.text,), self.__dict__


@dataclass(frozen=True, slots=True)
class Failure:
    """An exception captured in a worker, ready to travel between processes."""

    type_name: str
    message: str
    traceback: str
    payload: bytes | None
    worker_id: int | None
    indices: Any
    where: str = "fetching"
    # the exception itself, when it was raised in this process (the main process, a thread
    # worker): raised again as it is, frames and all; never pickled
    original: BaseException | None = None

    def __reduce__(self) -> Any:
        return (Failure, (self.type_name, self.message, self.traceback, self.payload, self.worker_id,
                          self.indices, self.where))

    def summary(self) -> str:
        return f"{self.type_name}: {self.message}"


def _describe_indices(indices: Any, limit: int = 16) -> str:
    if indices is None:
        return "the next batch of an iterable dataset"
    try:
        seq = list(indices)
    except TypeError:
        return f"index {indices!r}"
    if len(seq) == 1:
        return f"index {seq[0]}"
    shown = ", ".join(str(i) for i in seq[:limit])
    more = f", ... ({len(seq)} in all)" if len(seq) > limit else ""
    return f"indices [{shown}{more}]"


def _worker_name(worker_id: int | None) -> str:
    return "the main process" if worker_id is None else f"worker {worker_id}"


def capture(exc: BaseException, worker_id: int | None, indices: Any, where: str = "fetching",
            *, keep: bool = False) -> Failure:
    """Record ``exc`` (with its traceback) so it can be re-raised elsewhere; ``keep``: it will be
    raised in this process, so keep the exception object itself too (nothing to pickle)."""
    if indices is not None and type(indices) is not list:
        indices = list(indices)  # a batch sampler's array, tuple or range: reported as a list
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    payload: bytes | None = None
    if not keep:
        try:
            saved_tb = exc.__traceback__
            exc.__traceback__ = None
            try:
                payload = pickle.dumps(exc)
                pickle.loads(payload)
            finally:
                exc.__traceback__ = saved_tb
        except Exception:
            payload = None
    try:
        message = str(exc)
    except Exception as inner:  # an exception whose __str__ fails must still be reported
        message = f"<str() of the exception failed: {type(inner).__name__}: {inner}>"
    cls = type(exc)
    return Failure(
        type_name=f"{cls.__module__}.{cls.__qualname__}",
        message=message,
        traceback=text,
        payload=payload,
        worker_id=worker_id,
        indices=list(indices) if isinstance(indices, (list, tuple, range)) else indices,
        where=where,
        original=exc if keep else None,
    )


def rebuild(failure: Failure) -> BaseException:
    """The exception to raise in the main process for ``failure``."""
    if failure.indices is None and failure.where.startswith("running"):
        note = f"This exception was raised in {_worker_name(failure.worker_id)} while {failure.where}."
    else:
        note = (f"This exception was raised in {_worker_name(failure.worker_id)} while "
                f"{failure.where} {_describe_indices(failure.indices)}.")
    exc: BaseException | None = failure.original
    if exc is not None:
        # raised in this process: the exception itself, its own traceback and cause (the same
        # object may be raised for several batches: one note)
        if failure.worker_id is not None:
            note = f"Caught {_short_type(failure)} in DataLoader worker thread {failure.worker_id}.\n{note}"
        if note not in getattr(exc, "__notes__", ()):
            exc.add_note(note)
        _tag(exc, failure)
        return exc
    if failure.worker_id is not None:
        # torch's line (users and tests match on it: pytest's match= reads notes too), on a
        # note: the exception keeps its own message and attributes, where torch makes a new
        # one of the type from a message it rewrites
        note = f"Caught {_short_type(failure)} in DataLoader worker process {failure.worker_id}.\n{note}"
    if failure.payload is not None:
        try:
            exc = pickle.loads(failure.payload)
        except Exception:
            exc = None
    if not isinstance(exc, BaseException):
        exc = WorkerError(failure.summary(), type_name=failure.type_name,
                          worker_id=failure.worker_id, indices=failure.indices)
    exc.__cause__ = RemoteTraceback(failure.traceback)
    exc.add_note(note)
    _tag(exc, failure)
    return exc


def _short_type(failure: Failure) -> str:
    return failure.type_name.rpartition(".")[2]


def _tag(exc: BaseException, failure: Failure) -> None:
    try:
        exc.worker_id = failure.worker_id  # type: ignore[attr-defined]
        exc.indices = failure.indices  # type: ignore[attr-defined]
    except Exception:
        pass
