"""A small DDP training job: conveyor's DataLoader + DistributedSampler + exact resume.

Run on CPU with two processes (gloo)::

    torchrun --nproc_per_node 2 examples/ddp_train.py --epochs 3 --ckpt /tmp/ddp_ckpt

Kill it mid-run (or pass ``--stop-at STEP``) and start the same command again:
every rank reloads the model, the optimiser and its own loader state, and
continues with exactly the batches the uninterrupted run would have seen (the
final weights it prints are the same). Add ``--backend nccl`` on GPUs.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from conveyor import DataLoader, DistributedSampler


class Regression(torch.utils.data.Dataset):
    """y = x @ w + noise, with a random flip as "augmentation" (seeded per sample by conveyor)."""

    def __init__(self, n: int = 2048, dim: int = 16) -> None:
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, dim, generator=g)
        self.y = self.x @ torch.randn(dim, 1, generator=g) + 0.1 * torch.randn(n, 1, generator=g)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        sign = 1.0 if torch.rand(()) < 0.5 else -1.0  # global RNG: derived from (seed, epoch, i)
        return self.x[i] * sign, self.y[i] * sign


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--backend", default="gloo")
    p.add_argument("--ckpt", type=Path, default=None, help="directory for per-rank checkpoints")
    p.add_argument("--save-every", type=int, default=10, help="steps between checkpoints")
    p.add_argument("--stop-at", type=int, default=None, help="stop right after this step, as if killed")
    args = p.parse_args()

    dist.init_process_group(args.backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device(f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}" if args.backend == "nccl" else "cpu")
    torch.manual_seed(0)  # same initial weights on every rank

    data = Regression()
    sampler = DistributedSampler(data, shuffle=True, seed=0)  # rank and world from torch.distributed
    loader = DataLoader(data, batch_size=args.batch_size, sampler=sampler, num_workers=args.workers,
                        seed=1234 + rank, persistent_workers=args.workers > 0)
    model = nn.parallel.DistributedDataParallel(nn.Linear(16, 1).to(device))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)

    ckpt = args.ckpt / f"rank{rank}.pt" if args.ckpt else None
    start_epoch, step = 0, 0
    if ckpt is not None and ckpt.exists():
        saved: dict[str, Any] = torch.load(ckpt, weights_only=False)
        model.module.load_state_dict(saved["model"])
        opt.load_state_dict(saved["opt"])
        state = json.loads(saved["loader"])  # plain JSON: readable, diffable
        loader.load_state_dict(state)
        # the loader's state names the epoch to go on with: the interrupted one, or the next
        # when the checkpoint came after an epoch's last batch
        start_epoch, step = state["epoch"], saved["step"]
        print(f"[rank {rank}] resumed at epoch {start_epoch}, step {step}", flush=True)

    def save() -> None:
        if ckpt is None:
            return
        ckpt.parent.mkdir(parents=True, exist_ok=True)
        tmp = ckpt.with_suffix(".tmp")
        torch.save({"model": model.module.state_dict(), "opt": opt.state_dict(), "step": step,
                    "loader": json.dumps(loader.state_dict())}, tmp)
        tmp.replace(ckpt)

    for epoch in range(start_epoch, args.epochs):
        sampler.set_epoch(epoch)
        total, count = 0.0, 0
        for x, y in loader:
            loss = nn.functional.mse_loss(model(x.to(device)), y.to(device))
            opt.zero_grad()
            loss.backward()
            opt.step()
            total, count, step = total + loss.item(), count + 1, step + 1
            if step % args.save_every == 0:
                save()
            if step == args.stop_at:
                os._exit(0)  # as if killed: no cleanup, no end-of-epoch checkpoint
        save()
        mean = torch.tensor([total / max(count, 1)], device=device)
        dist.all_reduce(mean)
        if rank == 0:
            print(f"epoch {epoch}: loss {mean.item() / world:.4f} ({count} steps per rank)", flush=True)
    if rank == 0:
        weights = torch.cat([p.detach().flatten() for p in model.parameters()])
        print(f"final weights: sum {weights.sum().item():.9f}", flush=True)
    loader.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
