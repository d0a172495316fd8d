"""Samplers: which dataset indices to load, in which order.

```
 data_source ──> Sampler ──> index, index, ...  ──> BatchSampler ──> [index, ...], ...
                   ▲                                     │
  (seed, epoch) or a torch.Generator          state_dict / load_state_dict
```

Randomness has two modes:

* **torch mode** (no ``seed=`` given and torch installed): the samplers draw
  exactly what ``torch.utils.data``'s samplers draw, from the same RNG and in
  the same order, so the same ``torch.manual_seed`` or ``torch.Generator``
  gives the same indices as torch.
* **seed mode** (``seed=`` given, or torch missing): the order is a pure
  function of ``(seed, epoch)`` computed with numpy. Each iteration uses the
  current epoch and then moves to the next one; ``set_epoch`` picks it.

Every sampler checkpoints with ``state_dict()``: a small JSON-ready dict from
which ``load_state_dict`` on an identically built sampler makes the next
iteration repeat the one that most recently started (or the one that would
start next). Skipping consumed items on resume is the loader's job.

``base``: the protocol, ``SequentialSampler``, ``BatchSampler`` and the shared RNG;
``random``: the samplers that draw; ``distributed``: ``DistributedSampler``.
"""

from __future__ import annotations

from .base import BatchSampler, Sampler, SequentialSampler
from .distributed import DistributedSampler
from .random import RandomSampler, SubsetRandomSampler, WeightedRandomSampler

__all__ = [
    "BatchSampler",
    "DistributedSampler",
    "RandomSampler",
    "Sampler",
    "SequentialSampler",
    "SubsetRandomSampler",
    "WeightedRandomSampler",
]
