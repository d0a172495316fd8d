"""num_workers / fetch_threads / prefetch_factor = "auto": the loader tunes itself and says so."""

from __future__ import annotations

import time

import numpy as np
import pytest

import conveyor.loader
from conveyor import DataLoader


class Tiny:
    """Samples cost next to nothing: the main process should keep them."""

    def __len__(self) -> int:
        return 512

    def __getitem__(self, i: int) -> np.ndarray:
        return np.full(2, i, dtype=np.int64)


class Waits:
    """Each sample waits on 'storage' (sleeps) and uses almost no CPU."""

    def __len__(self) -> int:
        return 16 * 24

    def __getitem__(self, i: int) -> np.ndarray:
        time.sleep(0.004)
        return np.full(2, i, dtype=np.int64)


def _all(loader: DataLoader) -> np.ndarray:
    return np.concatenate([b[:, 0] for b in loader])


@pytest.mark.timeout(60)
def test_cheap_samples_stay_in_the_main_process(monkeypatch: pytest.MonkeyPatch) -> None:
    # "cheap" is a measured cost; a generous bar keeps this independent of how busy the machine is
    monkeypatch.setattr(conveyor.loader, "INLINE_MAX_S", 0.05)
    with DataLoader(Tiny(), batch_size=16, num_workers="auto", output="numpy") as loader:
        got = _all(loader)
        stats = loader.stats()
        decision = loader.tuning()
    assert np.array_equal(got, np.arange(512))
    assert decision is not None and decision["num_workers"] == 0, decision
    assert stats["main_process_batches"] == 512 // 16
    assert not stats["workers_started"]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("worker_type", ["process", "thread"])
def test_waiting_samples_get_workers_and_fetch_threads(worker_type: str) -> None:
    with DataLoader(Waits(), batch_size=16, num_workers="auto", fetch_threads="auto",
                    worker_type=worker_type, output="numpy") as loader:
        got = _all(loader)
        stats = loader.stats()
        decision = loader.tuning()
    assert np.array_equal(got, np.arange(16 * 24))  # every sample once, in order, while settings changed
    assert stats["workers_started"]
    assert decision is not None and decision["num_workers"] >= 1
    assert stats["fetch_threads"] > 1, stats["fetch_threads"]
    assert decision["reason"]


def test_auto_prefetch_needs_workers() -> None:
    with pytest.raises(ValueError, match="prefetch_factor"):
        DataLoader(Tiny(), num_workers=0, prefetch_factor="auto")


@pytest.mark.timeout(60)
def test_the_choice_can_be_pinned() -> None:
    with DataLoader(Waits(), batch_size=16, num_workers="auto", fetch_threads="auto", output="numpy") as loader:
        _all(loader)
        decision = loader.tuning()
    assert decision is not None
    pinned = {k: decision[k] for k in ("num_workers", "fetch_threads", "prefetch_factor")}
    if pinned["num_workers"] == 0:
        pinned["prefetch_factor"] = None
    with DataLoader(Waits(), batch_size=16, output="numpy", **pinned) as again:
        assert np.array_equal(_all(again), np.arange(16 * 24))
        assert again.stats()["fetch_threads"] == pinned["fetch_threads"]
