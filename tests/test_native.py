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


OVERLAPPING = """
import os, sys, threading
from pe_export.native import capture_native_output
entered, left = threading.Event(), threading.Event()
texts = {}

def first():
    with capture_native_output() as captured:
        os.write(2, b"native line from the first\\n")
        entered.set()
        left.wait()  # the second block opened while this one was open
    texts["first"] = captured.text

def second():
    entered.wait()
    with capture_native_output() as captured:
        left.set()
        threading.Event().wait(0.2)  # the first block closes before this one does
        os.write(2, b"native line from the second\\n")
    texts["second"] = captured.text

threads = [threading.Thread(target=first), threading.Thread(target=second)]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
print("first:", texts["first"].strip().replace(chr(10), " | "))
print("second:", texts["second"].strip().replace(chr(10), " | "))
os.write(2, b"stderr after both\\n")
"""


def test_overlapping_captures_in_two_threads_give_the_fds_back() -> None:
    """Interpreters run one per core in threads, each capturing its first call: the fds must come back to the
    process once the last block closes (they stayed on a deleted temp file, and the CLI's report with them), and
    each block gets what was written while it was open."""
    result = subprocess.run([sys.executable, "-c", OVERLAPPING], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr[-2000:]
    lines = result.stdout.splitlines()
    assert lines[-2] == "first: native line from the first", result.stdout
    assert lines[-1] == "second: native line from the second", result.stdout
    assert "native line" not in result.stderr and result.stderr.strip().endswith("stderr after both"), result.stderr
