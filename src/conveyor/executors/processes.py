"""``worker_type="process"``: workers are child processes (fork, spawn, forkserver).

Each worker has its own pair of pipes (orders in, results out). The main
process waits on every result pipe *and* every worker's sentinel at once,
so a worker that dies is seen the moment the loader waits, not after a
timeout. Results carry shared-memory slot references (see ``transport``);
slots freed by the garbage collector ride back on the next order.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import tempfile
import threading
import time
from multiprocessing.connection import Connection, wait
from collections.abc import Callable
from typing import Any

from .. import transport
from .._platform import process
from .._platform.signals import hold_ctrl_c
from ..errors import StartupError, rebuild
from ..transport import move, share
from .base import Event, Executor, Ledger
from . import starting, stopping
from .received import Received
from .serve import serve, stack_path
from .task import Death, Doorbell, Hello, Inbox, Order, PollSet, Result, Task, send
from .worker import WorkerSpec

__all__ = ["ProcessExecutor", "StartupError"]


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

    def tell(self, order: Order) -> None:
        """Send an order outside the per-batch path (ringing the bell)."""
        send(self.tasks, order, self.bell)


class ProcessExecutor(Executor):
    kind = "process"
    can_kill = True

    def __init__(self, spec: WorkerSpec | Callable[[], WorkerSpec], num_workers: int, context: Any = None,
                 *, pinner: Any = None, private_files: Callable[[], tuple[int, ...]] | None = None,
                 collect: bool = True, shipping: share.ShipLog | None = None) -> None:
        if context is None:
            context = mp.get_context()
        elif isinstance(context, str):
            context = mp.get_context(context)
        self.launch = starting.Launch(context, private_files, shipping, collect)
        # the spec comes from a function (the loader's pool's, through a weak reference): what
        # closes this executor must not keep the user's dataset and collate_fn (and so a loader
        # they may refer to) reachable, or a loader dropped in a reference cycle would live on
        self._spec_of: Callable[[], WorkerSpec] = spec if callable(spec) else (lambda: spec)
        self.output = self.spec.output
        finish_cut_short()
        self.num_workers = num_workers
        self.ledger = Ledger(num_workers)
        self.prefix = transport.new_prefix() if transport.available() else ""
        global _swept
        if self.prefix and not _swept:
            _swept = True
            transport.sweep_stale()  # what killed runs left in /dev/shm: once a process
        self.received = Received(pinner)  # the slots of results received
        self.workers: list[_Worker | None] = [None] * num_workers
        self.gens = [0] * num_workers
        self.closed = False
        self._shut = False  # close() ran to its end
        # close() from another thread than the one iterating, while that one's epoch ends and
        # closes too: one runs, the other waits for it (two would close each worker's bell, the
        # second time another file's descriptor, perhaps). A finalizer re-entering returns.
        self._closing = threading.RLock()
        self._in_close = False
        self._reaping = threading.Lock()
        self.hung: set[int] = set()  # workers a timeout found stuck: close() kills them at once
        self.kill_causes: dict[int, tuple[str, str | None]] = {}  # workers killed on purpose: why
        self.start_deaths: list[Death] = []  # replacements killed before their hello (restart)
        self.poll_set = PollSet()  # every result pipe and sentinel, kept across calls
        self.parent_pid = os.getpid()
        # where workers write their stacks (stack_path): the first gettempdir() of a process
        # writes a probe file to choose the directory, a cost to a freshly forked worker's
        # start; asked here, forked workers inherit the answer
        # (docs/decisions/head-start-while-workers-start.md)
        tempfile.gettempdir()
        try:
            for w in range(num_workers):
                self.workers[w] = self._spawn(w)
                self.poll_set.watch(w, self.workers[w])
        except BaseException:
            self.close()
            raise

    @property
    def method(self) -> str:
        """The start method: fork, spawn or forkserver."""
        return self.launch.method

    @property
    def views(self) -> Any:
        """The mappings of the workers' slots (``transport.Views``)."""
        return self.received.views

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
        launch = self.launch
        task_r, task_w = launch.ctx.Pipe(duplex=False)
        res_r, res_w = launch.ctx.Pipe(duplex=False)
        private = launch.private_files() if launch.private_files is not None and self.method == "fork" else ()
        # a forked child inherits the bell's descriptor; a spawned one would need it sent
        bell = Doorbell.make() if self.method == "fork" else None
        # a forked worker inherits the spec as it is; any other is sent it pickled
        spec: Any = self.spec if self.method == "fork" else share.Shipped(self.spec, launch.shares)
        proc = launch.ctx.Process(
            target=serve,
            args=(spec, w, gen, task_r, res_w, self.parent_pid, self.prefix, private, bell,
                  self.method == "spawn"),
            name=f"conveyor-worker-{w}",
            daemon=True,
        )
        launch.freeze()
        before = starting.my_children()
        held = hold_ctrl_c(later=True)
        try:
            with held:
                proc.start()
            task_r.close()
            res_w.close()
            wk = _Worker(proc, task_w, res_r, gen, bell)
            self.workers[w] = wk  # recorded at once: close() now knows it, whatever comes next
        except BaseException as exc:
            starting.undo(exc, proc, before, f"{self.prefix}w{w}g{gen}_", (task_r, task_w, res_r, res_w), bell,
                          w, self.method)
            raise
        if isinstance(spec, share.Shipped) and launch.shipping is not None:
            launch.shipping.shipped(spec.seconds, spec.nbytes, spec.shared, spec.moved_s)
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
        if move.active:
            # the dataset's arrays are still being copied into shared memory: these rows first
            move.prefer(self.spec.dataset, tasks)
        with hold_ctrl_c():
            self.ledger.add(worker, tasks)
            freed = self.received.freed_for(worker, wk.gen)
            try:
                # plain tuples, not an Order of Tasks: the worker unpickles one for every batch, a
                # class lookup and a constructor call each cost it a few microseconds cold
                order = ([tuple(t) for t in tasks], freed, True) if grouped else ([tuple(t) for t in tasks], freed)
                send(wk.tasks, order, wk.bell)
            except (BrokenPipeError, OSError):
                pass  # the worker died; poll() reports it and recovery re-issues the tasks

    def flush_freed(self) -> None:
        """Send freed slots to workers that have no task to carry them."""
        pending = self.received.pending_freed
        self.received.collect_freed()
        for (w, gen), ids in list(pending.items()):
            wk = self.workers[w]
            if wk is None or wk.gen != gen:
                del pending[(w, gen)]
                continue
            if len(ids) >= 2:
                del pending[(w, gen)]
                try:
                    wk.tell(Order((), tuple(ids)))
                except (BrokenPipeError, OSError):
                    pass

    def poll(self, timeout: float | None) -> list[Event]:
        return self.take_ready(self.poll_set.ready(self.workers, timeout))

    def wait_ready(self, timeout: float | None) -> list[tuple[int, bool]]:
        """``poll`` in two: wait up to ``timeout`` for pipes or sentinels to be ready (a Ctrl-C
        may cut this short), then ``take_ready`` what they hold (to be held from a Ctrl-C, with
        whatever records the results it returns: a result read and not recorded is lost)."""
        return self.poll_set.ready(self.workers, timeout)

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
                self._take(w, wk, msgs, events, hellos=True)
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
                    self._take(w, wk, wk.inbox.take(), events, hellos=False)
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

    def _take(self, w: int, wk: _Worker, msgs: list[Any], events: list[Event], *, hellos: bool) -> None:
        """Record the results among ``msgs`` (one, or a group's list: executors/grouping.py)
        into ``events``; apply the hellos too, with ``hellos`` (a dead worker's are not)."""
        for msg in msgs:
            if type(msg) is tuple or type(msg) is list:
                for fields in msg if type(msg) is list else (msg,):
                    result = _result(fields)
                    if result.failure is not None and move.failed():
                        raise self._startup_error(w, wk)  # it read rows the failed copy never wrote
                    self._note(w, wk, result)
                    events.append(result)
            elif hellos and isinstance(msg, Hello):
                self._hello(wk, msg)

    def _hello(self, wk: _Worker, msg: Hello) -> None:
        if msg.failure is not None:
            raise rebuild(msg.failure)
        wk.ready = True
        wk.pid = msg.pid
        move.started()  # a copy into shared memory held back for the workers' start goes on

    @property
    def ready(self) -> int:
        """How many workers have finished starting."""
        return sum(1 for wk in self.workers if wk is not None and wk.ready)

    def _startup_error(self, w: int, wk: _Worker) -> StartupError:
        code = wk.proc.exitcode
        hint = "" if self.method == "fork" else " " + starting.startup_hint(self.spec, self.method)
        moved = move.failure()  # the copy of the dataset's arrays into shared memory failed: the workers stop
        if moved is not None:
            hint = f" The main process could not copy the dataset's arrays into shared memory: {moved!r}."
        # torch's words first ("DataLoader worker (pid 12) exited unexpectedly"): users match on them
        if code is None:  # alive: it read rows of the dataset that the failed copy never wrote
            err = StartupError(f"DataLoader worker (pid {wk.proc.pid}) could not read the dataset (worker {w}).{hint}")
        else:
            err = StartupError(f"DataLoader worker (pid {wk.proc.pid}) exited unexpectedly during start-up with "
                               f"exit code {code} (worker {w}).{hint}")
        err.__cause__ = moved
        return err

    def _note(self, w: int, wk: _Worker, msg: Result) -> None:
        self.ledger.done(w, msg.seq)
        self.received.note(w, wk.gen, msg)

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
            self.poll_set.watch(w, self.workers[w])

    def set_rng(self, worker: int, state: Any) -> None:
        """``worker`` takes over these global RNG states before its next task."""
        wk = self.workers[worker]
        if wk is not None:
            try:
                wk.tell(Order(rng=state))
            except (BrokenPipeError, OSError):
                pass

    def set_threads(self, n: int) -> None:
        """Every worker fetches ``n`` samples at once from now on."""
        for wk in self.workers:
            if wk is not None:
                try:
                    wk.tell(Order(threads=n))
                except (BrokenPipeError, OSError):
                    pass

    def alive(self, worker: int) -> bool:
        wk = self.workers[worker]
        return wk is not None and wk.proc.is_alive()

    def pid(self, worker: int) -> int | None:
        wk = self.workers[worker]
        return None if wk is None else wk.pid

    def restart(self, worker: int, wait_s: float = 60.0, tries: int = starting.START_TRIES, spent: str = "") -> list[Task]:
        """Replace a dead worker (new generation); its unfinished tasks are returned. A
        replacement killed by a signal before its hello is replaced in turn, ``tries``
        replacements in all (the loader's restart budget; ``spent`` says so when it runs out);
        each such death is kept for ``take_start_deaths``."""
        old = self.workers[worker]
        if self.closed:
            raise RuntimeError("this DataLoader's workers were shut down")
        if old is not None:
            self.poll_set.unwatch(self.workers, old)
            self._reap(old)
            self.received.worker_gone(worker, old.gen)
            transport.sweep(f"{self.prefix}w{worker}g{old.gen}_")
            # reaped (its process object closed), so not left here: after a Ctrl-C while the
            # replacement starts, every close() would raise "process object is closed"
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
            self.poll_set.watch(worker, wk)
            # wait for its hello so start-up failures surface here
            code = self._await_hello(worker, wk, deadline, wait_s)
            if code is None:
                return tasks
            how = f"was killed by {starting.signal_name(-code)}" if code < 0 else f"exited with code {code}"
            if code >= 0 or attempt == tries:
                # it failed to start (an import, worker_init_fn): another would too
                row = f"{attempt} replacements in a row" if attempt > 1 else ""
                if code < 0 and spent:
                    row = f"{row}{'; ' if row else ''}{spent}"
                raise StartupError(f"replacement for worker {worker} {how} during start-up"
                                   + (f" ({row})" if row else ""))
            self.start_deaths.append(Death(worker, wk.pid, code))
            # killed by a signal (the OOM killer, a scheduler, a user) before its hello: a death
            # like one after it, which the next replacement makes good, not the end of the epoch
            self.poll_set.unwatch(self.workers, wk)
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
        return stopping.read_stack(wk.pid, stack_path(self.prefix, worker, wk.gen))

    def held(self) -> list[dict[int, Task]]:
        return self.ledger.held

    def give_up(self, worker: int) -> None:
        self.hung.add(worker)  # closing need not wait for it to finish its batch

    def kill(self, worker: int, cause: str | None = None, stack: str | None = None) -> None:
        """Kill ``worker``; its Death then says ``cause`` (and its last ``stack``)."""
        wk = self.workers[worker]
        if wk is not None and wk.proc.is_alive():
            if cause is not None:
                self.kill_causes[worker] = (cause, stack)
            wk.proc.kill()

    def release(self, result: Result) -> None:
        self.received.release(result)

    def decode(self, result: Result) -> Any:
        return self.received.decode(result, self.output)

    # -- shutdown ---------------------------------------------------------
    def _reap(self, wk: _Worker, timeout: float = 5.0) -> None:
        stopping.reap(wk, self._reaping, timeout, lambda: stack_path(self.prefix, self.workers.index(wk), wk.gen))

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
        # batch is made; one stuck there would hold the exit up for the 5 s below (torch's
        # workers are ended by multiprocessing's own exit hook at once)
        exiting = process.exiting() or not threading.main_thread().is_alive()
        while live := [(w, wk) for w, wk in enumerate(self.workers) if wk is not None]:
            for w, wk in live:
                with contextlib.suppress(ValueError):  # closed: reaped by that other thread
                    if w in self.hung or exiting and self.ledger.count(w):
                        wk.proc.kill()  # stuck in a sample: it would not read the stop order in time
                    elif not wk.ready:
                        # still starting (importing, worker_init_fn), holding no batch: it would
                        # read the stop order only once started, and a spawned worker's imports
                        # would hold up the close of an epoch the main process made alone
                        # (docs/decisions/findings-carry-across-epochs.md)
                        wk.proc.terminate()
            for _, wk in live:
                try:
                    wk.tell(Order(stop=True))
                except (BrokenPipeError, OSError):
                    pass
            deadline = time.monotonic() + 5.0
            for _, wk in live:
                with contextlib.suppress(ValueError):
                    wk.proc.join(max(0.0, deadline - time.monotonic()))
            for w, wk in live:
                with contextlib.suppress(KeyError):  # unwatched by that other thread
                    self.poll_set.unwatch(self.workers, wk)
                with contextlib.suppress(ValueError, AttributeError):
                    self._reap(wk, timeout=0.0)
                if self.workers[w] is wk:
                    self.workers[w] = None
        self.received.views.close()
        self.launch.close()
        transport.sweep(self.prefix)
        stopping.sweep_stacks(self.prefix)
        self._shut = True


_cut_short: list[ProcessExecutor] = []  # closes a Ctrl-C cut short, that nothing else would finish


def finish_cut_short() -> None:
    """Finish the closes a Ctrl-C cut short (their workers, slots, bells and gc freeze would
    be kept for the rest of the process where the close ran from a finalizer, which runs once)."""
    for ex in list(_cut_short):
        try:
            ex.close()
        except Exception:  # noqa: BLE001 - it stays listed, for the next try
            pass


def _result(fields: tuple[Any, ...]) -> Result:
    """A worker's Result from the plain tuple it sent (``Result.fields``; the batch, when
    there is one, as the fields of a ``Packed``)."""
    result = Result(*fields)
    if result.batch is not None:
        result.batch = transport.Packed._make(result.batch)
    return result


_swept = False  # stale segments of dead processes removed (transport.sweep_stale)


