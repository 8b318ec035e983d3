"""Parity on aarch64 without ARM hardware: the TF-free checker under qemu user-mode emulation.

Builds (and caches) an aarch64 Python with numpy, ai-edge-litert, onnxruntime, onnx and click
with ../shared/arm64/setup-env.sh, installs pe-export's wheel into it, and runs
`pe-export parity` there on .tflite fp32, .tflite dynamic-int8 and .onnx exports.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import pytest

from pe_export.golden import GoldenOptions, make_golden
from pe_export.parity.supervisor import CHILD_PYTHON_ENV
from tests.helpers import REPO, VENV_CACHE, cache_lock, run_outside_repo

pytestmark = pytest.mark.slow  # minutes: excluded from the quick run (-m "not slow")

SETUP = REPO.parent / "shared" / "arm64" / "setup-env.sh"
CACHE = VENV_CACHE
QEMU_CPU = "neoverse-n1"
SHARED_SETUP_HOST_LACKS = 2  # ../shared/arm64/setup-env.sh exits 2 where the host lacks what it needs


@pytest.fixture(scope="session")
def arm64_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if not SETUP.exists():
        pytest.skip(f"no {SETUP}: the shared aarch64 setup script is not beside this checkout")
    key = hashlib.sha256(SETUP.read_bytes()).hexdigest()[:12]
    env_dir = CACHE / f"arm64-env-{key}"
    launcher = env_dir / "run.sh"
    if not launcher.exists():
        CACHE.mkdir(parents=True, exist_ok=True)
        built = run_outside_repo("bash", SETUP, env_dir, sys.executable, "click", "onnx")
        if built.returncode != 0:
            reason = (built.stderr.strip().splitlines() or ["unknown"])[-1]
            if built.returncode == SHARED_SETUP_HOST_LACKS:  # the shared script's "not here" (no apt source, old qemu)
                pytest.skip(f"qemu aarch64 emulation cannot be had here: {reason}")
            raise AssertionError(built.stdout[-1500:] + built.stderr[-1500:])
    wheels = tmp_path_factory.mktemp("wheel")
    with cache_lock("checkout"):
        made = run_outside_repo(sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", wheels, REPO)
    assert made.returncode == 0, made.stderr[-1500:]
    installed = run_outside_repo(
        sys.executable,
        "-m",
        "pip",
        "install",
        "-q",
        "--no-deps",
        "--upgrade",
        "--target",
        env_dir / "site",
        *wheels.glob("*.whl"),
    )
    assert installed.returncode == 0, installed.stderr[-1500:]
    machine = run_outside_repo(launcher, "-c", "import platform; print(platform.machine())", env={"QEMU_CPU": QEMU_CPU})
    assert machine.stdout.strip() == "aarch64", machine.stderr
    return launcher


def test_parity_passes_on_emulated_aarch64(arm64_python: Path, saved_model, exported_file, tmp_path: Path) -> None:
    model = "encoder_multi_io"
    files = {
        "tflite fp32": ("tflite", "none"),
        "tflite dynamic-int8": ("tflite", "dynamic-int8"),
        "onnx fp32": ("onnx", "none"),
    }
    bundle = tmp_path / "golden"
    make_golden(saved_model(model), bundle, GoldenOptions(samples=8, batch=4))
    for name, (target, quantize) in files.items():
        exported = exported_file(model, target, quantize)
        report = tmp_path / f"{name.replace(' ', '-')}.json"
        checked = run_outside_repo(
            arm64_python,
            "-m",
            "pe_export.cli",
            "parity",
            exported,
            bundle,
            "--json",
            report,
            env={"QEMU_CPU": QEMU_CPU, CHILD_PYTHON_ENV: str(arm64_python)},
        )
        assert checked.returncode == 0, checked.stdout[-1500:] + checked.stderr[-1500:]
        result = json.loads(report.read_text())
        worst = max(output["max_abs"] for output in result["outputs"])
        print(f"aarch64 ({QEMU_CPU}) {name}: {result['runtime']}, max abs {worst:.3g}, passed {result['passed']}")
        assert result["passed"] and result["precision"] == ("int8" if quantize != "none" else "fp32")
