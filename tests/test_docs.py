"""The examples in conveyor's docstrings run and print what they say."""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import conveyor


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
