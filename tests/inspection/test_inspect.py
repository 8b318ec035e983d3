"""`inspect` on .tflite, .onnx and SavedModel dirs; corrupt files give one line, never a crash."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from pe_export.errors import BadInputError, ExitCode
from pe_export.inspection import inspect_path
from pe_export.inspection.tflite_schema import BUILTIN_OPERATORS, TENSOR_TYPES
from tests.helpers import run_cli


@pytest.fixture(scope="module")
def exported(exported_file) -> dict[str, Path]:
    return {
        "tflite": exported_file("encoder_multi_io", "tflite"),
        "onnx": exported_file("encoder_multi_io", "onnx"),
        "flex": exported_file("encoder_flex", "tflite"),
    }


def test_schema_table_matches_installed_schema() -> None:
    from ai_edge_litert import schema_py_generated as schema

    installed = {v: k for k, v in vars(schema.BuiltinOperator).items() if not k.startswith("_")}
    assert {code: installed[code] for code in BUILTIN_OPERATORS} == BUILTIN_OPERATORS
    assert set(TENSOR_TYPES) <= {v for k, v in vars(schema.TensorType).items() if not k.startswith("_")}


def test_tflite_summary_agrees_with_the_interpreter(exported: dict[str, Path]) -> None:
    from ai_edge_litert.interpreter import Interpreter

    summary = inspect_path(exported["tflite"])
    interpreter = Interpreter(model_path=str(exported["tflite"]))
    ops = [op["op_name"] for op in interpreter._get_ops_details()]
    assert sum(summary.op_counts.values()) == len(ops)
    assert summary.op_counts["FULLY_CONNECTED"] == ops.count("FULLY_CONNECTED")
    (signature,) = summary.signatures
    runner_inputs = interpreter.get_signature_runner().get_input_details()
    assert sorted(s.name for s in signature.inputs) == sorted(runner_inputs)
    assert all(s.shape == (None, None) and s.dtype == "int32" for s in signature.inputs)
    largest = summary.largest_constants(1)[0]
    assert largest.nbytes == int(np.prod(largest.shape)) * 4  # a float32 weight
    assert summary.file_bytes == exported["tflite"].stat().st_size


def test_flex_ops_are_listed(exported: dict[str, Path]) -> None:
    summary = inspect_path(exported["flex"])
    assert summary.flex_ops == ["FlexCumprod"]
    verdicts = {v.runtime: v.runs for v in summary.runs_on}
    assert verdicts == {"ai-edge-litert": False, "tflite-runtime": False, "tflite+flex": True, "litert-gpu": False}


def test_onnx_summary(exported: dict[str, Path]) -> None:
    import onnx

    summary = inspect_path(exported["onnx"])
    model = onnx.load(str(exported["onnx"]))
    assert sum(summary.op_counts.values()) == len(model.graph.node)
    assert sorted(s.name for s in summary.signatures[0].outputs) == ["pooled_output", "sequence_output"]
    assert summary.custom_ops == [] and summary.runs_on[0].runs
    assert summary.details["opset"].startswith("ai.onnx:17")


def test_savedmodel_summary(saved_model) -> None:
    summary = inspect_path(saved_model("encoder_multi_io"))
    assert summary.format == "savedmodel"
    assert {s.name for s in summary.signatures} >= {"serving_default"}
    names = [c.name for c in summary.constants]
    assert any("token_embedding" in n for n in names)
    assert summary.op_counts["MatMul"] + summary.op_counts["BatchMatMulV2"] + summary.op_counts["Einsum"] > 0


def test_cli_inspect_prints_the_summary(capfd, exported: dict[str, Path]) -> None:
    result = run_cli(capfd, "inspect", exported["flex"])
    assert result.exit_code == 0
    assert "flex ops: FlexCumprod" in result.stdout and "largest:" in result.stdout


@pytest.mark.parametrize("damage", ["truncate", "flip", "garbage", "empty"])
def test_damaged_tflite_is_one_line_bad_input(capfd, exported: dict[str, Path], tmp_path: Path, damage: str) -> None:
    data = bytearray(exported["tflite"].read_bytes())
    if damage == "truncate":
        data = data[: len(data) // 3]
    elif damage == "flip":
        for position in range(8, len(data), 97):
            data[position] ^= 0xFF
    elif damage == "garbage":
        data = bytearray(b"TFL3" * 3 + bytes(range(256)))
        data[4:8] = b"TFL3"
    else:
        data = bytearray()
    bad = tmp_path / "bad.tflite"
    bad.write_bytes(bytes(data))
    result = run_cli(capfd, "inspect", bad)
    if result.exit_code == 0:  # a flip that spared every structural byte still parses
        assert damage == "flip"
        return
    assert result.exit_code == ExitCode.BAD_INPUT
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr


def test_garbage_onnx_is_bad_input(tmp_path: Path) -> None:
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"\x08\x07garbage protobuf \xff\xff\xff")
    with pytest.raises(BadInputError, match="not a readable ONNX model"):
        inspect_path(bad)


@pytest.mark.parametrize(
    ("min_runtime_version", "runs", "said"),
    [
        ("2.17.0", False, "TFLite ≥ 2.17.0"),
        ("2.14.0", True, "2.14.0 ≤ 2.14.0"),
        ("2.10.0", True, "2.10.0 ≤"),
        (None, True, "no min_runtime_version"),
        ("2.x", True, "no min_runtime_version"),
    ],
)
def test_tflite_runtime_verdict_reads_min_runtime_version(
    min_runtime_version: str | None, runs: bool, said: str
) -> None:
    from pe_export.inspection.runtimes import tflite_verdicts

    verdict = {v.runtime: v for v in tflite_verdicts([], [], min_runtime_version)}["tflite-runtime"]
    assert verdict.runs is runs and said in verdict.why


def _converted(tmp_path: Path, function: object, spec: object) -> Path:
    """``function`` at ``spec`` as the bare TFLite converter writes it (a signature, builtin ops)."""
    import tensorflow as tf

    module = tf.Module()
    module.f = tf.function(function, input_signature=[spec])
    tf.saved_model.save(module, str(tmp_path / "sm"), signatures={"serving_default": module.f})
    path = tmp_path / "bare.tflite"
    path.write_bytes(tf.lite.TFLiteConverter.from_saved_model(str(tmp_path / "sm")).convert())
    return path


# (what, function of [1, 8] int32 ids, the litert-gpu reason it must give): what the GPU accelerator refuses or
# gets wrong, found from the file's ops and shapes (measured under lavapipe: docs/devices.md)
GPU_RISKS = [
    ("GATHER by a matrix of ids", lambda tf, t, ids: tf.gather(t, ids), "GATHER by [1, 8] ids"),
    (
        "2-D rows plus a constant [8, 4]",
        lambda tf, t, ids: tf.gather(t, tf.reshape(ids, [-1])) + t[:8],
        "ADD of a [8, 4] tensor and a constant [8, 4]",
    ),
]


@pytest.mark.parametrize(("what", "function", "reason"), GPU_RISKS, ids=[r[0] for r in GPU_RISKS])
def test_what_the_gpu_would_refuse_or_get_wrong_is_named(tmp_path: Path, what: str, function, reason: str) -> None:
    import tensorflow as tf

    table = tf.constant(np.random.default_rng(0).normal(size=(16, 4)).astype(np.float32))
    path = _converted(tmp_path, lambda ids: function(tf, table, ids), tf.TensorSpec([1, 8], tf.int32, name="ids"))
    gpu = next(v for v in inspect_path(path).runs_on if v.runtime == "litert-gpu")
    assert not gpu.runs and reason in gpu.why, gpu.why


def test_a_fixed_shape_export_has_neither(saved_model, tmp_path: Path) -> None:
    from pe_export.api import export_tflite
    from pe_export.converters.options import ExportOptions

    path = tmp_path / "fixed.tflite"
    report = export_tflite(saved_model("encoder_multi_io"), path, ExportOptions(batch=1, seq_len=16, verify=False))
    assert report.exit_code == ExitCode.OK
    gpu = next(v for v in inspect_path(path).runs_on if v.runtime == "litert-gpu")
    assert gpu.runs, gpu.why


def test_cli_inspect_of_a_savedmodel_names_its_signature_inputs_and_tables(capfd, saved_model) -> None:
    """`pe-export inspect SAVED_MODEL` prints what the library summary holds: the signature, its three inputs,
    the embedding tables among the largest constants."""
    model = saved_model("encoder_multi_io")
    summary = inspect_path(model)
    result = run_cli(capfd, "inspect", model)
    assert result.exit_code == 0, result.stderr
    assert "serving_default" in result.stdout
    for name in ("attention_mask", "segment_ids", "token_ids"):
        assert name in result.stdout
    largest = max(summary.constants, key=lambda c: c.nbytes) if summary.constants else None
    assert largest is not None and largest.name in result.stdout, result.stdout


@pytest.mark.parametrize("kind", ["truncated", "flex"])
def test_bench_refuses_a_file_it_cannot_run_in_one_line(
    capfd, exported: dict[str, Path], tmp_path: Path, kind: str
) -> None:
    """A damaged file is bad input (exit 2); a file with Flex ops no pip runtime runs says which ops (exit 3)."""
    if kind == "truncated":
        path = tmp_path / "cut.tflite"
        path.write_bytes(exported["tflite"].read_bytes()[:4000])
        code, fragments = ExitCode.BAD_INPUT, ("cut.tflite",)
    else:
        path, code, fragments = exported["flex"], ExitCode.RUNTIME_UNAVAILABLE, ("select TF (Flex) ops",)
    result = run_cli(capfd, "bench", path, "--runs", "2", "--seq-len", "16")
    assert result.exit_code == code and "Traceback" not in result.stderr, (result.exit_code, result.stderr)
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and all(f in errors[0] for f in fragments), result.stderr
    assert not result.stdout.strip()  # no figures for a file that did not run
