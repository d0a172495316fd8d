"""Placement: where batches are made under ``num_workers="auto"``, and with how much.

``machine``: what this machine lends the loader (usable cores, a cgroup's quota and free
memory, the training processes that share them). ``tuner``: stats snapshots in, a
:class:`Decision` (``num_workers``, ``fetch_threads``, ``prefetch_factor``) out. ``probe``: the
main process's probing batches, the thresholds that decide where batches are made (``Mode``),
and what one epoch found for the next.
"""

from __future__ import annotations

from .machine import (
    cgroup_cpus,
    cgroup_free_bytes,
    cpu_budget,
    cpu_share,
    no_core_left,
    ram_budget,
    ranks_here,
    usable_cores,
)
from .tuner import IO_BOUND, MAX_THREADS, Decision, ThreadSteer, Tuner, Window

__all__ = [
    "IO_BOUND",
    "MAX_THREADS",
    "Decision",
    "ThreadSteer",
    "Tuner",
    "Window",
    "cgroup_cpus",
    "cgroup_free_bytes",
    "cpu_budget",
    "cpu_share",
    "no_core_left",
    "ram_budget",
    "ranks_here",
    "usable_cores",
]
