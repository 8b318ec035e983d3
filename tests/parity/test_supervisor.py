"""The isolated check's child: a fork of a light process (the `pe-export parity` command), a fresh
interpreter otherwise; a crash or a hang in either is one line and the supervising process survives.

The forked cases run in a fresh light process (this one has numpy and TensorFlow loaded, where forking
is refused); the child's work is replaced there by a real SIGSEGV or a real hang.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from pe_export.golden import GoldenOptions, make_golden
from pe_export.parity.supervisor import fork_is_safe, signal_name

# Runs in a light process: the real check_parity, with the child's check swapped for `behaviour`.
PROBE = """
import os, signal, sys, time
from pathlib import Path
from pe_export.parity.harness import ParityOptions, check_parity
from pe_export.parity.supervisor import fork_is_safe

behaviour = sys.argv[3]

def in_the_child():  # after the fork, in the child only: this process must stay light to fork at all
    import pe_export.parity.inprocess as inprocess

    real = inprocess.run_check
    def run_check(*args, **kwargs):
        if behaviour == "segfault":
            os.kill(os.getpid(), signal.SIGSEGV)
        if behaviour == "rtsignal":  # outside signal.Signals: its default action ends the process
            os.kill(os.getpid(), signal.SIGRTMIN + 3)
        if behaviour == "hang":
            time.sleep(600)
        if behaviour == "endless":  # alive and reporting progress, never done: each beat within the deadline
            while True:
                args[3]()
                time.sleep(0.01)
        return real(*args, **kwargs)
    inprocess.run_check = run_check

os.register_at_fork(after_in_child=in_the_child)
print("fork", fork_is_safe(), flush=True)
try:
    report = check_parity(Path(sys.argv[1]), Path(sys.argv[2]), ParityOptions(timeout_s=5.0))
    print("report", report.passed, report.runtime, "pid", os.getpid())
except Exception as err:
    print("error", type(err).__name__, err, "pid", os.getpid())
print("loaded", [m for m in ("numpy", "ai_edge_litert") if m in sys.modules])
"""


@pytest.fixture(scope="module")
def checked(saved_model, exported_file, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    bundle = tmp_path_factory.mktemp("supervisor") / "golden"
    make_golden(saved_model("encoder_dynamic"), bundle, GoldenOptions(samples=4, batch=2))
    return exported_file("encoder_dynamic", "tflite", "none"), bundle


def probe(checked: tuple[Path, Path], behaviour: str) -> list[str]:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, *map(str, checked), behaviour],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip().splitlines()


def test_this_process_is_not_forked_from() -> None:
    import threading

    # TensorFlow's and the BLAS's threads: the fresh-interpreter child (tests/parity/test_harness.py).
    threads = len(list(Path("/proc/self/task").iterdir()))
    assert threads > threading.active_count() and not fork_is_safe()


ORT_SESSION_WITH_POOL = """\
import onnx, onnxruntime
from onnx import TensorProto, helper
graph = helper.make_graph(
    [helper.make_node("Identity", ["x"], ["y"])], "g",
    [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
    [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
)
options = onnxruntime.SessionOptions()
options.intra_op_num_threads = 2
session = onnxruntime.InferenceSession(
    helper.make_model(graph).SerializeToString(), options, providers=["CPUExecutionProvider"]
)"""

FORK_VERDICT = (
    "import threading, time\n{setup}\nfrom pe_export.parity.supervisor import fork_is_safe\nprint(fork_is_safe())"
)


@pytest.mark.parametrize(
    ("setup", "threads", "forks"),
    [
        ("import numpy", "1", True),  # a module that merely is loaded: no thread, nothing held
        ("import numpy", "2", False),  # the same module with its BLAS pool started: a native thread
        ("threading.Thread(target=time.sleep, args=(5,), daemon=True).start()", "1", False),
        # A runtime session with its intra-op pool: its own worker thread, whatever the BLAS setting. (Importing
        # onnxruntime alone starts a thread on some hosts and none on others, so it decides nothing here.)
        (ORT_SESSION_WITH_POOL, "1", False),
    ],
)
def test_the_fork_decision_counts_the_process_threads(setup: str, threads: str, forks: bool) -> None:
    env = {**os.environ, "OPENBLAS_NUM_THREADS": threads, "OMP_NUM_THREADS": threads}
    done = subprocess.run(
        [sys.executable, "-c", FORK_VERDICT.format(setup=setup)], capture_output=True, text=True, env=env, check=False
    )
    assert done.returncode == 0 and done.stdout.split() == [str(forks)], done.stderr[-1000:]


def test_a_forked_child_checks_the_file(checked: tuple[Path, Path]) -> None:
    lines = probe(checked, "check")
    assert lines[0] == "fork True"
    assert lines[1].startswith("report True litert"), lines
    assert lines[2] == "loaded []"  # numpy and the runtime were loaded in the child only


def test_a_forked_child_that_segfaults_is_one_line(checked: tuple[Path, Path]) -> None:
    lines = probe(checked, "segfault")
    assert lines[0] == "fork True"
    assert lines[1].startswith("error RuntimeUnavailableError the runtime crashed (signal SIGSEGV) while loading")


def test_a_signal_without_a_name_in_the_enum_is_a_crash_not_a_bug(checked: tuple[Path, Path]) -> None:
    lines = probe(checked, "rtsignal")  # was exit 6: signal.Signals(-code) raised ValueError
    assert lines[1].startswith("error RuntimeUnavailableError the runtime crashed (signal SIGRTMIN+3) while"), lines
    assert (signal_name(signal.SIGSEGV), signal_name(999)) == ("SIGSEGV", "999")


def test_a_forked_child_that_hangs_is_killed_at_the_deadline(checked: tuple[Path, Path]) -> None:
    lines = probe(checked, "hang")
    assert lines[1].startswith("error RuntimeUnavailableError the runtime did not answer within 5 s while loading")


def test_a_child_that_never_finishes_is_stopped_past_the_bundles_work(checked: tuple[Path, Path]) -> None:
    lines = probe(checked, "endless")  # 4 samples in batches of 2: loading and 2 batches
    assert lines[1].startswith(
        "error RuntimeUnavailableError the runtime's process went on past the bundle's work (3"
    ), lines
