"""Process-wide: import hooks first on ``sys.meta_path`` (``insert_first``), which run code
right after a module is imported: the loader the other finders return for it, wrapped.
(Plain classes: ``importlib.abc`` takes ~10 ms to import.)

Used where something must be set up in a module that may be imported later than conveyor
can act: numpy's global RNG seeded the moment ``numpy.random`` is imported (``rng``), and
torch's worker info given to a worker whose dataset imports torch only once it runs
(``torch_hooks``).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

__all__ = ["ExecThen", "find_wrapped", "insert_first"]


def insert_first(hook: Any) -> None:
    """Put ``hook`` first on ``sys.meta_path`` (once)."""
    if hook not in sys.meta_path:
        sys.meta_path.insert(0, hook)


def find_wrapped(hook: Any, fullname: str, path: Any, target: Any, then: Callable[[Any], None]) -> Any:
    """The spec the finders after ``hook`` give for ``fullname``, its loader made to call
    ``then(module)`` once the module has run."""
    for finder in sys.meta_path:
        find = getattr(finder, "find_spec", None)
        if finder is hook or find is None:
            continue
        spec = find(fullname, path, target)
        if spec is not None:
            if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                spec.loader = ExecThen(spec.loader, then)
            return spec
    return None


class ExecThen:
    """A module's own loader, then ``then(module)`` (the module keeps its own loader)."""

    def __init__(self, inner: Any, then: Callable[[Any], None]) -> None:
        self.inner = inner
        self.then = then

    def create_module(self, spec: Any) -> Any:
        return self.inner.create_module(spec)

    def exec_module(self, module: Any) -> None:
        module.__loader__ = self.inner
        if getattr(module, "__spec__", None) is not None:
            module.__spec__.loader = self.inner
        self.inner.exec_module(module)
        self.then(module)
