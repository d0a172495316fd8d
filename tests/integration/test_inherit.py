"""Files a dataset opens lazily (the usual 'open in the worker' pattern) stay private to each
worker, although conveyor's main process makes the first batches on the same dataset."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import conveyor
from conveyor.executors import inherit

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/self/fd is Linux's")

N, D = 240, 16


class Records(torch.utils.data.Dataset):
    """Rows of a binary file, read through one handle opened on first use (seek, then read)."""

    def __init__(self, path: str, wait: float = 0.0) -> None:
        self.path, self.wait, self.f = path, wait, None

    def __len__(self) -> int:
        return N

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        if self.f is None:
            self.f = open(self.path, "rb")  # noqa: SIM115 - kept open on purpose
        self.f.seek(i * D * 4)
        if self.wait:
            time.sleep(self.wait)  # between the seek and the read: another reader would move us
        return torch.from_numpy(np.frombuffer(self.f.read(D * 4), dtype=np.float32).copy()), i


@pytest.fixture()
def records(tmp_path: Path) -> str:
    path = tmp_path / "rows.bin"
    np.arange(N * D, dtype=np.float32).tofile(path)
    return str(path)


def _bad(loader: Any, epochs: int = 2) -> int:
    bad = 0
    for _ in range(epochs):
        for x, i in loader:
            bad += int((x[:, 0] != i.to(torch.float32) * D).sum())
    return bad


@pytest.mark.timeout(120)
@pytest.mark.parametrize("workers, persistent", [(2, False), (2, True), ("auto", False)])
def test_a_lazily_opened_file_is_read_right_in_every_worker(records: str, workers: Any, persistent: bool) -> None:
    # the main process opens the file making its first batches; forked workers then shared
    # its offset, and their reads came back from other rows or empty. "auto" must also not
    # give such a dataset fetch threads, which would share the handle inside a worker
    loader = conveyor.DataLoader(Records(records, wait=0.0005), batch_size=16, shuffle=True,
                                 num_workers=workers, persistent_workers=persistent)
    with loader:
        assert _bad(loader) == 0
        assert loader.stats()["workers_started"]
        if workers == "auto":
            assert loader.stats()["fetch_threads"] == 1


def test_reopen_private_gives_a_forked_child_its_own_offset(tmp_path: Path) -> None:
    path = tmp_path / "f.bin"
    path.write_bytes(bytes(range(100)))
    mark = inherit.open_fds()
    f = open(path, "rb")  # noqa: SIM115
    try:
        f.seek(10)
        fds = inherit.opened_since(mark)
        assert fds == (f.fileno(),)
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: reopen, check its offset, move it far
            try:
                inherit.reopen_private(fds)
                ok = os.lseek(f.fileno(), 0, os.SEEK_CUR) == 10
                os.lseek(f.fileno(), 90, os.SEEK_SET)
                os.write(w, b"1" if ok else b"0")
            finally:
                os._exit(0)
        os.close(w)
        assert os.read(r, 1) == b"1"
        os.waitpid(pid, 0)
        os.close(r)
        assert os.lseek(f.fileno(), 0, os.SEEK_CUR) == 10  # the child's seek did not move ours
    finally:
        f.close()
    assert inherit.opened_since(mark) == ()


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="reads /proc/self/fd (Linux)")
def test_conveyors_own_segments_are_not_files_the_dataset_opened(tmp_path: Path) -> None:
    # the main process keeps the batch slots it mapped open: counted as the dataset's files,
    # with persistent workers they told "auto" the dataset keeps files open (one thread)
    from conveyor.transport.segment import Segment, new_prefix

    mark = inherit.open_fds()
    seg = Segment.create(new_prefix() + "t", 4096)
    data = open(tmp_path / "data.bin", "wb")  # noqa: SIM115
    try:
        slots = [fd for fd in map(int, os.listdir("/proc/self/fd"))
                 if os.path.exists(f"/proc/self/fd/{fd}") and "/dev/shm/conveyor_" in os.readlink(f"/proc/self/fd/{fd}")]
        assert slots, "the segment keeps no descriptor open: nothing to tell apart"
        opened = inherit.opened_since(mark)
        assert data.fileno() in opened
        assert not set(slots) & set(opened), (slots, opened)
    finally:
        data.close()
        seg.close()
        seg.unlink()
