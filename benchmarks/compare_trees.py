"""Before and after in one session: conveyor's rows from two source trees, side by side.

    for scenario: for repeat: torch rows, then each conveyor row from tree A and from tree B
        (A B in even repeats, B A in odd ones), every run a child forked as run.py's are,
        importing conveyor from its own tree's src ──> B / A per row, paired per repeat

The benchmark code (scenarios, adapters, the child's clock) is this checkout's for both
trees: only the library differs. torch's rows are the common yardstick: each tree's speed-up
over them is printed too, so a drift of the machine between A's and B's runs shows there.
B / A is a ratio of times: above 1, B is slower. A row counts as slower when both the ratio
of medians and the paired ratio (the median over repeats of B's run / A's run of the same
repeat) exceed 1 + ``--tolerance`` (default 5%) and the paired ratios' interval for their
median lies above 1; when only some of that holds, or the interval reaches past the
tolerance, it reads "within noise".

    git -C /work/main worktree add /tmp/base <commit> --detach     # the "before" tree
    python benchmarks/compare_trees.py /tmp/base/src src --suite workers
    python benchmarks/compare_trees.py /tmp/base/src src --scenario diabetes --loader conveyor2 --repeats 31
    python benchmarks/compare_trees.py src src --quick              # the harness against itself
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import run  # noqa: E402  (benchmarks/ is no package)

YARDSTICK = ("torch0", "torch2")


def tree_commit(src: Path) -> str:
    """The commit of the git checkout ``src`` lies in, with "+changes" when it has any."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=src, capture_output=True, text=True,
                              timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "."], cwd=src, capture_output=True,
                               text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "?"
    return (head or "?") + (" +changes" if dirty else "")


def compare(a: dict[str, Any], b: dict[str, Any], tolerance: float) -> dict[str, Any]:
    """B / A for one row: ratio of medians, paired ratio, its interval and a verdict."""
    out: dict[str, Any] = {"a_s": a.get("median_s"), "b_s": b.get("median_s")}
    if a.get("status") != "ok" or b.get("status") != "ok":
        out["verdict"] = f"n/a (A {a.get('status')}, B {b.get('status')})"
        return out
    ratios = [tb / ta for ta, tb in zip(a["runs_s"], b["runs_s"])]
    out["ratio"] = b["median_s"] / a["median_s"]
    out["paired"] = statistics.median(ratios)
    lo, hi, cover = run.median_interval(ratios)
    out["interval"] = [lo, hi, cover]
    limit = 1.0 + tolerance
    over = [v > limit for v in (out["ratio"], out["paired"])]
    if all(over) and lo > 1.0:
        # (and the paired ratios' interval for the median above 1: two identical trees read
        # 1.05-1.07 on diabetes with 31 repeats on a loaded 2-core host, their interval 0.94-1.17)
        out["verdict"] = f"B SLOWER by more than {tolerance:.0%}"
    elif any(over) or hi > limit:
        out["verdict"] = "within noise"
    else:
        out["verdict"] = "ok"
    return out


def markdown(report: dict[str, Any]) -> str:
    m = report["machine"]
    out = [f"# conveyor, tree B against tree A: {report['name']}", "",
           f"- A: `{report['a']}` ({report['a_commit']}); B: `{report['b']}` ({report['b_commit']})",
           f"- machine: {m['cpu']}, {m['cores_usable']} usable cores; load average (1/5/15 min) at start "
           f"{m['load_avg_start']}, at end {report['load_avg_end']}; benchmark code of commit {m['commit']}",
           f"- {report['repeats']} repeats (scenarios of short runs get their min_repeats), quick={report['quick']}; "
           f"every run a forked child, A and B alternated (A first in even repeats); {report['elapsed_s']:.0f} s",
           "- B / A = B's time over A's (above 1: B is slower); paired = the median over repeats of B's run "
           f"over A's run of the same repeat; slower when both exceed 1 + {report['tolerance']:.0%} and the paired "
           "interval lies above 1", "",
           "| scenario | row | A median s | B median s | B / A | paired B / A | interval (coverage) | "
           "A vs torch0 | B vs torch0 | verdict |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    for sname, sc in report["scenarios"].items():
        torch0 = sc["loaders"].get("torch0", {}).get("median_s")
        for row, c in sc["rows"].items():
            a, b = sc["loaders"][f"A:{row}"], sc["loaders"][f"B:{row}"]
            iv = c.get("interval")
            out.append(f"| {sname} | {row} | {run.fmt(c.get('a_s'), 4)} | {run.fmt(c.get('b_s'), 4)} | "
                       f"{run.fmt(c.get('ratio'), 3)} | {run.fmt(c.get('paired'), 3)} | "
                       + (f"{iv[0]:.3f}-{iv[1]:.3f} ({iv[2]:.0%})" if iv else "-") + " | "
                       + f"{run.fmt(torch0 / a['median_s'] if torch0 and a.get('median_s') else None)} | "
                       + f"{run.fmt(torch0 / b['median_s'] if torch0 and b.get('median_s') else None)} | "
                       + f"{c['verdict']} |")
    out += ["", "Yardstick (torch, the same runs' neighbours): median s per scenario", "",
            "| scenario | " + " | ".join(report["yardstick"]) + " |", "|---|" + "---|" * len(report["yardstick"])]
    for sname, sc in report["scenarios"].items():
        out.append(f"| {sname} | " + " | ".join(run.fmt(sc["loaders"].get(y, {}).get("median_s"), 4)
                                                for y in report["yardstick"]) + " |")
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("a", help="tree A's source folder (the one holding conveyor/), the 'before'")
    p.add_argument("b", help="tree B's source folder, the 'after'")
    p.add_argument("--suite", choices=sorted(run.SUITES), help="run.py's named selections")
    p.add_argument("--scenario", action="append", help="only these scenarios (repeatable)")
    p.add_argument("--loader", action="append", help="only these conveyor rows (repeatable; default every "
                   "conveyor row of the scenario, or of the suite)")
    p.add_argument("--yardstick", action="append", help=f"torch rows run beside them (default {' '.join(YARDSTICK)})")
    p.add_argument("--repeats", type=int, default=3, help="runs per row (scenarios' min_repeats raise it)")
    p.add_argument("--repeats-exact", action="store_true", help="no min_repeats: exactly --repeats everywhere")
    p.add_argument("--quick", action="store_true", help="the scenarios' small sizes")
    p.add_argument("--tolerance", type=float, default=0.05, help="how much slower B may be (default 0.05)")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per child run")
    p.add_argument("--name", default="compare", help="report name")
    p.add_argument("--out", default=None, help="write <name>.md and <name>.json here (default: print only)")
    a = p.parse_args(argv)

    trees = {}
    for tag, given in (("A", a.a), ("B", a.b)):
        src = Path(given).resolve()
        if not (src / "conveyor" / "__init__.py").is_file():
            p.error(f"{tag}: {src} holds no conveyor/__init__.py (give the tree's src folder)")
        trees[tag] = src

    import scenarios  # imports torch, as run.py's parent does: children start warm

    unknown = [n for n in a.scenario or () if n not in scenarios.SCENARIOS]
    if unknown:
        p.error(f"unknown scenario(s) {unknown}; known: {', '.join(scenarios.SCENARIOS)}")
    names, wanted = run.selection(a.suite, a.scenario, None)
    yardstick = tuple(a.yardstick or YARDSTICK)
    if "conveyor" in sys.modules:
        # a child forked from here would keep this conveyor, whichever tree it was given
        raise SystemExit("conveyor is imported in the parent already; run this script with a plain PYTHONPATH")
    with tempfile.TemporaryDirectory(prefix="conveyor_compare_") as work:  # the children's --out (unused)
        return _run(a, trees, names, wanted, yardstick, Path(work), scenarios)


def _run(a: argparse.Namespace, trees: dict[str, Path], names: list[str], wanted: list[str] | None,
         yardstick: tuple[str, ...], work: Path, scenarios: Any) -> int:
    report: dict[str, Any] = {"name": a.name, "a": str(trees["A"]), "b": str(trees["B"]),
                              "a_commit": tree_commit(trees["A"]), "b_commit": tree_commit(trees["B"]),
                              "machine": run.machine({}), "repeats": a.repeats, "quick": a.quick,
                              "tolerance": a.tolerance, "yardstick": list(yardstick), "scenarios": {}}
    started = time.perf_counter()
    for sname in names:
        sc = scenarios.SCENARIOS[sname]
        rows = [ln for ln in sc.loaders if ln.startswith("conveyor")
                and (wanted is None or ln in wanted) and (a.loader is None or ln in a.loader)]
        if not rows:
            continue
        ys = [y for y in yardstick if y in sc.loaders]
        runs: dict[str, list[dict[str, Any]]] = {y: [] for y in ys}
        runs.update({f"{t}:{r}": [] for r in rows for t in "AB"})
        reps = a.repeats if a.quick or a.repeats_exact else max(a.repeats, sc.min_repeats)
        for rep in range(reps):
            order = [(y, None) for y in ys]
            for r in rows:
                order += [(r, t) for t in ("AB" if rep % 2 == 0 else "BA")]
            for ln, tag in order:
                key = ln if tag is None else f"{tag}:{ln}"
                if runs[key] and runs[key][-1]["status"] != "ok":
                    continue  # failed once: not again
                args = ["--child", sname, ln, "--out", str(work)] + ["--quick"] * a.quick
                if tag is not None:
                    args += ["--src", str(trees[tag])]
                result = run.fork_child(args, a.timeout)
                if tag is not None and result.get("status") == "ok" and result.get("conveyor_from") != str(trees[tag]):
                    result = {"status": "error", "note": f"imported conveyor from {result.get('conveyor_from')}, "
                              f"not {trees[tag]}"}
                runs[key].append(result)
                shown = f"{result['seconds']:.4f} s" if result["status"] == "ok" else \
                    f"{result['status']}: {result.get('note', '')}"
                print(f"[{time.perf_counter() - started:6.1f}s] {sname:15s} {key:17s} #{rep + 1} {shown}", flush=True)
        loaders = {k: run.summarize(v) for k, v in runs.items() if v}
        report["scenarios"][sname] = {"repeats": reps, "loaders": loaders,
                                      "rows": {r: compare(loaders[f"A:{r}"], loaders[f"B:{r}"], a.tolerance)
                                               for r in rows}}
    report["elapsed_s"] = time.perf_counter() - started
    report["load_avg_end"] = [round(x, 2) for x in os.getloadavg()]
    text = markdown(report)
    if a.out:
        out = Path(a.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / f"{a.name}.json").write_text(json.dumps(report, indent=1) + "\n")
        (out / f"{a.name}.md").write_text(text)
    print(text)
    slower = [(s, r) for s, sc in report["scenarios"].items() for r, c in sc["rows"].items()
              if c["verdict"].startswith("B SLOWER")]
    return 1 if slower else 0


if __name__ == "__main__":
    sys.exit(main())
