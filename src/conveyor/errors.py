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
from typing import Any

__all__ = ["Failure", "RemoteTraceback", "WorkerError", "capture", "rebuild"]


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


class RemoteTraceback(Exception):
    """The traceback of an exception raised in a worker, as text."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text

    def __str__(self) -> str:
        return "\n\n" + self.text


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


def capture(exc: BaseException, worker_id: int | None, indices: Any, where: str = "fetching") -> Failure:
    """Record ``exc`` (with its traceback) so it can be re-raised elsewhere."""
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    payload: bytes | None
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
    cls = type(exc)
    return Failure(
        type_name=f"{cls.__module__}.{cls.__qualname__}",
        message=str(exc),
        traceback=text,
        payload=payload,
        worker_id=worker_id,
        indices=list(indices) if isinstance(indices, (list, tuple, range)) else indices,
        where=where,
    )


def rebuild(failure: Failure) -> BaseException:
    """The exception to raise in the main process for ``failure``."""
    if failure.indices is None and failure.where.startswith("running"):
        note = f"This exception was raised in {_worker_name(failure.worker_id)} while {failure.where}."
    else:
        note = (f"This exception was raised in {_worker_name(failure.worker_id)} while "
                f"{failure.where} {_describe_indices(failure.indices)}.")
    exc: BaseException | None = None
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
    try:
        exc.worker_id = failure.worker_id  # type: ignore[attr-defined]
        exc.indices = failure.indices  # type: ignore[attr-defined]
    except Exception:
        pass
    return exc
