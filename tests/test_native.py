"""TensorFlow is imported for conversion with the GPUs hidden from it alone: the process environment, and so
every runtime child and the user's own code, keep seeing them."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

SCRIPT = """
import os, subprocess, sys
from pe_export.native import import_tensorflow
before = os.environ.get("CUDA_VISIBLE_DEVICES")
tf = import_tensorflow()
child = subprocess.run([sys.executable, "-c", "import os; print(os.environ.get('CUDA_VISIBLE_DEVICES'))"],
                       capture_output=True, text=True, check=True).stdout.strip()
print(before, os.environ.get("CUDA_VISIBLE_DEVICES"), child, len(tf.config.get_visible_devices("GPU")))
"""


@pytest.mark.parametrize("given", [None, "1"])
def test_importing_tensorflow_leaves_cuda_visible_devices_alone(given: str | None) -> None:
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    if given is not None:
        env["CUDA_VISIBLE_DEVICES"] = given
    result = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, check=False)
    assert result.returncode == 0, result.stderr[-2000:]
    before, after, child, tf_gpus = result.stdout.strip().splitlines()[-1].split()
    assert before == after == child == str(given)  # unset stays unset ("None"), a user's value stays theirs
    assert tf_gpus == "0"  # TensorFlow itself sees no GPU, with or without one on the machine
