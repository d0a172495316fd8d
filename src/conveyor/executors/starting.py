"""Starting process workers: what a start is given (``Launch``), and what the main process
says when one does not start (``startup_hint``, ``signal_name``), or must stop (``my_children``,
``mp_servers``).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import sys
import threading
from collections.abc import Callable
from typing import Any

from .. import transport
from .._platform import gc_freeze
from ..transport import share
from .worker import WorkerSpec

__all__ = ["Launch", "START_TRIES", "mp_servers", "my_children", "signal_name", "startup_hint", "undo"]

# replacements of one dead worker started in a row while each is killed by a signal before
# its hello; the last one's death ends the epoch
START_TRIES = 3


def signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


_GUARD_HINT = (
    "With the '{method}' start method every worker re-imports your main module, so the "
    "code that creates and iterates the DataLoader must run only in the main process: "
    "put it under `if __name__ == \"__main__\":`. An unpicklable dataset, collate_fn or "
    "worker_init_fn also ends workers at start-up with this start method."
)


def mp_servers() -> set[int]:
    """multiprocessing's own helper processes (the resource tracker a first spawn starts, the
    fork server): children of ours, but everyone's, never to be stopped with a worker."""
    from multiprocessing import forkserver, resource_tracker

    pids = {getattr(resource_tracker._resource_tracker, "_pid", None),
            getattr(forkserver._forkserver, "_forkserver_pid", None)}
    return {p for p in pids if p is not None}


def startup_hint(spec: WorkerSpec, method: str) -> str:
    """Why a worker that re-imports the main module (spawn, forkserver) died before its hello:
    what the main module shows, else the usual causes. The worker printed its own error."""
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if not path or not os.path.exists(path):
        return (f"With the '{method}' start method every worker re-imports your main module, and "
                "this one has no file to import (a script read from stdin, or an interactive "
                "session): define the dataset, collate_fn and worker_init_fn in a module of their "
                "own and import them, or use multiprocessing_context='fork'. The worker's own "
                "error is printed above.")
    guarded = _under_main_guard(path)
    hidden = []
    for what, obj in (("dataset", spec.dataset), ("collate_fn", spec.collate_fn),
                      ("worker_init_fn", spec.worker_init_fn)):
        itself = isinstance(obj, type) or callable(obj) and hasattr(obj, "__qualname__")
        defined = obj if itself else type(obj)
        name = getattr(defined, "__qualname__", "").split(".")[0]
        if getattr(defined, "__module__", None) == "__main__" and name in guarded:
            hidden.append(f"the {what} {name}" if itself else f"the {what}'s class {name}")
    if hidden:
        said = " and ".join(hidden)
        verb = "is" if len(hidden) == 1 else "are"
        return (f"{said[0].upper()}{said[1:]} {verb} defined under `if __name__ == \"__main__\":`. "
                f"A worker started with '{method}' re-imports your main module without running that "
                "block, so it cannot find it: define it at module level, above the guard. The "
                "worker's own error is printed above.")
    return _GUARD_HINT.format(method=method) + " The worker's own error is printed above."


def _under_main_guard(path: str) -> set[str]:
    """Names a script defines only under ``if __name__ == "__main__":`` (classes, functions,
    assignments, imports), which a re-import of it as ``__mp_main__`` does not run."""
    import ast

    try:
        with open(path, "rb") as f:
            tree = ast.parse(f.read())
    except (OSError, SyntaxError, ValueError):
        return set()

    def is_guard(test: ast.expr) -> bool:
        if not (isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq)):
            return False
        sides = [test.left, test.comparators[0]]
        return (any(isinstance(x, ast.Name) and x.id == "__name__" for x in sides)
                and any(isinstance(x, ast.Constant) and x.value == "__main__" for x in sides))

    names: set[str] = set()

    def collect(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                names.add(node.name)
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                names.update((a.asname or a.name).split(".")[0] for a in node.names)
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                    names.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
            else:  # blocks inside the guard: if, for, while, with, try
                for field in ("body", "orelse", "finalbody"):
                    collect(getattr(node, field, []))
                for handler in getattr(node, "handlers", []):
                    collect(handler.body)

    for node in tree.body:
        if isinstance(node, ast.If) and is_guard(node.test):
            collect(node.body)
    return names


def my_children() -> set[int]:
    """Processes this thread forked (Linux: /proc/self/task/<tid>/children), else none known."""
    try:
        with open(f"/proc/self/task/{threading.get_native_id()}/children") as f:
            return {int(x) for x in f.read().split()}
    except (OSError, ValueError):
        return set()


def undo(exc: BaseException, proc: Any, before: set[int], segments: str, conns: tuple[Any, ...],
         bell: Any, w: int, method: str) -> None:
    """Undo worker ``w``'s start, cut short by ``exc`` (``before``: the children forked before
    it; ``segments``: the prefix of its slots' names), and say what ``exc`` may mean."""
    # a start that failed, or Ctrl-C while forking: a child that started is recorded
    # nowhere close() looks (the interrupt may land before multiprocessing keeps its
    # pid), so stop it here
    started = getattr(proc, "_popen", None) is not None
    if started:
        proc.kill()
        proc.join(2.0)
    for pid in my_children() - before - mp_servers():
        try:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        except OSError:
            pass
    transport.sweep(segments)
    for conn in conns:
        conn.close()
    if bell is not None:
        bell.close()
    if isinstance(exc, AssertionError) and mp.current_process().daemon:
        exc.add_note("This loader runs inside a worker process of another loader (its dataset "
                     "iterates a loader of its own), and worker processes cannot start processes: "
                     "give the inner loader worker_type='thread', or num_workers=0.")
    elif (isinstance(exc, Exception) and not started and method != "fork"
          and not getattr(mp.current_process(), "_inheriting", False)):
        # (a worker re-importing a main module with no guard lands here too: its
        # RuntimeError says so, the pickling note would mislead)
        exc.add_note(f"Starting worker {w} with the '{method}' start method pickles the "
                     "dataset, collate_fn and worker_init_fn: each must be picklable "
                     "(defined at module level, not a lambda or a local function).")


class Launch:
    """How a pool starts its workers: the multiprocessing context, the descriptors to make
    private to each forked worker, what a spawned worker is sent, and the gc freeze its
    fork workers hold."""

    def __init__(self, context: Any, private_files: Callable[[], tuple[int, ...]] | None,
                 shipping: share.ShipLog | None, collect: bool) -> None:
        self.ctx = context
        self.method = context.get_start_method()
        # descriptors of files the main process opened through the dataset, to be made private
        # to each forked worker (inherit.py); asked at each fork, as more may have been opened
        self.private_files = private_files
        # a spawned or forkserver worker receives the spec pickled: its arrays travel by
        # reference (transport.share), the copies of those no container holds kept here for
        # every worker of this pool; ``shipping`` hears what each start pickled and what the
        # pool copied
        self.shares = share.Registry(None if shipping is None else shipping.copied)
        self.shipping = shipping
        self.froze = False  # this pool holds a gc freeze (fork only)
        self.collect = collect  # may collect what the freeze kept when another pool holds it

    def freeze(self) -> None:
        """Before a fork: hold the gc freeze (once)."""
        if self.method == "fork" and not self.froze:
            self.froze = True
            gc_freeze.freeze(self.collect)

    def close(self) -> None:
        self.shares.close()
        if self.froze:
            self.froze = False
            gc_freeze.unfreeze()
