"""A spawned or forkserver worker whose batches need no torch does not import it.

A process worker whose batches are tensors imports torch as it starts (``torch_for``):
under spawn and forkserver that is most of a worker's start, and a large part of the whole
tree's memory beyond the data (docs/decisions/copy-while-workers-start.md). Where the
dataset gathers numpy columns (``gatherable``:
``ArrayDataset``), no torch code runs in the worker at all: the columns go to the main
process as numpy arrays marked ``TensorLater`` and become tensors there
(``torch.from_numpy`` in ``decode``, which the main process runs for every batch anyway).

torch stays what it was the moment anything imports it in such a worker (``worker_init_fn``,
the dataset's own code): it is set up as at a start (``set_num_threads(1)``, the collate
routing), its RNG gets the seed it would have had (``rng.defer_torch``), and the batches
from then on are gathered as tensors again.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import numpy as np

from .. import _torch, rng
from .._platform.imports import find_wrapped
from ..transport.codec import TensorLater

__all__ = ["defer", "gather_later", "lean"]

# dtypes torch.from_numpy takes on every torch conveyor supports; a column of any other (a
# uint16 one on an old torch, say) is gathered as torch would, torch imported for it
_KINDS = frozenset({"b1", "i1", "u1", "i2", "i4", "i8", "f2", "f4", "f8", "c8", "c16"})


def lean(spec: Any) -> bool:
    """May this process worker start without torch? Its batches are tensors made by
    ``gather`` (the default collate of a ``gatherable`` dataset) and nothing it unpickled
    imported torch."""
    return (spec.output == "torch" and bool(getattr(spec, "gather", False)) and _torch.loaded() is None
            and callable(getattr(spec.dataset, "gather", None)))


def defer(spec: Any, set_up: Callable[[Any], None]) -> bool:
    """Where ``lean(spec)``: torch is not imported now, and ``set_up(torch)`` (then the
    pending seed) runs the moment something imports it. True where deferred."""
    if not lean(spec):
        return False
    _hook.set_up = set_up
    rng.defer_torch = True
    if _hook not in sys.meta_path:
        sys.meta_path.insert(0, _hook)
    return True


class _TorchImported:
    """Runs the worker's torch set-up right after ``torch`` itself has run (whole: its
    ``random`` and ``set_num_threads`` are there)."""

    set_up: Callable[[Any], None] | None = None

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != "torch" or self.set_up is None:
            return None
        return find_wrapped(self, fullname, path, target, _imported)


_hook = _TorchImported()


def _imported(torch: Any) -> None:
    set_up, _hook.set_up = _hook.set_up, None
    rng.defer_torch = False
    try:
        if set_up is not None:
            set_up(torch)
        seed, rng.torch_pending = rng.torch_pending, None
        if seed is not None:
            torch.random.default_generator.manual_seed(seed)
    except Exception:  # pragma: no cover - torch internals moved: never fail the user's import
        pass


def gather_later(gather: Callable[..., Any]) -> Callable[..., Any]:
    """``gather`` as a lean worker calls it: numpy columns marked ``TensorLater`` while torch
    is not imported here (what ``gather(output="torch")`` gives, made tensors by the main
    process), the dataset's own ``gather`` once it is."""

    def lean_gather(indices: Any, output: str = "torch") -> Any:
        if output != "torch" or "torch" in sys.modules:
            return gather(indices, output=output)
        columns = gather(indices, output="numpy")
        out = []
        for c in columns:
            if type(c) is not np.ndarray or f"{c.dtype.kind}{c.dtype.itemsize}" not in _KINDS:
                return gather(indices, output="torch")  # (imports torch: set up as above)
            if not c.dtype.isnative:
                c = c.astype(c.dtype.newbyteorder("="))  # as gather(output="torch") does
            out.append(c.view(TensorLater))
        return out

    return lean_gather
