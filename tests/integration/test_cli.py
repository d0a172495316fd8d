"""The ``conveyor`` command: --help, demo, tune (subprocesses with timeouts) and the numpy fallback."""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import conveyor as conveyor_pkg
from conveyor import _torch, cli
from conveyor.cli import demo, tune

SRC = str(Path(conveyor_pkg.__file__).resolve().parents[1])


def conveyor(*args: str, cwd: Path, timeout: float) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (SRC, str(cwd), env.get("PYTHONPATH", "")) if p)
    env["MPLBACKEND"] = "Agg"
    return subprocess.run([sys.executable, "-m", "conveyor", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)


def user_dataset(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, getitem: str, *, n: int = 16,
                 imports: str = "") -> None:
    """A module ``name`` whose ``make()`` returns a dataset of ``n`` items, ``__getitem__(i)``
    running the lines ``getitem``."""
    body = textwrap.indent(textwrap.dedent(getitem).strip(), " " * 8)
    (tmp_path / f"{name}.py").write_text(f"{imports}\nclass Data:\n    def __len__(self):\n        return {n}\n\n"
                                         f"    def __getitem__(self, i):\n{body}\n\n\ndef make():\n    return Data()\n")
    monkeypatch.syspath_prepend(str(tmp_path))


def tune_numpy(factory: str, *args: str) -> int:
    """``conveyor tune`` over 0 workers and 1 thread unless ``args`` say otherwise, 3 batches."""
    return cli.main(["tune", factory, "--batch-size", "4", "--workers", "0", "--fetch-threads", "1",
                     "--batches", "3", "--output", "numpy", *args])


@pytest.mark.timeout(60)
def test_help_explains_both_commands(tmp_path: Path) -> None:
    out = conveyor("--help", cwd=tmp_path, timeout=50)
    assert out.returncode == 0, out.stderr
    assert "demo" in out.stdout and "tune" in out.stdout and "MODULE:FACTORY" in out.stdout
    for command, words in (("demo", ["--workers", "--epochs", "--out", "--quick", "--repeats"]),
                           ("tune", ["--batch-size", "--workers", "--fetch-threads", "--batches"])):
        sub = conveyor(command, "--help", cwd=tmp_path, timeout=50)
        assert sub.returncode == 0, sub.stderr
        for w in words:
            assert w in sub.stdout


def test_parser_rejects_bad_lists(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli.main(["demo", "--workers", "0,x"])
    # each with its own command's usage line (the top-level one named neither option)
    for command, bad in ((["demo"], ["--repeats", "0"]), (["demo"], ["--epochs", "0"]),
                         (["tune", "m:f", "--batch-size", "4"], ["--fetch-threads", "0"])):
        capsys.readouterr()
        with pytest.raises(SystemExit):
            cli.main([*command, *bad])
        err = capsys.readouterr().err
        assert f"usage: conveyor {command[0]}" in err and bad[0] in err, err


@pytest.mark.timeout(300)
def test_demo_quick_writes_the_trace(tmp_path: Path) -> None:
    out_dir = tmp_path / "demo-out"
    out = conveyor("demo", "--quick", "--workers", "0,1", "--epochs", "1", "--out", str(out_dir),
                   cwd=tmp_path, timeout=280)
    assert out.returncode == 0, out.stdout + out.stderr
    text = out.stdout
    assert "samples/s" in text and "wait %" in text
    assert "auto chose num_workers=" in text
    assert "where time went" in text
    # torch's and conveyor's cost of a worker against none, in this run's numbers
    assert re.search(r"conveyor: num_workers=1 [0-9.]+x the time of num_workers=0", text), text
    rows = [line.split() for line in text.splitlines() if line.split()[:1] in (["torch"], ["conveyor"])
            and len(line.split()) == 5]
    assert {(r[0], r[1]) for r in rows} >= {("conveyor", "0"), ("conveyor", "1")}
    doc = json.loads((out_dir / "trace.json").read_text())
    assert any(e["ph"] == "X" and e["name"] == "fetch" for e in doc["traceEvents"])
    assert any(e["ph"] == "X" and e["name"] == "step" for e in doc["traceEvents"])
    # num_workers=1 means a worker made every batch: its trace has a worker's track and no main-process one
    one = json.loads((out_dir / "trace-conveyor-w1.json").read_text())["traceEvents"]
    tracks = {e["args"]["name"] for e in one if e["ph"] == "M" and e["name"] == "thread_name"}
    assert "worker 0" in tracks and "main process" not in tracks, tracks


@pytest.mark.timeout(300)
def test_demo_reports_the_fastest_of_its_repeats(tmp_path: Path) -> None:
    out = conveyor("demo", "--workers", "0", "--epochs", "1", "--repeats", "2", "--out", str(tmp_path / "o"),
                   cwd=tmp_path, timeout=280)
    assert out.returncode == 0, out.stdout + out.stderr
    text = out.stdout
    assert "each row: the fastest of 2 runs" in text
    progress = {}
    for line in text.splitlines():
        m = re.match(r"\s+(torch|conveyor)\s+num_workers=0: ([0-9.]+) s \(runs ([0-9.]+), ([0-9.]+)\)$", line)
        if m:
            progress[m[1]] = (float(m[2]), float(m[3]), float(m[4]))
    assert set(progress) == {"torch", "conveyor"}, text
    table = {r[0]: float(r[2]) for r in (line.split() for line in text.splitlines())
             if len(r) == 5 and r[0] in ("torch", "conveyor") and r[1] == "0"}
    for name, (shown, a, b) in progress.items():
        assert shown == min(a, b) == table[name]


@pytest.mark.timeout(300)
def test_tune_sweeps_a_user_factory(tmp_path: Path) -> None:
    (tmp_path / "userdata.py").write_text(textwrap.dedent('''
        import numpy as np

        class Squares:
            def __len__(self):
                return 64

            def __getitem__(self, i):
                return np.full(3, i * i, dtype=np.int64)

        def make():
            return Squares()
    '''))
    out = conveyor("tune", "userdata:make", "--batch-size", "8", "--workers", "0,1", "--fetch-threads", "1,2",
                   "--batches", "12", "--output", "numpy", cwd=tmp_path, timeout=280)
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    table = [line.split() for line in lines if line.split()[:1] in (["0"], ["1"])]
    assert {(r[0], r[1]) for r in table} == {("0", "1"), ("0", "2"), ("1", "1"), ("1", "2")}
    assert "from conveyor import DataLoader" in out.stdout
    snippet = next(line for line in lines if "DataLoader(dataset," in line)
    assert "batch_size=8" in snippet and "num_workers=" in snippet


@pytest.mark.timeout(120)
def test_tune_notes_more_workers_than_cores_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    # the sweep was asked for: one note before it, not the loader's warning at each setting
    (tmp_path / "manydata.py").write_text("import numpy as np\n"
                                          "def make():\n    return [np.full(2, i) for i in range(32)]\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    cores = len(os.sched_getaffinity(0))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cli.main(["tune", "manydata:make", "--batch-size", "4", "--workers", f"0,{cores + 1}",
                  "--fetch-threads", "1", "--batches", "3", "--output", "numpy"])
    out = capsys.readouterr().out
    assert f"note: up to {cores + 1} workers on {cores} usable cores" in out
    assert not [w for w in caught if "worker processes in total" in str(w.message)]
    assert f"\n{cores + 1} " in out  # its row in the table


@pytest.mark.timeout(60)
def test_tune_names_a_missing_factory(tmp_path: Path) -> None:
    out = conveyor("tune", "nosuchmodule_xyz:make", "--batch-size", "4", cwd=tmp_path, timeout=50)
    assert out.returncode != 0 and "cannot import 'nosuchmodule_xyz'" in out.stderr


@pytest.mark.parametrize(("args", "says"), [
    (["--batches", "1"], "--batches must be at least 2"),
    (["--batch-size", "0"], "--batch-size must be a positive integer"),
    (["--step-ms", "-5"], "--step-ms must be a non-negative number"),
    (["--step-ms", "nan"], "--step-ms must be a non-negative number, got nan"),  # (failed mid-sweep)
    (["--step-ms", "inf"], "--step-ms must be a non-negative number, got inf"),
])
def test_tune_refuses_bad_numbers_plainly(args: list[str], says: str) -> None:
    with pytest.raises(SystemExit, match=says):
        cli.main(["tune", "json:loads", "--batch-size", "4", *args])


def test_tune_says_when_the_factory_gives_no_dataset() -> None:
    with pytest.raises(SystemExit, match=r"builtins:int\(\) returned an int, not a dataset"):
        cli.main(["tune", "builtins:int", "--batch-size", "4"])
    # a string has __getitem__ and __len__, yet is no dataset
    with pytest.raises(SystemExit, match=r"builtins:str\(\) returned a str, not a dataset"):
        cli.main(["tune", "builtins:str", "--batch-size", "4"])


@pytest.mark.timeout(120)
def test_tune_says_which_setting_a_failing_dataset_failed_in(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    user_dataset(tmp_path, monkeypatch, "baddata", "raise KeyError(f'no row {i}')")
    with pytest.raises(SystemExit, match=r"loading failed at num_workers=0 fetch_threads=1 with KeyError: 'no row 0'"):
        tune_numpy("baddata:make")
    assert "baddata.py" in capsys.readouterr().err  # the user's traceback, to find where it failed


def test_demo_says_when_it_cannot_write_its_folder(tmp_path: Path) -> None:
    taken = tmp_path / "a-file"
    taken.write_text("")
    with pytest.raises(SystemExit, match="cannot make the --out folder"):
        cli.main(["demo", "--quick", "--out", str(taken)])


def test_tune_notes_a_pick_at_the_edge_of_the_sweep(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    user_dataset(tmp_path, monkeypatch, "slowdata", "time.sleep(0.004)\nreturn np.full(2, i)", n=64,
                 imports="import time\nimport numpy as np")
    # 4 ms reads: 8 fetch threads beat 1 by far, whatever the machine
    assert tune_numpy("slowdata:make", "--batch-size", "8", "--fetch-threads", "1,8", "--batches", "6") == 0
    out = capsys.readouterr().out
    assert "fetch_threads=8" in out and "the pick is the largest --fetch-threads swept" in out, out


def test_tune_says_when_the_factory_fails(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "faildata.py").write_text("def needs(path):\n    return [path]\n"
                                          "def boom():\n    raise OSError('cannot open /data/missing')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(SystemExit, match=r"calling faildata:needs\(\) failed with TypeError.*no arguments"):
        cli.main(["tune", "faildata:needs", "--batch-size", "4"])
    with pytest.raises(SystemExit, match=r"calling faildata:boom\(\) failed with OSError: cannot open"):
        cli.main(["tune", "faildata:boom", "--batch-size", "4"])
    assert "faildata.py" in capsys.readouterr().err  # the user's traceback, to find where it failed


@pytest.mark.timeout(120)
def test_tune_sweeps_a_stream_without_fetch_threads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    # the default --fetch-threads 1,8 made a loader the constructor refuses for a stream
    (tmp_path / "streamdata.py").write_text("import numpy as np\n"
                                            "class Stream:\n"
                                            "    def __iter__(self):\n"
                                            "        return (np.full(2, i) for i in range(64))\n"
                                            "def make():\n    return Stream()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert cli.main(["tune", "streamdata:make", "--batch-size", "4", "--workers", "0,1", "--batches", "3",
                     "--output", "numpy"]) == 0
    out = capsys.readouterr().out
    assert "fetch threads do not apply" in out and "num_workers=" in out
    with pytest.raises(SystemExit, match="cannot shuffle"):
        cli.main(["tune", "streamdata:make", "--batch-size", "4", "--shuffle"])


def test_builtin_data_is_deterministic_and_seed_shaped() -> None:
    x1, y1 = cli.make_diabetes()
    x2, y2 = cli.make_diabetes()
    assert x1.shape == (759, 8) and y1.shape == (759, 1) and x1.dtype == np.float32
    assert np.array_equal(x1, x2) and np.array_equal(y1, y2)
    assert set(np.unique(y1)) == {0.0, 1.0}


def test_numpy_mlp_learns() -> None:
    x, y = cli.make_diabetes()
    step = demo._numpy_step()
    first = [step(x[i:i + 32], y[i:i + 32]) for i in range(0, 759, 32)]
    for _ in range(30):
        last = [step(x[i:i + 32], y[i:i + 32]) for i in range(0, 759, 32)]
    assert np.mean(last) < np.mean(first)


@pytest.mark.timeout(120)
def test_demo_without_torch_uses_numpy(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(_torch, "available", lambda: False)
    assert cli.main(["demo", "--workers", "0", "--epochs", "1", "--out", str(tmp_path)]) == 0
    text = capsys.readouterr().out
    assert "torch is not installed" in text
    assert not any(line.startswith("torch ") for line in text.splitlines())
    assert (tmp_path / "trace.json").exists()


def test_demo_settings_take_their_runs_in_turn() -> None:
    # one setting's runs in a block let a burst of other work on the machine slow all of
    # them: a sweep once put conveyor's num_workers=0 at 3.55 s and num_workers=2 at 0.11 s
    order: list[str] = []

    def make(name: str) -> Any:
        def loader() -> list[tuple[list[int], list[int]]]:
            order.append(name)
            return [([1, 2], [0, 1])]
        return loader

    results = demo._fastest_each([make("a"), make("b")], 3, 1, lambda: (lambda x, y: 0.0))
    assert order == ["a", "b"] * 3
    assert [len(seconds) for _, seconds in results] == [3, 3]
    assert all(best[0]["samples"] == 2 for best, _ in results)


def test_tune_interrupted_says_so_without_a_traceback(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    user_dataset(tmp_path, monkeypatch, "ctrlc", "raise KeyboardInterrupt")
    assert tune_numpy("ctrlc:make") == 130
    err = capsys.readouterr().err
    assert "conveyor tune: interrupted" in err and "Traceback" not in err


def test_tune_says_plainly_when_the_users_module_fails_to_import(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    # only ImportError was caught: a module that raised, or did not parse, dumped cli.py's traceback
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "raisesdata.py").write_text("raise RuntimeError('no data mounted')\n")
    (tmp_path / "brokendata.py").write_text("def make(:\n")
    with pytest.raises(SystemExit, match=r"importing 'raisesdata' failed with RuntimeError: no data mounted"):
        tune_numpy("raisesdata:make")
    assert "raisesdata.py" in capsys.readouterr().err  # the user's traceback, to find where it failed
    with pytest.raises(SystemExit, match=r"importing 'brokendata' failed with SyntaxError"):
        tune_numpy("brokendata:make")


@pytest.mark.parametrize(("batch", "n"), [
    (("a b c".split(), np.zeros((3, 2))), 3),  # names first: it counted the batch's 2 fields
    ({"name": ["x", "y"], "label": [1, 2]}, 2),
    ([np.zeros((5, 1)), [1, 2, 3, 4, 5]], 5),
    ([[1, 2], [3, 4], [5, 6]], 2),  # default_collate's list of per-position lists
    (object(), 7),
])
def test_tune_counts_the_samples_of_a_batch_whatever_its_first_field(batch: object, n: int) -> None:
    assert tune._batch_len(batch, 7) == n


@pytest.mark.timeout(120)
def test_tune_sweeps_past_bad_samples_with_on_error_skip(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    # one unreadable sample stopped the whole sweep, with no way around it
    user_dataset(tmp_path, monkeypatch, "somebad", """
        if i == 5:
            raise OSError('unreadable file')
        return i
    """)
    with pytest.raises(SystemExit, match=r"OSError: unreadable file \(--on-error skip sweeps past bad samples\)"):
        tune_numpy("somebad:make")
    capsys.readouterr()
    assert tune_numpy("somebad:make", "--on-error", "skip") == 0
    assert "on_error='skip'" in capsys.readouterr().out


def test_version_names_the_package(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit:
        cli.main(["--version"])
    assert exit.value.code == 0
    assert capsys.readouterr().out.strip() == f"conveyor {conveyor_pkg.__version__}"


def test_every_option_says_what_it_does() -> None:
    # tune's --batch-size (required), --worker-type and --output had no text in --help
    top = cli.parser()
    commands = next(a for a in top._actions if isinstance(a, argparse._SubParsersAction)).choices
    for name, sub in [("conveyor", top), *commands.items()]:
        for action in sub._actions:
            if action.option_strings:
                assert action.help, (name, action.option_strings)
    batch = next(a for a in commands["tune"]._actions if "--batch-size" in a.option_strings)
    assert batch.required and "required" in batch.help


def test_help_says_where_the_demo_experiment_comes_from(capsys: pytest.CaptureFixture[str]) -> None:
    # "the seed's diabetes experiment" read as a random seed
    for argv in (["--help"], ["demo", "--help"]):
        with pytest.raises(SystemExit):
            cli.main(argv)
        out = " ".join(capsys.readouterr().out.split())
        assert "seed" not in out, out
        assert "diabetes example of a published PyTorch DataLoader tutorial" in out, out
        assert "every added worker made training slower" in out, out
