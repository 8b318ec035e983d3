"""The learned-table reference: trained to the task, and how far its table shrinks before answers go."""

from __future__ import annotations

from pathlib import Path

import pytest

from pe_export.api import export_onnx, export_tflite
from pe_export.converters.options import ExportOptions
from pe_export.encoders import task
from pe_export.runners import create_runner
from pe_export.tables.pipeline import TableOptions


def file_accuracy(path: Path, runtime: str = "litert") -> float:
    """Task accuracy of the file on the 1,000 held-out sequences (a seed no export ever draws from)."""
    tokens, labels = task.task_data(task.TEST_SAMPLES, task.TEST_SEED)
    with create_runner(runtime, path) as runner:
        logits = runner.infer({"token_ids": tokens})[task.LABEL_OUTPUT]
    return task.accuracy(logits, labels)


def test_learned_table_reference_and_its_rank_limit(tmp_path: Path) -> None:
    from pe_export.native import import_tensorflow

    import_tensorflow()
    model = task.load_trained_model(task.LEARNED_WEIGHTS, table_kind="learned")
    table = next(w.numpy() for w in model.weights if "position_embedding" in w.path)
    assert table.shape == (task.TABLE_LEN, task.WIDTH) and task.LEARNED_WEIGHTS.stat().st_size <= 2**17
    saved = tmp_path / "learned"
    model.export(str(saved), verbose=False)
    scores = {}
    for budget in (12, 6):  # svd rank 8 and rank 4 of the 64x32 table
        options = ExportOptions(tables=TableOptions(compress=budget, method="svd", allow_lossy=True))
        report = export_tflite(saved, tmp_path / f"{budget}.tflite", options)
        (result,) = report.tables
        scores[result.notes["rank"]] = file_accuracy(tmp_path / f"{budget}.tflite")
    plain = export_tflite(saved, tmp_path / "fp32.tflite", ExportOptions())
    print(f"task accuracy: fp32 {file_accuracy(plain.output):.4f}, by svd rank {scores}")
    assert file_accuracy(plain.output) == 1.0
    assert scores[8] >= 0.99 and scores[4] < 0.5  # rank 8 keeps the answers; rank 4 loses most


def test_full_integer_keeps_the_task_on_sequences_it_never_saw(tmp_path: Path) -> None:
    """Issue 25: full-integer TFLite (activations int8 or int16 by measured error, chosen on generated inputs)
    answers the 1,000 held-out task sequences as float32 does (measured: 1.0000 both)."""
    from pe_export.native import import_tensorflow

    import_tensorflow()
    saved = tmp_path / "learned"
    task.load_trained_model(task.LEARNED_WEIGHTS, table_kind="learned").export(str(saved), verbose=False)
    plain = export_tflite(saved, tmp_path / "fp32.tflite", ExportOptions())
    options = ExportOptions(quantize="int8", seq_len=task.SEQ_LEN)
    report = export_tflite(saved, tmp_path / "int8.tflite", options)
    assert int(report.exit_code) == 0, report.notes
    assert any(note.startswith("activations by measured error:") for note in report.notes), report.notes
    assert report.summary.file_bytes < 0.75 * plain.summary.file_bytes
    assert file_accuracy(tmp_path / "int8.tflite") >= file_accuracy(plain.output) - 0.005


@pytest.mark.parametrize(
    ("target", "quantize", "min_cosine"),
    [
        ("onnx", "int8", None),
        ("onnx", "int8", 0.999),
        ("onnx", "dynamic-int8", 0.999),
        ("tflite", "dynamic-int8", 0.999),
    ],
)
def test_integer_precisions_keep_the_task_on_sequences_they_never_saw(
    tmp_path: Path, target: str, quantize: str, min_cosine: float | None
) -> None:
    """Issue 25's last clause: static QDQ ONNX and dynamic int8 at 0.999, chosen on generated inputs, answer the
    1,000 held-out task sequences as the float32 file of the same format does, in fewer bytes."""
    from pe_export.native import import_tensorflow

    import_tensorflow()
    saved = tmp_path / "learned"
    task.load_trained_model(task.LEARNED_WEIGHTS, table_kind="learned").export(str(saved), verbose=False)
    export, runtime = (export_onnx, "onnxruntime") if target == "onnx" else (export_tflite, "litert")
    plain = export(saved, tmp_path / f"fp32.{target}", ExportOptions())
    report = export(saved, tmp_path / f"q.{target}", ExportOptions(quantize=quantize, min_cosine=min_cosine))
    assert int(report.exit_code) == 0, report.notes
    assert report.summary.file_bytes < plain.summary.file_bytes
    baseline = file_accuracy(plain.output, runtime)
    assert baseline == 1.0
    assert file_accuracy(tmp_path / f"q.{target}", runtime) >= baseline - 0.005


def test_full_integer_cli_prints_its_report(tmp_path: Path) -> None:
    """The full-integer search runs one interpreter per core in threads: through the CLI the report, and its last
    line, reach the user (they went into a deleted temp file with the process's file descriptors)."""
    import subprocess
    import sys

    from pe_export.native import import_tensorflow

    import_tensorflow()
    saved = tmp_path / "learned"
    task.load_trained_model(task.LEARNED_WEIGHTS, table_kind="learned").export(str(saved), verbose=False)
    output = tmp_path / "int8.tflite"
    cli = "from pe_export.cli import main; main()"
    args = ["tflite", str(saved), "-o", str(output), "--quantize", "int8"]
    result = subprocess.run([sys.executable, "-c", cli, *args], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "activations by measured error" in result.stdout, result.stdout[-2000:]
    assert result.stdout.rstrip().splitlines()[-1].startswith(f"OK: wrote {output}"), result.stdout[-2000:]
