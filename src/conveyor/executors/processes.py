"""``worker_type="process"``: workers are child processes (fork, spawn, forkserver).

Each worker has its own pair of pipes (orders in, results out). The main
process waits on every result pipe *and* every worker's sentinel at once,
so a worker that dies is seen the moment the loader waits, not after a
timeout. Results carry shared-memory slot references (see ``transport``);
slots freed by the garbage collector ride back on the next order.
"""

from __future__ import annotations

import _thread
import atexit
import contextlib
import gc
import math
import multiprocessing as mp
import os
import select
import signal
import sys
import tempfile
import threading
import time
import warnings
from multiprocessing.connection import Connection, wait
from collections.abc import Callable
from typing import Any

from .. import transport
from ..errors import StartupError, rebuild
from ..transport import share
from .base import Event, Ledger, hold_ctrl_c
from .task import Death, Doorbell, Hello, Inbox, Order, Result, Task, send
from .worker import WorkerSpec, serve, stack_path

__all__ = ["ProcessExecutor", "StartupError"]


# replacements of one dead worker started in a row while each is killed by a signal before
# its hello; the last one's death ends the epoch
START_TRIES = 3


def _signal_name(number: int) -> str:
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


def _mp_servers() -> set[int]:
    """multiprocessing's own helper processes (the resource tracker a first spawn starts, the
    fork server): children of ours, but everyone's, never to be stopped with a worker."""
    from multiprocessing import forkserver, resource_tracker

    pids = {getattr(resource_tracker._resource_tracker, "_pid", None),
            getattr(forkserver._forkserver, "_forkserver_pid", None)}
    return {p for p in pids if p is not None}


def _startup_hint(spec: WorkerSpec, method: str) -> str:
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


class _Worker:
    __slots__ = ("proc", "tasks", "results", "gen", "pid", "ready", "inbox", "bell", "born", "reaped")

    def __init__(self, proc: Any, tasks: Connection, results: Connection, gen: int,
                 bell: Doorbell | None = None) -> None:
        self.proc = proc
        self.tasks = tasks
        self.bell = bell  # rung after every order (fork workers on Linux; else the pipe wakes)
        self.results = results
        self.gen = gen
        self.pid: int | None = proc.pid
        self.ready = False
        self.inbox = Inbox(results)  # every read of ``results`` goes through it
        self.born = time.monotonic()
        self.reaped = False


class ProcessExecutor:
    kind = "process"

    def __init__(self, spec: WorkerSpec | Callable[[], WorkerSpec], num_workers: int, context: Any = None,
                 *, pinner: Any = None, private_files: Callable[[], tuple[int, ...]] | None = None,
                 collect: bool = True, shipped: Callable[[float, int, int, float], None] | None = None) -> None:
        if context is None:
            context = mp.get_context()
        elif isinstance(context, str):
            context = mp.get_context(context)
        self.ctx = context
        self.method = context.get_start_method()
        # the spec comes from a function (the loader's pool's, through a weak reference): what
        # closes this executor must not keep the user's dataset and collate_fn (and so a loader
        # they may refer to) reachable, or a loader dropped in a reference cycle would live on
        self._spec_of: Callable[[], WorkerSpec] = spec if callable(spec) else (lambda: spec)
        self.output = self.spec.output
        # descriptors of files the main process opened through the dataset, to be made private
        # to each forked worker (inherit.py); asked at each fork, as more may have been opened
        self._private_files = private_files
        finish_cut_short()
        self.num_workers = num_workers
        self.ledger = Ledger(num_workers)
        self.prefix = transport.new_prefix() if transport.available() else ""
        global _swept
        if self.prefix and not _swept:
            _swept = True
            transport.sweep_stale()  # what killed runs left in /dev/shm: once a process
        self.views = transport.Views(pinner)
        # a spawned or forkserver worker receives the spec pickled: its arrays travel by
        # reference (transport.share), the copies of those no container holds kept here for
        # every worker of this pool; ``shipped`` hears what each start pickled
        self.shares = share.Registry()
        self._shipped = shipped
        self.workers: list[_Worker | None] = [None] * num_workers
        self.gens = [0] * num_workers
        self.closed = False
        self._shut = False  # close() ran to its end
        # close() from another thread than the one iterating, while that one's epoch ends and
        # closes too: one runs, the other waits for it (the two closed each worker's bell, the
        # second time another file's descriptor, perhaps). A finalizer re-entering returns.
        self._closing = threading.RLock()
        self._in_close = False
        self._reaping = threading.Lock()
        self.warned = False
        self.hung: set[int] = set()  # workers a timeout found stuck: close() kills them at once
        self.kill_causes: dict[int, tuple[str, str | None]] = {}  # workers killed on purpose: why
        self.start_deaths: list[Death] = []  # replacements killed before their hello (restart)
        self.pending_freed: dict[tuple[int, int], list[int]] = {}  # (worker, gen) -> slot ids
        # results received and not yet decoded or released, by (worker, gen): their slots must
        # stay readable when that worker dies and its segments are unlinked
        self.undecoded: dict[tuple[int, int], dict[int, tuple[tuple[int, str], ...]]] = {}
        self.dying: set[tuple[int, int]] = set()  # dead generations whose slots are still to be read
        self.froze = False  # this pool holds a gc freeze (fork only)
        self.collect = collect  # may collect what the freeze kept when another pool holds it
        # one poll set for every result pipe and sentinel, kept across calls
        self._poller = select.poll() if hasattr(select, "poll") else None
        self._fds: dict[int, tuple[int, bool]] = {}  # fd -> (worker, is its sentinel)
        self.parent_pid = os.getpid()
        # where workers write their stacks (stack_path): the first gettempdir() of a process
        # writes a probe file to choose the directory, ~1 ms in a freshly forked worker; asked
        # here, forked workers inherit the answer (0.96 -> 0.20 ms in the child)
        tempfile.gettempdir()
        try:
            for w in range(num_workers):
                self.workers[w] = self._spawn(w)
                self._watch(w, self.workers[w])
        except BaseException:
            self.close()
            raise

    @property
    def spec(self) -> WorkerSpec:
        spec = self._spec_of()
        if spec is None:
            raise RuntimeError("this DataLoader is gone: its workers cannot be restarted")
        return spec

    # -- start-up ---------------------------------------------------------
    def _spawn(self, w: int) -> _Worker:
        gen = self.gens[w]
        self.hung.discard(w)
        task_r, task_w = self.ctx.Pipe(duplex=False)
        res_r, res_w = self.ctx.Pipe(duplex=False)
        private = self._private_files() if self._private_files is not None and self.method == "fork" else ()
        # a forked child inherits the bell's descriptor; a spawned one would need it sent
        bell = Doorbell.make() if self.method == "fork" else None
        # a forked worker inherits the spec as it is; any other is sent it pickled
        spec: Any = self.spec if self.method == "fork" else share.Shipped(self.spec, self.shares)
        proc = self.ctx.Process(
            target=serve,
            args=(spec, w, gen, task_r, res_w, self.parent_pid, self.prefix, private, bell,
                  self.method == "spawn"),
            name=f"conveyor-worker-{w}",
            daemon=True,
        )
        if self.method == "fork" and not self.froze:
            self.froze = True
            _freeze(self.collect)
        before = _my_children()
        held = _CtrlCHeld()
        try:
            with held:
                proc.start()
            task_r.close()
            res_w.close()
            wk = _Worker(proc, task_w, res_r, gen, bell)
            self.workers[w] = wk  # recorded at once: close() now knows it, whatever comes next
        except BaseException as exc:
            # a start that failed, or Ctrl-C while forking: a child that started is recorded
            # nowhere close() looks (the interrupt may land before multiprocessing keeps its
            # pid), so stop it here
            started = getattr(proc, "_popen", None) is not None
            if started:
                proc.kill()
                proc.join(2.0)
            for pid in _my_children() - before - _mp_servers():
                try:
                    os.kill(pid, signal.SIGKILL)
                    os.waitpid(pid, 0)
                except OSError:
                    pass
            transport.sweep(f"{self.prefix}w{w}g{gen}_")
            for conn in (task_r, task_w, res_r, res_w):
                conn.close()
            if bell is not None:
                bell.close()
            if isinstance(exc, AssertionError) and mp.current_process().daemon:
                exc.add_note("This loader runs inside a worker process of another loader (its dataset "
                             "iterates a loader of its own), and worker processes cannot start processes: "
                             "give the inner loader worker_type='thread', or num_workers=0.")
            elif (isinstance(exc, Exception) and not started and self.method != "fork"
                  and not getattr(mp.current_process(), "_inheriting", False)):
                # (a worker re-importing a main module with no guard lands here too: its
                # RuntimeError says so, the pickling note would mislead)
                exc.add_note(f"Starting worker {w} with the '{self.method}' start method pickles the "
                             "dataset, collate_fn and worker_init_fn: each must be picklable "
                             "(defined at module level, not a lambda or a local function).")
            raise
        if isinstance(spec, share.Shipped) and self._shipped is not None:
            self._shipped(spec.seconds, spec.nbytes, spec.shared, spec.moved_s)
        held.deliver()  # a Ctrl-C while forking: now, with the worker recorded for close() to stop
        return wk

    # -- running ----------------------------------------------------------
    def submit(self, worker: int, tasks: list[Task], grouped: bool = False) -> None:
        """Send ``worker`` its next tasks in one order; ``grouped``: it sends their results
        back in one message, once the last is made (executors/grouping.py)."""
        wk = self.workers[worker]
        assert wk is not None
        # tasks counted as held and never sent (a Ctrl-C between the two) would keep the worker
        # counted busy for good; ``send`` itself finishes a frame before raising one
        with hold_ctrl_c():
            self.ledger.add(worker, tasks)
            freed = self._freed_for(worker, wk.gen)
            try:
                # plain tuples, not an Order of Tasks: the worker unpickles one for every batch, a
                # class lookup and a constructor call each cost it a few microseconds cold
                order = ([tuple(t) for t in tasks], freed, True) if grouped else ([tuple(t) for t in tasks], freed)
                send(wk.tasks, order, wk.bell)
            except (BrokenPipeError, OSError):
                pass  # the worker died; poll() reports it and recovery re-issues the tasks

    def _freed_for(self, worker: int, gen: int) -> tuple[int, ...]:
        pending = self.pending_freed
        for key in self.views.take_freed():
            pending.setdefault((key[0], key[1]), []).append(key[2])
        ids = pending.pop((worker, gen), None)
        return tuple(ids) if ids else ()

    def flush_freed(self) -> None:
        """Send freed slots to workers that have no task to carry them."""
        for key in self.views.take_freed():
            self.pending_freed.setdefault((key[0], key[1]), []).append(key[2])
        for (w, gen), ids in list(self.pending_freed.items()):
            wk = self.workers[w]
            if wk is None or wk.gen != gen:
                del self.pending_freed[(w, gen)]
                continue
            if len(ids) >= 2:
                del self.pending_freed[(w, gen)]
                try:
                    _tell(wk, Order((), tuple(ids)))
                except (BrokenPipeError, OSError):
                    pass

    def _ready(self, timeout: float | None) -> list[tuple[int, bool]]:
        """(worker, is its sentinel) for every pipe or sentinel ready within ``timeout``."""
        if self._poller is None:  # no select.poll here: build the wait list each time
            conns: dict[Any, tuple[int, bool]] = {}
            for w, wk in enumerate(self.workers):
                if wk is not None:
                    conns[wk.results] = (w, False)
                    conns[wk.proc.sentinel] = (w, True)
            return [conns[obj] for obj in wait(list(conns), timeout)] if conns else []
        if not self._fds:
            return []
        ms = -1 if timeout is None else max(0, math.ceil(timeout * 1000))
        while True:
            try:
                ready = self._poller.poll(ms)
                break
            except InterruptedError:  # pragma: no cover - PEP 475 retries on its own
                continue
        return [self._fds[fd] for fd, _ in ready if fd in self._fds]

    def _watch(self, w: int, wk: _Worker) -> None:
        if self._poller is not None:
            for fd, sentinel in ((wk.results.fileno(), False), (wk.proc.sentinel, True)):
                self._poller.register(fd, select.POLLIN | select.POLLHUP | select.POLLERR)
                self._fds[fd] = (w, sentinel)

    def _unwatch(self, wk: _Worker) -> None:
        if self._poller is not None:
            for fd in [fd for fd, (w, _) in self._fds.items() if self.workers[w] is wk]:
                self._poller.unregister(fd)
                del self._fds[fd]

    def poll(self, timeout: float | None) -> list[Event]:
        return self.take_ready(self._ready(timeout))

    def wait_ready(self, timeout: float | None) -> list[tuple[int, bool]]:
        """``poll`` in two: wait up to ``timeout`` for pipes or sentinels to be ready (a Ctrl-C
        may cut this short), then ``take_ready`` what they hold (to be held from a Ctrl-C, with
        whatever records the results it returns: a result read and not recorded is lost)."""
        return self._ready(timeout)

    def take_ready(self, ready: list[tuple[int, bool]]) -> list[Event]:
        events: list[Event] = []
        dead: set[int] = set()
        for w, sentinel in ready:
            wk = self.workers[w]
            assert wk is not None
            if not sentinel:
                try:
                    msgs = wk.inbox.take()
                except OSError:
                    dead.add(w)
                    continue
                for msg in msgs:
                    if type(msg) is tuple:
                        result = _result(msg)
                        self._note(w, wk, result)
                        events.append(result)
                    elif type(msg) is list:  # a group's results (executors/grouping.py)
                        for fields in msg:
                            result = _result(fields)
                            self._note(w, wk, result)
                            events.append(result)
                    elif isinstance(msg, Hello):
                        self._hello(wk, msg)
                if wk.inbox.eof:
                    dead.add(w)
            else:
                dead.add(w)
        for w in sorted(dead):
            wk = self.workers[w]
            assert wk is not None
            # drain what it sent before dying
            try:
                while not wk.inbox.eof and wait([wk.results], 0):
                    for msg in wk.inbox.take():
                        for fields in msg if type(msg) is list else [msg] if type(msg) is tuple else []:
                            result = _result(fields)
                            self._note(w, wk, result)
                            events.append(result)
            except OSError:
                pass
            wk.proc.join(0.5)
            if wk.proc.exitcode is None and wk.proc.is_alive():
                continue  # pipe closed but still running: wait for the sentinel
            code = wk.proc.exitcode
            if not wk.ready and w not in self.kill_causes and (code is None or code >= 0):
                # it failed to start (an import, an unpicklable dataset): another would too.
                # One killed by a signal (the OOM killer, this loader's restart_hung) is a death
                # like any other, replaced within max_worker_restarts
                raise self._startup_error(w, wk)
            cause, stack = self.kill_causes.pop(w, (None, None))
            events.append(Death(w, wk.pid, wk.proc.exitcode, tuple(self.ledger.held[w].values()), cause, stack))
        return events

    def _hello(self, wk: _Worker, msg: Hello) -> None:
        if msg.failure is not None:
            raise rebuild(msg.failure)
        wk.ready = True
        wk.pid = msg.pid

    @property
    def ready(self) -> int:
        """How many workers have finished starting."""
        return sum(1 for wk in self.workers if wk is not None and wk.ready)

    def _startup_error(self, w: int, wk: _Worker) -> StartupError:
        code = wk.proc.exitcode
        hint = "" if self.method == "fork" else " " + _startup_hint(self.spec, self.method)
        moved = share.failure()  # the copy of the dataset's arrays into shared memory failed: the workers stop
        if moved is not None:
            hint = f" The main process could not copy the dataset's arrays into shared memory: {moved!r}."
        # torch's words first ("DataLoader worker (pid 12) exited unexpectedly"): users match on them
        err = StartupError(f"DataLoader worker (pid {wk.proc.pid}) exited unexpectedly during start-up with exit "
                           f"code {code} (worker {w}).{hint}")
        err.__cause__ = moved
        return err

    def _note(self, w: int, wk: _Worker, msg: Result) -> None:
        self.ledger.done(w, msg.seq)
        packed = msg.batch
        if isinstance(packed, transport.Packed) and packed.slots:
            self.undecoded.setdefault((packed.worker, packed.gen), {})[msg.seq] = packed.slots
        if msg.retired:
            self.views.retire(w, wk.gen, list(msg.retired))
        if msg.warning and not self.warned:
            self.warned = True
            warnings.warn(f"conveyor: shared memory is unavailable ({msg.warning}); batches now travel "
                          "through pipes, which is slower. Enlarge /dev/shm (e.g. docker --shm-size) "
                          "to get zero-copy batches back.", RuntimeWarning, stacklevel=4)

    def outstanding(self, worker: int) -> int:
        return self.ledger.count(worker)

    def grow(self, n: int) -> None:
        """Start more workers, up to ``n`` in all (they say hello in ``poll``)."""
        while self.num_workers < n:
            w = self.num_workers
            self.workers.append(None)
            self.gens.append(0)
            self.ledger.held.append({})
            self.num_workers += 1
            try:
                self.workers[w] = self._spawn(w)
            except BaseException:
                # the fork failed (EAGAIN, ENOMEM, EMFILE: the pressure "auto" grows under):
                # no phantom worker is left counted, which the next submit would trip over
                self.num_workers -= 1
                del self.workers[w], self.gens[w], self.ledger.held[w]
                raise
            self._watch(w, self.workers[w])

    def set_rng(self, worker: int, state: Any) -> None:
        """``worker`` takes over these global RNG states before its next task."""
        wk = self.workers[worker]
        if wk is not None:
            try:
                _tell(wk, Order(rng=state))
            except (BrokenPipeError, OSError):
                pass

    def set_threads(self, n: int) -> None:
        """Every worker fetches ``n`` samples at once from now on."""
        for wk in self.workers:
            if wk is not None:
                try:
                    _tell(wk, Order(threads=n))
                except (BrokenPipeError, OSError):
                    pass

    def alive(self, worker: int) -> bool:
        wk = self.workers[worker]
        return wk is not None and wk.proc.is_alive()

    def pid(self, worker: int) -> int | None:
        wk = self.workers[worker]
        return None if wk is None else wk.pid

    def restart(self, worker: int, wait_s: float = 60.0, tries: int = START_TRIES, spent: str = "") -> list[Task]:
        """Replace a dead worker (new generation); its unfinished tasks are returned. A
        replacement killed by a signal before its hello is replaced in turn, ``tries``
        replacements in all (the loader's restart budget; ``spent`` says so when it runs out);
        each such death is kept for ``take_start_deaths``."""
        old = self.workers[worker]
        if self.closed:
            raise RuntimeError("this DataLoader's workers were shut down")
        if old is not None:
            self._unwatch(old)
            self._reap(old)
            # batches it finished that wait to be handed out are read from its slots later:
            # map those now, before the slots are unlinked; the rest of its mappings go
            key = (worker, old.gen)
            for slots in self.undecoded.get(key, {}).values():
                for slot_id, name in slots:
                    self.views.keep((worker, old.gen, slot_id), name)
            if key in self.undecoded:
                self.dying.add(key)
            else:
                self.views.forget_worker(worker, old.gen)
            transport.sweep(f"{self.prefix}w{worker}g{old.gen}_")
            self.pending_freed.pop((worker, old.gen), None)
            # reaped (its process object closed): a Ctrl-C while the replacement starts left
            # it here, and every close() after raised "process object is closed"
            self.workers[worker] = None
        tasks = self.ledger.take(worker)
        deadline = time.monotonic() + wait_s
        tries = max(1, tries)
        for attempt in range(1, tries + 1):
            self.gens[worker] += 1
            wk = self._spawn(worker)
            self.workers[worker] = wk
            if self.closed:  # close() from another thread while this one started
                with contextlib.suppress(ValueError):
                    self._reap(wk, timeout=0.0)
                self.workers[worker] = None
                raise RuntimeError("this DataLoader's workers were shut down")
            self._watch(worker, wk)
            # wait for its hello so start-up failures surface here
            code = self._await_hello(worker, wk, deadline, wait_s)
            if code is None:
                return tasks
            how = f"was killed by {_signal_name(-code)}" if code < 0 else f"exited with code {code}"
            if code >= 0 or attempt == tries:
                # it failed to start (an import, worker_init_fn): another would too
                row = f"{attempt} replacements in a row" if attempt > 1 else ""
                if code < 0 and spent:
                    row = f"{row}{'; ' if row else ''}{spent}"
                raise StartupError(f"replacement for worker {worker} {how} during start-up"
                                   + (f" ({row})" if row else ""))
            self.start_deaths.append(Death(worker, wk.pid, code))
            # killed by a signal (the OOM killer, a scheduler, a user) before its hello: a death
            # like one after it, which the next replacement makes good. It ended the epoch.
            self._unwatch(wk)
            self._reap(wk, timeout=0.0)
            self.workers[worker] = None
            transport.sweep(f"{self.prefix}w{worker}g{wk.gen}_")
        raise AssertionError("unreachable")  # pragma: no cover

    def take_start_deaths(self) -> list[Death]:
        """Replacements killed before their hello since the last call (``restart``)."""
        out, self.start_deaths = self.start_deaths, []
        return out

    def _await_hello(self, worker: int, wk: _Worker, deadline: float, wait_s: float) -> int | None:
        """Wait for a replacement's hello: None once it is ready, else its exit code."""
        while not wk.ready:
            left = deadline - time.monotonic()
            ready = wait([wk.results, wk.proc.sentinel], left) if left > 0 else []
            if not ready:
                wk.proc.kill()  # close() reaps it
                raise StartupError(f"replacement for worker {worker} did not start within {wait_s:g} s "
                                   "(its worker_init_fn, or an import, may hang)")
            try:
                msgs = wk.inbox.take() if wk.results in ready else []
            except OSError:
                msgs = []
            for msg in msgs:
                if isinstance(msg, Hello):
                    self._hello(wk, msg)
            if not wk.ready and (wk.inbox.eof or not msgs and wk.results not in ready):
                wk.proc.join(1.0)
                code = wk.proc.exitcode
                return 1 if code is None else code
        return None

    def starting_for(self, worker: int) -> float | None:
        """Seconds since ``worker`` was started, while it has not said it is ready (it is
        still importing, unpickling the dataset or running worker_init_fn); else None."""
        wk = self.workers[worker]
        if wk is None or wk.ready:
            return None
        return time.monotonic() - wk.born

    def stack(self, worker: int) -> str | None:
        """Ask a (hung) worker for its Python stack; None when it cannot say."""
        wk = self.workers[worker]
        if wk is None or wk.pid is None:
            return None
        path = stack_path(self.prefix, worker, wk.gen)
        try:
            before = os.path.getsize(path)
        except OSError:
            return None
        try:
            os.kill(wk.pid, signal.SIGUSR1)
        except OSError:
            return None
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline:
            time.sleep(0.05)
            try:
                if os.path.getsize(path) > before:
                    time.sleep(0.05)
                    with open(path, encoding="utf-8", errors="replace") as f:
                        f.seek(before)
                        return f.read()
            except OSError:
                return None
        return None

    def kill(self, worker: int, cause: str | None = None, stack: str | None = None) -> None:
        """Kill ``worker``; its Death then says ``cause`` (and its last ``stack``)."""
        wk = self.workers[worker]
        if wk is not None and wk.proc.is_alive():
            if cause is not None:
                self.kill_causes[worker] = (cause, stack)
            wk.proc.kill()

    def release(self, result: Result) -> None:
        packed = result.batch
        if isinstance(packed, transport.Packed) and packed.slots:
            key = (packed.worker, packed.gen)
            self.pending_freed.setdefault(key, []).extend(i for i, _ in packed.slots)
            self._read(key, result.seq)

    def decode(self, result: Result) -> Any:
        packed = result.batch
        if isinstance(packed, transport.Packed):
            batch = transport.decode(packed, self.views, output=self.output)
            if packed.slots:
                self._read((packed.worker, packed.gen), result.seq)
            return batch
        return packed

    def _read(self, key: tuple[int, int], seq: int) -> None:
        """A result's slots were read (or will not be): a dead generation with none left to
        read gives up its mappings (views the user holds keep theirs)."""
        waiting = self.undecoded.get(key)
        if waiting is not None:
            waiting.pop(seq, None)
            if not waiting:
                del self.undecoded[key]
        if key in self.dying and key not in self.undecoded:
            self.dying.discard(key)
            self.views.forget_worker(*key)

    # -- shutdown ---------------------------------------------------------
    def _reap(self, wk: _Worker, timeout: float = 5.0) -> None:
        with self._reaping:  # once: a second close of its descriptors may close another file's
            if wk.reaped:
                return
            wk.reaped = True
        try:
            try:
                _tell(wk, Order(stop=True))
            except (BrokenPipeError, OSError):
                pass
            wk.proc.join(timeout)
            if wk.proc.is_alive():
                wk.proc.terminate()
                wk.proc.join(2.0)
            if wk.proc.is_alive():
                wk.proc.kill()
                wk.proc.join(2.0)
        except BaseException:
            wk.reaped = False  # cut short (Ctrl-C) while it waited: the next close() reaps it
            raise
        for conn in (wk.tasks, wk.results):
            try:
                conn.close()
            except OSError:
                pass
        if wk.bell is not None:
            wk.bell.close()
        try:
            wk.proc.close()
        except ValueError:
            pass
        try:
            os.unlink(stack_path(self.prefix, self.workers.index(wk), wk.gen))
        except (OSError, ValueError):
            pass

    def close(self) -> None:
        # ``closed`` stops restarts at once; ``_shut`` says every step ran. A close() cut short
        # (Ctrl-C while it waits for a worker) is finished by the next call: each step can run
        # again, and a worker is forgotten only once it is reaped.
        if self._shut or os.getpid() != self.parent_pid:
            return  # a forked child inherits this object: only its creator may close it
        with self._closing:
            if self._shut or self._in_close:
                return
            self._in_close = True
            try:
                self._close()
            except BaseException:
                # cut short (Ctrl-C while it waited for a worker), perhaps in a finalizer that
                # runs once: the next pool to start, or the next close of any, finishes it
                if self not in _cut_short:
                    _cut_short.append(self)
                raise
            finally:
                self._in_close = False
        if self in _cut_short:
            _cut_short.remove(self)

    def _close(self) -> None:
        self.closed = True
        # (another thread iterating may be replacing a worker meanwhile: one it reaped has its
        # process object closed, one it started after this snapshot is reaped by the next round)
        # at interpreter exit (the loader's finalizer, from atexit) nothing waits for a batch:
        # a worker holding some is in a sample, and would read the stop order only once its
        # batch is made; one stuck there held the exit up for the 5 s below (torch's workers
        # are ended by multiprocessing's own exit hook at once)
        exiting = _exiting or not threading.main_thread().is_alive()
        while live := [(w, wk) for w, wk in enumerate(self.workers) if wk is not None]:
            for w, wk in live:
                with contextlib.suppress(ValueError):  # closed: reaped by that other thread
                    if w in self.hung or exiting and self.ledger.count(w):
                        wk.proc.kill()  # stuck in a sample: it would not read the stop order in time
                    elif not wk.ready:
                        # still starting (importing, worker_init_fn), holding no batch: it would
                        # read the stop order only once started. A spawned worker imports for
                        # ~1 s, and an epoch the main process made alone waited that long for it
                        wk.proc.terminate()
            for _, wk in live:
                try:
                    _tell(wk, Order(stop=True))
                except (BrokenPipeError, OSError):
                    pass
            deadline = time.monotonic() + 5.0
            for _, wk in live:
                with contextlib.suppress(ValueError):
                    wk.proc.join(max(0.0, deadline - time.monotonic()))
            for w, wk in live:
                with contextlib.suppress(KeyError):  # unwatched by that other thread
                    self._unwatch(wk)
                with contextlib.suppress(ValueError, AttributeError):
                    self._reap(wk, timeout=0.0)
                if self.workers[w] is wk:
                    self.workers[w] = None
        self.views.close()
        self.shares.close()
        transport.sweep(self.prefix)
        _sweep_stacks(self.prefix)
        if self.froze:
            self.froze = False
            _unfreeze()
        self._shut = True


_cut_short: list[ProcessExecutor] = []  # closes a Ctrl-C cut short, that nothing else would finish
_exiting = False  # the interpreter runs its exit hooks (see _close)


def _note_exit() -> None:
    global _exiting
    _exiting = True


atexit.register(_note_exit)  # (hooks run last registered first: before finalizers registered later)


def finish_cut_short() -> None:
    """Finish the closes a Ctrl-C cut short (their workers, slots, bells and gc freeze were
    kept for the rest of the process where the close ran from a finalizer, which runs once)."""
    for ex in list(_cut_short):
        try:
            ex.close()
        except Exception:  # noqa: BLE001 - it stays listed, for the next try
            pass


class _CtrlCHeld:
    """Holds a Ctrl-C that arrives inside the block, for ``deliver()`` once it is over.

    Forking runs ``os.register_at_fork`` hooks in the parent (logging's lock release): a
    KeyboardInterrupt raised in one is reported as ignored, and the training loop went on
    (3 of 30 interrupted runs with 2 workers, 12 of 40 during worker restarts). Only the
    main thread sets handlers; a handler that is not Python's (ignored, or the default
    action) is left alone."""

    def __init__(self) -> None:
        self.handler: Any = None
        self.frames: list[Any] = []

    def __enter__(self) -> _CtrlCHeld:
        if threading.current_thread() is threading.main_thread():
            handler = signal.getsignal(signal.SIGINT)
            if callable(handler):
                self.handler = handler
                signal.signal(signal.SIGINT, lambda signum, frame: self.frames.append(frame))
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.handler is not None:
            signal.signal(signal.SIGINT, self.handler)

    def deliver(self) -> None:
        if self.frames and self.handler is not None:
            self.frames, frame = [], self.frames[0]
            self.handler(signal.SIGINT, frame)


def _tell(wk: _Worker, order: Order) -> None:
    """Send a worker an order outside the per-batch path (ringing its bell)."""
    send(wk.tasks, order, wk.bell)


def _result(fields: tuple[Any, ...]) -> Result:
    """A worker's Result from the plain tuple it sent (``Result.fields``; the batch, when
    there is one, as the fields of a ``Packed``)."""
    result = Result(*fields)
    if result.batch is not None:
        result.batch = transport.Packed._make(result.batch)
    return result


# Copy-on-read: a garbage collection walks every tracked object and writes to its
# header, so after a fork each page of Python objects that either process scans gets
# copied, until every worker holds a copy of the dataset's lists and dicts. Objects
# frozen with gc.freeze() are never scanned, so while fork workers run, the objects
# that existed when they started stay shared by all. The freeze is counted across
# loaders and lifted when the last such pool closes (unless the user froze first).
_freezes = 0
_user_froze = False
_sigint_held = False  # a Ctrl-C taken in a full collection's callback, for its end
_in_callback = False  # _see_full_collections is starting the thread that sends it again
_swept = False  # stale segments of dead processes removed (transport.sweep_stale)
# Python 3.12's collector keeps immortal objects in the frozen generation: 375 at start on
# 3.12.1, back after every collection even once unfrozen (3.11 and 3.13 start with none).
# Counted as the user's freeze, they kept every freeze of ours in place for good, and
# loaders dropped in a reference cycle were never collected. Only a count above this
# baseline is the user's. (A user who froze before importing conveyor on 3.12 is then
# taken for one who did not: the last pool's close unfreezes their objects too.)
_FROZEN_AT_START = gc.get_freeze_count() if sys.version_info[:2] == (3, 12) and hasattr(gc, "freeze") else 0


def _freeze(collect: bool = True) -> None:
    global _freezes, _user_froze
    if not hasattr(gc, "freeze"):
        return
    if _freezes == 0:
        _user_froze = gc.get_freeze_count() > _FROZEN_AT_START
    elif not _user_froze and collect:
        # another pool holds the freeze: a loader dropped since in a reference cycle was frozen
        # with everything else and could never be collected (nor its workers stopped). Collect
        # such loaders now, once, before freezing anew. Only for a loader's first workers (a
        # new loader, as in k-fold): a full collection of a large heap takes ~0.3 s, and a
        # validation loader iterated every few steps would pay it every pass. (A full
        # collection unfreezes for its duration: _see_full_collections.)
        gc.collect()
        if _freezes == 0:  # the collection closed the pools that held it
            _user_froze = gc.get_freeze_count() > _FROZEN_AT_START
    _freezes += 1
    gc.freeze()
    if _see_full_collections not in gc.callbacks:
        gc.callbacks.append(_see_full_collections)


def _see_full_collections(phase: str, info: dict[str, int]) -> None:
    """A full collection (the user's ``gc.collect()``, say) looks at frozen objects too, and
    what survives it is frozen again: a loader dropped in a reference cycle is collected
    (and its workers stopped) when the user asks for it, as it would be without a freeze.
    Younger collections, the frequent ones, still leave the frozen objects alone.

    A signal that arrives during a collection is handled at the first call Python makes
    after it, and an exception raised in a gc callback (or a finalizer the collection runs)
    is reported as ignored: a Ctrl-C there was lost. So nothing is called before a young
    collection returns, and a KeyboardInterrupt raised at the (un)freeze is sent to the main
    thread again once the collection is over and this callback has returned. (It was sent
    from a timer 1 ms after it was taken: on a busy machine the timer's signal landed while
    this callback still waited for the timer thread to start, and was lost in turn.)"""
    global _sigint_held, _in_callback
    if info["generation"] != 2:  # no call: see above
        return
    if _freezes and not _user_froze:
        try:
            if phase == "start":
                gc.unfreeze()
            else:
                gc.freeze()
        except KeyboardInterrupt:
            _sigint_held = True
    if phase == "stop" and _sigint_held:
        _sigint_held = False
        _in_callback = True
        # a bare thread: threading's start() waits for the thread, a wait a signal interrupts
        _thread.start_new_thread(_send_sigint_again, (threading.main_thread().ident,))
        _in_callback = False  # the last statement, and no call: nothing is handled after it here


def _send_sigint_again(main: int) -> None:
    while _in_callback:  # the main thread holds the GIL until it has left the callback
        time.sleep(0.0001)
    signal.pthread_kill(main, signal.SIGINT)


def _unfreeze() -> None:
    global _freezes
    if not hasattr(gc, "freeze") or _freezes == 0:
        return
    _freezes -= 1
    if _freezes == 0:
        if not _user_froze:
            gc.unfreeze()
        if _see_full_collections in gc.callbacks:  # nothing frozen of ours: no Python in collections
            gc.callbacks.remove(_see_full_collections)


def _my_children() -> set[int]:
    """Processes this thread forked (Linux: /proc/self/task/<tid>/children), else none known."""
    try:
        with open(f"/proc/self/task/{threading.get_native_id()}/children") as f:
            return {int(x) for x in f.read().split()}
    except (OSError, ValueError):
        return set()


def _sweep_stacks(prefix: str) -> None:
    if not prefix:
        return
    d = tempfile.gettempdir()
    try:
        for name in os.listdir(d):
            if name.startswith(prefix) and name.endswith(".stack"):
                try:
                    os.unlink(os.path.join(d, name))
                except OSError:
                    pass
    except OSError:
        pass

