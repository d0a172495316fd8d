"""Shared pytest setup: import paths for spawned workers and subprocess scripts.

Spawned workers import test datasets by module name, so ``tests/`` and
``src/`` go on ``sys.path`` (and on ``PYTHONPATH`` for scripts run in a
subprocess). multiprocessing's resource tracker is started once up front, so
that leak snapshots taken inside tests already count it.
"""

from __future__ import annotations

import multiprocessing.resource_tracker
import os
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
SRC = TESTS.parent / "src"

for _p in (str(SRC), str(TESTS)):
    if _p not in sys.path:
        sys.path.insert(0, _p)
os.environ["PYTHONPATH"] = os.pathsep.join(
    [str(SRC), str(TESTS)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])


@pytest.fixture(scope="session", autouse=True)
def _resource_tracker() -> None:
    multiprocessing.resource_tracker.ensure_running()


@pytest.fixture
def script_env() -> dict[str, str]:
    """Environment for a Python subprocess that imports conveyor and the test helpers."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(SRC), str(TESTS)])
    env.pop("PYTEST_CURRENT_TEST", None)
    return env
