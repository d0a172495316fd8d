"""Trainers that take torch DataLoaders: PyTorch Lightning (a real 2-process DDP fit) and accelerate.

Both are in the ``trainers`` extra (and ``dev``); each test skips only where its package is absent.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

import conveyor
from helpers import wait_until

TESTS = Path(__file__).resolve().parents[1]


def _group_members(pgid: int) -> list[int]:
    members = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                if os.getpgid(int(name)) == pgid:
                    members.append(int(name))
            except ProcessLookupError:
                pass
    return members


@pytest.mark.timeout(300)
def test_lightning_ddp_gives_each_rank_its_own_shuffled_share_with_a_conveyor_loader(tmp_path: Path) -> None:
    pytest.importorskip("lightning")
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT", "MASTER_ADDR", "NODE_RANK")}
    env["PYTHONPATH"] = os.pathsep.join([str(TESTS.parent / "src"), str(TESTS)])
    env["OMP_NUM_THREADS"] = "1"
    # its own session: Lightning's launcher starts rank 1 as a child; whatever is left is killed
    proc = subprocess.Popen([sys.executable, str(TESTS / "lightning_ddp_check.py"), str(tmp_path)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=270)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"the Lightning DDP run did not finish in 270 s:\n{out[-4000:]}")
    finally:
        # rank 1 (rank 0's child) may still be tearing down when rank 0 exits: give it a while
        wait_until(lambda: not _group_members(proc.pid), grace=60)
        left = _group_members(proc.pid)
        if left:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, out[-6000:]
    assert not left, f"processes left behind by the DDP run: {left}"
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    for how in ("hook", "passed"):  # made in train_dataloader(), or passed to fit()
        for epoch in range(2):
            seen = [r[how]["seen"][epoch] for r in ranks]
            assert len(seen[0]) == len(seen[1]) == 32, how
            assert not set(seen[0]) & set(seen[1]), f"{how}: ranks overlap on {sorted(set(seen[0]) & set(seen[1]))}"
            assert sorted(seen[0] + seen[1]) == list(range(64)), how
            assert seen[0] != sorted(seen[0]) and seen[1] != sorted(seen[1]), f"{how}: not shuffled"
        for r in ranks:
            assert r[how]["seen"][0] != r[how]["seen"][1], f"{how}: both epochs in one order"  # set_epoch reached it
            loaders = r[how]["loaders"]
            assert len(loaders) == 16
            # inside every training step the loader Lightning rebuilt with its DistributedSampler
            # is still conveyor's, with conveyor's own arguments
            assert all(d == {"type": "conveyor.loader.DataLoader", "conveyor": True,
                             "args": ["thread", 5, "skip", 2]} for d in loaders), loaders


class _Index(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 10

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.tensor([float(i)])


def _samples(loader: Any) -> list[int]:
    return [int(v) for b in loader for v in b.flatten().tolist()]


@pytest.mark.timeout(120)
def test_accelerate_prepare_rebuilds_it_as_its_own_loader() -> None:
    # what the README says: accelerate's prepare() makes a torch-based loader of any torch
    # DataLoader (conveyor's included) from its dataset, batch sampler and collate_fn; the
    # samples are the same, but conveyor's workers and arguments are not used
    accelerate = pytest.importorskip("accelerate")
    accelerator = accelerate.Accelerator(cpu=True)
    loader = conveyor.DataLoader(_Index(), batch_size=4, num_workers=1, worker_type="thread")
    prepared = accelerator.prepare(loader)
    assert not isinstance(prepared, conveyor.DataLoader)
    assert _samples(prepared) == _samples(loader) == list(range(10))
    loader.close()


@pytest.mark.timeout(120)
def test_the_readme_s_accelerate_recipe_keeps_conveyor_s_loader() -> None:
    accelerate = pytest.importorskip("accelerate")
    accelerator = accelerate.Accelerator(cpu=True)
    model = torch.nn.Linear(1, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = accelerator.prepare(model, optimizer)
    sampler = conveyor.DistributedSampler(_Index(), num_replicas=accelerator.num_processes,
                                          rank=accelerator.process_index, shuffle=True, seed=1)
    with conveyor.DataLoader(_Index(), batch_size=4, sampler=sampler, num_workers=1, worker_type="thread",
                             device=accelerator.device) as loader:
        seen = []
        for batch in loader:
            assert isinstance(loader, conveyor.DataLoader) and batch.device == accelerator.device
            loss = model(batch).sum()
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            seen += [int(v) for v in batch.flatten().tolist()]
    assert sorted(seen) == list(range(10)) and seen != sorted(seen)
