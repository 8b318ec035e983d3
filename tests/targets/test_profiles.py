"""The target profiles file (targets/__init__.py): every shipped profile reads whole, and a damaged
file is one line naming what is wrong, never a traceback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import pe_export.targets as targets
from pe_export.errors import ExitCode
from tests.helpers import assert_one_line_error, run_cli


def test_every_shipped_profile_reads_whole(capfd) -> None:
    names = targets.profile_names()
    assert names and all(targets.get_profile(name).name == name for name in names)
    listed = run_cli(capfd, "targets")
    assert listed.exit_code == 0 and all(name in listed.stdout for name in names)


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        ("{not json", "is not a readable profiles file"),
        ("[1, 2]", "expected an object of profiles by name"),
        (json.dumps({"jetson": {"description": "x"}}), "target 'jetson' lacks platform, runtimes"),
        (
            json.dumps({"x": {k: [] for k in targets.PROFILE_KEYS} | {"tolerances": {"fp99": {}}}}),
            "tolerances for 'fp99'",
        ),
    ],
)
def test_a_damaged_profiles_file_is_one_line(
    capfd, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, content: str, fragment: str
) -> None:
    damaged = tmp_path / "profiles.json"
    damaged.write_text(content)
    monkeypatch.setattr(targets, "PROFILES", damaged)
    targets._raw.cache_clear()  # read once per process: this test reads the damaged file, the next the shipped one
    try:
        assert_one_line_error(run_cli(capfd, "targets"), ExitCode.BAD_INPUT, fragment)
    finally:
        targets._raw.cache_clear()
