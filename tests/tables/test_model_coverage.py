"""Model coverage: a tiny random-init keras-hub backbone of every encoder family reports exactly the
position tables it reads by position, and exports to TFLite (builtins only) and ONNX, plain and with
--compress 64, each file verified through the CLI at the fp32 tolerance."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from pe_export.api import find_position_tables
from pe_export.converters.options import ExportOptions
from tests.fixtures.keras_hub_models import FAMILIES
from tests.helpers import run_cli

pytestmark = [
    pytest.mark.slow,  # minutes: excluded from the quick run (-m "not slow")
    pytest.mark.skipif(sys.version_info < (3, 11), reason="keras-hub 0.32 needs Python 3.11+"),
]


MAX_ABS = re.compile(r"^\s+(?:random|padded)\s+\S+\s+([0-9.e+-]+)\s", re.M)
FP32_ATOL = 1e-4


@pytest.mark.parametrize("family", list(FAMILIES))
def test_reports_exactly_the_tables_read_by_position(family: str, family_model) -> None:
    case = FAMILIES[family]
    found = find_position_tables(family_model(family), ExportOptions(seq_len=case.seq_len))
    reported = sorted((r.table.kind, r.table.shape) for r in found)
    assert reported == sorted(case.tables), [(r.table.name, r.table.kind, r.table.shape) for r in found]
    for result in found:
        assert any(word in result.table.notes[0] for word in ("gathered", "sliced", "added", "multiplied")), result


@pytest.mark.parametrize("target", ["tflite", "onnx"])
@pytest.mark.parametrize("family", list(FAMILIES))
def test_exports_plain_and_compressed_within_fp32(
    family: str, target: str, family_model, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    case = FAMILIES[family]
    model = family_model(family)
    length = ["--seq-len", str(case.seq_len)] if case.seq_len else []
    builtins = ["--builtins-only"] if target == "tflite" and not case.refusal else []
    sizes = {}
    for label, extra in (("plain", []), ("compress 64", ["--compress", "64"])):
        output = tmp_path / f"{label.replace(' ', '_')}.{target}"
        result = run_cli(capfd, target, model, "-o", output, *length, *builtins, *extra)
        if case.refusal:  # FFT mixing: a named refusal, one line, a documented exit code
            assert result.exit_code == case.refusal[target], result.stderr
            assert "FFT" in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr
            continue
        assert result.exit_code == 0, (label, result.stderr, result.stdout[-3000:])
        errors = [float(value) for value in MAX_ABS.findall(result.stdout)]
        assert errors and max(errors) <= FP32_ATOL, (label, errors)
        assert "flex ops: none" in result.stdout or target == "onnx", result.stdout
        sizes[label] = output.stat().st_size
        print(f"{family} {target} {label}: {sizes[label]:,} B, max abs {max(errors):.2g}")
    if sizes:
        # --compress never makes a file larger than the plain export. For ONNX the stored data is compared:
        # tf2onnx numbers the names it generates with a process-wide counter, so a later conversion of the
        # same graph in one process has longer names (measured: +1,075 B of 181,268).
        if target == "onnx":
            sizes = {label: stored_bytes(tmp_path / f"{label.replace(' ', '_')}.onnx") for label in sizes}
        assert sizes["compress 64"] <= sizes["plain"], sizes


def stored_bytes(path: Path) -> int:
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(path))
    return sum(numpy_helper.to_array(i).nbytes for i in model.graph.initializer) + sum(
        numpy_helper.to_array(a.t).nbytes for n in model.graph.node for a in n.attribute if a.type == a.TENSOR
    )


def test_input_bounds_follow_keras_hub_id_wrapping(family_model) -> None:
    """keras-hub wraps negative ids (SelectV2(ids < 0, ids + rows, ids)) before its lookups: the bounds
    must still come through, or verification would feed ids 0-1 only."""
    from pe_export.savedmodel import FrozenSignature, input_bounds, load_savedmodel, signature_input_specs

    loaded = load_savedmodel(family_model("bert"))
    signature = loaded.signature(None)
    bounds = input_bounds(FrozenSignature(signature, signature_input_specs(signature)))
    assert bounds == {"token_ids": 100, "segment_ids": 2}, bounds


def test_rope_backbone_at_dynamic_length_keeps_its_signature(
    family_model, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """The ExpandDims retry used to write no SignatureDef here (keras-hub's RoPE carries custom gradients)."""
    result = run_cli(capfd, "tflite", family_model("llama"), "-o", tmp_path / "m.tflite", "--builtins-only")
    assert result.exit_code == 0, result.stderr
    assert "converted as ExpandDims" in result.stdout and "signature serving_default" in result.stdout


def test_compress_weighs_svd_on_a_learned_table_and_keeps_it(
    family_model, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """A random-init 64x128 table is full rank: SVD within 64 values per position errs far over the fp32
    atol, so auto keeps the table and says what SVD would have cost; the export passes (exit 0)."""
    result = run_cli(capfd, "tflite", family_model("bert"), "-o", tmp_path / "m.tflite", "--compress", "64")
    assert result.exit_code == 0, result.stderr
    match = re.search(
        r"kept: svd rank (\d+) would store ([\d,]+) B, keep ([\d.]+)% of the energy and err ([\d.e-]+)", result.stdout
    )
    assert match, result.stdout
    rank, stored, energy, error = int(match[1]), int(match[2].replace(",", "")), float(match[3]), float(match[4])
    assert rank == 64 * 64 // (64 + 128) and stored == rank * (64 + 128) * 4
    assert energy < 90 and error > FP32_ATOL
