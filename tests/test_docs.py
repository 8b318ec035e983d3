"""The docs cannot drift from the CLI: every `pe-export` command in a fenced shell block of the README, docs/ and
examples/ names a subcommand that exists and only options that subcommand takes (checked against the click
commands themselves), and the README stays a page a newcomer reads (at most ~200 lines)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import click
import pytest

from tests.helpers import REPO, shell_lines

PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), *sorted((REPO / "examples").glob("*/README.md"))]
README_LINES = 200


def pe_export_calls(line: str) -> list[list[str]]:
    """The argument lists of each pe-export call on the line (direct, after `&&`, or a container's entrypoint:
    `docker run … pe-export:IMAGE SUBCOMMAND …`)."""
    spaced = line.replace("[", " ").replace("]", " ").replace("&&", " && ")
    try:
        words = shlex.split(spaced)
    except ValueError:  # a quote the shell would close on a later line: the words are enough here
        words = spaced.split()
    calls, current = [], None
    for word in words:
        if word in ("&&", "||", ";", "|"):
            current = None
        elif current is not None:
            current.append(word)
        elif word == "pe-export" or (word.startswith("pe-export:") and "run" in words[: words.index(word)]):
            current = []
            calls.append(current)
    return [call for call in calls if call]


def cases() -> list[tuple[str, list[str]]]:
    found = []
    for page in PAGES:
        for line in shell_lines(page):
            found += [(f"{page.relative_to(REPO)}: {line[:60]}", call) for call in pe_export_calls(line)]
    return found


CASES = cases()  # read once: the parametrization, its ids and the count below share it


def test_the_docs_hold_commands_to_check() -> None:
    pages = {case.split(":")[0] for case, _ in CASES}
    assert len(CASES) > 30 and {"README.md", "docs/parity.md", "examples/minilm-int8/README.md"} <= pages


@pytest.mark.parametrize(("where", "call"), CASES, ids=[case for case, _ in CASES])
def test_every_documented_command_is_one_the_cli_takes(where: str, call: list[str]) -> None:
    from pe_export.cli import cli

    command = cli.commands.get(call[0]) if isinstance(cli, click.Group) else None
    if call[0] in ("--help", "--version"):
        return
    assert command is not None, f"{where}: no subcommand {call[0]!r} (have {', '.join(sorted(cli.commands))})"
    options = {name for param in command.params for name in (*param.opts, *param.secondary_opts)}
    unknown = [word.split("=")[0] for word in call[1:] if word.startswith("--") and word.split("=")[0] not in options]
    assert not unknown, f"{where}: `pe-export {call[0]}` takes no {', '.join(unknown)}"


def test_the_readme_is_a_page_not_a_manual() -> None:
    lines = (REPO / "README.md").read_text(encoding="utf-8").count("\n")
    assert lines <= README_LINES, f"README.md is {lines} lines; move detail to docs/ (at most {README_LINES})"


@pytest.mark.parametrize("page", PAGES, ids=[str(page.relative_to(REPO)) for page in PAGES])
def test_every_relative_link_leads_somewhere(page: Path) -> None:
    for link in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", page.read_text(encoding="utf-8")):
        assert (page.parent / link).exists(), f"{page.relative_to(REPO)} links to {link}, which does not exist"


def test_a_drifted_command_is_caught() -> None:
    """The check itself: a renamed option and a removed subcommand fail it."""
    (call,) = pe_export_calls('docker run --rm -v "$PWD:/work" pe-export:cpu parity m.tflite g/ --no-such-flag 1')
    assert call == ["parity", "m.tflite", "g/", "--no-such-flag", "1"]
    with pytest.raises(AssertionError, match="takes no --no-such-flag"):
        test_every_documented_command_is_one_the_cli_takes("here", call)
    with pytest.raises(AssertionError, match="no subcommand 'convert'"):
        test_every_documented_command_is_one_the_cli_takes("here", ["convert", "m/"])
    assert pe_export_calls("docker build -f docker/cpu.Dockerfile -t pe-export:cpu .") == []
