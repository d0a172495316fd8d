"""The machine the loader runs on: usable cores, a cgroup's CPU quota and free memory, the
training processes that share them, and the CPU and RAM budgets the tuner works within.

::

    affinity, cgroup cpu.max / memory.max, LOCAL_WORLD_SIZE --> cpu_share() --> cpu_budget()
    /proc/meminfo (or psutil), cgroup memory                 --> ram_budget()
"""

from __future__ import annotations

import math
import os
import time
from typing import Any

from ..executors.sched import read_small

__all__ = ["cgroup_cpus", "cgroup_free_bytes", "cpu_budget", "cpu_share", "no_core_left", "ram_budget",
           "ranks_here", "usable_cores"]


def usable_cores() -> int:
    """CPUs this process may run on (its affinity; the machine's count where that is unknown).

    >>> usable_cores() >= 1
    True
    """
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - macOS
        return os.cpu_count() or 1


CGROUP_ROOT = "/sys/fs/cgroup"


def _cgroup_dirs(controller: str, root: str = CGROUP_ROOT, table: str = "/proc/self/cgroup") -> list[tuple[str, str]]:
    """This process's cgroup directories that may hold ``controller``'s files ("cpu" or
    "memory"), innermost first with their ancestors after, each once, as (version,
    directory): ``"2"`` for the unified hierarchy, ``"1"`` for v1's controller (under its own
    mount). A container's cgroup namespace shows its own cgroup as "/"; a v1 path that is
    not there (no namespace) falls back to the mount's root. Only the controller's own
    hierarchy is walked: every file opened on cgroupfs costs ~15 us, and on a v1 host the
    other controllers' lines add directories a CPU quota cannot be in
    (docs/decisions/cpu-budget-per-rank-and-container.md)."""
    raw = read_small(table)
    if raw is None:
        return []
    lines = raw.decode("ascii", "replace").splitlines()
    out: list[tuple[str, str]] = []
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if controllers == "":
            # the unified hierarchy: at the root, or beside v1's controllers (a hybrid host)
            unified = os.path.join(root, "unified")
            mounts = [unified if os.path.isdir(unified) and not os.path.exists(os.path.join(root, "cgroup.controllers"))
                      else root]
            version = "2"
        else:
            if controller not in controllers.split(","):
                continue
            mounts = [os.path.join(root, m) for m in (("cpu,cpuacct", "cpu") if controller == "cpu" else (controller,))]
            version = "1"
        for mount in mounts:
            here = os.path.normpath(mount + "/" + path.strip("/")) if path.strip("/") else mount
            if not os.path.isdir(here):
                here = mount
            while True:
                if (version, here) not in out:
                    out.append((version, here))
                if len(here) <= len(mount) or not here.startswith(mount):
                    break
                here = os.path.dirname(here)
    return out


def _read(path: str) -> str | None:
    raw = read_small(path)
    try:
        return None if raw is None else raw.decode("ascii").strip()
    except ValueError:  # (UnicodeDecodeError is a ValueError)
        return None


def cgroup_cpus(root: str = CGROUP_ROOT, table: str = "/proc/self/cgroup") -> float | None:
    """The CPUs a cgroup quota lets this process use (``docker --cpus``, a Kubernetes CPU
    limit: the affinity still lists every core of the host), the tightest of its cgroup and
    their ancestors; None where there is none.

    >>> n = cgroup_cpus(); n is None or n > 0
    True
    """
    best: float | None = None
    for version, d in _cgroup_dirs("cpu", root, table):
        if version == "2":
            text = _read(os.path.join(d, "cpu.max"))
            fields = text.split() if text else []
            quota, period = (fields + ["", ""])[:2]
        else:
            quota = _read(os.path.join(d, "cpu.cfs_quota_us")) or ""
            period = _read(os.path.join(d, "cpu.cfs_period_us")) or ""
        try:
            q, p = float(quota), float(period)
        except ValueError:
            continue  # "max", -1, or no such file: no quota here
        if q > 0 and p > 0:
            best = q / p if best is None else min(best, q / p)
    return best


QUOTA_TTL_S = 30.0  # a cgroup's CPU quota is read again after this long (a pod resized in place)
_quota_seen: tuple[Any, float, float | None] | None = None  # (the reader, when, what it read)


def _quota() -> float | None:
    """``cgroup_cpus()``, read at most every ``QUOTA_TTL_S``: its files cost up to ~1 ms a read,
    and each ``iter()`` of an "auto" loader asks."""
    global _quota_seen
    now = time.monotonic()
    seen = _quota_seen
    if seen is None or seen[0] is not cgroup_cpus or now - seen[1] > QUOTA_TTL_S:
        seen = _quota_seen = (cgroup_cpus, now, cgroup_cpus())
    return seen[2]


def cgroup_free_bytes(root: str = CGROUP_ROOT, table: str = "/proc/self/cgroup") -> int | None:
    """Bytes this process's cgroups still allow it (``memory.max`` less what they use: a
    container's limit, where the host's free memory says nothing); None where none is set."""
    best: int | None = None
    for version, d in _cgroup_dirs("memory", root, table):
        names = ("memory.max", "memory.current") if version == "2" else ("memory.limit_in_bytes", "memory.usage_in_bytes")
        limit, used = (_read(os.path.join(d, n)) for n in names)
        try:
            room = int(limit or "") - int(used or "0")
        except ValueError:
            continue  # "max", or no such file
        if int(limit or "0") >= 1 << 60:
            continue  # v1's "no limit" is a page-rounded 2**63
        best = max(0, room) if best is None else min(best, max(0, room))
    return best


def ranks_here() -> int:
    """Training processes on this machine, as their launcher says (torchrun's
    ``LOCAL_WORLD_SIZE``, Open MPI's ``OMPI_COMM_WORLD_LOCAL_SIZE``); 1 where none says.

    >>> ranks_here() >= 1
    True
    """
    for name in ("LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE"):
        try:
            n = int(os.environ.get(name, ""))
        except ValueError:
            continue
        if n >= 1:
            return n
    return 1


def cpu_share() -> int:
    """The cores this process's loader may fill: its usable cores, shared with the other
    training processes of this machine where they run on the same ones.

    Under DDP the ranks share one affinity: a rank that takes every core starts workers the
    other ranks also start, and reads its starved workers as waiting on storage
    (docs/decisions/cpu-budget-per-rank-and-container.md). A launcher
    that binds each rank to cores of its own leaves the ranks' affinities disjoint
    (their count times the ranks fits the machine), and nothing is divided then.

    >>> cpu_share() >= 1
    True
    """
    cores = usable_cores()
    ranks = ranks_here()
    quota = _quota()
    if quota is not None and quota < cores:
        # a cgroup's quota (a container's): its training processes share it, whatever cores they run on
        return max(1, math.ceil(quota - 1e-9) // ranks)
    if ranks > 1 and cores * ranks > (os.cpu_count() or cores):
        return max(1, cores // ranks)
    return cores


def no_core_left() -> bool:
    """Do this machine's training processes (more than one) leave each at most the one core
    its training loop runs on? A worker that computes then only takes the loop's core, and the
    ranks run slower with it than without."""
    return ranks_here() > 1 and cpu_share() <= 1


def cpu_budget() -> int:
    """Cores this process may use (its share, see :func:`cpu_share`), minus one for the
    training loop where possible (at least 1).

    >>> cpu_budget() >= 1
    True
    """
    return max(1, cpu_share() - 1)


def ram_budget(fraction: float = 0.5) -> int | None:
    """Bytes the loader may add: ``fraction`` of available memory (None when it cannot be told).

    Reads /proc/meminfo where there is one (no import: the tuner starts with the loader),
    else asks psutil.

    >>> b = ram_budget(); b is None or b > 0
    True
    """
    free = cgroup_free_bytes()  # a container's limit: the host's free memory says nothing of it
    try:
        with open("/proc/meminfo", "rb") as f:  # bytes: no codec lookup on a first call (~1 ms)
            for line in f:
                if line.startswith(b"MemAvailable:"):
                    host = int(line.split()[1]) * 1024
                    return int((host if free is None else min(host, free)) * fraction)
    except (OSError, ValueError, IndexError):
        pass
    try:
        import psutil
    except ImportError:
        return None if free is None else int(free * fraction)
    host = psutil.virtual_memory().available
    return int((host if free is None else min(host, free)) * fraction)
