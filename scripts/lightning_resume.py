"""PyTorch Lightning's mid-epoch checkpoints with conveyor's loader (by hand, not in CI:
Lightning is not a dependency).

Lightning's fit loop saves the ``state_dict()`` of each training loader that has one and
calls ``load_state_dict()`` when it resumes from a checkpoint (torch's own loader has none:
Lightning then warns that the resumed epoch is unreliable and starts it over). This trains
a tiny model for ``--epochs`` epochs with a checkpoint every ``--every`` steps, resumes a
new Trainer from each checkpoint, and checks that the resumed run sees exactly the batches
the uninterrupted one saw after that step. Exit status 1 on any difference.

    pip install pytorch_lightning   # with torch==2.13.0 already installed
    python scripts/lightning_resume.py [--workers 2] [--epochs 3] [--every 5]
"""

from __future__ import annotations

import argparse
import glob
import re
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
import conveyor  # noqa: E402

try:
    import pytorch_lightning as pl
    from pytorch_lightning.callbacks import ModelCheckpoint
except ImportError:
    sys.exit("needs pytorch_lightning: pip install pytorch_lightning")


class Indexed(torch.utils.data.Dataset):  # type: ignore[type-arg]
    def __len__(self) -> int:
        return 96

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.tensor([float(i)]), torch.tensor([i])


class Tiny(pl.LightningModule):
    """Notes the indices of every training batch it gets."""

    def __init__(self, seen: list[list[int]]) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(1, 1)
        self.seen = seen

    def training_step(self, batch: Any, _: int) -> torch.Tensor:
        x, index = batch
        self.seen.append(index.flatten().tolist())
        return self.layer(x).pow(2).mean()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=1e-3)


LOADERS = {
    "shuffle-seed": lambda w: conveyor.DataLoader(Indexed(), batch_size=8, shuffle=True, seed=0, num_workers=w),
    "shuffle-generator": lambda w: conveyor.DataLoader(Indexed(), batch_size=8, shuffle=True, num_workers=w,
                                                       generator=torch.Generator().manual_seed(0)),
    "torch-sampler": lambda w: conveyor.DataLoader(
        Indexed(), batch_size=8, num_workers=w,
        sampler=torch.utils.data.RandomSampler(range(96), generator=torch.Generator().manual_seed(0))),
}


def fit(loader: Any, epochs: int, seen: list[list[int]], ckpt_dir: str | None = None,
        every: int = 0, ckpt_path: str | None = None) -> None:
    callbacks = [ModelCheckpoint(dirpath=ckpt_dir, every_n_train_steps=every, save_top_k=-1)] if ckpt_dir else []
    trainer = pl.Trainer(max_epochs=epochs, accelerator="cpu", devices=1, logger=False, callbacks=callbacks,
                         enable_checkpointing=bool(ckpt_dir), enable_progress_bar=False,
                         enable_model_summary=False)
    trainer.fit(Tiny(seen), train_dataloaders=loader, ckpt_path=ckpt_path)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--every", type=int, default=5)
    args = p.parse_args()
    warnings.filterwarnings("ignore", message=".*LeafSpec.*")
    bad = 0
    for name, make in LOADERS.items():
        with tempfile.TemporaryDirectory() as tmp:
            full: list[list[int]] = []
            fit(make(args.workers), args.epochs, full, tmp, args.every)
            checkpoints = sorted(glob.glob(f"{tmp}/*.ckpt"),
                                 key=lambda f: int(re.search(r"step=(\d+)", f).group(1)))  # type: ignore[union-attr]
            for ckpt in checkpoints:
                step = int(re.search(r"step=(\d+)", ckpt).group(1))  # type: ignore[union-attr]
                resumed: list[list[int]] = []
                fit(make(args.workers), args.epochs, resumed, ckpt_path=ckpt)
                same = resumed == full[step:]
                bad += not same
                print(f"{name:14s} resumed at step {step:3d}: {len(resumed):3d} batches, "
                      f"{'the same as' if same else 'NOT the same as'} the uninterrupted run's")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
