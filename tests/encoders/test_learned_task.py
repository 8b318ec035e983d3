"""The learned-table reference: trained to the task, and how far its table shrinks before answers go."""

from __future__ import annotations

from pathlib import Path

from pe_export.api import export_tflite
from pe_export.converters.options import ExportOptions
from pe_export.encoders import task
from pe_export.runners import create_runner
from pe_export.tables.pipeline import TableOptions


def file_accuracy(path: Path) -> float:
    tokens, labels = task.task_data(task.TEST_SAMPLES, task.TEST_SEED)
    with create_runner("litert", path) as runner:
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
