"""The device side installs and runs without TensorFlow.

Builds a real venv with `pip install '.[device]'` (cached between runs, keyed by
pyproject.toml), then inspects and runs exported files there and checks that TensorFlow
is neither installed nor imported.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from pe_export.golden import GoldenOptions, make_golden
from tests.helpers import REPO, cached_venv, pyproject, run_outside_repo

pytestmark = pytest.mark.slow  # minutes: excluded from the quick run (-m "not slow")

DEVICE_SCRIPT = """
import importlib.util, sys
import numpy as np
from pathlib import Path
from pe_export.inspection import inspect_path
from pe_export.runners import create_runner
assert importlib.util.find_spec("tensorflow") is None, "tensorflow is installed in the device venv"
for path, runtime in ((Path(sys.argv[1]), "litert"), (Path(sys.argv[2]), "onnxruntime")):
    summary = inspect_path(path)
    with create_runner(runtime, path) as runner:
        feed = {s.name: np.ones((2, 8), np.int32) for s in runner.input_specs()}
        out = runner.infer(feed)
    print(path.suffix, sum(summary.op_counts.values()), "ops", {k: v.shape for k, v in out.items()})
assert "tensorflow" not in sys.modules
print("tensorflow imported:", "tensorflow" in sys.modules)
"""


PARITY_SCRIPT = """
import subprocess
import sys
from pe_export.parity.harness import assert_parity
for model in sys.argv[1:3]:
    assert_parity(model, sys.argv[3])  # isolated child process
    assert_parity(model, sys.argv[3], isolate=False)  # in this process
assert "tensorflow" not in sys.modules
print("parity passed without tensorflow")
"""


_run = run_outside_repo


def python_310() -> str | None:
    """A Python 3.10 interpreter (JetPack 6's version): on PATH, or pyenv's."""
    import glob
    import shutil

    candidates = sorted(glob.glob(str(Path.home() / ".pyenv" / "versions" / "3.10*" / "bin" / "python3.10")))
    candidates.append(shutil.which("python3.10") or "")  # a pyenv shim is on PATH without being usable
    for candidate in filter(None, candidates):
        if subprocess.run([candidate, "-c", "import venv"], capture_output=True, check=False).returncode == 0:
            return candidate
    return None


@pytest.fixture(scope="session", params=["current", "3.10"])
def device_venv(request: pytest.FixtureRequest) -> Path:
    """The device extra in a fresh venv: of this interpreter, and of Python 3.10, which the extra claims."""
    if request.param == "current":
        return cached_venv("device-venv", [f"{REPO}[device]"])
    base = python_310()
    if base is None:
        pytest.skip("no Python 3.10 interpreter here (python3.10 on PATH or pyenv's)")
    return cached_venv("device-venv", [f"{REPO}[device]"], base=base)


def test_device_extra_pulls_no_tensorflow(device_venv: Path) -> None:
    listed = _run(device_venv / "bin" / "python", "-m", "pip", "list", "--format=freeze")
    packages = {line.split("==")[0].lower() for line in listed.stdout.splitlines()}
    assert {"ai-edge-litert", "onnxruntime", "onnx", "numpy", "click", "pe-export"} <= packages
    assert not {p for p in packages if p.startswith(("tensorflow", "tf-", "keras", "tf2onnx"))}


def test_inspect_and_run_without_tensorflow(device_venv: Path, saved_model, exported_file, tmp_path: Path) -> None:
    tflite, onnx = exported_file("encoder_dynamic", "tflite"), exported_file("encoder_dynamic", "onnx")

    for path in (tflite, onnx):
        cli = _run(device_venv / "bin" / "pe-export", "inspect", path)
        assert cli.returncode == 0, cli.stderr
        assert "signature" in cli.stdout and "runs on:" in cli.stdout

    script = tmp_path / "device_check.py"
    script.write_text(DEVICE_SCRIPT)
    checked = _run(device_venv / "bin" / "python", script, tflite, onnx)
    assert checked.returncode == 0, checked.stderr[-2000:]
    assert "tensorflow imported: False" in checked.stdout
    assert "'sequence_output': (2, 8, 32)" in checked.stdout

    bundle = tmp_path / "golden"
    make_golden(saved_model("encoder_dynamic"), bundle, GoldenOptions(samples=6, batch=3))
    for path in (tflite, onnx):
        checked = _run(device_venv / "bin" / "pe-export", "parity", path, bundle)
        assert checked.returncode == 0, checked.stdout + checked.stderr
        assert "model digest match" in checked.stdout and "PASS" in checked.stdout
    library = _run(device_venv / "bin" / "python", "-c", PARITY_SCRIPT, tflite, onnx, bundle)
    assert library.returncode == 0, library.stderr[-2000:]
    assert "parity passed without tensorflow" in library.stdout

    refused = _run(
        device_venv / "bin" / "pe-export", "tflite", saved_model("encoder_dynamic"), "-o", tmp_path / "x.tflite"
    )
    assert refused.returncode == 3  # conversion needs the convert extra: said in one line
    assert "pip install 'pe-export[convert]'" in refused.stderr and "Traceback" not in refused.stderr


def test_int8_kernel_benchmark_runs_without_tensorflow(device_venv: Path) -> None:
    """benchmarks/int8_kernels.py is the device's own measurement of which ONNX int8 product is fast there."""
    script = REPO / "benchmarks" / "int8_kernels.py"
    probe = (
        "import runpy, sys; sys.argv = ['int8_kernels.py', '--runs', '5', '--tokens', '4']; "
        f"runpy.run_path({str(script)!r}, run_name='__main__'); "
        "print('tensorflow imported:', 'tensorflow' in sys.modules)"
    )
    ran = _run(device_venv / "bin" / "python", "-c", probe)
    assert ran.returncode == 0, ran.stderr[-2000:]
    assert "tensorflow imported: False" in ran.stdout
    rows = [line.split() for line in ran.stdout.splitlines() if " x " in line and line.split()[0].isdigit()]
    assert {(row[0], row[2]) for row in rows} == {("384", "384"), ("384", "1536"), ("1536", "384")}


DEVICE_PLATFORMS = {
    "aarch64": ["manylinux_2_28_aarch64", "manylinux_2_27_aarch64", "manylinux2014_aarch64", "manylinux_2_17_aarch64"],
    "x86_64": ["manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux2014_x86_64", "manylinux_2_17_x86_64"],
}


@pytest.mark.parametrize(("python", "arch"), [("3.10", "aarch64"), ("3.11", "aarch64"), ("3.10", "x86_64")])
def test_device_extra_resolves_to_wheels(python: str, arch: str, tmp_path: Path) -> None:
    """JetPack 6 is Python 3.10 on aarch64: every device dependency must have a wheel there."""
    import json

    project = pyproject()["project"]
    requirements = project["dependencies"] + project["optional-dependencies"]["device"]
    platforms = [arg for platform in DEVICE_PLATFORMS[arch] for arg in ("--platform", platform)]
    report = tmp_path / "report.json"
    resolved = _run(
        sys.executable,
        "-m",
        "pip",
        "install",
        "--dry-run",
        "-q",
        "--ignore-installed",
        "--only-binary=:all:",
        "--python-version",
        python,
        *platforms,
        "--target",
        tmp_path / "target",
        "--report",
        report,
        *requirements,
        timeout=300,
    )
    assert resolved.returncode == 0, resolved.stderr[-1500:]
    names = {item["metadata"]["name"].lower() for item in json.loads(report.read_text())["install"]}
    assert {"ai-edge-litert", "onnxruntime", "onnx", "numpy", "click"} <= names
    assert not any(name.startswith(("tensorflow", "keras", "tf2onnx")) for name in names)


@pytest.fixture(scope="module")
def altered_bert(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A keras-hub BERT's faithful exports, copies with block 1's feed-forward kernel scaled, and its layers bundle."""
    from pe_export.api import export_onnx, export_tflite
    from pe_export.converters.options import ExportOptions
    from tests.fixtures.keras_hub_models import export_random_bert
    from tests.parity.layers.test_layers import SEQ_LEN, altered_copy

    root = tmp_path_factory.mktemp("altered")
    saved = export_random_bert(root / "bert")
    files: dict[str, Path] = {}
    for file_format, export in (("tflite", export_tflite), ("onnx", export_onnx)):
        faithful = export(saved, root / f"bert.{file_format}", ExportOptions(seq_len=SEQ_LEN)).output
        files[f"faithful.{file_format}"] = faithful
        files[f"altered.{file_format}"] = altered_copy(faithful, root / f"altered.{file_format}")
    make_golden(saved, root / "golden", GoldenOptions(samples=4, batch=2, seq_len=SEQ_LEN, layers="all"))
    return {**files, "golden": root / "golden"}


def test_layer_parity_runs_without_tensorflow(altered_bert, tmp_path: Path) -> None:
    """Faithful exports pass every layer and block 1's scaled kernel is named, in the TF-free device venv (this
    interpreter's: the layer code is the same numpy-only device code the 3.10 venv runs above)."""
    import json

    from tests.parity.layers.test_layers import ALTERED

    venv = cached_venv("device-venv", [f"{REPO}[device]"])
    for file_format in ("tflite", "onnx"):
        for kind, code in (("faithful", 0), ("altered", 1)):
            report = tmp_path / f"{kind}.{file_format}.json"
            checked = _run(
                venv / "bin" / "pe-export",
                "parity",
                altered_bert[f"{kind}.{file_format}"],
                altered_bert["golden"],
                "--layers",
                "--json",
                report,
            )
            assert checked.returncode == code, checked.stdout + checked.stderr
            data = json.loads(report.read_text())
            names = [layer["name"] for layer in data["layers"]]
            if kind == "faithful":
                assert data["first_divergence"] is None and data["passed"] and len(names) >= 40
                continue
            assert data["first_divergence"] == ALTERED
            assert all(layer["ok"] for layer in data["layers"][: names.index(ALTERED)])
            assert f"first layer over tolerance: {ALTERED!r}" in checked.stderr
