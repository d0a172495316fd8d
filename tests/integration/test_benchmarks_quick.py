"""Smoke test of the benchmark runner: ``benchmarks/run.py --quick`` runs and writes its results.

No timing is checked: only that every scenario ran with the quick loaders and
that the JSON and markdown reports exist and agree.
"""

from __future__ import annotations

import json
import os
import statistics
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


def _bench_env(tmp_path: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT / "src"), env.get("PYTHONPATH", "")) if p)
    env["CONVEYOR_BENCH_CACHE"] = str(tmp_path / "cache")
    return env


def test_the_suites_select_issue_39s_rows() -> None:
    run = _runner()
    names, wanted = run.selection("workers", None, None)
    assert sorted(names) == ["detection", "diabetes", "images_uint8", "jpeg"]
    assert wanted is not None and {"torch0", "torch1", "torch2", "torch4", "conveyor2", "conveyor_auto",
                                   "floor2"} == set(wanted)
    scenarios = _bench_module("scenarios")
    names, wanted = run.selection("auto", None, None)
    assert names == [n for n, sc in scenarios.SCENARIOS.items() if "conveyor_auto" in sc.loaders]
    assert "diabetes_array" not in names and "latency" in names
    assert wanted == ["torch0", "torch1", "torch2", "torch4", "conveyor_auto"]
    # --scenario and --loader narrow a suite; without a suite they select as they did
    assert run.selection("workers", ["jpeg", "latency"], ["torch1", "floor2", "conveyor0"]) == (["jpeg"], ["torch1", "floor2"])
    assert run.selection(None, ["jpeg"], ["conveyor0"]) == (["jpeg"], ["conveyor0"])
    for name, sc in scenarios.SCENARIOS.items():
        if "conveyor_auto" in sc.loaders:
            assert {"torch0", "torch1", "torch2", "torch4"} <= set(sc.loaders), name


def test_auto_is_read_against_the_fastest_torch_row_paired_with_it() -> None:
    run = _runner()
    result = {"torch0": {"status": "ok", "median_s": 2.0, "runs_s": [2.0, 2.1, 1.9]},
              "torch1": {"status": "ok", "median_s": 1.0, "runs_s": [1.0, 0.9, 1.2]},
              "torch2": {"status": "ok", "median_s": 1.5, "runs_s": [1.5, 1.5, 1.5]},
              "torch4": {"status": "error", "note": "x"},
              "conveyor_auto": {"status": "ok", "median_s": 1.1, "runs_s": [1.25, 0.9, 1.1]}}
    assert run.best_torch(result) == "torch1"
    got = run.check("conveyor_auto/torchbest>=1", result)
    assert got["ref"] == "torch1" and got["value"] == pytest.approx(1.0 / 1.1)
    assert got["paired"] == pytest.approx(1.0)  # the median of 1.0/1.25, 0.9/0.9, 1.2/1.1
    assert got["met"] is True  # the paired ratio meets it, the ratio of medians does not
    run.speedups(result)
    assert result["conveyor_auto"]["torchbest"] == "torch1"
    assert result["conveyor_auto"]["vs_torchbest"] == pytest.approx(1.0 / 1.1)
    assert "conveyor_auto/torchbest>=1" in run.AUTO_TARGETS


@pytest.mark.timeout(300)
def test_the_workers_suite_runs_torch_with_1_and_4_workers_and_prints_auto_against_the_best(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "run.py"), "--suite", "workers", "--quick", "--scenario", "diabetes",
         "--loader", "torch0", "--loader", "torch1", "--loader", "torch4", "--loader", "conveyor_auto",
         "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=280, env=_bench_env(tmp_path), cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((tmp_path / "workers.json").read_text())
    assert report["suite"] == "workers" and list(report["scenarios"]) == ["diabetes"]
    rows = report["scenarios"]["diabetes"]["loaders"]
    assert list(rows) == ["torch0", "torch1", "torch4", "conveyor_auto"]
    for name, workers in (("torch0", 0), ("torch1", 1), ("torch4", 4)):
        assert rows[name]["status"] == "ok" and rows[name]["workers"] == workers and rows[name]["batches"] > 0
    best = min(("torch0", "torch1", "torch4"), key=lambda n: rows[n]["median_s"])
    auto = rows["conveyor_auto"]
    assert auto["torchbest"] == best
    assert auto["vs_torchbest"] == pytest.approx(rows[best]["median_s"] / auto["median_s"])
    summary = (tmp_path / "workers.md").read_text().split("## diabetes")[0]
    assert "auto / best of torch0,1,2,4" in summary
    assert f"{auto['vs_torchbest']:.2f} (best {best} of torch0,1,4)" in summary
    # the scenario's targets name conveyor2 and torch2, which this run left out: not listed
    assert report["scenarios"]["diabetes"]["targets"] == [] and "conveyor2/torch" not in summary


def test_a_tree_comparison_calls_b_slower_only_when_both_estimates_and_the_interval_say_so() -> None:
    compare_trees = _bench_module("compare_trees")

    def row(runs: list[float]) -> dict[str, Any]:
        return {"status": "ok", "median_s": statistics.median(runs), "runs_s": runs}

    a = row([1.0] * 7)
    slower = compare_trees.compare(a, row([1.2] * 7), 0.05)
    assert slower["ratio"] == pytest.approx(1.2) and slower["paired"] == pytest.approx(1.2)
    assert slower["verdict"].startswith("B SLOWER")
    same = compare_trees.compare(a, row([1.0, 0.99, 1.01, 1.0, 1.02, 0.98, 1.0]), 0.05)
    assert same["verdict"] == "ok"
    # one estimate past the tolerance, the other not: the runs cannot tell
    mixed = compare_trees.compare(row([1.0, 2.0, 3.0, 4.0, 5.0]), row([1.0, 2.0, 3.3, 4.0, 5.0]), 0.05)
    assert mixed["ratio"] == pytest.approx(1.1) and mixed["paired"] == pytest.approx(1.0)
    assert mixed["verdict"] == "within noise"
    # both past it, but a repeat where B was faster keeps the interval from lying above 1
    unsure = compare_trees.compare(row([1.0] * 5), row([0.9, 1.1, 1.1, 1.1, 1.2]), 0.05)
    assert unsure["ratio"] == pytest.approx(1.1) and unsure["paired"] == pytest.approx(1.1)
    assert unsure["interval"][0] == pytest.approx(0.9) and unsure["verdict"] == "within noise"
    assert compare_trees.compare(a, {"status": "error"}, 0.05)["verdict"].startswith("n/a")


@pytest.mark.timeout(300)
def test_compare_trees_runs_each_rows_conveyor_from_its_own_tree(tmp_path: Path) -> None:
    import shutil

    # tree A: a copy of this checkout's src elsewhere; each A run must import conveyor from it
    # (compare_trees checks what each child imported and fails a run that took another tree)
    other = tmp_path / "other" / "src"
    shutil.copytree(ROOT / "src" / "conveyor", other / "conveyor",
                    ignore=shutil.ignore_patterns("__pycache__"))
    env = _bench_env(tmp_path)
    env["PYTHONPATH"] = ""  # the parent imports no conveyor; each child its own tree's
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "compare_trees.py"), str(other), str(ROOT / "src"), "--quick",
         "--scenario", "diabetes", "--loader", "conveyor2", "--yardstick", "torch0", "--repeats", "2",
         "--name", "self", "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=280, env=env, cwd=ROOT)
    assert proc.returncode in (0, 1), proc.stderr[-3000:]  # 1: B read slower (timing: not checked here)
    report = json.loads((tmp_path / "self.json").read_text())
    sc = report["scenarios"]["diabetes"]
    assert set(sc["loaders"]) == {"torch0", "A:conveyor2", "B:conveyor2"}
    for key in sc["loaders"]:
        assert sc["loaders"][key]["status"] == "ok", (key, sc["loaders"][key])
        assert len(sc["loaders"][key]["runs_s"]) == 2
    row = sc["rows"]["conveyor2"]
    assert row["ratio"] == pytest.approx(sc["loaders"]["B:conveyor2"]["median_s"] / sc["loaders"]["A:conveyor2"]["median_s"])
    assert row["verdict"] in ("ok", "within noise") or row["verdict"].startswith("B SLOWER")
    assert f"| diabetes | conveyor2 |" in (tmp_path / "self.md").read_text()
    assert (proc.returncode == 1) == row["verdict"].startswith("B SLOWER")
    bad = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "compare_trees.py"), str(tmp_path), "src"],
                         capture_output=True, text=True, timeout=120, env=env, cwd=ROOT)
    assert bad.returncode == 2 and "holds no conveyor/__init__.py" in bad.stderr


@pytest.mark.timeout(300)
def test_the_worker_path_profile_times_every_step_of_conveyor_and_the_floor(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "profile_workers.py"), "--quick", "--runs", "1",
         "--scenario", "diabetes", "--out", str(tmp_path / "prof")],
        capture_output=True, text=True, timeout=280, env=_bench_env(tmp_path), cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    # its timers wrap private functions of conveyor: a rename must reach profile_workers.patch_conveyor
    assert "no timer for" not in proc.stderr, proc.stderr[-2000:]
    text = (tmp_path / "prof.md").read_text()
    head = next(line for line in text.splitlines() if line.startswith("| ms per batch"))
    assert [c.strip() for c in head.split("|")[2:-1]] == ["torch0", "conveyor2", "floor2"]

    def cells(label: str) -> list[str]:
        line = next(line for line in text.splitlines() if line.startswith(f"| {label}"))
        return [c.strip() for c in line.split("|")[2:-1]]

    # every step measured for the two loaders with workers; torch0 has no worker steps
    for label in ("workers: fetch", "workers: collate", "workers: encode", "workers: send",
                  "  blocked waiting", "  decode", "hand-off: send begun", "CPU: workers"):
        torch0, conveyor2, floor2 = cells(label)
        assert conveyor2 != "-" and floor2 != "-", label
        assert torch0 in ("-", "0.000"), label
    assert all(c != "-" for c in cells("main: in next(), mean"))
    runs = json.loads((tmp_path / "prof.json").read_text())["diabetes"]
    assert runs["conveyor2"][0]["batches"] == runs["torch0"][0]["batches"] == 2 * 24
