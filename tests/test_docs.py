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
