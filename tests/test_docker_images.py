"""The device images built and run for real: a local Docker engine, bases made with debootstrap, parity inside.

No registry is reachable from where pe-export is developed, so each image is built on a base made here
(docker/local-base.sh: debootstrap + the host's CA certificates, passed as the BASE build argument). The
CPU image is built for x86_64 and for aarch64 (through qemu and binfmt_misc); the CUDA and Jetson images,
whose NVIDIA bases cannot be pulled, have their `python-layer` stage built on the same stand-in. In each,
`pe-export parity` runs inside the container on a bundle mounted read-only, and the exit code must come
through `docker run` unchanged (0 pass, 1 parity failure, 2 bad input). The builds run once, in the
background from the start of the session (tests/docker_builds.py, started by conftest.py in the process that
controls pytest-xdist's workers), while the rest of the suite runs.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from pe_export.errors import ExitCode
from tests import docker_builds
from tests.docker_builds import IMAGES, ImageBuilds

pytestmark = pytest.mark.slow  # minutes (an arm64 build runs under emulation): excluded from the quick run

PLATFORMS = {"amd64": "linux/amd64", "arm64": "linux/arm64"}


def _run(*args: str | Path, timeout: int = 900) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=timeout, check=False)


@pytest.fixture(scope="session")
def images(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> ImageBuilds:
    builds = docker_builds.outcome()
    if builds is None:  # selected in a way conftest.py did not foresee: build now, stop dockerd after
        builds = ImageBuilds()
        builds.start(tmp_path_factory.mktemp("docker-builds") / "outcome.json")
        request.addfinalizer(builds.stop)
        builds.join()
    if builds.unavailable:
        pytest.skip(builds.unavailable)
    return builds


def built(images: ImageBuilds, tag: str) -> str:
    error = images.outcomes.get(tag, "not built")
    assert error is None, f"docker build of {tag} ({IMAGES[tag][0]}) failed: {error}"
    return tag


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo's trained encoder: tflite fp32 and dynamic-int8, onnx fp32, its golden bundle and another model's."""
    from pe_export.api import export_onnx, export_tflite
    from pe_export.converters.options import ExportOptions
    from pe_export.encoders import task
    from pe_export.golden import GoldenOptions, make_golden

    root = tmp_path_factory.mktemp("mounted")
    task.load_trained_model().export(str(root / "encoder"), verbose=False)
    task.load_trained_model(task.LEARNED_WEIGHTS, table_kind="learned").export(str(root / "other"), verbose=False)
    export_tflite(root / "encoder", root / "fp32.tflite", ExportOptions())
    export_tflite(root / "encoder", root / "int8.tflite", ExportOptions(quantize="dynamic-int8"))
    export_onnx(root / "encoder", root / "fp32.onnx", ExportOptions())
    make_golden(root / "encoder", root / "golden", GoldenOptions(samples=8))
    make_golden(root / "other", root / "other_golden", GoldenOptions(samples=4))
    for path in root.rglob("*"):  # what a user mounts: readable by the image's uid 1000
        path.chmod(0o755 if path.is_dir() else 0o644)
    root.chmod(0o755)
    return root


def run_in(image: str, arch: str, mounted: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return _run(
        "docker", "run", "--rm", "--platform", PLATFORMS[arch], "-v", f"{mounted}:/work:ro", image, *args, timeout=900
    )


def check_parity_inside(image: str, arch: str, mounted: Path) -> None:
    probe = "import platform, importlib.util as u; print(platform.machine(), u.find_spec('tensorflow'))"
    platform = ("--platform", PLATFORMS[arch])
    machine = _run("docker", "run", "--rm", *platform, "--entrypoint", "python3", image, "-c", probe)
    assert machine.stdout.split() == [{"amd64": "x86_64", "arm64": "aarch64"}[arch], "None"], machine.stderr
    whoami = _run("docker", "run", "--rm", *platform, "--entrypoint", "id", image, "-u")
    assert whoami.stdout.strip() == "1000"
    for model in ("fp32.tflite", "int8.tflite", "fp32.onnx"):
        done = run_in(image, arch, mounted, "parity", f"/work/{model}", "/work/golden")
        assert done.returncode == ExitCode.OK, (model, done.stdout, done.stderr)
        assert done.stdout.rstrip().endswith("PASS")
    # A parity failure (the int8 file against float32's tolerance) and a wrong bundle come out as 1 and 2.
    failed = run_in(image, arch, mounted, "parity", "/work/int8.tflite", "/work/golden", "--precision", "fp32")
    assert failed.returncode == ExitCode.PARITY_FAILED, failed.stderr
    assert failed.stderr.startswith("error: int8.tflite fails parity on litert")
    wrong = run_in(image, arch, mounted, "parity", "/work/fp32.onnx", "/work/other_golden")
    assert wrong.returncode == ExitCode.BAD_INPUT and "wrong bundle for this model" in wrong.stderr


def test_cpu_image_on_x86_64(images: ImageBuilds, bundle: Path, tmp_path: Path) -> None:
    image = built(images, "pe-export-test:cpu-amd64")
    check_parity_inside(image, "amd64", bundle)
    # examples/device-parity/README.md's docker run line as written, on the image built here (its docker build
    # line needs a base from a registry; this one is built on a local base, as above) and the README's out/
    from tests.helpers import REPO, shell_lines

    line = next(line for line in shell_lines(REPO / "examples" / "device-parity" / "README.md") if "docker run" in line)
    out = tmp_path / "out"
    out.mkdir()
    shutil.copy(bundle / "fp32.tflite", out / "encoder.tflite")
    shutil.copytree(bundle / "golden", out / "golden")
    for path in [tmp_path, *tmp_path.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    done = subprocess.run(
        ["bash", "-c", line.replace(" pe-export:cpu ", f" {image} ")],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert done.returncode == ExitCode.OK and done.stdout.rstrip().endswith("PASS"), (line, done.stdout, done.stderr)


def test_cpu_image_on_arm64(images: ImageBuilds, bundle: Path) -> None:
    check_parity_inside(built(images, "pe-export-test:cpu-arm64"), "arm64", bundle)


@pytest.mark.parametrize("image", ["cuda", "jetson"])
def test_gpu_images_python_layer_on_a_stand_in_base(images: ImageBuilds, bundle: Path, image: str) -> None:
    # NVIDIA's bases cannot be pulled here: their Python layer (the same in both files) is built on the
    # local Debian base and must run parity on the CPU provider. The GPU stage is not built.
    tag = built(images, f"pe-export-test:{image}-python-layer")
    done = run_in(tag, "amd64", bundle, "parity", "/work/fp32.onnx", "/work/golden", "--providers", "cpu")
    assert done.returncode == ExitCode.OK, done.stderr
    assert "on onnxruntime[cpu]" in done.stdout
