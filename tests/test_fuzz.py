"""Fuzzing with hypothesis: mutated exported models and golden bundles go through the CLI.

Over 1,000 cases per run (derandomised, so CI is repeatable). Every case must end in a
documented exit code with one line — a non-PeExportError escaping (exit 6) counts as a
parent crash — and leave no temporary file behind. The figures are printed at the end.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import shutil
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pe_export.cli import main
from pe_export.errors import ExitCode
from pe_export.golden import GoldenOptions, make_golden
from pe_export.parity.bundle import file_sha256

FIGURES = {"cases": 0, "parent_crashes": 0, "partial_files": 0, "child_runs": 0, "child_crashes": 0}
EXIT_CODES: Counter[int] = Counter()
MESSAGES: set[str] = set()
CRASHES: list[str] = []
SETTINGS = dict(
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture],
)
ALLOWED = {int(code) for code in ExitCode} - {int(ExitCode.INTERNAL_ERROR)}


@pytest.fixture(scope="module")
def seeds(saved_model, exported_file, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("fuzz-seeds")
    paths = {target: exported_file("encoder_dynamic", target) for target in ("tflite", "onnx")}
    paths.update({"bundle": out / "golden", "work": out / "work"})
    make_golden(saved_model("encoder_dynamic"), paths["bundle"], GoldenOptions(samples=4, batch=2))
    paths["work"].mkdir()
    return paths


def run_case(work: Path, *args: str | Path) -> int:
    """One CLI run in this process; classify the outcome."""
    FIGURES["cases"] += 1
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main([str(a) for a in args])
            code = 0
        except SystemExit as exit_info:
            code = int(exit_info.code or 0)
        except BaseException as escaped:  # anything else would take a user's process down
            code = -1
            CRASHES.append(f"{type(escaped).__name__}: {escaped}")
    EXIT_CODES[code] += 1
    if "crashed (signal" in err.getvalue():
        FIGURES["child_crashes"] += 1  # the runtime died in its child process; the checker reported it
    if code not in ALLOWED:
        FIGURES["parent_crashes"] += 1
        CRASHES.append(err.getvalue()[-300:])
    lines = [line for line in err.getvalue().splitlines() if line.startswith("error: ")]
    if lines:
        MESSAGES.add(re.sub(r"[0-9]+|/\S+|'[^']*'", "#", lines[0])[:90])
    stray = [p for p in work.rglob("*") if p.name.endswith(".tmp") or p.name.endswith(".old")]
    FIGURES["partial_files"] += len(stray)
    return code


def mutate(data: bytes, flips: list[tuple[int, int]], cut: int | None) -> bytes:
    mutated = bytearray(data)
    for position, value in flips:
        mutated[position % len(mutated)] = value
    return bytes(mutated[:cut] if cut is not None else mutated)


FLIPS = st.lists(st.tuples(st.integers(0, 1 << 30), st.integers(0, 255)), min_size=1, max_size=12)
CUTS = st.one_of(st.none(), st.integers(0, 200_000))


def fuzz_model_file(seeds: dict[str, Path], kind: str, flips: list[tuple[int, int]], cut: int | None,
                    run: int) -> None:  # fmt: skip
    """Inspect a mutated exported file; now and then also run it, in the runtime's child process."""
    path = seeds["work"] / f"fuzz.{kind}"
    path.write_bytes(mutate(seeds[kind].read_bytes(), flips, cut))
    run_case(seeds["work"], "inspect", path)
    if run == 0:
        FIGURES["child_runs"] += 1
        run_case(seeds["work"], "parity", path, seeds["bundle"], "--timeout", "30")


@settings(max_examples=450, **SETTINGS)
@given(flips=FLIPS, cut=CUTS, run=st.integers(0, 29))
def test_fuzz_tflite(seeds, flips, cut, run) -> None:
    fuzz_model_file(seeds, "tflite", flips, cut, run)


@settings(max_examples=300, **SETTINGS)
@given(flips=FLIPS, cut=CUTS, run=st.integers(0, 29))
def test_fuzz_onnx(seeds, flips, cut, run) -> None:
    fuzz_model_file(seeds, "onnx", flips, cut, run)


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-(10**12), 10**12) | st.floats(allow_nan=True) | st.text(max_size=12),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=6), children, max_size=3),
    max_leaves=6,
)
MANIFEST_PATHS = [
    ("format",), ("version",), ("samples",), ("model",), ("model", "digest"), ("inputs",), ("inputs", 0),
    ("inputs", 0, "shape"), ("inputs", 0, "dtype"), ("outputs", 0, "name"), ("batches",), ("batches", 0, "file"),
    ("batches", 0, "samples"), ("tolerances",), ("tolerances", "fp32"), ("tolerances", "fp32", "atol"),
]  # fmt: skip


@settings(max_examples=300, **SETTINGS)
@given(
    where=st.sampled_from(MANIFEST_PATHS), value=JSON_VALUES, flips=FLIPS, reseal=st.booleans(),
    target=st.sampled_from(["manifest", "batch"]),
)  # fmt: skip
def test_fuzz_bundle(seeds, where, value, flips, reseal, target) -> None:
    bundle = seeds["work"] / "bundle"
    shutil.rmtree(bundle, ignore_errors=True)
    shutil.copytree(seeds["bundle"], bundle)
    manifest = json.loads((bundle / "manifest.json").read_text())
    if target == "manifest":
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
    run_case(seeds["work"], "parity", seeds["onnx"], bundle, "--no-isolate")


def test_fuzz_figures() -> None:
    print(
        f"\nfuzz: {FIGURES['cases']} cases ({FIGURES['child_runs']} through a runtime child), "
        f"parent crashes {FIGURES['parent_crashes']}, partial files {FIGURES['partial_files']}, "
        f"distinct error messages {len(MESSAGES)}, runtime children that crashed and were reported "
        f"{FIGURES['child_crashes']}, exit codes {dict(sorted(EXIT_CODES.items()))}"
    )
    assert FIGURES["cases"] >= 1000
    assert FIGURES["parent_crashes"] == 0, CRASHES[:5]
    assert FIGURES["partial_files"] == 0
    assert len(MESSAGES) >= 10  # the mutations reached many different checks
