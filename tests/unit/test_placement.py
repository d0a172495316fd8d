"""The probe's decision after a batch timed in the main process (``rules.verdict``), table-driven:
observations in, a verdict out, no loader and no process."""

from __future__ import annotations

from dataclasses import replace

import pytest

from conveyor.placement import rules
from conveyor.placement.rules import Timed, Verdict

SLOW = rules.SLOW_S
CHEAP = rules.INLINE_MAX_S / 4

# the user's worker count (adaptive=True), nothing decided yet
USER = Timed(costs=(CHEAP,), rate=1e6, copying=False, waits=False, auto=False, probing=True, workers=2,
             window_end=False, rng_sensitive=False, no_core_left=False)
# "auto", no workers yet
AUTO = replace(USER, auto=True, workers=0)


def never(*args: object) -> bool:
    raise AssertionError("asked where the answer cannot matter")


def yes(*args: object) -> bool:
    return True


def no(*args: object) -> bool:
    return False


@pytest.mark.parametrize("seen, start_outweighs, worth, reopenable, expected", [
    # the user's workers: one cheap batch says nothing yet; two decide at once
    (USER, no, never, never, Verdict.KEEP),
    (replace(USER, costs=(CHEAP, CHEAP)), no, no, never, Verdict.HERE),
    (replace(USER, costs=(CHEAP, CHEAP)), no, yes, never, Verdict.WORKERS),
    # ... four costly ones decide by the cheapest
    (replace(USER, costs=(2 * CHEAP,) * 4), no, yes, never, Verdict.WORKERS),
    # a memory copy stays here, whatever a trip costs (not even asked)
    (replace(USER, costs=(CHEAP, CHEAP), copying=True), no, never, never, Verdict.HERE),
    # one batch five times SLOW_S is enough; one moderately slow batch is not, two are
    (replace(USER, costs=(6 * SLOW,)), no, never, never, Verdict.WORKERS_NOW),
    (replace(USER, costs=(1.5 * SLOW,)), no, never, never, Verdict.KEEP),
    (replace(USER, costs=(1.5 * SLOW, 1.5 * SLOW)), no, never, never, Verdict.WORKERS_NOW),
    # ... but not a fast memory copy, nor where starting the workers costs more than they save
    (replace(USER, costs=(6 * SLOW,), rate=2 * rules.INLINE_RATE), no, never, never, Verdict.KEEP),
    (replace(USER, costs=(1.5 * SLOW, 1.5 * SLOW)), yes, never, never, Verdict.KEEP),
    # a dataset that draws from the global RNGs is made right only by its worker
    (replace(USER, rng_sensitive=True), no, never, never, Verdict.WORKERS_NOW),
    # "auto": a slow first batch that waits starts a worker per core now; one that computes waits
    # for a second opinion, which two training processes on the machine's cores overrule
    (replace(AUTO, costs=(1.5 * SLOW,), waits=True), no, never, never, Verdict.JUMP),
    (replace(AUTO, costs=(1.5 * SLOW,)), no, never, never, Verdict.KEEP),
    (replace(AUTO, costs=(1.5 * SLOW, 1.5 * SLOW)), no, never, never, Verdict.JUMP),
    (replace(AUTO, costs=(1.5 * SLOW, 1.5 * SLOW), no_core_left=True), no, never, never, Verdict.KEEP),
    (replace(AUTO, costs=(1.5 * SLOW,), waits=True), yes, never, never, Verdict.KEEP),
    # ... workers already running are not started again
    (replace(AUTO, costs=(1.5 * SLOW,), waits=True, workers=2, probing=False), no, never, never, Verdict.KEEP),
    # "auto" probing: cheap batches stay here, costly ones go on to the tuner's choice
    (replace(AUTO, costs=(CHEAP, CHEAP)), no, no, never, Verdict.HERE),
    (replace(AUTO, costs=(CHEAP, CHEAP)), no, yes, never, Verdict.KEEP),
    (replace(AUTO, costs=(CHEAP,), copying=True), no, never, never, Verdict.HERE),
    # "auto" settled here: a whole window of costly batches reopens the choice
    (replace(AUTO, costs=(2 * CHEAP,) * 16, probing=False, window_end=True), no, yes, yes, Verdict.REOPEN),
    (replace(AUTO, costs=(2 * CHEAP,) * 16, probing=False, window_end=True), no, no, yes, Verdict.KEEP),
    (replace(AUTO, costs=(2 * CHEAP,) * 16, probing=False, window_end=True), no, never, no, Verdict.KEEP),
    (replace(AUTO, costs=(2 * CHEAP,) * 15, probing=False, window_end=True), no, never, never, Verdict.KEEP),
])
def test_a_timed_batch_gets_its_verdict(seen: Timed, start_outweighs: object, worth: object, reopenable: object,
                                        expected: Verdict) -> None:
    said, _, _ = rules.verdict(seen, start_outweighs, worth, reopenable)  # type: ignore[arg-type]
    assert said is expected


def test_a_whole_window_read_is_what_later_epochs_go_by() -> None:
    # the window's low quartile (its fifth cheapest of 16): a few slow batches say nothing
    costs = (1e-3,) * 4 + (2e-4,) * 12
    seen = replace(AUTO, costs=costs, probing=False, window_end=True)
    judged: list[float] = []

    def worth(cost: float) -> bool:
        judged.append(cost)
        return False

    said, low, whole = rules.verdict(seen, no, worth, yes)
    assert (said, low, whole) == (Verdict.KEEP, 2e-4, True)
    assert judged == [2e-4]
    # a probing choice judges by the same quartile, but later epochs keep the probe's estimate
    said, low, whole = rules.verdict(replace(AUTO, costs=(CHEAP, 3 * CHEAP)), no, no, never)
    assert (said, low, whole) == (Verdict.HERE, rules.typical((CHEAP, 3 * CHEAP)), False)
