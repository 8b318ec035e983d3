"""The documented CI example passes on a good model and fails the build on a regression."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def run(*args: str | Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    environment = {**os.environ, **(env or {})}
    return subprocess.run(
        [str(a) for a in args], capture_output=True, text=True, check=False, env=environment, timeout=600
    )


@pytest.mark.slow  # tens of seconds: out of the quick run
def test_ci_script_passes_then_fails_on_regression(saved_model, tmp_path: Path) -> None:
    script = REPO / "examples" / "ci" / "export-and-check.sh"
    good = run("bash", script, saved_model("encoder_multi_io"), tmp_path / "out")
    assert good.returncode == 0, good.stdout + good.stderr
    assert (tmp_path / "out" / "parity-onnx.json").exists()
    files = {"PE_EXPORT_MODEL": tmp_path / "out" / "encoder.onnx", "PE_EXPORT_GOLDEN": tmp_path / "out" / "golden"}
    as_pytest = run(
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        REPO / "examples" / "ci" / "test_parity.py",
        env={key: str(value) for key, value in files.items()},
    )
    assert "1 passed" in as_pytest.stdout, as_pytest.stdout
    # A regression: demand exactness the float32 conversion cannot meet.
    bad = run("bash", script, saved_model("encoder_multi_io"), tmp_path / "out", "--atol", "0", "--rtol", "0")
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert "fails parity" in bad.stderr


@pytest.mark.slow  # tens of seconds: out of the quick run
def test_device_parity_example_runs_as_written(saved_model, tmp_path: Path) -> None:
    """examples/device-parity/README.md, its commands as written, on one of the suite's encoders at saved_model/
    (the docker lines are the CPU image's, built and run by tests/test_docker_images.py)."""
    from tests.helpers import shell_lines

    (tmp_path / "saved_model").symlink_to(saved_model("encoder_dynamic"), target_is_directory=True)
    commands = shell_lines(REPO / "examples" / "device-parity" / "README.md")
    ran = [line for line in commands if not line.startswith("docker ")]
    assert len(ran) == 4 and len(commands) == 6, commands
    for line in ran:
        done = subprocess.run(["bash", "-c", line], cwd=tmp_path, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, (line, done.stdout, done.stderr)
    import json

    report = json.loads((tmp_path / "out" / "parity.json").read_text())
    assert report["passed"] is True and report["outputs"] and report["runtime"]
