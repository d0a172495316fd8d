"""A process worker's loop (``serve``): read ``Order``s, make batches with a ``Fetcher``,
answer ``Result``s with their leaves in shared-memory slots, until told to stop or the main
process is gone (``ParentWatch``, the watchdog thread), draining orders while the results
pipe is full (``Drain``).
"""

from __future__ import annotations

import _thread
import dataclasses
import math
import os
import select
import signal
import time
from collections.abc import Callable
from typing import Any

from .._platform import malloc, process, signals, torch_hooks
from ..errors import capture
from .task import Doorbell, Hello, Inbox, Order, Readable, Result, Task, send
from . import torchless
from .worker import WorkerSpec, start_worker, torch_for

__all__ = ["serve", "stack_path", "name_unpicklable", "ParentWatch", "Drain"]

WORKER_NICE = int(os.environ.get("CONVEYOR_WORKER_NICE", "5"))
# a group's results (executors/grouping.py) go back at once when they have waited this long
# for the rest of their group: a preempted worker must not hold a batch the loop waits for
GROUP_HOLD_S = 2e-3


def serve(spec: WorkerSpec, worker_id: int, gen: int, tasks: Any, results: Any,
          parent_pid: int, prefix: str, private_files: tuple[int, ...] = (), bell: Doorbell | None = None,
          quick_exit: bool = False) -> None:
    """Entry point of a process worker: read ``Order``s, answer ``Result``s. With a ``bell``
    (see ``Doorbell``) it sleeps on that, never on the order pipe.

    With ``quick_exit`` (a spawned worker) a worker that ends as told leaves without tearing
    its interpreter down. A forked worker (and a forkserver's) leaves with ``os._exit``; a
    spawned one would run ``sys.exit``: the teardown of everything it imported (torch's is
    long), which the main process waits for in ``close()`` at the end of every epoch of
    workers that do not persist (docs/decisions/findings-carry-across-epochs.md)."""
    _serve(spec, worker_id, gen, tasks, results, parent_pid, prefix, private_files, bell)
    if quick_exit:
        process.leave()


def _serve(spec: WorkerSpec, worker_id: int, gen: int, tasks: Any, results: Any,
           parent_pid: int, prefix: str, private_files: tuple[int, ...], bell: Doorbell | None) -> None:
    signals.ignore_ctrl_c()  # Ctrl-C is the main process's to handle
    if private_files:
        from .inherit import reopen_private

        reopen_private(private_files)  # files the main process opened through the dataset
    malloc.steady_malloc()
    # batches gathered as numpy need no torch here: imported only if something asks for it
    lean = torchless.defer(spec, _set_up_torch)
    torch = None if lean else torch_for(spec)
    if torch is not None:
        _set_up_torch(torch)
    stack_at = stack_path(prefix, worker_id, gen)
    from ..transport import SlotPool, Writer, encode
    from ..transport import segment as _segment

    pool: SlotPool | None = None
    parent = ParentWatch(parent_pid)

    def cleanup() -> None:
        try:
            os.unlink(stack_at)
        except OSError:
            pass
        if pool is not None:
            # the main thread may be using the pool: the last thing done before exiting
            if parent.going():
                pool.close()
                # a segment being created when the signal landed is in /dev/shm but not yet in
                # the pool: every name of this worker's goes
                _segment.sweep(pool.prefix)
            else:
                # only this worker ends (``kill PID``, earlyoom, a sample's sys.exit()): the
                # main process replaces it and still reads the batches it sent, so their slots
                # stay; it sweeps this worker's names once it has mapped them
                pool.close(keep_sent=True)

    # installed before the stack file is made: a SIGTERM in between would leave it in /tmp
    signals.clean_up_on_term(cleanup)
    stack_file = signals.install_stack_dump(stack_at)
    pool = SlotPool(f"{prefix}w{worker_id}g{gen}_") if _segment.available() else None
    _watchdog(parent, cleanup)
    try:
        try:
            fetcher = start_worker(spec, worker_id, kind="process")
        except Exception as exc:
            results.send(Hello(worker_id, os.getpid(), capture(exc, worker_id, None, "running worker_init_fn")))
            return
        if lean and fetcher.gather is not None:
            fetcher.gather = torchless.gather_later(fetcher.gather)
        results.send(Hello(worker_id, os.getpid()))
        queue: list[Task] = []
        rss = _Rss()
        slots_writer = Writer(pool) if pool is not None else None
        allocator = fetcher.allocator  # (its alloc: each batch's slot writer)
        readable = Readable(tasks)
        inbox = Inbox(tasks)
        warned = False
        done = 0
        rss_read: int | None = None  # the memory reading the next result carries
        grouped: set[int] = set()  # tasks whose results wait for the rest of their group
        held: list[tuple[Any, ...]] = []  # those results, in the order made
        held_ctx: list[Any] = []  # each held result's (result, batch, task, slots), should its send fail

        drain = Drain(results, inbox, parent)
        os.set_blocking(results.fileno(), False)  # (see Drain)

        def take() -> bool:
            """Apply the orders waiting (the pipe is readable, or orders were read while a result
            waited for room); False: stop, or the main process is gone."""
            orders = inbox.take() if not drain.parked else drain.parked + (
                inbox.take() if bell is not None or readable() else [])
            drain.parked = []
            if inbox.eof:
                return False
            return all(accept(order) for order in orders)

        def accept(order: Order | tuple[Any, ...]) -> bool:
            """Apply an order; False when it says stop."""
            if type(order) is tuple:
                # the order of each batch, sent as plain tuples (processes.submit): (tasks, freed),
                # and True after them for a group whose results go back together
                tasks, freed = order[0], order[1]
                if pool is not None and freed:
                    pool.release(list(freed))
                for t in tasks:
                    task = Task._make(t)
                    queue.append(task)
                    fetcher.schedule(task)
                if len(order) > 2 and len(tasks) > 1:
                    grouped.update(t[0] for t in tasks[:-1])  # held until the group's last is made
                return True
            if order.stop:
                return False
            if pool is not None and order.freed:
                pool.release(list(order.freed))
            if order.threads:
                fetcher.set_threads(order.threads)
            if order.rng is not None:
                order.rng.restore()
            queue.extend(order.tasks)
            for t in order.tasks:
                fetcher.schedule(t)
            return True

        if bell is not None:
            # sleeping is the bell's business: the pipe is read without waiting (one read
            # instead of a poll and a read)
            os.set_blocking(tasks.fileno(), False)
        while True:
            if not queue:
                if bell is not None:
                    if not take():
                        return
                    # part of a message read: the rest comes through the pipe, and the bell
                    # rings only once a piece is whole (task.send), so wait on the pipe then
                    if not queue and not _wait(readable if inbox.buf else bell.wait, parent):
                        return
                    continue  # rung: the orders are in the pipe (or were taken with earlier ones)
                if not _wait(readable, parent) or not take():
                    return
                continue
            task = queue.pop(0)
            if pool is not None and pool.failed is None:
                writer = slots_writer
                writer.reset()
            else:
                writer = None
            allocator.alloc = writer  # collate into the slot (None: no shared memory)
            result = fetcher.run(task)
            batch = result.batch
            used = None
            if batch is not None:
                try:
                    tree, holes, leaves, blob = encode(batch, writer)
                except Exception as exc:
                    if writer is not None:
                        writer.abandon()
                    name_unpicklable(exc, batch, task, spec)
                    result = Result(task.seq, worker_id, failure=capture(exc, worker_id, task.indices, "sending"))
                else:
                    used = writer.finish() if writer is not None else None
                    names = tuple((i, pool.slots[i].name) for i in used) if used and pool is not None else ()
                    # a Packed's fields as a plain tuple (see codec): the main process makes it a Packed
                    result.batch = (tree, holes, leaves, names, gen, worker_id, blob)
                    result.nbytes = (writer.total if writer is not None else 0) + (len(blob) if blob else 0)
            elif writer is not None:
                writer.abandon()
            if pool is not None:
                if pool.retired:
                    result.retired = tuple(pool.take_retired())
                if pool.failed is not None and not warned:
                    warned = True
                    result.warning = pool.failed
            done += 1
            if rss_read is not None:
                result.rss, rss_read = rss_read, None
            msg: Any = result.fields()  # plain tuples only: cheap to pickle (see Result.fields)
            ctx = (result, batch, task, used)
            ctxs = [ctx]
            if task.seq in grouped:
                grouped.discard(task.seq)
                held.append(msg)
                held_ctx.append(ctx)
                msg = None
                # (a group that runs long goes back as it is: its first batch waits for it)
                if not queue or result.end - held[0][7] > GROUP_HOLD_S:
                    msg, held, ctxs, held_ctx = held, [], held_ctx, []
            elif held:
                held.append(msg)
                held_ctx.append(ctx)
                msg, held, ctxs, held_ctx = held, [], held_ctx, []
            if msg is not None:
                _deliver(results, msg, ctxs, drain, pool, spec, worker_id)
            batch = ctx = ctxs = None  # type: ignore[assignment]
            if done % 16 == 1:
                # read after the send, for the next result: the kernel walks the page tables
                # for it (milliseconds for a fork of a large training process, more on a loaded
                # host), and the first batch, which the loop waits for, would wait as long
                # (docs/decisions/first-batch-before-housekeeping.md)
                rss_read = rss()
            if done == 1 and WORKER_NICE:
                # loading fills the cores the training loop leaves idle; where both want the
                # same core, the training step (the critical path) goes first. Not before
                # the first batch is out: the loop has no step to run until it comes, and
                # a worker started at nice 5 among other jobs waits longer for a core at
                # each turn
                process.lower_priority(WORKER_NICE)
            # take any orders that arrived meanwhile, without blocking
            if (drain.parked or bell is not None or readable()) and not take():
                return
    except (BrokenPipeError, EOFError, ConnectionResetError):
        return
    finally:
        if pool is not None:
            # told to stop, or leaving on a sample's sys.exit(): a main process that is still
            # there reads what was sent and sweeps the rest (see cleanup)
            pool.close(keep_sent=not parent.going())
        if stack_file is not None:
            stack_file.close()
            try:
                os.unlink(stack_at)  # also when the main process is gone and cannot sweep it
            except OSError:
                pass


def _deliver(results: Any, msg: Any, ctxs: list[Any], drain: Any, pool: Any, spec: WorkerSpec,
             worker_id: int) -> None:
    """Send one result, or a group of them (``msg`` a list, ``ctxs`` each one's (result, batch,
    task, slots)). A batch that cannot be pickled (a lock, a lambda, a generator in a sample)
    is sent as its failure, at once: else the worker would die of it, and each replacement
    again on the same batch. Pickling fails before anything is written; a group that fails is
    sent one result at a time, so that only the batch that cannot be pickled fails."""
    try:
        send(results, msg, full=drain)
    except (OSError, EOFError):
        raise
    except Exception as exc:  # noqa: BLE001 - pickling failed: nothing was written
        if len(ctxs) > 1:
            for one, ctx in zip(msg, ctxs):
                _deliver(results, one, [ctx], drain, pool, spec, worker_id)
            return
        result, batch, task, used = ctxs[0]
        if used and pool is not None:
            pool.release(used)
        name_unpicklable(exc, batch, task, spec)
        send(results, Result(task.seq, worker_id, failure=capture(exc, worker_id, task.indices, "sending"),
                             retired=result.retired, warning=result.warning).fields(), full=drain)


def name_unpicklable(exc: BaseException, batch: Any, task: Task, spec: WorkerSpec) -> None:
    """Note on ``exc`` (pickling a batch failed) which sample holds what could not be pickled,
    and where in it: ``sample['meta'][2]``. A process worker sends a batch by pickling what
    is not an array; the error itself names only a type."""
    found = _unpicklable(batch, "")
    if found is None:
        return
    path, kind = found
    indices = task.indices if isinstance(task.indices, list) else None
    where = f"the batch at batch{path}"
    if indices is not None and not spec.auto_collation:
        where = f"sample {indices[0]} at sample{path}"  # the batch is the sample
    elif indices is not None and not spec.iterable:
        # the batch's shape is the collate_fn's: ask the samples themselves, one by one
        for i in indices:
            try:
                inner = _unpicklable(spec.dataset[i], "")
            except Exception:  # noqa: BLE001 - the sample cannot be read again: say what is known
                break
            if inner is not None:
                path, kind = inner
                where = f"sample {i} at sample{path}"
                break
    name = kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"
    exc.add_note(f"A process worker sends each batch to the main process by pickling what is not an array, and "
                 f"{where} holds a {name}, which cannot be pickled. Return plain data "
                 "from the dataset (or drop that field in a collate_fn), or use worker_type='thread'.")


def _unpicklable(obj: Any, path: str, depth: int = 0) -> tuple[str, type] | None:
    """The path of the innermost part of ``obj`` that cannot be pickled, and its type; None when
    ``obj`` pickles. Containers are looked into (their first 1,000 items, 20 levels deep)."""
    import pickle

    try:
        pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
        return None
    except Exception:  # noqa: BLE001 - whatever pickling raises, this is the part that fails
        pass
    if depth < 20:
        if isinstance(obj, dict):
            parts: list[tuple[str, Any]] = [(f"[{k!r}]", v) for k, v in list(obj.items())[:1000]]
        elif isinstance(obj, (list, tuple)):
            parts = [(f"[{i}]", v) for i, v in enumerate(obj[:1000])]
        elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
            parts = [(f".{f.name}", getattr(obj, f.name, None)) for f in dataclasses.fields(obj)]
        elif hasattr(obj, "__dict__") and not callable(obj) and isinstance(getattr(obj, "__dict__", None), dict):
            parts = [(f".{k}", v) for k, v in list(vars(obj).items())[:1000]]
        else:
            parts = []
        for step, part in parts:
            inner = _unpicklable(part, path + step, depth + 1)
            if inner is not None:
                return inner
    return path, type(obj)


class _Rss:
    """``rss()``: the memory this process adds, in bytes (Linux), or None: its private pages
    (``/proc/self/smaps_rollup``), not its resident set. A forked worker's resident set counts
    every page of the training process it shares copy-on-write, and would have "auto" cap the
    workers on memory they share with it (docs/decisions/cpu-budget-per-rank-and-container.md).
    The file stays open and is read again from its start (one system call); the kernel walks
    the page tables for it (~1 ms a GB), so it is read at most every ``every`` seconds, and
    the last reading given between. Where there is no such file, the resident set
    (``/proc/self/statm``)."""

    def __init__(self, every: float = 1.0) -> None:
        self.every, self.at, self.last = every, -math.inf, None
        self.rollup = True
        try:
            self.fd: int | None = os.open("/proc/self/smaps_rollup", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            self.rollup = False
            try:
                self.fd = os.open("/proc/self/statm", os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                self.fd = None
        try:
            self.page = os.sysconf("SC_PAGE_SIZE")
        except (ValueError, AttributeError, OSError):
            self.fd = None

    def __call__(self) -> int | None:
        if self.fd is None:
            return None
        now = time.monotonic()
        if now - self.at < self.every:
            return self.last
        self.at = now
        try:
            if not self.rollup:
                self.last = int(os.pread(self.fd, 128, 0).split()[1]) * self.page
                return self.last
            kb = 0
            for line in os.pread(self.fd, 4096, 0).splitlines():
                if line.startswith((b"Private_Clean:", b"Private_Dirty:", b"Private_Hugetlb:")):
                    kb += int(line.split()[1])
            self.last = kb * 1024
        except (OSError, ValueError, IndexError):
            self.last = None
        return self.last


class ParentWatch:
    """Is the main process (``pid``) still there? Not always this process's parent: a
    forkserver worker's parent is the fork server. A pidfd (Linux 5.3+) says so exactly and
    can be waited on; elsewhere the pid is probed."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.fd: int | None = None
        try:
            self.fd = os.pidfd_open(pid)
        except (AttributeError, OSError):
            self.fd = None  # no pidfd here (or the process is gone already: alive() says so)

    def alive(self) -> bool:
        if self.fd is not None:
            return not self._poll(0)
        if os.getppid() == self.pid:
            return True
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        except OSError:
            return True
        return True

    def going(self) -> bool:
        """Is the main process gone, or ending now of a signal (one sent to the whole process
        group, say)? A main process that is ending leaves nobody to sweep this worker's slots.
        Read from its pending signals (Linux): a fatal signal stays pending, and the kernel adds
        SIGKILL to each of its threads while it exits; elsewhere, wait briefly for it to end."""
        if not self.alive():
            return True
        try:
            with open(f"/proc/{self.pid}/status", "rb") as f:
                fields = dict(line.split(b":", 1) for line in f.read().splitlines() if b":" in line)
            pending = int(fields[b"SigPnd"], 16) | int(fields[b"ShdPnd"], 16)
            handled = int(fields[b"SigCgt"], 16) | int(fields[b"SigIgn"], 16)
            state = fields[b"State"].split()[0]
        except (OSError, KeyError, ValueError, IndexError):
            if self.fd is not None:
                return self._poll(200)
            time.sleep(0.2)
            return not self.alive()
        if state in (b"Z", b"X"):
            return True
        fatal = 0
        for sig in (signal.SIGTERM, getattr(signal, "SIGHUP", None), signal.SIGINT,
                    getattr(signal, "SIGQUIT", None), getattr(signal, "SIGALRM", None)):
            if sig is not None:
                fatal |= 1 << (sig - 1)
        fatal &= ~handled  # one the main process handles (or ignores) does not end it
        fatal |= 1 << (signal.SIGKILL - 1)
        return bool(pending & fatal)

    def _poll(self, timeout_ms: int | None) -> bool:
        import select  # poll, not select: a worker may hold more than 1024 descriptors

        p = select.poll()
        assert self.fd is not None
        p.register(self.fd, select.POLLIN)
        return bool(p.poll(timeout_ms))

    def wait_gone(self) -> None:
        """Block until the main process has ended."""
        if self.fd is not None:
            self._poll(None)
            return
        while self.alive():
            time.sleep(0.5)


class Drain:
    """What a worker does while its results pipe is full: read its orders, keeping them
    (``parked``) for the loop to apply.

    The main process writes an order with a blocking write and reads no result meanwhile;
    an order larger than the room left in the pipe (the indices of a large shuffled batch)
    to a worker busy with a batch whose result is larger too (a side leaf) would leave each
    waiting on the other for ever, ``timeout`` included (docs/decisions/own-pipe-framing.md).
    Called as ``send``'s ``full``: the results pipe is non-blocking."""

    def __init__(self, results: Any, inbox: Inbox, parent: ParentWatch) -> None:
        self.inbox, self.parent = inbox, parent
        self.parked: list[Any] = []
        self.poller = select.poll()  # poll, not select: a worker may hold more than 1024 descriptors
        self.poller.register(inbox.fd, select.POLLIN | select.POLLHUP | select.POLLERR)
        self.poller.register(results.fileno(), select.POLLOUT | select.POLLERR)

    def __call__(self) -> None:
        got = self.poller.poll(500)
        if any(fd == self.inbox.fd for fd, _ in got):
            self.parked += self.inbox.take()
            if self.inbox.eof:
                raise BrokenPipeError("the main process closed the order pipe")
            if any(type(o) is Order and o.stop for o in self.parked):
                # closing: it reads no more results, and would wait 5 s for this one's room
                raise BrokenPipeError("told to stop while a result waited for room")
        elif not got and not self.parent.alive():
            raise BrokenPipeError("the main process is gone")


def _wait(readable: Callable[[float], bool], parent: ParentWatch) -> bool:
    """Block until ``readable`` (the order pipe, or the bell) says so; False when the main
    process is gone."""
    while not readable(0.5):
        if not parent.alive():
            return False
    return True


def _watchdog(parent: ParentWatch, cleanup: Callable[[], None]) -> None:
    """A thread of each process worker: when the main process ends (killed, say) while this
    worker is inside a slow or stuck sample, free its shared memory and stack file and exit
    now, rather than stay behind until the sample returns."""
    def run() -> None:
        parent.wait_gone()
        try:
            cleanup()
        finally:
            os._exit(1)

    # a bare thread: threading's start() waits until the new thread runs, which among other
    # jobs holds up the worker's hello (docs/decisions/first-batch-before-housekeeping.md)
    _thread.start_new_thread(run, ())


def stack_path(prefix: str, worker: int, gen: int) -> str:
    """Where a process worker writes its Python stack when sent SIGUSR1."""
    import tempfile

    return os.path.join(tempfile.gettempdir(), f"{prefix or 'conveyor_'}w{worker}g{gen}.stack")


def _set_up_torch(torch: Any) -> None:
    """A process worker's torch: one thread (the workers are the parallelism), conveyor's collate."""
    torch.set_num_threads(1)
    torch_hooks.route_torch_collate(torch)
