"""The device images built and run for real: a local Docker engine, bases made with debootstrap, parity inside.

No registry is reachable from where pe-export is developed, so each image is built on a base made here
(docker/local-base.sh: debootstrap + the host's CA certificates, passed as the BASE build argument). The
CPU image is built for x86_64 and for aarch64 (through qemu and binfmt_misc); the CUDA and Jetson images,
whose NVIDIA bases cannot be pulled, have their `python-layer` stage built on the same stand-in. In each,
`pe-export parity` runs inside the container on a bundle mounted read-only, and the exit code must come
through `docker run` unchanged (0 pass, 1 parity failure, 2 bad input).

Needs root (dockerd, debootstrap, binfmt_misc); Debian's docker.io and debootstrap are installed with
apt-get when missing. A dockerd started here is stopped by its pid at the end. Bases are kept between
runs (tagged by the script's hash); the images are rebuilt from the checkout every run.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from pe_export.errors import ExitCode
from tests.helpers import REPO

pytestmark = pytest.mark.slow  # minutes (an arm64 build runs under emulation): excluded from the quick run

DOCKER = REPO / "docker"
BASE_SCRIPT = DOCKER / "local-base.sh"
BASE_KEY = hashlib.sha256(BASE_SCRIPT.read_bytes()).hexdigest()[:12]
PLATFORMS = {"amd64": "linux/amd64", "arm64": "linux/arm64"}


def _run(*args: str | Path, timeout: int = 1200, check: bool = False) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=timeout, check=False)
    if check and done.returncode != 0:
        raise AssertionError(f"{' '.join(map(str, args))}: {done.stdout[-1500:]}{done.stderr[-2500:]}")
    return done


def _engine_answers() -> bool:
    return shutil.which("docker") is not None and _run("docker", "info", timeout=30).returncode == 0


@pytest.fixture(scope="session")
def docker_engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """A running dockerd: the one already there, else one started here (and stopped by its pid after)."""
    if os.geteuid() != 0:
        pytest.skip("building images needs root (dockerd, debootstrap, binfmt_misc)")
    needed = (("dockerd", "docker.io"), ("debootstrap", "debootstrap"))
    missing = [package for tool, package in needed if not shutil.which(tool)]
    if missing:
        installed = _run("apt-get", "install", "-y", "-qq", "--no-install-recommends", *missing, timeout=600)
        if installed.returncode != 0:
            pytest.skip(f"cannot install {', '.join(missing)}: {(installed.stderr.strip().splitlines() or ['?'])[-1]}")
    if _engine_answers():
        yield
        return
    folder = tmp_path_factory.mktemp("dockerd")
    pidfile = folder / "dockerd.pid"
    with open(folder / "dockerd.log", "wb") as log:
        daemon = subprocess.Popen(["dockerd", "--pidfile", str(pidfile)], stdout=log, stderr=log)
    deadline = time.monotonic() + 60
    while not _engine_answers():
        if daemon.poll() is not None or time.monotonic() > deadline:
            daemon.kill()
            pytest.skip(f"dockerd did not start: {(folder / 'dockerd.log').read_text()[-300:]}")
        time.sleep(1)
    try:
        yield
    finally:
        os.kill(int(pidfile.read_text()), signal.SIGTERM)
        daemon.wait(timeout=60)


@pytest.fixture(scope="session")
def base_image(docker_engine: None) -> dict[str, str]:
    """arch → a local Debian base with python3-venv and this host's CA certificates (made once, kept)."""
    made = {}
    for arch in PLATFORMS:
        tag = f"pe-export-base:bookworm-{arch}-{BASE_KEY}"
        if _run("docker", "image", "inspect", tag, timeout=60).returncode != 0:
            built = _run("bash", BASE_SCRIPT, arch, tag, timeout=1200)
            if built.returncode != 0:
                pytest.skip(f"cannot make a {arch} base here: {(built.stderr.strip().splitlines() or ['?'])[-1]}")
        made[arch] = tag
    _run("bash", DOCKER / "arm64-emulation.sh", check=True)  # after a reboot the registration is gone
    return made


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo's trained encoder: tflite fp32 and dynamic-int8, onnx fp32, its golden bundle and another model's."""
    from converters.options import ExportOptions
    from pe_export.api import export_onnx, export_tflite
    from pe_export.golden import GoldenOptions, make_golden
    from pe_export.reference import task

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


def build(dockerfile: str, base: str, tag: str, *extra: str) -> None:
    _run("docker", "build", "-q", "--build-arg", f"BASE={base}", "-f", DOCKER / dockerfile, "-t", tag, *extra, REPO,
         check=True)  # fmt: skip


def run_in(image: str, arch: str, mounted: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return _run("docker", "run", "--rm", "--platform", PLATFORMS[arch], "-v", f"{mounted}:/work:ro", image, *args,
                timeout=900)  # fmt: skip


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


def test_cpu_image_on_x86_64(base_image: dict[str, str], bundle: Path) -> None:
    build("cpu.Dockerfile", base_image["amd64"], "pe-export-test:cpu-amd64")
    check_parity_inside("pe-export-test:cpu-amd64", "amd64", bundle)


def test_cpu_image_on_arm64(base_image: dict[str, str], bundle: Path) -> None:
    build("cpu.Dockerfile", base_image["arm64"], "pe-export-test:cpu-arm64")
    check_parity_inside("pe-export-test:cpu-arm64", "arm64", bundle)


@pytest.mark.parametrize("dockerfile", ["cuda.Dockerfile", "jetson.Dockerfile"])
def test_gpu_images_python_layer_on_a_stand_in_base(base_image: dict[str, str], bundle: Path, dockerfile: str) -> None:
    # NVIDIA's bases cannot be pulled here: their Python layer (the same in both files) is built on the
    # local Debian base and must run parity on the CPU provider. The GPU stage is not built.
    tag = f"pe-export-test:{dockerfile.split('.')[0]}-python-layer"
    build(dockerfile, base_image["amd64"], tag, "--target", "python-layer")
    done = run_in(tag, "amd64", bundle, "parity", "/work/fp32.onnx", "/work/golden", "--providers", "cpu")
    assert done.returncode == ExitCode.OK, done.stderr
    assert "on onnxruntime[cpu]" in done.stdout
