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

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.timeout(300)
def test_quick_run_writes_reports(tmp_path: Path) -> None:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT / "src"), env.get("PYTHONPATH", "")) if p)
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


@pytest.mark.timeout(120)
@pytest.mark.skipif(not os.path.exists("/proc/self/schedstat"), reason="reads Linux's /proc schedstat")
def test_overlap_budget_accounts_for_the_cpu_it_asked_for() -> None:
    # the scenario burns 4 ms of CPU a batch in the step (main process) and 4 ms in the
    # collate (workers): the budget must find at least that much on each side
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import overlap_budget
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    run = overlap_budget.run_child("conveyor2")
    assert run["main_cpu_s"] >= 0.004 and run["workers_cpu_s"] >= 0.004
    assert run["steady_batch_s"] >= 0.004 and run["total_s"] >= 2 * 256 * 0.004 * 0.999
    assert abs(run["efficiency"] - 2 * 256 * 0.004 / run["total_s"]) < 1e-9
    text = overlap_budget.report({"conveyor2": [run]}, cores=2)
    row = next(line for line in text.splitlines() if line.startswith("| conveyor2 |"))
    bound = max(run["main_cpu_s"], (run["main_cpu_s"] + run["workers_cpu_s"]) / 2)
    assert row.split("|")[1:-1][-1].strip() == f"{1e3 * bound:.3f}"
