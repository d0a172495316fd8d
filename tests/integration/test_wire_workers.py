"""What workers send arrives as the main process would have made it: small leaves, dtypes
numpy lacks, memory layouts, aliased leaves, ArrayDataset's odd columns, and orders that
reach a sleeping worker (the in-process half of the pipe protocol is tests/unit/test_wire.py)."""

from __future__ import annotations

import multiprocessing as mp
from typing import Any

import numpy as np
import pytest
import torch

import conveyor


class Odd(torch.utils.data.Dataset):  # type: ignore[type-arg]
    """Small leaves of every shape the blob carries: scalars, empty, bool, half, numpy."""

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {"scalar": torch.tensor(float(i)), "empty": torch.zeros(0, 3), "flag": torch.tensor(i % 2 == 0),
                "half": torch.full((2,), i, dtype=torch.float16), "np": np.arange(3, dtype=np.int32) + i,
                "label": i}


@pytest.mark.parametrize("output", ["torch", "numpy"])
def test_small_leaves_from_workers_match_the_main_process(output: str) -> None:
    inline = list(conveyor.DataLoader(Odd(), batch_size=4, output=output))
    with conveyor.DataLoader(Odd(), batch_size=4, num_workers=2, adaptive=False, output=output) as loader:
        from_workers = list(loader)
    for a, b in zip(inline, from_workers):
        assert a.keys() == b.keys()
        for k in a:
            if output == "torch" and k != "label":
                assert isinstance(b[k], torch.Tensor) and b[k].dtype == a[k].dtype
                assert b[k].shape == a[k].shape and torch.equal(a[k], b[k])
            else:
                np.testing.assert_array_equal(np.asarray(a[k]), np.asarray(b[k]))
                assert np.asarray(a[k]).dtype == np.asarray(b[k]).dtype


_LACKING = [d for d in ("bfloat16", "float8_e4m3fn", "float8_e5m2", "complex32") if hasattr(torch, d)]


class Lacking(torch.utils.data.Dataset):  # type: ignore[type-arg]
    """Tensors of dtypes numpy lacks: small (in the message), large (in a slot), 0-d, empty,
    transposed; float8 and complex32 did not survive the pickle they used to travel by."""

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> dict[str, Any]:
        g = torch.Generator().manual_seed(i)
        out: dict[str, Any] = {}
        for name in _LACKING:
            dt = getattr(torch, name)
            base = torch.randn(64, 40, generator=g) if name != "complex32" else torch.randn(64, 40, 2, generator=g)
            t = (base if name != "complex32" else torch.view_as_complex(base)).to(dt)
            out[name] = {"big": t, "small": t[:2, :3], "0d": t[0, 0], "empty": t[:0], "t": t[:4].t()}
        return out


def _bytes_of(t: torch.Tensor) -> bytes:
    return t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


@pytest.mark.timeout(60)
@pytest.mark.filterwarnings("ignore:ComplexHalf support is experimental")
@pytest.mark.parametrize("batch_size", [None, 2])
def test_dtypes_numpy_lacks_come_from_workers_as_they_were_made(batch_size: int | None) -> None:
    inline = list(conveyor.DataLoader(Lacking(), batch_size=batch_size))
    with conveyor.DataLoader(Lacking(), batch_size=batch_size, num_workers=2, adaptive=False) as loader:
        from_workers = list(loader)
    assert len(inline) == len(from_workers)
    for a, b in zip(inline, from_workers):
        for name in _LACKING:
            for k, want in a[name].items():
                got = b[name][k]
                assert type(got) is torch.Tensor and got.dtype == want.dtype and got.shape == want.shape, (name, k)
                assert _bytes_of(got) == _bytes_of(want), (name, k)


class Layouts(torch.utils.data.Dataset):  # type: ignore[type-arg]
    """Samples laid out other than in C order: small and large (a slot), 4-d and 2-d."""

    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        g = torch.Generator().manual_seed(i)
        return {"cl": torch.rand(2, 3, 4, 5, generator=g).contiguous(memory_format=torch.channels_last),
                "cl_big": torch.rand(4, 3, 32, 32, generator=g).contiguous(memory_format=torch.channels_last),
                "t": torch.rand(3, 4, generator=g).t(), "t_big": torch.rand(100, 200, generator=g).t()}


@pytest.mark.timeout(60)
def test_unbatched_tensors_from_workers_keep_their_memory_layout() -> None:
    # batch_size=None: torch's workers pickle a sample tensor as it is, strides and all; they
    # came back in C order (channels_last lost)
    inline = list(conveyor.DataLoader(Layouts(), batch_size=None))
    with conveyor.DataLoader(Layouts(), batch_size=None, num_workers=2, adaptive=False) as loader:
        from_workers = list(loader)
    for a, b in zip(inline, from_workers):
        for k in a:
            assert torch.equal(a[k], b[k]) and b[k].stride() == a[k].stride(), (k, a[k].stride(), b[k].stride())


@pytest.mark.timeout(60)
def test_unbatched_scalar_labels_from_workers_keep_their_values() -> None:
    """batch_size=None over labels: each batch is one 0-d integer tensor, as torch gives it."""
    labels = torch.arange(10) * 10 + 10
    data = torch.utils.data.TensorDataset(labels)
    with conveyor.DataLoader(data, batch_size=None, num_workers=2, adaptive=False) as loader:
        got = [b[0] for b in loader]
    assert [t.item() for t in got] == labels.tolist()
    assert all(t.dim() == 0 and t.dtype == torch.int64 for t in got)


class OneD(torch.utils.data.Dataset):  # type: ignore[type-arg]
    """Large 1-D samples, unbatched: each a slot leaf decoded with torch.frombuffer."""

    def __len__(self) -> int:
        return 12

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.full((20000,), float(i))


@pytest.mark.timeout(60)
def test_one_dimensional_slot_leaves_stay_intact_while_held() -> None:
    with conveyor.DataLoader(OneD(), batch_size=None, num_workers=2, adaptive=False) as loader:
        held = list(loader)
        again = list(loader)  # slots of batches still held must not be reused
    for batches in (held, again):
        assert [b.shape for b in batches] == [torch.Size([20000])] * 12
        assert all(torch.equal(b, torch.full((20000,), float(i))) for i, b in enumerate(batches))


class ImagesAndIds(torch.utils.data.Dataset):  # type: ignore[type-arg]
    """1 MB of pixels and 8 KB of token ids a sample: batches of 8 MB beside 64 KB."""

    def __len__(self) -> int:
        return 8 * 40

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"pixels": torch.full((256, 1024), float(i)), "ids": torch.full((1024,), i, dtype=torch.int64)}


@pytest.mark.timeout(120)
def test_keeping_a_batchs_small_leaf_keeps_only_that_leaf() -> None:
    # a slot goes back to its worker once no view of it is left: the ids kept for epoch-end
    # metrics kept their batch's pixels too, a new slot every batch (100 MB batches, 2
    # workers: 1434 -> 4271 MB over 30 batches; torch's workers kept only the ids)
    from helpers import shm_entries

    kept, most = [], 0
    with conveyor.DataLoader(ImagesAndIds(), batch_size=8, num_workers=2, adaptive=False) as loader:
        for batch in loader:
            kept.append(batch["ids"])
            assert batch["pixels"].shape == (8, 256, 1024)
            del batch
            most = max(most, len(shm_entries()))
    assert len(kept) == 40 and all(torch.equal(ids, torch.arange(8 * k, 8 * k + 8).repeat_interleave(1024)
                                               .view(8, 1024)) for k, ids in enumerate(kept))
    assert most <= 16, most  # (8 seen) the slots each worker holds ahead, not one per batch kept


def _aliased(samples: list[torch.Tensor]) -> dict[str, Any]:
    ids = torch.stack(samples)
    small = torch.arange(3)
    return {"input_ids": ids, "labels": ids, "pair": (small, small), "other": ids.clone()}


class Rows(torch.utils.data.Dataset):  # type: ignore[type-arg]
    def __len__(self) -> int:
        return 16

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.full((8192,), i, dtype=torch.int64)  # 256 KB batches of 4: in a slot


@pytest.mark.timeout(60)
@pytest.mark.parametrize("workers", [0, 2])
def test_a_leaf_the_batch_holds_twice_comes_back_as_one_object(workers: int) -> None:
    # torch's pickle keeps the identity ({"input_ids": ids, "labels": ids}, as a language
    # model's collate makes them): an in-place edit of labels (pad -> -100) edits input_ids
    # too. conveyor's workers sent two copies, and adaptive's main-process batches one.
    for loader in (torch.utils.data.DataLoader(Rows(), batch_size=4, num_workers=workers, collate_fn=_aliased),
                   conveyor.DataLoader(Rows(), batch_size=4, num_workers=workers, collate_fn=_aliased,
                                       adaptive=False)):
        for batch in loader:
            assert batch["labels"] is batch["input_ids"] and batch["pair"][0] is batch["pair"][1]
            assert batch["other"] is not batch["input_ids"]
            batch["labels"][0, 0] = -100
            assert batch["input_ids"][0, 0] == -100 and batch["other"][0, 0] != -100


@pytest.mark.timeout(60)
def test_fork_workers_sleep_on_a_bell_and_still_get_every_order() -> None:
    """Persistent workers idle between epochs (nothing in the pipe): each new order must
    reach them through the bell; close() too."""
    from conveyor.executors.task import Doorbell

    if Doorbell.make() is None or mp.get_start_method(allow_none=True) not in (None, "fork"):
        pytest.skip("fork workers with an eventfd only")
    with conveyor.DataLoader(list(range(40)), batch_size=4, num_workers=2, persistent_workers=True,
                             adaptive=False) as loader:
        for _ in range(3):
            assert [b.tolist() for b in loader] == [list(range(i, i + 4)) for i in range(0, 40, 4)]
        workers = loader._persistent.executor.workers
        assert all(wk is not None and wk.bell is not None and wk.bell.fd >= 0 for wk in workers)
        bells = [wk.bell for wk in workers]
    assert all(b.fd == -1 for b in bells)


@pytest.mark.timeout(60)
def test_orders_larger_than_the_pipe_reach_a_worker_asleep_on_its_bell() -> None:
    """A task of 40,000 indices pickles to ~200 KB, three times a pipe's capacity. Between
    epochs the persistent workers sleep; the next epoch's first order must still get through
    (a bell rung only once the whole message is written would never ring: the write would
    block on a full pipe that nobody reads)."""
    data = list(range(120_000))
    with conveyor.DataLoader(data, batch_size=40_000, num_workers=2, persistent_workers=True,
                             adaptive=False) as loader:
        for _ in range(2):
            batches = list(loader)
            assert [b.shape[0] for b in batches] == [40_000] * 3
            assert torch.equal(torch.cat(batches), torch.arange(120_000))


@pytest.mark.timeout(60)
@pytest.mark.parametrize("column", ["strings", "objects", "big-endian"])
@pytest.mark.parametrize("workers", [0, 2])
def test_array_dataset_odd_columns_collate_as_torchs(column: str, workers: int) -> None:
    # strings and objects cannot become tensors: their rows go through the collate function
    # (as torch's loader takes them); a big-endian column is gathered in native order
    import torch.utils.data as tud

    import conveyor

    cols: dict[str, list[Any]] = {
        "strings": [np.arange(6), ["a", "b", "c", "d", "e", "f"]],
        "objects": [np.arange(6), np.array([{"k": i} for i in range(6)], dtype=object)],
        "big-endian": [np.arange(6).astype(">i4")],
    }
    ds = conveyor.ArrayDataset(*cols[column])
    theirs = list(tud.DataLoader(ds, batch_size=4))
    with conveyor.DataLoader(ds, batch_size=4, num_workers=workers) as loader:
        mine = list(loader)
    assert repr(mine) == repr(theirs)
