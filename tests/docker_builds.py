"""The device images of tests/test_docker_images.py, built in a background thread that conftest.py starts
at configuration when those tests may run (in the process that controls pytest-xdist's workers, so once):
the engine, the bases (debootstrap, minutes under emulation for arm64) and the images are mostly downloads
and emulated work, so they overlap the rest of the suite instead of adding to it. The outcome is a JSON
file whose path the workers inherit (PE_EXPORT_DOCKER_BUILDS).

Needs root (dockerd, debootstrap, binfmt_misc); Debian's docker.io and debootstrap are installed with apt-get
when missing. A dockerd started here is stopped by its pid when the session ends. Bases are kept between
runs (tagged by local-base.sh's hash); the images are rebuilt from the checkout every run.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.helpers import HOST_LACKS

REPO = Path(__file__).resolve().parents[1]
DOCKER = REPO / "docker"
BASE_SCRIPT = DOCKER / "local-base.sh"
ARCHES = ("amd64", "arm64")
# tag → (Dockerfile, base arch, extra build arguments)
IMAGES = {
    "pe-export-test:cpu-amd64": ("cpu.Dockerfile", "amd64", ()),
    "pe-export-test:cpu-arm64": ("cpu.Dockerfile", "arm64", ()),
    "pe-export-test:cuda-python-layer": ("cuda.Dockerfile", "amd64", ("--target", "python-layer")),
    "pe-export-test:jetson-python-layer": ("jetson.Dockerfile", "amd64", ("--target", "python-layer")),
}


class Unavailable(Exception):
    """This machine cannot build images (not root, no engine, no archive): the tests skip with the reason."""


def script_outcome(done: subprocess.CompletedProcess[str], what: str) -> None:
    """A set-up script's run: exit 77 (the host lacks a facility) is Unavailable; any other failure is the
    script's own and fails the tests that need it."""
    if done.returncode == HOST_LACKS:
        raise Unavailable(f"{what}: {last_line(done)}")
    if done.returncode != 0:
        raise RuntimeError(f"{what} failed (exit {done.returncode}): {done.stdout[-500:]}{done.stderr[-1500:]}")


def run(*args: str | Path, timeout: int = 1800, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(a) for a in args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env=None if env is None else {**os.environ, **env},
    )


def last_line(done: subprocess.CompletedProcess[str]) -> str:
    return (done.stderr.strip().splitlines() or done.stdout.strip().splitlines() or ["?"])[-1]


def engine_answers() -> bool:
    return shutil.which("docker") is not None and run("docker", "info", timeout=30).returncode == 0


@dataclass
class ImageBuilds:
    """Each image's build outcome: None (built) or the error text; ``unavailable`` skips them all."""

    outcomes: dict[str, str | None] = field(default_factory=dict)
    unavailable: str | None = None
    seconds: dict[str, float] = field(default_factory=dict)
    _daemon: subprocess.Popen[bytes] | None = None
    _pidfile: Path | None = None
    _thread: threading.Thread | None = None

    def start(self, outcome: Path) -> None:
        """Build in a background thread; the outcome is written to ``outcome`` (JSON) when all is done."""
        self._thread = threading.Thread(target=self._build_all, args=(outcome,), name="docker-builds", daemon=True)
        self._thread.start()

    def to_json(self) -> str:
        return json.dumps({"outcomes": self.outcomes, "unavailable": self.unavailable, "seconds": self.seconds})

    @classmethod
    def from_json(cls, text: str) -> ImageBuilds:
        data = json.loads(text)
        return cls(outcomes=data["outcomes"], unavailable=data["unavailable"], seconds=data["seconds"])

    def join(self) -> ImageBuilds:
        if self._thread is not None:
            self._thread.join()
        return self

    def stop(self) -> None:
        """Stop the dockerd this session started, by its pid (after the builds)."""
        self.join()
        if self._daemon is not None and self._pidfile is not None and self._pidfile.exists():
            os.kill(int(self._pidfile.read_text()), signal.SIGTERM)
            self._daemon.wait(timeout=60)

    def _build_all(self, outcome: Path) -> None:
        try:
            self._build_images()
        finally:
            partial = outcome.with_suffix(".partial")
            partial.write_text(self.to_json())
            partial.replace(outcome)  # readers see the whole outcome or none

    def _build_images(self) -> None:
        try:
            self._engine()
            bases = {arch: self._base(arch) for arch in ARCHES}
            done = run("bash", DOCKER / "arm64-emulation.sh")  # after a reboot the registration is gone
            script_outcome(done, "no arm64 emulation (docker/arm64-emulation.sh)")
            for tag, (dockerfile, arch, extra) in IMAGES.items():
                started = time.perf_counter()
                built = run(
                    "docker",
                    "build",
                    "-q",
                    "--build-arg",
                    f"BASE={bases[arch]}",
                    "-f",
                    DOCKER / dockerfile,
                    "-t",
                    tag,
                    *extra,
                    REPO,
                )
                self.seconds[tag] = time.perf_counter() - started
                self.outcomes[tag] = None if built.returncode == 0 else built.stdout[-1500:] + built.stderr[-2500:]
        except Unavailable as why:
            self.unavailable = str(why)
        except Exception as err:  # surfaced by the tests, which wait for this thread
            self.outcomes = {tag: f"{type(err).__name__}: {err}" for tag in IMAGES}

    def _engine(self) -> None:
        if os.geteuid() != 0:
            raise Unavailable("building images needs root (dockerd, debootstrap, binfmt_misc)")
        needed = (("dockerd", "docker.io"), ("debootstrap", "debootstrap"))
        missing = [package for tool, package in needed if not shutil.which(tool)]
        if missing:  # a fresh machine may have no package lists yet
            quiet = {"DEBIAN_FRONTEND": "noninteractive"}
            run("apt-get", "update", "-qq", timeout=600, env=quiet)
            installed = run(
                "apt-get", "install", "-y", "-qq", "--no-install-recommends", *missing, timeout=600, env=quiet
            )
            if installed.returncode != 0:
                raise Unavailable(f"cannot install {', '.join(missing)}: {last_line(installed)}")
        if engine_answers():
            return
        folder = Path(tempfile.mkdtemp(prefix="pe-export-dockerd-"))
        self._pidfile = folder / "dockerd.pid"
        with open(folder / "dockerd.log", "wb") as log:
            self._daemon = subprocess.Popen(["dockerd", "--pidfile", str(self._pidfile)], stdout=log, stderr=log)
        deadline = time.monotonic() + 60
        while not engine_answers():
            if self._daemon.poll() is not None or time.monotonic() > deadline:
                self._daemon.kill()
                self._daemon = None
                raise Unavailable(f"dockerd did not start: {(folder / 'dockerd.log').read_text()[-300:]}")
            time.sleep(1)

    def _base(self, arch: str) -> str:
        tag = f"pe-export-base:bookworm-{arch}-{hashlib.sha256(BASE_SCRIPT.read_bytes()).hexdigest()[:12]}"
        if run("docker", "image", "inspect", tag, timeout=60).returncode != 0:
            started = time.perf_counter()
            built = run("bash", BASE_SCRIPT, arch, tag)
            self.seconds[tag] = time.perf_counter() - started
            script_outcome(built, f"cannot make a {arch} base here (docker/local-base.sh)")
        return tag


BUILDS_KEY = pytest.StashKey[ImageBuilds]()
# Where the builds' outcome is written (JSON); set by the controlling process before pytest-xdist starts its
# workers, which inherit it: the docker tests may run in any worker, the builds run once.
OUTCOME_ENV = "PE_EXPORT_DOCKER_BUILDS"


def wanted(config: pytest.Config) -> bool:
    """Whether this run may select tests/test_docker_images.py (decided before collection, from the command
    line: the workers of pytest-xdist collect, the controlling process does not)."""
    if hasattr(config, "workerinput") or "slow" in (config.getoption("markexpr", "") or ""):
        return False
    target = (REPO / "tests" / "test_docker_images.py").resolve()
    for arg in config.args or ["tests"]:
        path = Path(config.invocation_params.dir, arg.split("::")[0]).resolve()
        if path == target or (path.is_dir() and target.is_relative_to(path)):
            return True
    return False


def start(config: pytest.Config) -> None:
    """conftest.py's pytest_configure: start the builds in the background when the docker tests may run."""
    if not wanted(config):
        return
    outcome = Path(tempfile.mkdtemp(prefix="pe-export-docker-builds-")) / "outcome.json"
    os.environ[OUTCOME_ENV] = str(outcome)
    builds = ImageBuilds()
    config.stash[BUILDS_KEY] = builds
    builds.start(outcome)


def stop(config: pytest.Config) -> None:
    builds = config.stash.get(BUILDS_KEY, None)
    if builds is not None:
        builds.stop()


def outcome(timeout_s: float = 3600.0) -> ImageBuilds | None:
    """The outcome of the builds this session started (waited for), or None when it started none."""
    path = os.environ.get(OUTCOME_ENV)
    if not path:
        return None
    deadline = time.monotonic() + timeout_s
    while not Path(path).exists():
        if time.monotonic() > deadline:
            raise AssertionError(f"the image builds wrote nothing to {path} in {timeout_s:g} s")
        time.sleep(1)
    return ImageBuilds.from_json(Path(path).read_text())
