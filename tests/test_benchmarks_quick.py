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
