"""The tflite-runtime fallback runner, for real, in venvs of its own (tflite-runtime 2.14 is its last release).

`pip install 'pe-export[tflite-runtime]'` must give a working checker: it pins NumPy 1.x, which
tflite-runtime 2.14 was built for. Files whose ops are newer than 2.14's kernels are refused with
exit 3 and a pointer to ai-edge-litert, and `pe-export inspect` predicts which ones.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from pe_export.golden import GoldenOptions, make_golden
from pe_export.inspection import inspect_path
from tests.helpers import REPO, cached_venv, run_outside_repo

pytestmark = pytest.mark.skipif(
    sys.version_info >= (3, 12), reason="tflite-runtime 2.14, its last release, has wheels up to Python 3.11"
)


@pytest.fixture(scope="module")
def golden(saved_model, tmp_path_factory: pytest.TempPathFactory) -> Path:
    bundle = tmp_path_factory.mktemp("tflite-runtime") / "golden"
    make_golden(saved_model("encoder_dynamic"), bundle, GoldenOptions(samples=6, batch=3))
    return bundle


def test_parity_with_tflite_runtime(exported_file, golden: Path) -> None:
    venv = cached_venv("tflite-runtime-venv", [f"{REPO}[tflite-runtime]"])
    listed = run_outside_repo(venv / "bin" / "python", "-m", "pip", "list", "--format=freeze").stdout.lower()
    assert "tflite-runtime==2.14" in listed and "numpy==1." in listed and "ai-edge-litert" not in listed
    for quantize in ("none", "float16"):  # ops the 2.14 kernels know (min_runtime_version 2.10)
        model = exported_file("encoder_dynamic", "tflite", quantize)
        assert next(v for v in inspect_path(model).runs_on if v.runtime == "tflite-runtime").runs
        checked = run_outside_repo(venv / "bin" / "pe-export", "parity", model, golden, "--runtime", "tflite-runtime")
        assert checked.returncode == 0, (quantize, checked.stdout + checked.stderr)
        assert "PASS" in checked.stdout and "on tflite-runtime" in checked.stdout
    # Dynamic int8 from TF 2.21 uses FULLY_CONNECTED v12 (min_runtime_version 2.17): too new for 2.14. Full
    # integer's int16 RSQRT has no 2.14 kernel, though its op versions (1) do not say so: inspect reads the types.
    for quantize, why in (("dynamic-int8", "TFLite ≥ 2.17.0"), ("int8", "int16 activations on RSQRT")):
        newer = exported_file("encoder_dynamic", "tflite", quantize)
        verdict = next(v for v in inspect_path(newer).runs_on if v.runtime == "tflite-runtime")
        assert not verdict.runs and why in verdict.why, verdict.why
        refused = run_outside_repo(venv / "bin" / "pe-export", "parity", newer, golden, "--runtime", "tflite-runtime")
        assert refused.returncode == 3, refused.stdout + refused.stderr
        assert "tflite-runtime is older than" in refused.stderr and "ai-edge-litert" in refused.stderr


def test_tflite_runtime_beside_numpy2_says_what_to_do(exported_file, golden: Path) -> None:
    # What `pip install tflite-runtime` alone gives today: NumPy 2, and an interpreter that cannot load.
    venv = cached_venv("tflite-runtime-numpy2-venv", [str(REPO), "tflite-runtime==2.14.0", "numpy>=2"])
    model = exported_file("encoder_dynamic", "tflite")
    refused = run_outside_repo(venv / "bin" / "pe-export", "parity", model, golden, "--runtime", "tflite-runtime")
    assert refused.returncode == 3, refused.stdout + refused.stderr
    assert "built for NumPy 1.x" in refused.stderr and "pip install 'numpy<2'" in refused.stderr
    assert "Traceback" not in refused.stderr
