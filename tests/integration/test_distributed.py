"""Distributed: DistributedSampler under torchrun (2 ranks, gloo, CPU) and iterable sharding."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from conveyor import DataLoader
from conveyor.distributed import ShardedIterable, rank_and_world, shard_iterable, worker_and_count

TESTS = Path(__file__).resolve().parents[1]
N = 23  # as in ddp_check.py


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    torchrun = shutil.which("torchrun") or str(Path(sys.executable).with_name("torchrun"))
    if not os.path.exists(torchrun):
        pytest.skip("torchrun is not installed")
    out = tmp_path_factory.mktemp("ddp")
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT")}
    env["PYTHONPATH"] = os.pathsep.join([str(TESTS.parent / "src"), str(TESTS)])
    env["OMP_NUM_THREADS"] = "1"
    cmd = [torchrun, "--nproc_per_node", "2", "--nnodes", "1", "--master_addr", "127.0.0.1",
           "--master_port", str(free_port()), str(TESTS / "ddp_check.py"), str(out)]
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=150)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"torchrun did not finish in {exc.timeout} s:\n{exc.stdout}\n{exc.stderr}")
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]


@pytest.mark.timeout(180)
def test_ranks_partition_the_dataset_without_padding(ranks: list[dict[str, Any]]) -> None:
    assert [r["rank"] for r in ranks] == [0, 1] and all(r["world"] == 2 for r in ranks)
    for epoch in range(2):
        a, b = (r["even=False"]["epochs"][epoch] for r in ranks)
        assert not set(a) & set(b)
        assert sorted(a + b) == list(range(N))
        assert len(a) + len(b) == N


@pytest.mark.timeout(180)
def test_even_mode_pads_like_torch(ranks: list[dict[str, Any]]) -> None:
    for r in ranks:
        for epoch in range(2):
            want = torch.utils.data.DistributedSampler(range(N), num_replicas=2, rank=r["rank"], shuffle=True,
                                                       seed=3)
            want.set_epoch(epoch)
            assert r["even=True"]["epochs"][epoch] == list(want)
    a, b = (r["even=True"]["epochs"][0] for r in ranks)
    assert len(a) == len(b) == (N + 1) // 2
    assert set(a) | set(b) == set(range(N))


@pytest.mark.timeout(180)
@pytest.mark.parametrize("mode", ["even=False", "even=True"])
def test_epochs_differ_after_set_epoch(ranks: list[dict[str, Any]], mode: str) -> None:
    for r in ranks:
        e0, e1 = r[mode]["epochs"]
        assert e0 != e1


@pytest.mark.timeout(180)
@pytest.mark.parametrize("mode", ["even=False", "even=True"])
def test_each_rank_resumes_its_own_share(ranks: list[dict[str, Any]], mode: str) -> None:
    for r in ranks:
        epoch1 = r[mode]["epochs"][1]
        assert r[mode]["head"] == epoch1[: len(r[mode]["head"])]
        assert r[mode]["head"] + r[mode]["rest"] == epoch1


@pytest.mark.timeout(180)
def test_sharded_stream_under_torchrun(ranks: list[dict[str, Any]]) -> None:
    a, b = (r["stream"] for r in ranks)
    assert not set(a) & set(b)
    assert sorted(a + b) == list(range(40))


# --------------------------------------------------------------------------- without torchrun


def test_a_loader_without_a_distributed_sampler_warns_once_under_ddp(ranks: list[dict[str, Any]]) -> None:
    for report in ranks:
        assert report["warned"] == {"shuffle": 1, "sequential": 1, "conveyor_sampler": 0, "torch_sampler": 0,
                                    "torch_batch_sampler": 0, "conveyor_batch_sampler": 0,
                                    "sharded_stream": 0}, report["warned"]


def test_a_datapipe_s_shuffle_is_shared_by_the_ranks(ranks: list[dict[str, Any]]) -> None:
    # each rank's global RNG differs: rank 0's draw seeds every rank's shuffle, as torch's loader does
    for epoch in range(2):
        shares = [r["datapipe"][epoch] for r in ranks]
        assert not set(shares[0]) & set(shares[1]), sorted(set(shares[0]) & set(shares[1]))
        assert sorted(shares[0] + shares[1]) == list(range(40))
    assert ranks[0]["datapipe"][0] != ranks[0]["datapipe"][1]


def test_no_rank_warning_without_a_process_group(recwarn: pytest.WarningsRecorder) -> None:
    loader = DataLoader(list(range(8)), batch_size=2, shuffle=True, output="numpy")
    for _ in range(2):
        list(loader)
    assert not [w for w in recwarn if "every rank" in str(w.message)]


def test_rank_and_world_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert rank_and_world() == (0, 1)
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("WORLD_SIZE", "4")
    assert rank_and_world() == (2, 4)
    assert list(shard_iterable(range(12))) == [2, 6, 10]
    assert ShardedIterable(range(12)).rank == 2


@pytest.mark.timeout(60)
@pytest.mark.parametrize("workers", [0, 2])
def test_a_sharded_stream_built_before_the_group_takes_its_ranks_share(monkeypatch: pytest.MonkeyPatch,
                                                                        workers: int) -> None:
    # built before init_process_group (mp.spawn, init_method="tcp://...", no RANK in the
    # environment), the wrapper kept rank 0 of 1, and every rank read the whole stream
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    stream = ShardedIterable(range(20))
    monkeypatch.setenv("RANK", "1")  # the group is up now
    monkeypatch.setenv("WORLD_SIZE", "2")
    with DataLoader(stream, batch_size=None, num_workers=workers) as loader:
        got = sorted(int(x) for x in loader)
    assert got == list(range(1, 20, 2))
    assert (stream.rank, stream.world_size) == (1, 2)


def test_shard_iterable_arguments_and_errors() -> None:
    assert worker_and_count() == (0, 1)
    shares = [list(shard_iterable(range(10), rank=r, world_size=3)) for r in range(3)]
    assert shares == [[0, 3, 6, 9], [1, 4, 7], [2, 5, 8]]
    with pytest.raises(ValueError):
        list(shard_iterable(range(3), rank=2, world_size=2))
    with pytest.raises(ValueError):
        ShardedIterable(range(3), rank=0, world_size=0)


def _gen() -> range:
    return range(50)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kw", [{"num_workers": 0}, {"num_workers": 3, "worker_type": "thread"},
                                {"num_workers": 2, "worker_type": "process"}], ids=["inline", "threads", "procs"])
def test_sharded_iterable_splits_by_rank_and_worker(kw: dict[str, Any]) -> None:
    seen: list[list[int]] = []
    for rank in range(2):
        ds = ShardedIterable(_gen, rank=rank, world_size=2)
        with DataLoader(ds, batch_size=None, **kw) as loader:
            seen.append([int(x) for x in loader])
    assert not set(seen[0]) & set(seen[1])
    assert sorted(seen[0] + seen[1]) == list(range(50))


@pytest.mark.timeout(60)
def test_ranks_with_other_worker_counts_still_cover_the_stream_once() -> None:
    # a rank's share followed its own worker count (stride world x workers, offset rank x
    # workers + worker): rank 0 without workers and rank 1 with two saw items 2, 6, 10, 14
    # twice and 1, 5, 9, 13 never ("auto" on machines with other core counts does this)
    seen: list[int] = []
    for rank, kw in enumerate([{"num_workers": 0}, {"num_workers": 2, "worker_type": "thread"}]):
        with DataLoader(ShardedIterable(range(16), rank=rank, world_size=2), batch_size=None, **kw) as loader:
            seen += [int(x) for x in loader]
    assert sorted(seen) == list(range(16))


def test_a_sharded_iterable_refuses_a_source_that_runs_out() -> None:
    for one_pass in ((x for x in range(4)), iter([1, 2]), map(int, "12")):
        with pytest.raises(TypeError, match="afresh each epoch"):
            ShardedIterable(one_pass, rank=0, world_size=1)


class EnvStream(torch.utils.data.IterableDataset):
    """Shards by whatever rank the worker process can find (no rank given)."""

    def __iter__(self) -> Any:
        return shard_iterable(range(12))


@pytest.mark.timeout(120)
def test_spawned_workers_shard_by_the_main_processs_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    # a spawned worker has no process group, and torch.multiprocessing.spawn sets no RANK:
    # each rank read the whole stream. The main process's rank now reaches its workers.
    import conveyor.loader

    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.setattr(conveyor.loader, "rank_and_world", lambda: (1, 2))  # as an initialised group says
    with DataLoader(EnvStream(), batch_size=None, num_workers=2, multiprocessing_context="spawn") as loader:
        got = sorted(int(x) for x in loader)
    assert got == [1, 3, 5, 7, 9, 11]


def test_a_streams_state_names_its_world_and_refuses_another() -> None:
    first = DataLoader(ShardedIterable(range(12), rank=0, world_size=2), batch_size=2)
    it = iter(first)
    next(it)
    state = json.loads(json.dumps(first.state_dict()))
    assert state["rank_world"] == [0, 2]
    with pytest.raises(ValueError, match="rank 0 of 2.*rank 0 of 3"):
        DataLoader(ShardedIterable(range(12), rank=0, world_size=3), batch_size=2).load_state_dict(state)
    again = DataLoader(ShardedIterable(range(12), rank=0, world_size=2), batch_size=2)
    again.load_state_dict(state)
    assert [b.tolist() for b in again] == [[4, 6], [8, 10]]


class TorchStream(torch.utils.data.IterableDataset):
    def __init__(self, rank: int) -> None:
        self.rank = rank

    def __iter__(self) -> Any:
        return shard_iterable(range(30), rank=self.rank, world_size=2)


@pytest.mark.timeout(60)
def test_shard_iterable_in_torch_workers() -> None:
    """The worker is found through torch.utils.data.get_worker_info() too."""
    got = []
    for rank in range(2):
        got += [int(x) for x in torch.utils.data.DataLoader(TorchStream(rank), batch_size=None, num_workers=2)]
    assert sorted(got) == list(range(30))


@pytest.mark.timeout(300)
def test_the_ddp_example_killed_and_restarted_ends_with_the_same_weights(tmp_path: Path) -> None:
    """examples/ddp_train.py on 2 ranks (32 steps an epoch): stopped right after the checkpoint
    of step 32, an epoch's last batch, and restarted: the same final weights as a run never
    stopped. That loader state names the next epoch, and the example resumes there (it
    resumed the epoch it had saved as its own counter, and trained that epoch twice)."""
    stop_at = 32
    torchrun = shutil.which("torchrun") or str(Path(sys.executable).with_name("torchrun"))
    if not os.path.exists(torchrun):
        pytest.skip("torchrun is not installed")
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT")}
    env["PYTHONPATH"] = str(TESTS.parent / "src")
    env["OMP_NUM_THREADS"] = "1"

    def run(*extra: str) -> str:
        cmd = [torchrun, "--nproc_per_node", "2", "--nnodes", "1", "--master_addr", "127.0.0.1",
               "--master_port", str(free_port()), str(TESTS.parent / "examples" / "ddp_train.py"),
               "--epochs", "2", "--save-every", "8", "--workers", "1", *extra]
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
        return proc.stdout

    def weights(out: str) -> str:
        lines = [line for line in out.splitlines() if line.startswith("final weights")]
        assert len(lines) == 1, out
        return lines[0]

    want = weights(run())
    ckpt = str(tmp_path / "ckpt")
    assert "final weights" not in run("--ckpt", ckpt, "--stop-at", str(stop_at))
    out = run("--ckpt", ckpt)
    assert f"resumed at epoch {stop_at // 32}, step {stop_at}" in out, out
    assert weights(out) == want
