"""Results arrive in any order; the user receives them in ``seq`` order.

With ``in_order=False`` a ready batch is handed out at once instead of
waiting for a slower one ahead of it.
"""

from __future__ import annotations

from .task import Result

__all__ = ["Reorder"]


class Reorder:
    """A buffer keyed by ``seq``.

    >>> r = Reorder(first=0)
    >>> r.push(Result(1, 0)); r.pop() is None
    True
    >>> r.push(Result(0, 0)); [r.pop().seq, r.pop().seq]
    [0, 1]
    """

    __slots__ = ("next", "buffer", "in_order")

    def __init__(self, first: int, in_order: bool = True) -> None:
        self.next = first
        self.buffer: dict[int, Result] = {}
        self.in_order = in_order

    def push(self, result: Result) -> None:
        self.buffer[result.seq] = result

    def pop(self) -> Result | None:
        if self.in_order:
            r = self.buffer.pop(self.next, None)
            if r is not None:
                self.next += 1
            return r
        if not self.buffer:
            return None
        seq = min(self.buffer)
        return self.buffer.pop(seq)

    def __len__(self) -> int:
        return len(self.buffer)
