"""A worker's start: what it is given (``WorkerSpec``) and what it does first
(``start_worker``: seed, publish its info, run ``worker_init_fn``), for every executor.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable
from typing import Any

from .. import _torch, rng
from .fetcher import Fetcher
from .info import WorkerInfo, set_info
from .sched import process_clocks, process_demand, thread_demand

__all__ = ["WorkerSpec", "start_worker", "torch_for"]

main_rank_world: tuple[int, int] | None = None  # a process worker's main process's (rank, world size)


@dataclasses.dataclass(frozen=True)
class WorkerSpec:
    """Everything a worker needs, picklable for spawn."""

    dataset: Any
    collate_fn: Callable[[Any], Any] | None
    auto_collation: bool
    batch_size: int | None
    drop_last: bool
    iterable: bool
    num_workers: int
    base_seed: int
    seed: int | None = None
    worker_init_fn: Callable[[int], None] | None = None
    fetch_threads: int = 1
    on_error: str = "raise"
    gather: bool = False
    output: str = "torch"
    default_collate: bool = False
    # RNG states a worker takes over from batches the main process made in its name
    rng_states: dict[int, Any] | None = None
    # the main process's (rank, world size): a spawned worker has no process group, and a
    # launcher need not set RANK/WORLD_SIZE (torch.multiprocessing.spawn), yet shards by them
    rank_world: tuple[int, int] | None = None


def torch_for(spec: WorkerSpec) -> Any:
    """torch if imported, or imported now where the workers' batches are tensors (their
    collate would import it anyway). Workers start after: a spawned worker's first collate
    would import it under its fetch threads, too late for the worker's torch setup, and thread
    workers route torch's ``get_worker_info()`` only when torch is there as they start."""
    torch = _torch.loaded()
    if torch is None and spec.default_collate and spec.output == "torch":
        torch = _torch.get()
    return torch


def start_worker(spec: WorkerSpec, worker_id: int, *, kind: str) -> Fetcher:
    """Seed, publish worker info, run ``worker_init_fn``; the worker's fetcher."""
    global main_rank_world
    thread = kind == "thread"
    seed = rng.worker_seed(spec.base_seed, worker_id)
    if thread and spec.iterable and not _torch.is_datapipe(spec.dataset):
        # a stream's copy of its own, as a process worker has: torch's documented pattern
        # narrows get_worker_info().dataset.start/end in worker_init_fn, and state set in
        # __iter__ is the worker's. One object shared by every thread loses data silently.
        # (Shallow: the data it refers to is still shared.)
        try:
            spec = dataclasses.replace(spec, dataset=copy.copy(spec.dataset))
        except Exception:  # noqa: BLE001 - an object that cannot be copied stays shared
            pass
    if not thread:
        main_rank_world = spec.rank_world
        rng.seed_worker(spec.base_seed, worker_id)
        if spec.rng_states and worker_id in spec.rng_states:
            spec.rng_states[worker_id].restore()
    set_info(WorkerInfo(worker_id, spec.num_workers, seed, spec.dataset, kind), thread=thread)
    if not thread and spec.iterable and _torch.is_datapipe(spec.dataset):
        _torch.shard_datapipe(spec.dataset, worker_id, spec.num_workers)  # this process's copy
    if spec.worker_init_fn is not None:
        spec.worker_init_fn(worker_id)
    return Fetcher(spec, worker_id, shared_rng=thread, cpu_clock=thread_demand if thread else process_demand,
                   span_clocks=None if thread else process_clocks)
