"""Run by test_trainers.py: a PyTorch Lightning fit with strategy="ddp" on 2 CPU processes (gloo).

Lightning's launcher runs this script again for rank 1. Each rank writes
``<out>/rank<r>.json``: the sample indices its training steps saw in each of 2 epochs, in order, and what the
loader was inside the steps (its type and conveyor's arguments), for the loader made in
``train_dataloader()`` (``hook``) and for one passed to ``fit`` (``passed``).
"""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch import LightningModule, Trainer

import conveyor

N = 64
BATCH = 4


class Index(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return N

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.tensor([float(i)])


def make_loader() -> conveyor.DataLoader:
    return conveyor.DataLoader(Index(), batch_size=BATCH, shuffle=True, num_workers=1, worker_type="thread",
                               seed=5, on_error="skip", max_failures=2)


class Model(LightningModule):
    def __init__(self, hook: bool) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(1, 1)
        self.hook = hook
        self.seen: list[list[int]] = []  # per epoch
        self.loaders: list[dict[str, Any]] = []

    def train_dataloader(self) -> Any:
        if not self.hook:
            raise NotImplementedError  # (the loader is passed to fit)
        return make_loader()

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        loader = self.trainer.train_dataloader
        self.loaders.append({"type": f"{type(loader).__module__}.{type(loader).__name__}",
                             "conveyor": isinstance(loader, conveyor.DataLoader),
                             "args": [loader.worker_type, loader.seed, loader.on_error, loader.max_failures]})
        if len(self.seen) <= self.current_epoch:
            self.seen.append([])
        self.seen[self.current_epoch] += [int(v) for v in batch.flatten().tolist()]
        return self.layer(batch).sum()

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def fit(hook: bool) -> tuple[int, dict[str, Any]]:
    model = Model(hook)
    trainer = Trainer(strategy="ddp", accelerator="cpu", devices=2, max_epochs=2, logger=False,
                      enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*does not have many workers.*")
        if hook:
            trainer.fit(model)
        else:
            trainer.fit(model, train_dataloaders=make_loader())
    return trainer.global_rank, {"seen": model.seen, "loaders": model.loaders}


def main(out: Path) -> None:
    report: dict[str, Any] = {}
    rank = 0
    for hook in (True, False):
        rank, report["hook" if hook else "passed"] = fit(hook)
    (out / f"rank{rank}.json").write_text(json.dumps(report))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
