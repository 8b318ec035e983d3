"""Fuzzing with hypothesis: mutated exported models and golden bundles go through the CLI.

About 1,000 cases per run (derandomised, so CI is repeatable). Every case must end in a
documented exit code with one line — a non-PeExportError escaping (exit 6) counts as a
parent crash — and leave no temporary file behind. Each test tallies and checks its own cases, so
it gives the same verdict alone, in any order or split across workers.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import shutil
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pe_export.cli import main
from pe_export.errors import ExitCode
from pe_export.golden import GoldenOptions, make_golden
from pe_export.parity.bundle import file_sha256

pytestmark = pytest.mark.slow  # minutes: excluded from the quick run (-m "not slow")

SETTINGS = dict(
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture],
)
ALLOWED = {int(code) for code in ExitCode} - {int(ExitCode.INTERNAL_ERROR)}


@dataclass
class Figures:
    """One fuzz test's own tally: each test is judged on the cases it ran, alone or beside the others."""

    name: str
    cases: int = 0
    child_runs: int = 0
    child_crashes: int = 0
    exit_codes: Counter[int] = field(default_factory=Counter)
    messages: set[str] = field(default_factory=set)

    def check(self, examples: int, distinct_messages: int) -> None:
        print(
            f"\nfuzz {self.name}: {self.cases} cases ({self.child_runs} through a runtime child), "
            f"distinct error messages {len(self.messages)}, runtime children that crashed and were reported "
            f"{self.child_crashes}, exit codes {dict(sorted(self.exit_codes.items()))}"
        )
        assert self.cases >= examples  # every example ran (a crash or partial file fails its own case)
        assert len(self.messages) >= distinct_messages, sorted(self.messages)  # many different checks reached


@pytest.fixture(scope="module")
def corpus(saved_model, exported_file, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("fuzz-corpus")
    paths = {target: exported_file("encoder_dynamic", target) for target in ("tflite", "onnx")}
    paths.update({"bundle": out / "golden", "work": out / "work"})
    make_golden(saved_model("encoder_dynamic"), paths["bundle"], GoldenOptions(samples=4, batch=2))
    paths["work"].mkdir()
    return paths


def run_case(figures: Figures, work: Path, *args: str | Path) -> int:
    """One CLI run in this process; classify the outcome."""
    figures.cases += 1
    crash = ""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main([str(a) for a in args])
            code = 0
        except SystemExit as exit_info:
            code = int(exit_info.code or 0)
        except BaseException as escaped:  # anything else would take a user's process down
            code = -1
            crash = f"{type(escaped).__name__}: {escaped}"
    figures.exit_codes[code] += 1
    if "crashed (signal" in err.getvalue():
        figures.child_crashes += 1  # the runtime died in its child process; the checker reported it
    lines = [line for line in err.getvalue().splitlines() if line.startswith("error: ")]
    if lines:
        figures.messages.add(re.sub(r"[0-9]+|/\S+|'[^']*'", "#", lines[0])[:90])
    stray = [p for p in work.rglob("*") if p.name.endswith(".tmp") or p.name.endswith(".old")]
    # Every example on its own: an allowed exit code (a one-line error, never a traceback) and no partial file.
    assert code in ALLOWED, (args, crash or err.getvalue()[-300:])
    assert not stray, (args, stray)
    return code


def mutate(data: bytes, flips: list[tuple[int, int]], cut: int | None) -> bytes:
    mutated = bytearray(data)
    for position, value in flips:
        mutated[position % len(mutated)] = value
    return bytes(mutated[:cut] if cut is not None else mutated)


FLIPS = st.lists(st.tuples(st.integers(0, 1 << 30), st.integers(0, 255)), min_size=1, max_size=12)
CUTS = st.one_of(st.none(), st.integers(0, 200_000))


def fuzz_model_file(
    corpus: dict[str, Path], figures: Figures, kind: str, flips: list[tuple[int, int]], cut: int | None, run: int
) -> None:
    """Inspect a mutated exported file; now and then also run it, in the runtime's child process."""
    path = corpus["work"] / f"fuzz.{kind}"
    path.write_bytes(mutate(corpus[kind].read_bytes(), flips, cut))
    run_case(figures, corpus["work"], "inspect", path)
    if run == 0:
        figures.child_runs += 1
        run_case(figures, corpus["work"], "parity", path, corpus["bundle"], "--timeout", "30")


@pytest.mark.parametrize(("kind", "examples"), [("tflite", 330), ("onnx", 250)])
def test_fuzz_model_file(corpus, kind: str, examples: int) -> None:
    figures = Figures(kind)

    @settings(max_examples=examples, **SETTINGS)
    @given(flips=FLIPS, cut=CUTS, run=st.integers(0, 29))
    def case(flips: list[tuple[int, int]], cut: int | None, run: int) -> None:
        fuzz_model_file(corpus, figures, kind, flips, cut, run)

    case()
    figures.check(examples, distinct_messages=3)


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-(10**12), 10**12) | st.floats(allow_nan=True) | st.text(max_size=12),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=6), children, max_size=3),
    max_leaves=6,
)
MANIFEST_PATHS = [
    ("format",),
    ("version",),
    ("samples",),
    ("model",),
    ("model", "digest"),
    ("inputs",),
    ("inputs", 0),
    ("inputs", 0, "shape"),
    ("inputs", 0, "dtype"),
    ("outputs", 0, "name"),
    ("batches",),
    ("batches", 0, "file"),
    ("batches", 0, "samples"),
    ("tolerances",),
    ("tolerances", "fp32"),
    ("tolerances", "fp32", "atol"),
]


def test_fuzz_bundle(corpus) -> None:
    figures = Figures("bundle")

    @settings(max_examples=300, **SETTINGS)
    @given(
        where=st.sampled_from(MANIFEST_PATHS),
        value=JSON_VALUES,
        flips=FLIPS,
        reseal=st.booleans(),
        corrupt=st.sampled_from(["manifest", "batch"]),
    )
    def case(where: tuple, value: object, flips: list[tuple[int, int]], reseal: bool, corrupt: str) -> None:
        fuzz_bundle(corpus, figures, where, value, flips, reseal, corrupt)

    case()
    figures.check(300, distinct_messages=5)


def fuzz_bundle(corpus, figures, where, value, flips, reseal, corrupt) -> None:
    bundle = corpus["work"] / "bundle"
    shutil.rmtree(bundle, ignore_errors=True)
    shutil.copytree(corpus["bundle"], bundle)
    manifest = json.loads((bundle / "manifest.json").read_text())
    if corrupt == "manifest":
        node = manifest
        for key in where[:-1]:
            node = node[key]
        node[where[-1]] = value
    else:
        batch = bundle / manifest["batches"][0]["file"]
        batch.write_bytes(mutate(batch.read_bytes(), flips, None))
        if reseal:  # keep the checksum right, so that the arrays themselves are parsed
            manifest["batches"][0]["sha256"] = file_sha256(batch)
    (bundle / "manifest.json").write_text(json.dumps(manifest))
    run_case(figures, corpus["work"], "parity", corpus["onnx"], bundle, "--no-isolate")


ID_VALUES = st.one_of(st.integers(-3, 20), st.integers(-(2**31), 2**31 - 1))
INPUT_NAMES = st.sampled_from([("token_ids",), ("token_ids",), ("token_ids", "extra"), ("ids",), ()])


def test_fuzz_golden_inputs(corpus, saved_model) -> None:
    """User data for `golden --inputs`: every outcome a documented one-line error or a bundle, no exit 6."""
    figures = Figures("golden inputs")

    @settings(max_examples=60, **SETTINGS)
    @given(
        names=INPUT_NAMES,
        dtype=st.sampled_from(["int32", "int64", "float32", "bool", "uint8"]),
        shape=st.lists(st.integers(0, 70), min_size=0, max_size=3),
        values=st.lists(ID_VALUES, min_size=1, max_size=8),
        seq_len=st.one_of(st.none(), st.integers(-2, 200)),
    )
    def case(names: tuple[str, ...], dtype: str, shape: list[int], values: list[int], seq_len: int | None) -> None:
        fuzz_golden_inputs(corpus, figures, saved_model, names, dtype, shape, values, seq_len)

    case()
    figures.check(60, distinct_messages=3)


def fuzz_golden_inputs(corpus, figures, saved_model, names, dtype, shape, values, seq_len) -> None:
    import numpy as np

    size = int(np.prod(shape)) if shape else 1
    array = np.resize(np.array(values, dtype=np.int64), size).reshape(shape).astype(dtype)
    inputs = corpus["work"] / "inputs.npz"
    np.savez(inputs, **{name: array for name in names})
    extra = ["--seq-len", str(seq_len)] if seq_len is not None else []
    run_case(
        figures,
        corpus["work"],
        "golden",
        saved_model("encoder_dynamic"),
        "-o",
        corpus["work"] / "g",
        "--inputs",
        inputs,
        "--overwrite",
        *extra,
    )


def output_path(work: Path, kind: str, suffix: str) -> Path:
    """An output path of a kind users (and mistakes) produce; created as the kind needs."""
    base = work / "paths"
    shutil.rmtree(base, ignore_errors=True)  # each example starts from the same folder
    base.mkdir()
    made = {
        "fresh": base / f"new{suffix}",
        "existing": base / f"old{suffix}",
        "folder": base / "a-folder",
        "missing-folder": base / "nowhere" / f"x{suffix}",
        "file-as-folder": base / f"old{suffix}" / f"x{suffix}",
        "wrong-suffix": base / "x.tflite",
        "no-suffix": base / "x",
        "dangling-link": base / f"dangling{suffix}",
        "link-to-file": base / f"link{suffix}",
        "long-name": base / ("n" * 300 + suffix),
        "newline": base / f"a\nb{suffix}",
    }
    (base / f"old{suffix}").write_text("the user's own")
    (base / "a-folder").mkdir()
    (base / f"dangling{suffix}").symlink_to(base / "gone")
    (base / f"link{suffix}").symlink_to(base / f"old{suffix}")
    return made[kind]


PATH_KINDS = [
    "fresh",
    "existing",
    "folder",
    "missing-folder",
    "file-as-folder",
    "wrong-suffix",
    "no-suffix",
    "dangling-link",
    "link-to-file",
    "long-name",
    "newline",
]


def test_fuzz_output_paths(corpus, saved_model) -> None:
    """Every output path goes through the same checks: a documented code, one line, nothing of the user's
    replaced without --overwrite, no partial file."""
    figures = Figures("output paths")

    @settings(max_examples=60, **SETTINGS)
    @given(
        kind=st.sampled_from(PATH_KINDS),
        command=st.sampled_from(["parity-json", "parity-plot", "bench", "export"]),
        overwrite=st.booleans(),
    )
    def case(kind: str, command: str, overwrite: bool) -> None:
        fuzz_output_path(corpus, figures, saved_model, kind, command, overwrite)

    case()
    figures.check(60, distinct_messages=3)


def fuzz_output_path(corpus, figures, saved_model, kind, command, overwrite) -> None:
    suffix = {"parity-json": ".json", "bench": ".json", "parity-plot": ".png", "export": ".onnx"}[command]
    path = output_path(corpus["work"], kind, suffix)
    mine = (corpus["work"] / "paths" / f"old{suffix}").read_bytes()
    flag = ["--overwrite"] if overwrite else []
    args = {
        "parity-json": ["parity", corpus["onnx"], corpus["bundle"], "--no-isolate", "--json", path, *flag],
        "parity-plot": ["parity", corpus["onnx"], corpus["bundle"], "--no-isolate", "--plot", path, *flag],
        "bench": ["bench", corpus["onnx"], "--runs", "2", "--warmup", "0", "--json", path, *flag],
        "export": ["onnx", saved_model("encoder_dynamic"), "-o", path, "--no-verify", *flag],
    }[command]
    run_case(figures, corpus["work"], *args)
    if not overwrite:  # the user's file, reached directly or through a link, is never replaced
        assert (corpus["work"] / "paths" / f"old{suffix}").read_bytes() == mine
    stray = [p.name for p in (corpus["work"] / "paths").iterdir() if ".partial" in p.name or p.suffix == ".tmp"]
    assert stray == []
