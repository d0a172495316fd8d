"""One save/load/resume harness for the tests.

A resume is right when a loader cut after ``k`` batches, its ``state_dict()`` carried the
way a checkpoint carries it (through JSON or pickle) and loaded into a NEW loader, gives
what an uninterrupted run gives after those ``k`` batches: the rest of the cut epoch, then
the epochs after it. ``resumes_exactly`` checks exactly that; ``cut``, ``resume`` and
``interrupted`` are its steps, for tests that check something else about the states or the
batches (the batches handed out of order, a state's fields, the global RNGs in between).

Counting: ``k`` batches are counted over epochs (``k = len(epoch 0) + 2`` cuts epoch 1
after two batches). A state saved after an epoch's last batch names the next epoch, so
the resumed loader runs ``epochs`` minus the epochs the cut run finished.
"""

from __future__ import annotations

import json
import pickle
from collections.abc import Callable
from typing import Any, NamedTuple

Epochs = list[list[Any]]


def plain(batch: Any) -> Any:
    """A batch as plain values (tensors and arrays as nested lists), to compare with ``==``
    and to read in an assertion's message."""
    if isinstance(batch, dict):
        return {k: plain(v) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        return [plain(x) for x in batch]
    if hasattr(batch, "tolist"):
        return batch.tolist()
    return batch


def carry(state: Any, via: str | None) -> Any:
    """The state as a checkpoint gives it back: through JSON (a plain file), pickle
    (torch.save), or as it is (``None``: the same process, the same objects)."""
    if via == "json":
        return json.loads(json.dumps(state))
    if via == "pickle":
        return pickle.loads(pickle.dumps(state))
    if via is None:
        return state
    raise ValueError(f"via should be 'json', 'pickle' or None, not {via!r}")


def run_epochs(loader: Any, epochs: int = 1, convert: Callable[[Any], Any] = plain) -> Epochs:
    """``epochs`` whole epochs of ``loader`` (closed after)."""
    with loader:
        return [[convert(b) for b in loader] for _ in range(epochs)]


class Cut(NamedTuple):
    head: list[Any]  # the batches handed out before the cut, over epochs
    state: Any  # the state saved at the cut, carried
    epoch: int  # the epoch the state names (the epochs the cut run finished)


def cut(loader: Any, at: int, *, exhaust: bool = False, via: str | None = "json",
        convert: Callable[[Any], Any] = plain) -> Cut:
    """Take ``at`` batches from ``loader`` (over epochs), save its state while the iterator
    still runs, close it. ``exhaust``: where ``at`` ends an epoch, run its iterator to
    StopIteration before saving."""
    head: list[Any] = []
    epoch = 0
    with loader:
        it = iter(loader)
        while len(head) < at:
            try:
                batch = next(it)
            except StopIteration:
                assert head, "the loader's first epoch is empty"
                it = iter(loader)
                epoch += 1
                continue
            head.append(convert(batch))
        if exhaust:
            next(it, None)
        try:
            per_epoch = len(loader)
        except TypeError:  # a stream without a length: its epochs end where the stream does
            per_epoch = 0
        if head and per_epoch and len(head) == per_epoch * (epoch + 1):
            epoch += 1  # every batch of the epoch handed out: the state names the next one
        state = carry(loader.state_dict(), via)
    return Cut(head, state, epoch)


def resume(loader: Any, state: Any, epochs: int = 1, convert: Callable[[Any], Any] = plain,
           after_load: Callable[[Any], Any] | None = None) -> Epochs:
    """Load ``state`` into ``loader`` and run ``epochs`` epochs of it (the first is what was
    left of the saved one). ``after_load(loader)`` runs between the load and the first epoch."""
    with loader:
        loader.load_state_dict(state)
        if after_load is not None:
            after_load(loader)
        return [[convert(b) for b in loader] for _ in range(epochs)]


def interrupted(first: Any, second: Any, at: int, epochs: int = 1, *, exhaust: bool = False,
                via: str | None = "json", convert: Callable[[Any], Any] = plain) -> Epochs:
    """Cut ``first`` after ``at`` batches and resume in ``second``: what ``second`` gives, up
    to ``epochs`` epochs in all (counting those ``first`` ran)."""
    done = cut(first, at, exhaust=exhaust, via=via, convert=convert)
    assert done.epoch <= epochs, f"cut after {at} batches, past the {epochs} epochs asked for"
    return resume(second, done.state, epochs - done.epoch, convert)


def expected_after(ref: Epochs, at: int) -> Epochs:
    """The batches an uninterrupted run yields after ``at`` batches, epoch by epoch (after an
    epoch's last batch, the next epoch: a state saved there names it)."""
    if at == 0:
        return ref
    epoch = 0
    while epoch < len(ref) and at >= len(ref[epoch]):
        at -= len(ref[epoch])
        epoch += 1
    return ([ref[epoch][at:]] if epoch < len(ref) else []) + ref[epoch + 1:]


def resumes_exactly(make_loader: Callable[[], Any], cut_at: int, *, epochs: int = 1, via: str | None = "json",
                    first: Callable[[], Any] | None = None, resumed: Callable[[], Any] | None = None,
                    exhaust: bool = False, convert: Callable[[Any], Any] = plain,
                    after_load: Callable[[Any], Any] | None = None) -> Epochs:
    """Assert that a run cut after ``cut_at`` batches and resumed in a new loader gives what
    an uninterrupted run of ``make_loader()`` gives, over ``epochs`` epochs; returns the
    resumed loader's epochs.

    ``first`` and ``resumed`` make the cut and the resumed loaders where they differ from
    ``make_loader`` (another worker count, type or prefetch: the batches must not change).
    The cut run's first ``cut_at`` batches must be the uninterrupted run's too."""
    ref = run_epochs(make_loader(), epochs, convert)
    flat = [b for e in ref for b in e]
    assert cut_at <= len(flat), f"cut after {cut_at} batches of a run of {len(flat)}"
    done = cut((first or make_loader)(), cut_at, exhaust=exhaust, via=via, convert=convert)
    assert done.head == flat[:cut_at], f"the cut run's first {cut_at} batches are not the uninterrupted run's"
    rest = resume((resumed or make_loader)(), done.state, epochs - done.epoch, convert, after_load)
    want = expected_after(ref, cut_at)
    assert rest == want, f"resumed after {cut_at} batches (state {done.state}):\n{rest}\n!= uninterrupted\n{want}"
    return rest
