"""Position tables end to end: every position-encoding variant detected and exported with parity;
--compress shrinks the exported file by the table's size; lossy methods fail loudly."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from pe_export.api import export_onnx, export_tflite, find_position_tables
from pe_export.converters.options import ExportOptions
from pe_export.encoders.variants import VARIANTS
from pe_export.errors import ExitCode, ParityError
from pe_export.tables.pipeline import TableOptions
from tests.helpers import litert_outputs, max_abs_error, onnxruntime_outputs, reference_outputs, run_cli, token_feed

EXPORTS = {"tflite": (export_tflite, litert_outputs), "onnx": (export_onnx, onnxruntime_outputs)}
DYNAMIC_KINDS = {  # at a dynamic length, tables computed from range(T) stay computations, listed as such
    "hybrid_separate": ("learned", "sinusoid-interleaved"),  # two tables, each sliced; folded into one when fixed
    "t5_bias": ("relative", "relative-bucket"),  # its float log buckets frozen by distance (tables/arithmetic.py)
}
COMPUTED_AT_RUN_TIME = ("sinusoid_computed", "rotary")  # dynamic length: listed with source "run time", kept
TABLE_BYTES_512 = 512 * 512 * 4


def table_options_for(kinds: list[str]) -> TableOptions:
    if kinds and all(k.startswith(("sinusoid", "rotary")) for k in kinds):
        return TableOptions(compress=16)  # exact angle addition fits 16 values per position
    return TableOptions(method="none")  # learned tables: frozen, gathered at run time


@pytest.mark.parametrize("seq_len", [16, None])
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_variant_is_detected_and_exports_with_parity(
    variant: str, seq_len: int | None, variant_model, tmp_path: Path
) -> None:
    model = variant_model(variant, seq_len)
    listed = find_position_tables(model, ExportOptions())
    found = sorted(r.table.kind for r in listed)
    expected = VARIANTS[variant][1] if seq_len else DYNAMIC_KINDS.get(variant, VARIANTS[variant][1])
    assert found == sorted(expected), found
    run_time = {r.table.source == "run time" for r in listed}
    assert run_time == ({not seq_len and variant in COMPUTED_AT_RUN_TIME} if listed else set())
    options = ExportOptions(tables=table_options_for([r.table.kind for r in listed if r.table.source != "run time"]))
    for target, (export, run) in EXPORTS.items():
        report = export(model, tmp_path / f"m.{target}", options)
        assert report.exit_code == ExitCode.OK, (target, report.parity and report.parity.max_abs)
        assert report.parity.max_abs <= 1e-4 and report.summary.flex_ops == []
        assert all(t.exact and t.max_error <= 1e-5 for t in report.tables)
        # Judged apart from the export's own check: the file in its runtime against TensorFlow, other inputs.
        feed = token_feed(tuple(s.name for s in report.input_specs), batch=2, seq_len=seq_len or 24, vocab=64, seed=13)
        assert max_abs_error(run(tmp_path / f"m.{target}", feed), reference_outputs(model, feed)) <= 1e-4, target


@pytest.mark.parametrize("seq_len", [512, None])
def test_compress_64_on_512x512_saves_the_table(seq_len: int | None, variant_model, tmp_path: Path) -> None:
    model = variant_model("sinusoid_constant", seq_len, length=512, width=512)
    length = seq_len or 512
    feed = {"token_ids": np.random.default_rng(3).integers(1, 64, (2, length)).astype(np.int32)}
    expected = reference_outputs(model, feed)
    for target, (export, run) in EXPORTS.items():
        plain = export(model, tmp_path / f"plain.{target}", ExportOptions(verify=False))
        small = export(model, tmp_path / f"small.{target}", ExportOptions(tables=TableOptions(compress=64)))
        saved = plain.summary.file_bytes - small.summary.file_bytes
        (table,) = small.tables
        print(
            f"{target} seq {seq_len}: {plain.summary.file_bytes:,} → {small.summary.file_bytes:,} B "
            f"(saved {saved:,}), table {table.bytes_before:,} → {table.bytes_after:,} B, "
            f"end-to-end {small.parity.max_abs:.2g}"
        )
        assert table.method == "angle" and table.exact and table.max_error < 1e-6
        assert saved >= 0.9 * TABLE_BYTES_512
        assert small.parity.max_abs <= 1e-4
        error = max_abs_error(run(tmp_path / f"small.{target}", feed), expected)
        assert error <= 1e-4, error


def test_8192x256_table_shrinks_30x_exactly(variant_model, tmp_path: Path) -> None:
    model = variant_model("sinusoid_constant", None, length=8192, width=256, head=False)
    table_bytes = 8192 * 256 * 4
    feed = {"token_ids": np.zeros((1, 8192), np.int32)}
    expected = reference_outputs(model, feed)
    for target, (export, run) in EXPORTS.items():
        plain = export(model, tmp_path / f"plain.{target}", ExportOptions(verify=False))
        compressed = ExportOptions(verify=False, tables=TableOptions(compress=64))
        small = export(model, tmp_path / f"small.{target}", compressed)
        footprint = table_bytes - (plain.summary.file_bytes - small.summary.file_bytes)
        print(
            f"{target}: 8192x256 table {table_bytes:,} B takes {footprint:,} B in the file "
            f"({table_bytes / footprint:.1f}x smaller)"
        )
        assert table_bytes / footprint >= 30
        assert max_abs_error(run(tmp_path / f"small.{target}", feed), expected) <= 1e-5


def test_seed_interp_is_reported_lossy_and_fails_without_allow_lossy(capfd, variant_model, tmp_path: Path) -> None:
    model = variant_model("sinusoid_constant", None, length=512, width=512)
    args = ["onnx", model, "-o", tmp_path / "m.onnx", "--compress", "64", "--compress-method", "interp"]
    failed = run_cli(capfd, *args)
    assert failed.exit_code == ExitCode.PARITY_FAILED
    assert "lossy table compression breaks parity" in failed.stderr and "table error 2" in failed.stderr
    assert "interp" in failed.stdout and "LOSSY" in failed.stdout
    accepted = run_cli(capfd, *args, "--overwrite", "--allow-lossy")
    assert accepted.exit_code == 0 and "lossy tables accepted by --allow-lossy" in accepted.stdout


def test_svd_on_learned_table_reports_energy_and_end_to_end_error(variant_model, tmp_path: Path) -> None:
    model = variant_model("learned", None)
    strict = export_onnx(model, tmp_path / "m.onnx", ExportOptions(tables=TableOptions(compress=8, method="svd")))
    (table,) = strict.tables
    print(
        f"learned 64x32, svd rank {table.notes['rank']}: energy kept {table.notes['energy_kept']:.3f}, "
        f"table error {table.max_error:.3g}, end-to-end {strict.parity.max_abs:.3g}"
    )
    assert table.method == "svd" and not table.exact and 0 < table.notes["energy_kept"] < 1
    assert strict.exit_code == ExitCode.PARITY_FAILED and strict.parity.max_abs > 1e-4
    options = ExportOptions(overwrite=True, tables=TableOptions(compress=8, method="svd", allow_lossy=True))
    accepted = export_onnx(model, tmp_path / "m.onnx", options)
    assert accepted.exit_code == ExitCode.OK and accepted.against_lossy_tables  # the loss is the table's
    assert all(o.within_tolerance and o.max_abs <= 1e-4 for o in accepted.against_lossy_tables)


def test_allow_lossy_accepts_the_tables_loss_and_nothing_more(variant_model, tmp_path: Path) -> None:
    """A failure that is not the table's (here a cosine of 1.0 asked of the converted file, which TFLite's
    float kernels miss by rounding) still fails with --allow-lossy: it used to pass any failure."""
    model = variant_model("learned", None)
    tables = TableOptions(compress=8, method="svd", allow_lossy=True)
    output = tmp_path / "m.tflite"
    with pytest.raises(ParityError, match="accepts the tables' loss only"):
        export_tflite(model, output, ExportOptions(tables=tables, min_cosine=1.0)).raise_for_status()
    assert not output.exists()
    report = export_tflite(model, output, ExportOptions(tables=tables, min_cosine=1.0))
    assert report.exit_code == ExitCode.PARITY_FAILED and report.against_lossy_tables
    assert min(o.cosine for o in report.against_lossy_tables) < 1.0  # a real miss, not the table's
    assert max(o.max_abs for o in report.against_lossy_tables) < 1e-4 < report.parity.max_abs


def test_max_len_regenerates_the_sinusoid_exactly(variant_model, tmp_path: Path) -> None:
    import tensorflow as tf

    from pe_export.tables.sinusoid import sinusoid_table

    model = variant_model("sinusoid_constant", None, length=512, width=64, head=False)
    embedding = next(v.numpy() for v in tf.saved_model.load(str(model)).variables if "token_embedding" in v.name)
    feed = {"token_ids": np.zeros((1, 1024), np.int32)}
    formula = sinusoid_table(1024, 64)
    for target, (export, run) in EXPORTS.items():
        report = export(model, tmp_path / f"m.{target}", ExportOptions(tables=TableOptions(max_len=1024)))
        assert report.exit_code == ExitCode.OK and report.tables[0].rows == 1024
        positions = run(tmp_path / f"m.{target}", feed)["sequence_output"][0] - embedding[0]
        assert np.abs(positions[512:] - formula[512:]).max() <= 1e-5
        assert np.abs(positions[:512] - formula[:512]).max() <= 1e-5


def test_float16_tables(variant_model, tmp_path: Path) -> None:
    model = variant_model("sinusoid_constant", None, length=512, width=512)
    for tables in (TableOptions(compress=64, table_dtype="float16"), TableOptions(table_dtype="float16")):
        for target, (export, run) in EXPORTS.items():
            report = export(model, tmp_path / f"m.{target}", ExportOptions(overwrite=True, tables=tables))
            (table,) = report.tables
            assert report.exit_code == ExitCode.OK and report.parity.precision == "fp16"
            assert np.isfinite(table.max_error) and table.max_error <= 1e-3
            assert table.bytes_after <= table.bytes_before // 2 + 64
            feed = {"token_ids": np.random.default_rng(0).integers(1, 64, (2, 512)).astype(np.int32)}
            out = run(tmp_path / f"m.{target}", feed)["sequence_output"]
            assert np.isfinite(out).all()


def test_list_tables_and_unknown_table_name(capfd, variant_model, tmp_path: Path) -> None:
    model = variant_model("masked", 16)
    listed = run_cli(capfd, "tflite", model, "-o", tmp_path / "m.tflite", "--list-tables")
    assert listed.exit_code == 0 and "sinusoid-interleaved" in listed.stdout and "attention_mask" in listed.stdout
    assert not (tmp_path / "m.tflite").exists()
    unknown = run_cli(capfd, "tflite", model, "-o", tmp_path / "m.tflite", "--list-tables", "--table", "nope")
    assert unknown.exit_code == ExitCode.BAD_INPUT and "--table nope" in unknown.stderr
    angle = run_cli(
        capfd,
        "tflite",
        variant_model("learned", 16),
        "-o",
        tmp_path / "m.tflite",
        "--compress",
        "8",
        "--compress-method",
        "angle",
    )
    assert angle.exit_code == ExitCode.BAD_INPUT and "it is not a sinusoid" in angle.stderr


def test_max_len_stretches_learned_tables_with_a_warning(variant_model, tmp_path: Path) -> None:
    model = variant_model("learned", None)
    with pytest.warns(UserWarning, match="linear interpolation — an approximation"):
        report = export_onnx(
            model, tmp_path / "m.onnx", ExportOptions(tables=TableOptions(max_len=128), keep_failed=True)
        )
    (table,) = report.tables
    assert table.rows == 128 and table.warnings and table.method == "none"
    # The stretched rows no longer match the trained ones: a parity failure, so nothing at -o, and the
    # file kept by name for a look (--keep-failed).
    assert report.exit_code == ExitCode.PARITY_FAILED and not (tmp_path / "m.onnx").exists()
    feed = {"token_ids": np.ones((1, 100), np.int32)}  # longer than the 64 trained positions
    assert np.isfinite(onnxruntime_outputs(tmp_path / "m.FAILED.onnx", feed)["sequence_output"]).all()


def test_dynamic_export_is_verified_over_every_rebuilt_row(variant_model, tmp_path: Path) -> None:
    from pe_export.constants import MAX_CHECKED_POSITIONS, VERIFY_SEQ_LEN

    model = variant_model("sinusoid_constant", None, length=128, width=32, head=False)
    plain = export_onnx(model, tmp_path / "plain.onnx", ExportOptions())
    assert plain.parity.positions == 128  # the table's rows, rebuilt or not
    relative = export_onnx(variant_model("relative", None), tmp_path / "relative.onnx", ExportOptions())
    assert relative.parity.positions == VERIFY_SEQ_LEN  # distances bound no length: the short check
    for target, (export, _) in EXPORTS.items():
        rebuilt = export(model, tmp_path / f"c.{target}", ExportOptions(tables=TableOptions(compress=16)))
        assert rebuilt.tables[0].rows == 128 and rebuilt.parity.positions == 128 and rebuilt.parity.passed
        # --max-len: the file runs to 1024, the reference only to its 128 rows.
        extended = export(model, tmp_path / f"e.{target}", ExportOptions(tables=TableOptions(max_len=1024)))
        assert extended.tables[0].rows == 1024 and extended.parity.positions == 128 and extended.parity.passed
    long = variant_model("sinusoid_constant", None, length=1024, width=16, head=False)
    capped = export_tflite(long, tmp_path / "long.tflite", ExportOptions(tables=TableOptions(compress=8)))
    assert capped.parity.positions == MAX_CHECKED_POSITIONS and capped.parity.passed


@pytest.mark.parametrize("variant", ["relative", "t5_bias"])
def test_relative_gathers_are_not_folded_at_a_fixed_length(variant: str, variant_model, tmp_path: Path) -> None:
    """Shaw's [17, 32] table and T5's [32, 4] bucket biases, gathered by a 64x64 distance index: folding
    would store a 64x64x32 (524,288 B) or 4x64x64 (65,536 B) float constant. The file keeps table + index."""
    model = variant_model(variant, 64)
    for target, (export, _) in EXPORTS.items():
        report = export(model, tmp_path / f"m.{target}", ExportOptions())
        floats = [c for c in report.summary.constants if c.dtype.startswith("float")]
        largest = max(floats, key=lambda c: c.nbytes)
        print(
            f"{variant} {target}: {report.summary.file_bytes:,} B, largest float constant {largest.nbytes:,} B "
            f"{largest.shape}, parity {report.parity.max_abs:.2g}"
        )
        assert report.exit_code == ExitCode.OK and report.parity.max_abs <= 1e-4
        assert all(c.nbytes < 64 * 64 * 4 for c in floats), largest


@pytest.mark.parametrize("seq_len", [512, None])
def test_onnx_rebuild_is_folded_once_at_session_creation(seq_len: int | None, variant_model, tmp_path: Path) -> None:
    """The compressed ONNX file stores the small arrays; onnxruntime's default (basic) optimisation turns the
    rebuild into one constant table when it creates the session, so no call pays for it. With optimisations
    off the same ops run every call and give the same values."""
    import onnx
    import onnxruntime as ort

    from pe_export.tables.graph import RUN_TIME_ZERO

    model = variant_model("sinusoid_constant", seq_len, length=512, width=512)
    small = export_onnx(model, tmp_path / "small.onnx", ExportOptions(tables=TableOptions(compress=64)))
    assert small.parity.max_abs <= 1e-4 and small.tables[0].method == "angle"
    stored = onnx.load(str(tmp_path / "small.onnx")).graph
    assert not any(node.name == RUN_TIME_ZERO for node in stored.node)  # nothing reads the input for the table
    assert max(int(np.prod(init.dims)) for init in stored.initializer) < 512 * 512  # no whole table stored
    rebuild_ops = sum(node.name.startswith("pe_export_tables/") for node in stored.node)
    assert rebuild_ops >= 10

    feed = {"token_ids": np.random.default_rng(1).integers(1, 64, (1, seq_len or 200)).astype(np.int32)}
    outputs = {}
    for level in (ort.GraphOptimizationLevel.ORT_DISABLE_ALL, ort.GraphOptimizationLevel.ORT_ENABLE_BASIC):
        options = ort.SessionOptions()
        options.graph_optimization_level = level
        options.optimized_model_filepath = str(tmp_path / f"optimized-{int(level)}.onnx")
        session = ort.InferenceSession(str(tmp_path / "small.onnx"), options, providers=["CPUExecutionProvider"])
        outputs[level] = session.run(None, feed)[0]
    np.testing.assert_allclose(
        outputs[ort.GraphOptimizationLevel.ORT_DISABLE_ALL],
        outputs[ort.GraphOptimizationLevel.ORT_ENABLE_BASIC],
        atol=1e-5,
    )
    folded = onnx.load(str(tmp_path / f"optimized-{int(ort.GraphOptimizationLevel.ORT_ENABLE_BASIC)}.onnx")).graph
    assert not any(node.name.startswith("pe_export_tables/") for node in folded.node)
    assert any(int(np.prod(init.dims)) >= 512 * 512 for init in folded.initializer)  # the whole table, in memory
