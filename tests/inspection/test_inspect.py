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
    schema = pytest.importorskip("ai_edge_litert.schema_py_generated")
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
