"""Hostile inputs, interruption and racing writers: one line, a documented exit code, nothing partial."""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pe_export.errors import ExitCode
from pe_export.golden import GoldenOptions, make_golden
from tests.helpers import assert_one_line_error, run_cli

CLI = [sys.executable, "-m", "pe_export.cli"]


@pytest.fixture(scope="module")
def exported(saved_model, exported_file, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("hostile")
    paths = {target: exported_file("encoder_dynamic", target) for target in ("tflite", "onnx")}
    paths["bundle"] = out / "golden"
    make_golden(saved_model("encoder_dynamic"), paths["bundle"], GoldenOptions(samples=4, batch=2))
    return paths


def test_savedmodel_with_missing_variables(capfd, saved_model, tmp_path: Path) -> None:
    broken = tmp_path / "broken"
    shutil.copytree(saved_model("encoder_dynamic"), broken)
    for data in (broken / "variables").glob("variables.data-*"):
        data.unlink()
    assert_one_line_error(
        run_cli(capfd, "onnx", broken, "-o", tmp_path / "m.onnx"), ExitCode.BAD_INPUT, "could not be loaded"
    )


def test_savedmodel_without_signature(capfd, tmp_path: Path) -> None:
    import tensorflow as tf

    module = tf.Module()
    module.v = tf.Variable(1.0)
    tf.saved_model.save(module, str(tmp_path / "nosig"))
    assert_one_line_error(
        run_cli(capfd, "tflite", tmp_path / "nosig", "-o", tmp_path / "m.tflite"),
        ExitCode.BAD_INPUT,
        "has no serving signature",
    )


def test_onnx_with_missing_initializer_and_unknown_op(capfd, exported, tmp_path: Path) -> None:
    import onnx

    model = onnx.load(str(exported["onnx"]))
    del model.graph.initializer[0]
    missing = tmp_path / "missing.onnx"
    onnx.save(model, str(missing))
    assert run_cli(capfd, "inspect", missing).exit_code == 0  # reading it is fine
    assert_one_line_error(
        run_cli(capfd, "parity", missing, exported["bundle"]), ExitCode.BAD_INPUT, "onnxruntime could not load"
    )

    model = onnx.load(str(exported["onnx"]))
    model.graph.node[0].op_type = "NoSuchOp"
    unknown = tmp_path / "unknown.onnx"
    onnx.save(model, str(unknown))
    inspected = run_cli(capfd, "inspect", unknown)
    assert inspected.exit_code == 0 and "custom/unknown ops: NoSuchOp" in inspected.stdout
    assert "onnxruntime      NO" in inspected.stdout
    assert_one_line_error(run_cli(capfd, "parity", unknown, exported["bundle"]), ExitCode.BAD_INPUT, "NoSuchOp")


def test_truncated_tflite_in_parity(capfd, exported, tmp_path: Path) -> None:
    truncated = tmp_path / "t.tflite"
    truncated.write_bytes(exported["tflite"].read_bytes()[:5000])
    assert_one_line_error(
        run_cli(capfd, "parity", truncated, exported["bundle"]), ExitCode.BAD_INPUT, "truncated or corrupt"
    )


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--runtime", "tensorrt-native"], "unknown runtime 'tensorrt-native'"),
        (["--runtime", "onnxruntime"], "runs .onnx files, not 'm.tflite'"),
        (["--providers", "rocm"], "unknown provider 'rocm'"),
        (["--timeout", "0"], "--timeout 0"),
        (["--threads", "0"], "--threads 0"),
    ],
)
def test_bad_parity_options(capfd, exported, args: list[str], fragment: str) -> None:
    assert_one_line_error(
        run_cli(capfd, "parity", exported["tflite"], exported["bundle"], *args), ExitCode.BAD_INPUT, fragment
    )


def _wait_for(predicate, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


@pytest.mark.parametrize(("sent", "code"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_interrupted_golden_leaves_nothing(saved_model, tmp_path: Path, sent: int, code: int) -> None:
    out = tmp_path / "out"
    out.mkdir()
    process = subprocess.Popen(
        [*CLI, "golden", str(saved_model("encoder_dynamic")), "-o", str(out / "golden"), "--samples", "100000"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    started = _wait_for(lambda: any(p.name.endswith(".tmp") for p in out.iterdir()), 120)
    assert started, "the bundle never started"
    time.sleep(0.5)  # mid-way through the batches
    process.send_signal(sent)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == code, stderr
    assert "nothing partial was left behind" in stderr and "Traceback" not in stderr
    assert list(out.iterdir()) == []


@pytest.mark.slow  # tens of seconds: out of the quick run
def test_racing_exports(saved_model, tmp_path: Path) -> None:
    target = tmp_path / "m.onnx"
    command = [*CLI, "onnx", str(saved_model("encoder_dynamic")), "-o", str(target), "--no-verify"]
    racers = [subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    results = [(p.wait(timeout=300), p.stderr.read()) for p in racers]
    codes = sorted(code for code, _ in results)
    assert codes == [0, 2], results  # one wins, the other is refused: never a silent overwrite
    assert "already exists" in next(err for code, err in results if code == 2)
    racers = [
        subprocess.Popen([*command, "--overwrite"], stdout=subprocess.PIPE, stderr=subprocess.PIPE) for _ in range(2)
    ]
    assert [p.wait(timeout=300) for p in racers] == [0, 0]
    import onnxruntime as ort

    ort.InferenceSession(str(target), providers=["CPUExecutionProvider"])  # one complete file
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx"]


def test_no_pickle_anywhere() -> None:
    """No module of the package unpickles: every np.load passes allow_pickle=False."""
    root = Path(__file__).resolve().parents[1]
    sources = [*root.glob("pe_export/**/*.py"), *root.glob("targets/**/*.py")]
    assert len(sources) > 20
    for path in sources:
        text = path.read_text()
        assert "import pickle" not in text and "pickle.load" not in text, path
        for line in text.splitlines():
            if "np.load(" in line:
                assert "allow_pickle=False" in line, (path, line)
