"""Checks that need a Python interpreter of their own: the core imports with numpy alone,
an image folder without Pillow says what to install, the replay digest is the same under
another hash seed, and glibc's heap settings as a fresh process has them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from conveyor import replay
from test_datasets import image_tree  # a fixture: pytest finds it by its name in this module

SRC = str(Path(__file__).resolve().parents[2] / "src")


def test_numpy_collate_never_imports_torch() -> None:
    code = (
        "import sys, numpy as np\n"
        "from conveyor.collate import numpy_collate, use_allocator\n"
        "with use_allocator(lambda s, d: np.empty(s, d)):\n"
        "    out = numpy_collate([{'a': np.zeros(2), 'b': 1, 'c': 2.0}] * 4)\n"
        "assert out['a'].shape == (4, 2) and out['b'].dtype == np.int64\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    env = {"PYTHONPATH": str(SRC), "PATH": "/usr/bin:/bin"}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_import_without_torch() -> None:
    code = (
        "import sys, conveyor, conveyor._torch as t\n"
        "before = 'torch' in sys.modules\n"
        "t._available = False\n"
        "from conveyor import samplers as s\n"
        "list(s.RandomSampler(range(5))); list(s.SubsetRandomSampler([1, 2]))\n"
        "list(s.WeightedRandomSampler([1, 2], 3)); list(s.DistributedSampler(range(5), 2, 0))\n"
        "list(s.BatchSampler(s.SequentialSampler(range(5)), 2, False))\n"
        "assert before or 'torch' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_import_needs_neither_torch_nor_pillow() -> None:
    code = "import sys, conveyor.datasets; print('torch' in sys.modules, 'PIL' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], env={"PYTHONPATH": SRC}, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


def test_image_folder_without_pillow(image_tree: Path) -> None:
    code = (
        "import sys; sys.modules['PIL'] = None\n"
        "from conveyor.datasets import ImageFolder\n"
        "try:\n    ImageFolder(sys.argv[1])\n"
        "except ImportError as e:\n    print(e)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(image_tree)], env={"PYTHONPATH": SRC}, capture_output=True, text=True
    )
    assert "pip install conveyor[image]" in out.stdout


def test_the_digest_is_the_same_in_another_process() -> None:
    batches = [[3, 1, 2], ["k1", "k2"], [(4, 224), (5, 224)], np.arange(3), 7]
    here = 0
    for b in batches:
        here = replay.digest(here, b)
    code = ("import numpy as np; from conveyor import replay; d = 0\n"
            "for b in [[3, 1, 2], ['k1', 'k2'], [(4, 224), (5, 224)], np.arange(3), 7]: d = replay.digest(d, b)\n"
            "print(d)")
    env = dict(os.environ, PYTHONHASHSEED="12345")  # str hashes differ; the digest must not
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert int(out.stdout) == here
    assert replay.digest(0, [3, 1, 2]) != replay.digest(0, [1, 3, 2])


FAULTS = """
import resource, sys
import numpy as np
import conveyor

class Arrays:
    def __len__(self):
        return 128 * 24
    def __getitem__(self, i):
        return np.ones((3, 64, 64), dtype=np.float32)  # 48 KB: from the heap, not mmap

loader = conveyor.DataLoader(Arrays(), batch_size=128, num_workers=0, output="numpy")
for b in loader:  # the kept buffer is made; glibc learns the batch size
    pass
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for b in loader:
    pass
print((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / len(loader))
"""


@pytest.mark.timeout(60)
def test_a_kept_buffer_does_not_keep_glibc_trimming_the_heap_after_each_batch(tmp_path: Any,
                                                                            script_env: dict[str, str]) -> None:
    # freeing a batch (an mmapped chunk) makes glibc raise its trim threshold; a buffer the
    # recycler keeps is never freed, so each batch's 128 samples (6 MB) went back to the
    # kernel and were faulted in again (110-450 page faults a batch; under 1 with the hint)
    import platform
    import subprocess
    import sys

    if platform.libc_ver()[0] != "glibc":
        pytest.skip("glibc's malloc thresholds only")
    out = subprocess.run([sys.executable, "-c", FAULTS], capture_output=True, text=True, env=script_env, timeout=50)
    assert out.returncode == 0, out.stderr
    assert float(out.stdout) < 25, out.stdout  # without: 110 here
