"""The Dockerfiles, checked statically (tests/test_docker_images.py builds and runs them)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.helpers import pyproject

REPO = Path(__file__).resolve().parents[1]
DOCKERFILES = sorted((REPO / "docker").glob("*.Dockerfile"))


def instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    text = re.sub(r"\\\n", " ", path.read_text())
    result = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            keyword, _, rest = line.partition(" ")
            result.append((keyword.upper(), rest.strip()))
    return result


def test_the_three_images_exist() -> None:
    assert [p.name for p in DOCKERFILES] == ["cpu.Dockerfile", "cuda.Dockerfile", "jetson.Dockerfile"]


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.name)
def test_dockerfile(path: Path) -> None:
    steps = instructions(path)
    known = {"FROM", "ARG", "RUN", "COPY", "ENV", "USER", "WORKDIR", "ENTRYPOINT", "CMD"}
    assert {keyword for keyword, _ in steps} <= known
    defaults = dict(rest.partition("=")[::2] for keyword, rest in steps if keyword == "ARG" and "=" in rest)
    base = next(rest for keyword, rest in steps if keyword == "FROM").split()[0]
    assert base == "${BASE}", "the base is a build argument, so that a locally made base can stand in"
    base = defaults["BASE"]
    name, _, tag = base.rpartition(":")
    assert name and tag and tag != "latest" and re.search(r"\d", tag), f"unpinned base image {base}"
    users = [rest for keyword, rest in steps if keyword == "USER"]
    assert users and users[-1] not in ("root", "0"), "the image must run as a non-root user"
    last_user = max(i for i, step in enumerate(steps) if step == ("USER", users[-1]))
    assert last_user > max(i for i, (k, _) in enumerate(steps) if k == "RUN")
    runs = " ".join(rest for keyword, rest in steps if keyword == "RUN")
    assert "/opt/pe-export/docker/install-device.sh" in runs and "tensorflow" not in runs.lower()
    entry = next(rest for keyword, rest in steps if keyword == "ENTRYPOINT")
    assert "pe-export-entrypoint" in entry


def test_the_python_layer_is_one_script_that_refuses_tensorflow() -> None:
    script = (REPO / "docker" / "install-device.sh").read_text()
    assert "pip install --no-cache-dir '/opt/pe-export[device]'" in script
    assert 'find_spec("tensorflow") is not None' in script
    for name in ("cuda.Dockerfile", "jetson.Dockerfile"):  # buildable alone on a stand-in base
        assert "AS python-layer" in (REPO / "docker" / name).read_text()


def test_entrypoint_passes_the_exit_code_through() -> None:
    script = (REPO / "docker" / "entrypoint.sh").read_text()
    assert 'exec pe-export "$@"' in script and script.startswith("#!/bin/sh")


def test_device_extra_is_the_validated_one() -> None:
    extras = pyproject()["project"]["optional-dependencies"]
    assert not any("tensorflow" in requirement for requirement in extras["device"])
    assert "pip install '.[device]'" in (REPO / "docker" / "README.md").read_text()


def test_readme_commands_name_existing_files() -> None:
    readme = (REPO / "docker" / "README.md").read_text()
    for dockerfile in re.findall(r"-f (docker/\S+)", readme):
        assert (REPO / dockerfile).exists(), dockerfile


def test_gpu_check_command_names_the_script_in_the_image() -> None:
    readme = (REPO / "docker" / "README.md").read_text()
    copied_to = re.search(r"COPY --chown=\S+ \. (\S+)", (REPO / "docker" / "cuda.Dockerfile").read_text()).group(1)
    script = re.search(r"--entrypoint (\S+)", readme).group(1)
    assert script.startswith(copied_to + "/")
    in_checkout = REPO / script.removeprefix(copied_to + "/")
    assert in_checkout.is_file() and in_checkout.stat().st_mode & 0o111, in_checkout


def test_set_up_scripts_say_host_lacks_with_77_and_only_that_skips() -> None:
    """docker/debian-archive.sh (sourced by the three set-up scripts): an archive that does not answer is exit 77
    with a line naming it; the tests skip on 77 alone, any other failure is the script's and fails them."""
    import subprocess

    from tests.docker_builds import Unavailable, script_outcome
    from tests.helpers import HOST_LACKS

    archive = Path(__file__).resolve().parents[1] / "docker" / "debian-archive.sh"
    unreachable = subprocess.run(
        ["bash", "-c", f'. "{archive}"; URI=http://127.0.0.1:9/debian; archive_answers "$SUITE"'],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert unreachable.returncode == HOST_LACKS, unreachable.stderr
    assert "does not answer from here: http://127.0.0.1:9/debian/dists/" in unreachable.stderr
    for script in ("docker/local-base.sh", "docker/arm64-emulation.sh", "targets/software-vulkan/setup.sh"):
        text = (archive.parents[1] / script).read_text()
        assert "debian-archive.sh" in text and "archive_answers" in text  # the archive probed before apt runs
    with pytest.raises(Unavailable, match="no root"):
        script_outcome(subprocess.CompletedProcess([], HOST_LACKS, "", "no root\n"), "base")
    with pytest.raises(RuntimeError, match=r"failed \(exit 1\)"):
        script_outcome(subprocess.CompletedProcess([], 1, "", "qemu: apt-get crashed\n"), "base")
