"""The classic diabetes example (759 rows, 8 features, a 0/1 label) on conveyor.

It reads a diabetes CSV once with ``CSVDataset`` (given with ``--csv``; without
it, a synthetic one of the same shape, written to a temporary folder that is
removed at the end) and trains the 8-6-4-1 sigmoid MLP with BCELoss and SGD, as
in the tutorial; then times the same loop for a few worker counts.

    python examples/diabetes.py [--epochs 100] [--csv path/to/diabetes.csv]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import numpy as np
import torch

from conveyor import CSVDataset, DataLoader


def write_csv(path: str, rows: int = 759, seed: int = 0) -> None:
    """A diabetes-shaped CSV: 8 float features, last column 0/1, no header."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, 8)).astype(np.float32)
    w = rng.normal(size=8)
    y = (x @ w + 0.3 * rng.normal(size=rows) > 0).astype(np.float32)
    np.savetxt(path, np.column_stack([x, y]), delimiter=",", fmt="%.6f")


class Model(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear1 = torch.nn.Linear(8, 6)
        self.linear2 = torch.nn.Linear(6, 4)
        self.linear3 = torch.nn.Linear(4, 1)
        self.sigmoid = torch.nn.Sigmoid()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.sigmoid(self.linear1(x))
        x = self.sigmoid(self.linear2(x))
        return self.sigmoid(self.linear3(x))


def train(loader: DataLoader, epochs: int) -> tuple[float, float]:
    torch.manual_seed(0)
    model = Model()
    criterion = torch.nn.BCELoss(reduction="mean")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    start = time.perf_counter()
    loss = torch.tensor(0.0)
    for _ in range(epochs):
        for x, y in loader:
            y_pred = model(x)
            loss = criterion(y_pred, y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    return time.perf_counter() - start, loss.detach().item()  # (float(loss) warns of its grad)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--csv", default=None,
                    help="a diabetes CSV to read (default: a synthetic one, in a temporary folder)")
    ap.add_argument("--epochs", type=int, default=100)
    ap.add_argument("--workers", default="0,1,2", help="worker counts to time, comma-separated")
    args = ap.parse_args()
    if args.csv is None:
        with tempfile.TemporaryDirectory(prefix="diabetes-") as folder:
            path = os.path.join(folder, "diabetes.csv")
            write_csv(path)
            dataset = CSVDataset(path)  # read whole: the file is no longer needed
        print(f"{len(dataset)} samples of synthetic diabetes-shaped data")
    else:
        dataset = CSVDataset(args.csv)  # features (759, 8), labels (759, 1), float32
        print(f"{len(dataset)} samples from {args.csv}")
    for workers in [int(w) for w in args.workers.split(",")]:
        with DataLoader(dataset, batch_size=32, shuffle=True, num_workers=workers,
                        persistent_workers=workers > 0, seed=0) as loader:
            seconds, loss = train(loader, args.epochs)
            print(f"num_workers={workers}: {seconds:.2f} s for {args.epochs} epochs, final loss {loss:.4f}")


if __name__ == "__main__":
    main()
