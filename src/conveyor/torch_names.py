"""The private names of torch's ``_BaseDataLoaderIter`` that tools and tests read.

Lightning, torchdata's helpers and torch's own tests read ``_workers``, ``_num_yielded``,
``_shutdown`` and the rest off the iterator; a ``Run`` answers them from its own state.
"""

from __future__ import annotations

from typing import Any

from .executors.processes import ProcessExecutor

__all__ = ["TorchIteratorNames"]


class TorchIteratorNames:
    """torch's iterator attributes, read-only, for a class with ``loader``, ``pool``,
    ``yielded``, ``len_said``, ``origin`` (its ``base_seed``) and ``close()``."""

    loader: Any
    pool: Any
    yielded: int
    len_said: int | None
    origin: Any

    def close(self) -> None:
        raise NotImplementedError

    @property
    def _workers(self) -> list[Any]:
        """The worker processes (``multiprocessing.Process``) serving this epoch; none
        before they start, or with thread workers or none."""
        ex = self.pool.started_executor
        if not isinstance(ex, ProcessExecutor):
            return []
        return [wk.proc for wk in ex.workers if wk is not None]

    @property
    def _num_workers(self) -> int:
        return self.loader.num_workers

    @property
    def _num_yielded(self) -> int:
        return self.yielded

    @property
    def _shutdown(self) -> bool:
        return bool(self.pool.dead)

    def _shutdown_workers(self) -> None:
        self.close()

    @property
    def _dataset(self) -> Any:
        return self.loader.dataset

    @property
    def _index_sampler(self) -> Any:
        return self.loader._index_sampler

    @property
    def _dataset_kind(self) -> int:
        return self.loader._dataset_kind

    @property
    def _auto_collation(self) -> bool:
        return self.loader._auto_collation

    @property
    def _IterableDataset_len_called(self) -> int | None:  # noqa: N802 - torch's name
        return self.len_said

    @property
    def _persistent_workers(self) -> bool:
        return bool(self.loader.persistent_workers)

    @property
    def _base_seed(self) -> int:
        return int(self.origin.base_seed)
