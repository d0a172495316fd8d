"""Benchmark scenarios: a dataset, a batch size, a collate function and a train step.

    build(family, quick) ──> Setup(dataset, batch_size, collate_fn, epochs, step, opts)
    run.py child:  loader = loaders.make(setup...)  ──> for epoch: for batch: step(batch)

Every dataset class and collate function lives at module level here, so that a
loader that starts its workers with ``spawn`` (Grain) can pickle them. Data is
synthetic and made from a fixed seed, so every run of a scenario sees the same
bytes. ``family`` is ``"torch"``, ``"conveyor"`` or ``"peer"``: only
``diabetes_array`` gives the families different datasets.

>>> setup = SCENARIOS["diabetes"].build("torch", quick=True)
>>> setup.batch_size, len(setup.dataset)
(32, 759)
"""

from __future__ import annotations

import io
import os
import random
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset, TensorDataset, default_collate


__all__ = ["SCENARIOS", "Scenario", "Setup", "Skip"]

# torch1 and torch4 stand beside torch0 and torch2 so that "auto" is read against the best
# worker count a user could have picked for torch
BASE_LOADERS = ("torch0", "torch1", "torch2", "torch4", "torchdata2", "grain2", "spdl2",
                "conveyor0", "conveyor2", "conveyor2t", "conveyor_auto", "floor2")


class Skip(Exception):
    """The scenario cannot run in this checkout (a note says why)."""


@dataclass(frozen=True)
class Setup:
    """What one child run needs: data, batching, epochs and the per-batch step.

    ``opts`` maps a loader name to extra keyword arguments for that loader;
    ``ideal_s`` (overlap only) maps a worker count to the best possible time.
    ``warmup_epochs`` run untimed through the same loader before the timed ``epochs``
    (steady-state scenarios: first-call costs inside torch, paid by every loader alike,
    would otherwise be most of a run that takes a few milliseconds). With ``best_of`` > 1
    the timed epochs run that many times and the fastest pass counts, for every loader
    alike: a run of a millisecond or two on a shared machine otherwise measures other
    jobs' preemptions more than the loader.
    """

    dataset: Any
    batch_size: int
    epochs: int
    collate_fn: Callable[[list[Any]], Any] | None = None
    step: Callable[[Any], None] | None = None
    shuffle: bool = True
    opts: dict[str, dict[str, Any]] = field(default_factory=dict)
    ideal_per_batch_s: Callable[[int], float] | None = None
    warmup_epochs: int = 0
    best_of: int = 1


@dataclass(frozen=True)
class Scenario:
    """A named benchmark: ``build`` makes the Setup in the child process.

    ``loaders`` lists loader names; a name may be a variant ``"<base>_<tag>"``
    declared in ``variants`` as ``(base, extra kwargs)``. ``headline`` is the
    conveyor loader reported in the summary table. ``min_repeats``: runs of a few tens of
    milliseconds, where one preemption moves a run by a third, get at least this many
    repeats in a full run (every loader alike). ``steady_malloc``: every run of every loader
    fixes glibc's trim and mmap thresholds before it starts (``run.steady_malloc``), where
    glibc's own heuristics split the runs of every loader in two (see the README).
    """

    name: str
    doc: str
    build: Callable[[str, bool], Setup]
    loaders: tuple[str, ...] = BASE_LOADERS
    variants: dict[str, tuple[str, dict[str, Any]]] = field(default_factory=dict)
    headline: str = "conveyor2"
    targets: tuple[str, ...] = ()
    min_repeats: int = 0
    steady_malloc: bool = False


def busy(seconds: float) -> None:
    """Burn ``seconds`` of this thread's CPU time (not wall time)."""
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


# ---------------------------------------------------------------- diabetes
# the data is conveyor demo's (conveyor.cli.diabetes): 759 x 8 float32 + a 0/1 label, tensors held whole

class Model(torch.nn.Module):
    """The seed's 8-6-4-1 sigmoid MLP."""

    def __init__(self) -> None:
        super().__init__()
        self.linear1 = torch.nn.Linear(8, 6)
        self.linear2 = torch.nn.Linear(6, 4)
        self.linear3 = torch.nn.Linear(4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.sigmoid(self.linear1(x))
        x = torch.sigmoid(self.linear2(x))
        return torch.sigmoid(self.linear3(x))


def train_step() -> Callable[[Any], None]:
    """One SGD step of the seed's model on a batch ``(x, y)``.

    Runs torch on one intra-op thread: layers 8 wide gain nothing from more,
    and on a busy 2-core machine spinning OpenMP threads swamp the loader.
    """
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = Model()
    loss_fn = torch.nn.BCELoss(reduction="mean")
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    def step(batch: Any) -> None:
        x, y = batch
        loss = loss_fn(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()

    return step


def build_diabetes(family: str, quick: bool) -> Setup:
    from conveyor.cli import Diabetes  # (in the child: compare_trees' parent imports no conveyor)

    return Setup(Diabetes(tensors=True), batch_size=32, epochs=2 if quick else 10)


def build_diabetes_train(family: str, quick: bool) -> Setup:
    from conveyor.cli import Diabetes

    return Setup(Diabetes(tensors=True), batch_size=32, epochs=2 if quick else 10, step=train_step())


def build_diabetes_array(family: str, quick: bool) -> Setup:
    from conveyor.cli import make_diabetes

    x, y = make_diabetes()
    if family == "conveyor":
        try:
            from conveyor import ArrayDataset
        except ImportError as e:
            raise Skip(f"conveyor.ArrayDataset is missing: {e}") from e
        dataset: Any = ArrayDataset(x, y)
    else:
        dataset = TensorDataset(torch.from_numpy(x), torch.from_numpy(y))
    return Setup(dataset, batch_size=32, epochs=2 if quick else 10, warmup_epochs=1, best_of=1 if quick else 5)


# ---------------------------------------------------------------- images_uint8

class Images(Dataset):
    """``n`` random uint8 3x224x224 images in one numpy array; no compute."""

    def __init__(self, n: int) -> None:
        self.data = np.random.default_rng(0).integers(0, 256, size=(n, 3, 224, 224), dtype=np.uint8)

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.from_numpy(self.data[index])

    def __len__(self) -> int:
        return len(self.data)


def build_images(family: str, quick: bool) -> Setup:
    return Setup(Images(256 if quick else 2048), batch_size=64, epochs=1 if quick else 4)


# ---------------------------------------------------------------- jpeg

def jpeg_dir(n: int) -> Path:
    """``n`` random JPEGs of 256..320 px a side, made once and cached in the folder named by
    ``CONVEYOR_BENCH_CACHE`` (the system temp folder when unset; tests give their own)."""
    from PIL import Image

    root = Path(os.environ.get("CONVEYOR_BENCH_CACHE") or tempfile.gettempdir()) / f"conveyor_bench_jpeg_{n}"
    done = root / "DONE"
    if done.exists():
        return root
    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for i in range(n):
        h, w = (int(s) for s in rng.integers(256, 321, size=2))
        # smooth noise compresses like a photo, not like white noise
        small = rng.integers(0, 256, size=(h // 8 + 1, w // 8 + 1, 3), dtype=np.uint8)
        img = Image.fromarray(small).resize((w, h), Image.BILINEAR)
        buf = io.BytesIO()
        img.save(buf, format="JPEG", quality=90)
        (root / f"{i:05d}.jpg").write_bytes(buf.getvalue())
    done.write_text(str(n))
    return root


class Jpegs(Dataset):
    """Decode with Pillow, random 224 crop and horizontal flip, uint8 CHW tensor."""

    def __init__(self, root: str, size: int = 224) -> None:
        self.paths = sorted(os.path.join(root, f) for f in os.listdir(root) if f.endswith(".jpg"))
        self.size = size

    def __getitem__(self, index: int) -> torch.Tensor:
        from PIL import Image

        with Image.open(self.paths[index]) as img:
            arr = np.asarray(img.convert("RGB"))
        h, w, _ = arr.shape
        top = random.randint(0, h - self.size)
        left = random.randint(0, w - self.size)
        arr = arr[top:top + self.size, left:left + self.size]
        if random.random() < 0.5:
            arr = arr[:, ::-1]
        return torch.from_numpy(np.ascontiguousarray(arr.transpose(2, 0, 1)))

    def __len__(self) -> int:
        return len(self.paths)


def build_jpeg(family: str, quick: bool) -> Setup:
    return Setup(Jpegs(str(jpeg_dir(64 if quick else 512))), batch_size=64, epochs=1 if quick else 4)


# ---------------------------------------------------------------- detection

class Detection(Dataset):
    """A uint8 3x256x256 image and 1..20 float32 boxes (N x 4) per sample."""

    def __init__(self, n: int) -> None:
        rng = np.random.default_rng(0)
        self.images = rng.integers(0, 256, size=(n, 3, 256, 256), dtype=np.uint8)
        counts = rng.integers(1, 21, size=n)
        self.boxes = [rng.uniform(0, 256, size=(int(c), 4)).astype(np.float32) for c in counts]

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.from_numpy(self.images[index]), torch.from_numpy(self.boxes[index])

    def __len__(self) -> int:
        return len(self.images)


def detection_collate(samples: list[tuple[torch.Tensor, torch.Tensor]]) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Stack the images, keep the boxes as a list (they differ in length)."""
    return torch.stack([s[0] for s in samples]), [s[1] for s in samples]


def build_detection(family: str, quick: bool) -> Setup:
    return Setup(Detection(128 if quick else 1024), batch_size=16, epochs=1 if quick else 4,
                 collate_fn=detection_collate)


# ---------------------------------------------------------------- overlap

LOAD_S = 0.004
TRAIN_S = 0.004


class Small(Dataset):
    """A float32 vector of 16 per index; the cost lives in the collate."""

    def __init__(self, n: int) -> None:
        self.data = torch.arange(n * 16, dtype=torch.float32).reshape(n, 16)

    def __getitem__(self, index: int) -> torch.Tensor:
        return self.data[index]

    def __len__(self) -> int:
        return len(self.data)


def slow_collate(samples: list[torch.Tensor]) -> torch.Tensor:
    """default_collate after 4 ms of CPU (the loading cost of one batch)."""
    busy(LOAD_S)
    return default_collate(samples)


def overlap_step(batch: Any) -> None:
    busy(TRAIN_S)


def overlap_ideal(workers: int) -> float:
    """Best time per batch: load and train overlap only when workers load."""
    if workers <= 0:
        return LOAD_S + TRAIN_S
    return max(LOAD_S / workers, TRAIN_S)


def build_overlap(family: str, quick: bool) -> Setup:
    return Setup(Small(256 if quick else 2048), batch_size=8, epochs=1 if quick else 2,
                 collate_fn=slow_collate, step=overlap_step, ideal_per_batch_s=overlap_ideal)


# ---------------------------------------------------------------- latency

class Remote(Dataset):
    """Each sample waits 5 ms (network storage latency) and returns 64 floats."""

    def __init__(self, n: int, delay: float = 0.005) -> None:
        self.n = n
        self.delay = delay

    def __getitem__(self, index: int) -> torch.Tensor:
        time.sleep(self.delay)
        return torch.full((64,), float(index))

    def __len__(self) -> int:
        return self.n


def build_latency(family: str, quick: bool) -> Setup:
    # conveyor_auto is not given fetch_threads: "auto" picks threads as well as workers
    opts = {name: {"fetch_threads": 32} for name in ("conveyor0", "conveyor2t")}
    return Setup(Remote(256 if quick else 3072), batch_size=32, epochs=1, opts=opts)


# ---------------------------------------------------------------- remote_decode

class RemoteDecode(Dataset):
    """Each sample waits 2 ms (storage) and then computes 1 ms in Python (decoding, holding
    the GIL): fetch threads help until they fill a core, and crowd each other beyond."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __getitem__(self, index: int) -> torch.Tensor:
        time.sleep(0.002)
        busy(0.001)
        return torch.full((64,), float(index))

    def __len__(self) -> int:
        return self.n


def build_remote_decode(family: str, quick: bool) -> Setup:
    return Setup(RemoteDecode(256 if quick else 2048), batch_size=32, epochs=1)


SCENARIOS: dict[str, Scenario] = {s.name: s for s in [
    Scenario("diabetes", "759x8 float32 + label, tensor pair per index, batch 32, 10 epochs, loading only",
             build_diabetes, targets=("conveyor2/torch2>=4", "conveyor2/torch0>=0.7"), min_repeats=31,
             # an explicit prefetch_factor=2 holds the workers to 2 batches each: no groups
             loaders=BASE_LOADERS + ("conveyor2_pf2",), variants={"conveyor2_pf2": ("conveyor2", {"prefetch_factor": 2})}),
    Scenario("diabetes_train", "diabetes + the seed's 8-6-4-1 MLP, BCELoss, SGD step per batch",
             build_diabetes_train, min_repeats=31),
    Scenario("diabetes_array", "diabetes data as conveyor.ArrayDataset (torch: TensorDataset); "
             "10 epochs timed after one untimed warm-up epoch, best of 5 such passes per run "
             "(warm-up time in the note column)",
             build_diabetes_array, loaders=("torch0", "torch2", "conveyor0", "conveyor2", "conveyor2t"),
             targets=("conveyor0/torch0>=20", "conveyor2/torch0>=20")),
    Scenario("images_uint8", "2048 random uint8 3x224x224 from one numpy array, batch 64, 4 epochs",
             build_images, targets=("conveyor2/torch2>=4", "conveyor2/torch0>=1"), min_repeats=7),
    Scenario("jpeg", "512 JPEGs 256..320 px, Pillow decode, random 224 crop + flip, batch 64, 4 epochs",
             build_jpeg, targets=("conveyor2/torch2>=1.15",)),
    Scenario("detection", "uint8 3x256x256 + 1..20 boxes, list collate, batch 16, 4 epochs",
             build_detection, targets=("conveyor2/torch2>=3",), min_repeats=11, steady_malloc=True),
    Scenario("overlap", "4 ms CPU collate in workers, 4 ms CPU train step in main, batch 8, 512 batches",
             build_overlap, targets=("conveyor2:efficiency>=0.95",)),
    Scenario("remote_decode", "2 ms sleep + 1 ms pure-Python CPU per sample, batch 32, 2048 samples; "
             "conveyor fetch_threads 1 / 4 / 64 (2 workers); auto chooses its own",
             build_remote_decode, min_repeats=5,
             loaders=("torch0", "torch1", "torch2", "torch4", "spdl2", "conveyor0", "conveyor2", "conveyor2_ft4",
                      "conveyor2_ft64", "conveyor_auto"),
             variants={"conveyor2_ft4": ("conveyor2", {"fetch_threads": 4}),
                       "conveyor2_ft64": ("conveyor2", {"fetch_threads": 64})},
             headline="conveyor2_ft4"),
    Scenario("latency", "5 ms sleep per sample, batch 32, 3072 samples; conveyor fetch_threads 16 / 32 / 64 "
             "(2 workers), 32 (0 workers, thread workers); auto chooses its own",
             build_latency,
             loaders=("torch0", "torch1", "torch2", "torch4", "torchdata2", "grain2", "spdl2", "conveyor0",
                      "conveyor2_ft16", "conveyor2_ft32", "conveyor2_ft64", "conveyor2t", "conveyor_auto"),
             variants={"conveyor2_ft16": ("conveyor2", {"fetch_threads": 16}),
                       "conveyor2_ft32": ("conveyor2", {"fetch_threads": 32}),
                       "conveyor2_ft64": ("conveyor2", {"fetch_threads": 64})},
             headline="conveyor2_ft64", min_repeats=7,
             targets=("conveyor2_ft64/torch2>=20", "conveyor2_ft32/torch2>=20", "conveyor2_ft64/peers>=2.5",
                      "conveyor_auto/torch2>=20")),
]}
