"""Smoke test of the benchmark runner: ``benchmarks/run.py --quick`` runs and writes its results.

No timing is checked: only that every scenario ran with the quick loaders and
that the JSON and markdown reports exist and agree.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(300)
def test_quick_run_writes_reports(tmp_path: Path) -> None:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT / "src"), env.get("PYTHONPATH", "")) if p)
    env["CONVEYOR_BENCH_CACHE"] = str(tmp_path / "cache")  # the jpeg scenario's images: not in the temp folder
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "run.py"), "--quick", "--out", str(tmp_path), "--name", "smoke"],
        capture_output=True, text=True, timeout=280, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((tmp_path / "smoke.json").read_text())
    text = (tmp_path / "smoke.md").read_text()

    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import scenarios
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    assert list(report["scenarios"]) == list(scenarios.SCENARIOS)
    assert report["machine"]["cores_usable"] >= 1
    for name, sc in report["scenarios"].items():
        assert f"## {name}" in text
        for loader in ("torch0", "torch2"):
            r = sc["loaders"][loader]
            assert r["status"] == "ok", (name, loader, r)
            assert r["batches"] > 0 and r["median_s"] > 0
        head = sc["loaders"][sc["headline"]]
        assert head["status"] in ("ok", "skip"), (name, head)
        if head["status"] == "ok":
            assert head["vs_torch2"] > 0 and head["vs_torch0"] > 0
    assert "efficiency" in report["scenarios"]["overlap"]["loaders"]["torch2"]


def _bench_module(name: str) -> Any:
    """benchmarks/<name>.py as a module (the benchmarks folder is no package)."""
    import importlib

    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))


def _overlap_budget() -> Any:
    return _bench_module("overlap_budget")


@pytest.mark.timeout(120)
@pytest.mark.skipif(not os.path.exists("/proc/self/schedstat"), reason="reads Linux's /proc schedstat")
def test_overlap_budget_accounts_for_the_cpu_it_asked_for() -> None:
    # the scenario burns 4 ms of CPU a batch in the step (main process) and 4 ms in the
    # collate (workers): the budget must find at least that much on each side
    overlap_budget = _overlap_budget()
    run = overlap_budget.run_child("conveyor2")
    assert run["main_cpu_s"] >= 0.004 and run["workers_cpu_s"] >= 0.004
    assert run["steady_batch_s"] >= 0.004 and run["total_s"] >= 2 * 256 * 0.004 * 0.999
    assert abs(run["efficiency"] - 2 * 256 * 0.004 / run["total_s"]) < 1e-9
    assert 0 <= run["main_preempted_s"] <= run["total_s"]
    cold = {"warm": 8.0, "after_cpu": 16.0, "after_sleep": 60.0}
    text = overlap_budget.report({"conveyor2": [run]}, cores=2, cold=cold)
    lines = text.splitlines()
    head = [c.strip() for c in next(line for line in lines if line.startswith("| loader |")).split("|")[1:-1]]
    row = [c.strip() for c in next(line for line in lines if line.startswith("| conveyor2 |")).split("|")[1:-1]]
    bound = max(run["main_cpu_s"], (run["main_cpu_s"] + run["workers_cpu_s"]) / 2)
    assert row[head.index("CPU bound ms/batch")] == f"{1e3 * bound:.3f}"
    assert row[head.index("main thread preempted ms (run)")] == f"{1e3 * run['main_preempted_s']:.1f}"
    assert "8.0 us back to back, 16.0 us right after 4 ms of other CPU work, 60.0 us" in text


@pytest.mark.timeout(120)
def test_overlap_budget_times_the_same_work_warm_and_cold() -> None:
    cold = _overlap_budget().run_child("cold")  # in a fresh process, as the report's
    assert set(cold) == {"warm", "after_cpu", "after_sleep"}
    assert all(v > 0 for v in cold.values())


@pytest.mark.timeout(60)
def test_the_floor_reference_makes_every_batch() -> None:
    # floor2, the overlap budget's featureless reference, does the scenario's work in full: each
    # epoch hands out every sample once, collated, from two forked workers, which close() ends
    torch = pytest.importorskip("torch")
    overlap_budget = _overlap_budget()
    data = torch.arange(64 * 16, dtype=torch.float32).reshape(64, 16)
    floor = overlap_budget.Floor(data, 8, torch.stack)
    try:
        for _ in range(2):
            rows = torch.cat([batch.clone() for batch in floor.epoch()])
            assert rows.shape == (64, 16)
            assert torch.equal(rows[rows[:, 0].argsort()], data)
        pids = [w[0] for w in floor.workers]
        assert len(pids) == 2
    finally:
        floor.close()
    assert floor.workers == [] and not any(os.path.exists(f"/proc/{pid}") for pid in pids)


def _runner() -> Any:
    return _bench_module("run")


def test_median_interval_takes_the_order_statistics_binomial_coverage_allows() -> None:
    run = _runner()
    # 11 values: x(3) and x(9) cover the median with 1 - 2 * 67/2048 = 0.935; x(4)..x(8) with 0.773
    lo, hi, cov = run.median_interval([float(v) for v in range(11, 0, -1)])
    assert (lo, hi) == (3.0, 9.0) and cov == pytest.approx(1 - 2 * 67 / 2048)
    # 3 values: min and max, which cover it with only 0.75
    assert run.median_interval([2.0, 1.0, 3.0]) == (1.0, 3.0, 0.75)


def test_a_missed_target_is_called_noise_only_when_its_interval_reaches_it() -> None:
    run = _runner()
    torch0 = [1.0] * 11
    close = [1.0 / r for r in (0.9, 0.92, 0.94, 0.95, 0.96, 0.97, 0.98, 0.99, 1.02, 1.05, 1.1)]
    far = [1.0 / r for r in (0.80, 0.81, 0.82, 0.83, 0.84, 0.85, 0.86, 0.87, 0.88, 0.89, 0.95)]
    for runs, noise in ((close, True), (far, False)):
        result = {"torch0": {"status": "ok", "median_s": 1.0, "runs_s": torch0},
                  "conveyor_auto": {"status": "ok", "median_s": sorted(runs)[5], "runs_s": runs}}
        got = run.check("conveyor_auto/torch0>=1", result)
        assert got["met"] is False and got["noise"] is noise
        assert run.verdict(got).startswith("MISSED") and ("within noise" in run.verdict(got)) is noise
    met = run.check("conveyor_auto/torch0>=1", {"torch0": {"status": "ok", "median_s": 1.0, "runs_s": [1.0] * 3},
                                                 "conveyor_auto": {"status": "ok", "median_s": 0.9, "runs_s": [0.9] * 3}})
    assert met["met"] is True and run.verdict(met) == "met"


def test_what_auto_chose_is_counted_over_runs_and_shown_beside_its_time() -> None:
    run = _runner()
    inline = {"num_workers": 0, "fetch_threads": 1, "prefetch_factor": None}
    two = {"num_workers": 2, "fetch_threads": 1, "prefetch_factor": 2}
    runs = [{"status": "ok", "seconds": s, "batches": 8, "first_batch_s": 0.01, "workers": None, "opts": {},
             "chosen": c} for s, c in ((0.3, inline), (0.2, two), (0.1, inline))]
    summary = run.summarize(runs)
    assert summary["chosen"] == {json.dumps(inline, sort_keys=True): 2, json.dumps(two, sort_keys=True): 1}
    machine = {"cpu": "x", "cores_usable": 2, "cpu_count": 2, "ram": "1 GiB", "dev_shm": "1 GiB", "platform": "p",
               "load_avg_start": [0, 0, 0], "python": "3.11", "versions": {}, "commit": "c", "date": "d"}
    report = {"name": "t", "machine": machine, "repeats": 3, "quick": False, "fresh": "forked process",
              "unavailable": {}, "scenarios": {"s": {"doc": "d", "headline": "conveyor_auto", "targets": [],
                                                    "loaders": {"conveyor_auto": summary}}}}
    text = run.markdown(report)
    assert "chose fetch_threads=1, num_workers=0, prefetch_factor=None (2 of 3 runs)" in text
    assert "(2 of 3 runs); fetch_threads=1, num_workers=2, prefetch_factor=2 (1 of 3 runs)" in text


def test_a_scenario_can_fix_glibcs_thresholds_for_every_loader_and_says_so() -> None:
    run = _runner()
    # detection's runs split in two for every loader under glibc's own heuristics; the rest
    # leave glibc as users have it
    assert run._scenario_steady("detection") and not run._scenario_steady("diabetes_train")
    assert not run._scenario_steady("no such scenario")
    machine = {"cpu": "x", "cores_usable": 2, "cpu_count": 2, "ram": "1 GiB", "dev_shm": "1 GiB", "platform": "p",
               "load_avg_start": [0, 0, 0], "python": "3.11", "versions": {}, "commit": "c", "date": "d"}
    ok = {"status": "ok", "median_s": 0.1, "runs_s": [0.1], "batches": 8, "first_batch_s": 0.01}
    scenarios = {name: {"doc": name, "headline": "torch0", "targets": [], "repeats": 3, "steady_malloc": steady,
                        "loaders": {"torch0": ok}} for name, steady in (("fixed", True), ("left", False))}
    report = {"name": "t", "machine": machine, "repeats": 3, "quick": False, "fresh": "forked process",
              "unavailable": {}, "scenarios": scenarios}
    text = run.markdown(report)
    fixed, left = text.split("## fixed")[1].split("## left")
    assert "thresholds fixed in every run of every loader" in fixed
    assert "thresholds fixed" not in left


def test_the_jpeg_images_are_made_in_the_folder_given(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # the quick run left conveyor_bench_jpeg_64 in the system temp folder after the suite
    monkeypatch.setenv("CONVEYOR_BENCH_CACHE", str(tmp_path))
    root = _bench_module("scenarios").jpeg_dir(2)
    assert root == tmp_path / "conveyor_bench_jpeg_2"
    assert sorted(p.name for p in root.iterdir()) == ["00000.jpg", "00001.jpg", "DONE"]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("scenario", ["diabetes", "images_uint8", "detection"])
def test_the_worker_path_floor_makes_every_batch_as_collate_does(scenario: str) -> None:
    # loaders.floor2, the featureless 2-worker reference of the worker-path rows: every batch
    # of an epoch, in order, equal to the collate of its indices (tuples of small tensors
    # inline, a stack written into the shared mapping, a custom collate's ragged list), two
    # epochs on the same workers, which close() ends
    torch = pytest.importorskip("torch")
    sys.path[:0] = [str(ROOT / "benchmarks")]
    try:
        import loaders
        import scenarios
    finally:
        del sys.path[0]
    setup = scenarios.SCENARIOS[scenario].build("torch", True)
    collate = loaders._default(setup.collate_fn)
    handle = loaders.make("floor2", setup.dataset, setup.batch_size, setup.collate_fn, 2, shuffle=False)
    try:
        for _ in range(2):
            for k, batch in enumerate(handle.epoch()):
                indices = range(k * setup.batch_size, min(len(setup.dataset), (k + 1) * setup.batch_size))
                want = collate([setup.dataset[i] for i in indices])
                got_leaves: list[Any] = []
                want_leaves: list[Any] = []
                loaders._flatten(batch, got_leaves)
                loaders._flatten(want, want_leaves)
                assert len(got_leaves) == len(want_leaves) > 0
                assert all(torch.equal(a, b) for a, b in zip(got_leaves, want_leaves))
            assert k + 1 == -(-len(setup.dataset) // setup.batch_size)
        pids = [w[0] for w in handle.epoch.__self__.workers]
    finally:
        handle.close()
    assert len(pids) == 2 and not any(os.path.exists(f"/proc/{pid}") for pid in pids)  # reaped
