"""`pe-export demo`: the trained encoder through every variant, with task accuracy next to the errors."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from pe_export.errors import ExitCode
from tests.helpers import run_cli

DEMO_LIMIT_S = 120


@pytest.mark.slow  # tens of seconds: out of the quick run
def test_demo_shows_exact_compression_at_full_accuracy_and_the_lossy_recipe_worse(capfd, tmp_path: Path) -> None:
    started = time.perf_counter()
    result = run_cli(capfd, "demo", "--out", tmp_path / "demo")
    elapsed = time.perf_counter() - started
    assert result.exit_code == ExitCode.OK, result.stderr
    print(f"demo took {elapsed:.1f} s")
    assert elapsed < DEMO_LIMIT_S
    rows = {r["variant"]: r for r in json.loads((tmp_path / "demo" / "report.json").read_text())["variants"]}
    assert list(rows) == [
        "tflite fp32",
        "tflite float16",
        "tflite dynamic-int8",
        "onnx fp32",
        "onnx float16",
        "onnx dynamic-int8",
        "tflite compress 16",
        "onnx compress 16",
        "tflite seed interp",
        "learned tflite fp32",
        "learned svd rank 8",
        "learned svd rank 4",
    ]
    for name, row in rows.items():
        assert row["reference_accuracy"] >= 0.95
        if name == "tflite seed interp":
            assert row["verdict"] == "LOSSY (accepted)" and row["task_accuracy"] < 0.5
            assert row["table_max_error"] > 1.0
        elif name == "learned svd rank 8":  # the trained table at 3,072 B of 8,192 keeps every answer
            assert row["table_bytes"] == 8 * (64 + 32) * 4 and row["task_accuracy"] == row["reference_accuracy"]
        elif name == "learned svd rank 4":  # … and at 1,536 B loses most of them
            assert row["verdict"] == "LOSSY (accepted)" and row["task_accuracy"] < 0.5
        else:
            assert row["verdict"] == "PASS", row
            assert row["task_accuracy"] == row["reference_accuracy"]
        assert row["p50_ms"] > 0 and (tmp_path / "demo" / row["file"]).stat().st_size == row["file_bytes"]
        assert name in result.stdout
    for name in ("tflite compress 16", "onnx compress 16"):
        assert rows[name]["table_max_error"] < 1e-6 and rows[name]["max_abs_error"] <= 1e-4
    assert (tmp_path / "demo" / "position_error.png").read_bytes()[:4] == b"\x89PNG"
