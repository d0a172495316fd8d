"""The examples in conveyor's docstrings run and print what they say."""

from __future__ import annotations

import doctest
import importlib
import os
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

import conveyor

ROOT = Path(__file__).resolve().parents[2]


def _modules() -> list[str]:
    names = ["conveyor"]
    for info in pkgutil.walk_packages(conveyor.__path__, "conveyor."):
        if not info.name.endswith("__main__"):
            names.append(info.name)
    # executors/ is a namespace package: walk_packages does not descend into it
    executors = importlib.import_module("conveyor.executors")
    names += [f"conveyor.executors.{m.name}" for m in pkgutil.iter_modules(executors.__path__)]
    return sorted(set(names))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", _modules())
def test_docstring_examples(name: str) -> None:
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples failed in {name}"


def test_docstring_examples_write_no_fixed_path() -> None:
    # write_trace's example wrote /tmp/conveyor-trace.json on every run of the suite: the
    # examples make their own temporary folders (the session's temp folder is private, see
    # conftest.py, but a literal /tmp path goes around it)
    fixed = [f"{t.name}: {e.source.strip()}" for name in _modules()
             for t in doctest.DocTestFinder().find(importlib.import_module(name))
             for e in t.examples if "/tmp" in e.source]
    assert not fixed, fixed


@pytest.mark.timeout(120)
def test_the_diabetes_example_writes_nothing_where_it_runs_and_warns_of_nothing(tmp_path: Path) -> None:
    # it wrote diabetes.csv into the current folder, and float(loss) printed torch's
    # "Converting a tensor with requires_grad=True to a scalar" warning
    pytest.importorskip("torch")
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), TMPDIR=str(tmp_path / "temp"))
    (tmp_path / "temp").mkdir()
    (tmp_path / "cwd").mkdir()
    proc = subprocess.run([sys.executable, "-W", "always", str(ROOT / "examples" / "diabetes.py"), "--epochs", "1",
                           "--workers", "0"], capture_output=True, text=True, env=env, cwd=tmp_path / "cwd",
                          timeout=110)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "num_workers=0:" in proc.stdout and "Warning" not in proc.stderr, proc.stderr[-3000:]
    assert not list((tmp_path / "cwd").iterdir())
    # (torch's import makes its compiler's cache folder there)
    assert not [p.name for p in (tmp_path / "temp").iterdir() if not p.name.startswith("torchinductor_")]


def _anchor(heading: str) -> str:
    """A markdown heading's anchor as GitHub makes it: lower case, punctuation dropped, spaces
    to hyphens."""
    kept = "".join(c for c in heading.strip().lower() if c.isalnum() or c in " -_")
    return kept.replace(" ", "-")


@pytest.mark.parametrize("doc", ["README.md", "docs/guide.md", "docs/architecture.md", "benchmarks/README.md"])
def test_relative_links_reach_a_file_and_heading(doc: str) -> None:
    import re

    path = ROOT / doc
    for target in re.findall(r"\]\(([^)\s]+)\)", path.read_text()):
        if "://" in target:
            continue
        file, _, anchor = target.partition("#")
        dest = (path.parent / file).resolve() if file else path
        assert dest.exists(), f"{doc}: {target} names no file"
        if anchor:
            headings = [_anchor(h) for h in re.findall(r"^#+ (.+)$", dest.read_text(), flags=re.M)]
            assert anchor in headings, f"{doc}: {target} names no heading of {dest.name}"
