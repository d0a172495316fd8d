"""Run PyTorch's own DataLoader tests against torch's loader and against conveyor's.

PyTorch's ``test/test_dataloader.py`` defines what a DataLoader does; a test that passes
with torch's loader should pass with conveyor's (private iterator attributes aside). This
script runs a copy of that file (kept outside this repository: pass its path) under pytest
twice, once as it is and once with ``torch.utils.data.DataLoader`` (and
``torch.utils.data.dataloader.DataLoader``) replaced by ``conveyor.DataLoader``, then prints
the tests that pass with torch and fail with conveyor, grouped by failure reason.

The replacement happens in a ``sitecustomize`` module put first on ``PYTHONPATH``, so that it
also holds in the processes the tests start themselves (spawned helper processes that import
the test module again, ``python -c`` scripts) and in spawned workers.

conveyor's loader is built with ``adaptive=False`` unless ``--adaptive`` is given, so that
``num_workers=N`` means N workers as in torch (pass ``--adaptive`` to test the other setting;
where the loader no longer takes ``adaptive``, nothing is passed).

    python scripts/torch_parity.py /path/to/test_dataloader.py --out /tmp/parity
    python scripts/torch_parity.py /path/to/test_dataloader.py -k TestDictDataLoader
    python scripts/torch_parity.py /path/to/test_dataloader.py --report-only --out /tmp/parity \
        --merge /tmp/parity_rerun

The test file imports ``torch.testing._internal.common_utils``, which needs the ``expecttest``
package; ``--pythonpath`` adds a folder where it is installed. torch's ``@slowTest`` tests
(``test_proper_exit``) run only with ``--slow``.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import textwrap
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

SITECUSTOMIZE = textwrap.dedent('''\
    # Written by conveyor's scripts/torch_parity.py: replaces torch's DataLoader by conveyor's
    # in every Python process of a parity run that has CONVEYOR_PARITY=conveyor.
    import os as _os

    if _os.environ.get("CONVEYOR_PARITY") == "conveyor":
        import inspect as _inspect

        import torch.utils.data as _tud
        import torch.utils.data.dataloader as _tud_dataloader

        import conveyor as _conveyor

        _ADAPTIVE = _os.environ.get("CONVEYOR_PARITY_ADAPTIVE") == "1"
        _TAKES_ADAPTIVE = "adaptive" in _inspect.signature(_conveyor.DataLoader.__init__).parameters

        class DataLoader(_conveyor.DataLoader):
            """conveyor's loader, with the parity run's ``adaptive`` setting by default."""

            def __init__(self, *args, **kwargs):
                if _TAKES_ADAPTIVE:
                    kwargs.setdefault("adaptive", _ADAPTIVE)
                super().__init__(*args, **kwargs)

            def __class_getitem__(cls, item):  # DataLoader[T] in annotations, as with either loader
                return cls

        _tud.DataLoader = DataLoader
        _tud_dataloader.DataLoader = DataLoader
''')

# A pytest plugin (loaded with -p) that gives the test module's JOIN_TIMEOUT (how long its
# tests wait for a helper process they start, 60 s in torch's file) another value: a spawned
# helper imports torch and the test module afresh, which alone can take longer than that on
# a loaded machine, and the test then fails for torch's loader and conveyor's alike.
PLUGIN = textwrap.dedent('''\
    import os

    def pytest_collection_modifyitems(items):
        join = os.environ.get("CONVEYOR_PARITY_JOIN_TIMEOUT")
        if not join:
            return
        for item in items:
            module = getattr(item, "module", None)
            if module is not None and hasattr(module, "JOIN_TIMEOUT"):
                module.JOIN_TIMEOUT = float(join)
''')

# Failures that read a private attribute of torch's loader or iterator (torch's internals,
# not its behaviour): listed apart, out of the parity count's scope.
# "process object is closed": a process of ``iterator._workers`` read after its iterator ended.
PRIVATE = re.compile(r"has no attribute '_\w+'|_MultiProcessingDataLoaderIter|_utils\.|process object is closed")


def _env(mode: str, shim: Path, adaptive: bool, extra: list[str], src: Path) -> dict[str, str]:
    env = dict(os.environ)
    paths = [str(shim), str(src), *extra]
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env["CONVEYOR_PARITY"] = mode
    env["CONVEYOR_PARITY_ADAPTIVE"] = "1" if adaptive else "0"
    env["PYTORCH_PRINT_REPRO_ON_FAILURE"] = "0"  # torch's TestCase: no repro text in the message
    env.pop("PYTEST_CURRENT_TEST", None)
    return env


def run(mode: str, test_file: Path, out: Path, args: argparse.Namespace, shim: Path) -> None:
    env = _env(mode, shim, args.adaptive, args.pythonpath, args.src)
    if args.slow:
        env["PYTORCH_TEST_WITH_SLOW"] = "1"
    if args.join_timeout is not None:
        env["CONVEYOR_PARITY_JOIN_TIMEOUT"] = str(args.join_timeout)
    if mode == "conveyor":  # the replacement must hold, or the comparison means nothing
        probe = subprocess.run(
            [sys.executable, "-c", "import torch.utils.data as t, conveyor; "
             "print(issubclass(t.DataLoader, conveyor.DataLoader) and "
             "t.dataloader.DataLoader is t.DataLoader)"],
            env=env, capture_output=True, text=True, check=False)
        if probe.stdout.strip() != "True":
            raise SystemExit(f"torch's DataLoader was not replaced by conveyor's: {probe.stdout}{probe.stderr}")
    cmd = [sys.executable, "-m", "pytest", str(test_file), "-p", "no:cacheprovider", "-p", "torch_parity_plugin", "-v", "-rN",
           f"--timeout={args.timeout}", f"--junitxml={out / (mode + '.xml')}"]
    if args.k:
        cmd += ["-k", args.k]
    print(f"[{mode}] {' '.join(cmd)}  (log: {out / (mode + '.log')})", flush=True)
    with open(out / f"{mode}.log", "w") as log:
        subprocess.run(cmd, cwd=test_file.parent, env=env, stdout=log, stderr=subprocess.STDOUT, check=False)


def results(xml: Path) -> dict[str, tuple[str, str]]:
    """test id -> (outcome, first line of the failure) from pytest's junit file."""
    found: dict[str, tuple[str, str]] = {}
    if not xml.exists():
        return found
    for case in ET.parse(xml).getroot().iter("testcase"):
        name = f"{case.get('classname', '').rsplit('.', 1)[-1]}::{case.get('name')}"
        outcome, reason = "passed", ""
        for child in case:
            if child.tag in ("failure", "error"):
                outcome = "failed"
                reason = _reason(child.get("message") or "", child.text or "")
            elif child.tag == "skipped":
                outcome = "skipped"
                reason = child.get("message") or ""
        found[name] = (outcome, reason)
    return found


def _reason(message: str, text: str) -> str:
    """The exception line of a failure, with numbers, pids and addresses made alike."""
    line = message.strip().splitlines()[0] if message.strip() else ""
    if not line:
        errors = [c[4:].strip() for c in text.splitlines() if c.startswith("E   ") and c[4:].strip()]
        line = errors[0] if errors else ""
    line = re.sub(r"0x[0-9a-f]+", "0x..", line)
    line = re.sub(r"\d+", "N", line)
    return line[:160]


def report(out: Path, merge: list[Path]) -> int:
    torch_res = results(out / "torch.xml")
    conv_res = results(out / "conveyor.xml")
    for later in merge:  # a rerun of some tests (another -k, longer timeouts) replaces their results
        torch_res.update(results(later / "torch.xml"))
        conv_res.update(results(later / "conveyor.xml"))
    if not torch_res or not conv_res:
        print(f"missing results in {out} (torch: {len(torch_res)}, conveyor: {len(conv_res)})")
        return 2
    names = sorted(set(torch_res) | set(conv_res))

    def count(res: dict[str, tuple[str, str]], outcome: str) -> int:
        return sum(1 for v in res.values() if v[0] == outcome)

    print(f"tests: {len(names)}")
    for label, res in (("torch", torch_res), ("conveyor", conv_res)):
        print(f"  {label:9s} passed {count(res, 'passed'):3d}  failed {count(res, 'failed'):3d}  "
              f"skipped {count(res, 'skipped'):3d}")
    only = {n: conv_res.get(n, ("missing", "not run"))[1] for n in names
            if torch_res.get(n, ("",))[0] == "passed" and conv_res.get(n, ("",))[0] != "passed"}
    private = {n: r for n, r in only.items() if PRIVATE.search(r)}
    public = {n: r for n, r in only.items() if n not in private}
    print(f"pass with torch, fail with conveyor: {len(only)} "
          f"({len(public)} on behaviour, {len(private)} on private attributes)")
    for title, group in (("behaviour", public), ("private attributes (out of scope)", private)):
        by_reason: dict[str, list[str]] = defaultdict(list)
        for n, r in group.items():
            by_reason[r].append(n)
        if by_reason:
            print(f"\n== {title}")
        for r, tests in sorted(by_reason.items(), key=lambda kv: -len(kv[1])):
            print(f"- {r or '(no message)'}")
            for t in sorted(tests):
                print(f"    {t}")
    gained = [n for n in names if torch_res.get(n, ("",))[0] == "failed" and conv_res.get(n, ("",))[0] == "passed"]
    if gained:
        print("\nfail with torch, pass with conveyor: " + ", ".join(gained))
    return 1 if public else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("test_file", type=Path, help="a copy of PyTorch's test/test_dataloader.py")
    parser.add_argument("--out", type=Path, default=None, help="folder for logs and junit files")
    parser.add_argument("-k", default=None, help="pytest -k selection (both runs)")
    parser.add_argument("--timeout", type=int, default=120, help="seconds per test")
    parser.add_argument("--only", choices=("torch", "conveyor"), default=None, help="run one side only")
    parser.add_argument("--adaptive", action="store_true", help="build conveyor's loaders with adaptive=True")
    parser.add_argument("--join-timeout", type=float, default=None,
                        help="seconds the tests wait for the helper processes they start (torch's file: 60)")
    parser.add_argument("--slow", action="store_true", help="run torch's @slowTest tests too")
    parser.add_argument("--pythonpath", action="append", default=[],
                        help="folder added to PYTHONPATH (e.g. where expecttest is installed)")
    parser.add_argument("--src", type=Path, default=REPO / "src",
                        help="conveyor's source folder to test (default: this checkout's)")
    parser.add_argument("--merge", type=Path, action="append", default=[],
                        help="with --report-only: another --out folder whose results replace these (repeatable)")
    parser.add_argument("--report-only", action="store_true", help="compare the junit files already in --out")
    args = parser.parse_args()
    test_file = args.test_file.resolve()
    if not test_file.exists():
        parser.error(f"no such file: {test_file}")
    out = (args.out or Path(tempfile.mkdtemp(prefix="torch_parity_"))).resolve()
    out.mkdir(parents=True, exist_ok=True)
    if not args.report_only:
        with tempfile.TemporaryDirectory(prefix="torch_parity_shim_") as shim:
            (Path(shim) / "sitecustomize.py").write_text(SITECUSTOMIZE)
            (Path(shim) / "torch_parity_plugin.py").write_text(PLUGIN)
            for mode in ("torch", "conveyor"):
                if args.only in (None, mode):
                    run(mode, test_file, out, args, Path(shim))
    return report(out, args.merge)


if __name__ == "__main__":
    sys.exit(main())
