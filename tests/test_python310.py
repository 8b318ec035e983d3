"""The package and its tests on Python 3.10, the oldest Python it claims (JetPack 6's).

mypy already checks the code against 3.10's standard library (pyproject's [tool.mypy]); this runs it.
A cached 3.10 venv with this checkout installed editable (its dev dependencies, keras-hub aside: 0.32
has no 3.10 release) runs a slice of this suite that goes through every layer: errors and range
checks, the layout, the metrics, both file readers, and real exports to both formats with their
verification. `.ci/py310` runs the whole suite the same way.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import REPO, VENV_CACHE, cache_lock
from tests.test_device_extra import python_310

pytestmark = pytest.mark.slow  # a venv with TensorFlow, then exports: minutes

# One file (or case) per layer, real exports to both formats among them; about a minute on 3.10.
SLICE = (
    "tests/test_errors.py",
    "tests/test_layout.py",
    "tests/parity/test_metrics.py",
    "tests/inspection/test_onnx_metadata.py",
    "tests/inspection/test_file_precision.py::test_the_tensors_say_what_the_stamp_says[tflite-dynamic-int8]",
    "tests/inspection/test_file_precision.py::test_the_tensors_say_what_the_stamp_says[onnx-dynamic-int8]",
    "tests/tables/test_uses.py::test_a_fused_kernels_prefix_slice_is_a_kernel_not_a_table",
    "tests/converters/test_export_fp32.py::test_tflite_fp32_matches_tensorflow[encoder_multi_io]",
    "tests/converters/test_export_fp32.py::test_onnx_fp32_matches_tensorflow[encoder_multi_io]",
    "tests/converters/test_export_fp32.py::test_gelu_without_our_handler_is_invalid",
    "tests/converters/test_onnx_rewrites.py",
)


def dev_venv_310(base: str) -> str:
    """This checkout installed editable in a 3.10 venv (kept, keyed by the checkout and pyproject.toml)."""
    key = hashlib.sha256(str(REPO).encode() + (REPO / "pyproject.toml").read_bytes()).hexdigest()[:12]
    venv = VENV_CACHE / f"dev-venv-py310-{key}"
    python = venv / "bin" / "python"
    with cache_lock("checkout"):  # an editable install writes *.egg-info into the checkout
        if not python.exists():
            subprocess.run([base, "-m", "venv", str(venv)], check=True, capture_output=True)
            installed = subprocess.run(
                [str(python), "-m", "pip", "install", "-q", "-e", f"{REPO}[dev]"],
                capture_output=True,
                text=True,
                check=False,
                cwd=VENV_CACHE,
            )
            if installed.returncode != 0:
                subprocess.run(["rm", "-rf", str(venv)], check=False)
            assert installed.returncode == 0, installed.stderr[-2000:]
    return str(python)


def test_a_slice_of_the_suite_passes_on_python_310() -> None:
    base = python_310()
    if base is None:
        pytest.skip("no Python 3.10 interpreter here (python3.10 on PATH or pyenv's)")
    if sys.version_info[:2] == (3, 10):
        pytest.skip("this suite already runs on Python 3.10")
    python = dev_venv_310(base)
    version = subprocess.run([python, "-c", "import sys; print(sys.version_info[:2])"], capture_output=True, text=True)
    assert version.stdout.strip() == "(3, 10)"
    ran = subprocess.run(
        [python, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider", *SLICE],
        capture_output=True,
        text=True,
        check=False,
        cwd=REPO,
        timeout=1200,
    )
    summary = ran.stdout.strip().splitlines()[-1] if ran.stdout.strip() else ran.stderr[-2000:]
    print("Python 3.10:", summary)
    assert ran.returncode == 0, ran.stdout[-4000:]
    assert " passed" in summary and "failed" not in summary


def test_a_checkpoint_folder_on_python_310_says_which_python_it_needs(tmp_path) -> None:
    base = python_310()
    if base is None:
        pytest.skip("no Python 3.10 interpreter here (python3.10 on PATH or pyenv's)")
    if sys.version_info[:2] == (3, 10):
        pytest.skip("this suite already runs on Python 3.10")
    folder = tmp_path / "checkpoint"  # what a downloaded Hugging Face folder holds; keras-hub is not there
    folder.mkdir()
    (folder / "config.json").write_text('{"model_type": "bert"}')
    (folder / "model.safetensors").write_bytes(b"\0" * 8)
    ran = subprocess.run(
        [str(Path(dev_venv_310(base)).parent / "pe-export"), "tflite", str(folder), "-o", str(tmp_path / "m.tflite")],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    lines = ran.stderr.strip().splitlines()
    assert ran.returncode == 3 and len(lines) == 1, ran.stderr[-2000:]
    assert "needs Python 3.11+ (this is 3.10)" in lines[0] and "SavedModel or .keras" in lines[0]
    assert not (tmp_path / "m.tflite").exists()
