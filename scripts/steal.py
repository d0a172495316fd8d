"""Run a command while a hypervisor seems to steal its time: the command and every process
it starts are stopped (SIGSTOP) for STOP ms out of every PERIOD ms.

    python scripts/steal.py [--stop 3] [--period 10] -- python -m pytest tests/integration/test_auto.py

On a shared VM the host runs other guests on this guest's cores: a thread then neither runs
nor waits on the guest's run queue, so no clock the guest keeps per thread (CPU time,
schedstat's run-queue wait) counts that time, and a batch that only computes reads as one
that waits. A stopped process is in the same state. Tests that judge a batch by its clocks
must hold under this as they hold on a loaded machine (docs/decisions/tests-hold-under-load.md).
Exits with the command's status.
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import time

import psutil


def _signal_tree(root: psutil.Process, sig: int) -> list[psutil.Process]:
    try:
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []
    for proc in procs:
        try:
            proc.send_signal(sig)
        except psutil.NoSuchProcess:
            pass
    return procs


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--stop", type=float, default=3.0, help="ms stopped in each period")
    p.add_argument("--period", type=float, default=10.0, help="ms")
    p.add_argument("command", nargs=argparse.REMAINDER)
    args = p.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command or not 0 < args.stop < args.period:
        p.error("give a command, and 0 < --stop < --period")
    child = subprocess.Popen(command)
    root = psutil.Process(child.pid)
    try:
        while child.poll() is None:
            stopped = _signal_tree(root, signal.SIGSTOP)
            time.sleep(args.stop / 1e3)
            for proc in stopped:  # the same processes: one started meanwhile was never stopped
                try:
                    proc.send_signal(signal.SIGCONT)
                except psutil.NoSuchProcess:
                    pass
            time.sleep((args.period - args.stop) / 1e3)
    finally:
        _signal_tree(root, signal.SIGCONT)
    return child.wait()


if __name__ == "__main__":
    sys.exit(main())
