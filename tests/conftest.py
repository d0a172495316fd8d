"""Shared pytest setup: import paths for spawned workers and subprocess scripts.

Spawned workers import test datasets by module name, so ``src/``, ``tests/``
(the shared helpers) and ``tests/unit`` and ``tests/integration`` (datasets a test
module defines, and the few test modules another imports) go on ``sys.path`` (and on
``PYTHONPATH`` for scripts run in a subprocess). multiprocessing's resource tracker
is started once up front, so that leak snapshots taken inside tests already count it.
The system temp folder is a private one for the session, checked at its end for
conveyor's leftovers.
"""

from __future__ import annotations

import multiprocessing.resource_tracker
import os
import signal
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
SRC = TESTS.parent / "src"
PATHS = [str(SRC), str(TESTS), str(TESTS / "unit"), str(TESTS / "integration")]

for _p in reversed(PATHS):
    if _p not in sys.path:
        sys.path.insert(0, _p)
os.environ["PYTHONPATH"] = os.pathsep.join(
    PATHS + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p not in PATHS])


@pytest.fixture(scope="session", autouse=True)
def _private_temp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The system temp folder, for this session and the processes it starts, is a fresh
    folder of its own; whatever conveyor leaves there fails the run. Tests write under their
    ``tmp_path``: a file left in the shared temp folder outlives the run (a fixed name, read
    by the next run as its own, or by another user's) and another session's would be
    counted here as this one's."""
    folder = tmp_path_factory.mktemp("system-temp")
    before = os.environ.get("TMPDIR"), tempfile.tempdir
    os.environ["TMPDIR"] = tempfile.tempdir = str(folder)
    try:
        yield folder
    finally:
        if before[0] is None:
            os.environ.pop("TMPDIR", None)
        else:
            os.environ["TMPDIR"] = before[0]
        tempfile.tempdir = before[1]
    left = sorted(p.name for p in folder.iterdir() if p.name.startswith("conveyor"))
    assert not left, f"the tests left {left} in the temp folder ({folder}): tests write under tmp_path"


@pytest.fixture(scope="session", autouse=True)
def _ctrl_c_raises() -> Iterator[None]:
    """Ctrl-C raises KeyboardInterrupt in this process and in the scripts it runs, whatever
    launched the session: a shell without job control starts a background command (``cmd &``)
    with SIGINT ignored, which Python then leaves ignored, and every test of what a Ctrl-C
    does saw none (8 failed that way)."""
    old = signal.getsignal(signal.SIGINT)
    if old == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        if old == signal.SIG_IGN:
            signal.signal(signal.SIGINT, old)


@pytest.fixture(scope="session", autouse=True)
def _resource_tracker(_private_temp: Path) -> None:
    multiprocessing.resource_tracker.ensure_running()


@pytest.fixture
def script_env() -> dict[str, str]:
    """Environment for a Python subprocess that imports conveyor and the test helpers."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(PATHS)
    env.pop("PYTEST_CURRENT_TEST", None)
    return env
