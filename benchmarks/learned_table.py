"""How far can a learned position table shrink? The shift-task encoder trained with a learned 64×32
table (pe_export/encoders/task.py, weights shipped), exported at every SVD rank the budget allows
and in every precision, each file run on 1,000 held-out task sequences: task accuracy side by side
with file bytes, stored table bytes and the table's own error.

    python benchmarks/learned_table.py

Only rows 0…15 of the table are trained (the task's length); the rest keep their initial values.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from pe_export.api import export_onnx, export_tflite  # noqa: E402
from pe_export.converters.options import ExportOptions  # noqa: E402
from pe_export.encoders import task  # noqa: E402
from pe_export.errors import PeExportError  # noqa: E402
from pe_export.native import import_tensorflow  # noqa: E402
from pe_export.runners import create_runner  # noqa: E402
from pe_export.tables.pipeline import TableOptions  # noqa: E402

RUNNERS = {"tflite": "litert", "onnx": "onnxruntime"}
# --compress K with svd keeps rank ⌊K·64 / (64 + 32)⌋ of the 64x32 table.
VARIANTS = (
    ("fp32", {}),
    ("float16", {"quantize": "float16"}),
    ("dynamic-int8", {"quantize": "dynamic-int8"}),
    ("dynamic-int8 --min-cosine 0.999", {"quantize": "dynamic-int8", "min_cosine": 0.999}),
    ("int8 (full integer / QDQ)", {"quantize": "int8"}),  # TFLite: int16 activations; ONNX: static QDQ
    ("int8 --min-cosine 0.999", {"quantize": "int8", "min_cosine": 0.999}),
    ("--compress 16 (auto)", {"tables": TableOptions(compress=16)}),
    *(
        (
            f"svd rank {2 * k // 3} (--compress {k})",
            {"tables": TableOptions(compress=k, method="svd", allow_lossy=True)},
        )
        for k in (24, 12, 6, 3, 2)
    ),
)


def task_accuracy(path: Path, runtime: str) -> float:
    tokens, labels = task.task_data(task.TEST_SAMPLES, task.TEST_SEED)
    with create_runner(runtime, path) as runner:
        logits = np.concatenate(
            [runner.infer({"token_ids": tokens[i : i + 250]})[task.LABEL_OUTPUT] for i in range(0, len(tokens), 250)]
        )
    return task.accuracy(logits, labels)


def main() -> None:
    import_tensorflow()
    work = Path(tempfile.mkdtemp(prefix="pe-export-learned-"))
    saved = work / "learned_encoder"
    task.load_trained_model(task.LEARNED_WEIGHTS, table_kind="learned").export(str(saved), verbose=False)
    print(f"{'format':<7} {'variant':<32} {'exit':>4} {'file B':>9} {'table B':>8} {'table err':>9} {'task acc':>8}")
    for target, export in (("tflite", export_tflite), ("onnx", export_onnx)):
        for index, (label, options) in enumerate(VARIANTS):
            path = work / f"{index}.{target}"
            try:
                report = export(saved, path, ExportOptions(**options))
            except PeExportError as err:  # refused by its own gate: nothing written, the exit code is the row
                print(f"{target:<7} {label:<32} {int(err.exit_code):>4} (nothing written: {err})", flush=True)
                continue
            (table,) = report.tables or [None]
            stored = f"{table.bytes_after:,}" if table else "-"
            error = f"{table.max_error:.3g}" if table else "-"
            print(
                f"{target:<7} {label:<32} {int(report.exit_code):>4} {report.summary.file_bytes:>9,} {stored:>8} "
                f"{error:>9} {task_accuracy(path, RUNNERS[target]):>8.4f}",
                flush=True,
            )


if __name__ == "__main__":
    main()
