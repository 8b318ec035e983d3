"""`pe-export demo`: the whole path on the bundled, trained task encoder, in one command.

Loads the shift-task encoder (pe_export/encoders/task.py), exports it to TFLite and ONNX
in several precisions, with exact table compression and with the source write-up's lossy
recipe, makes a golden bundle of task samples with their labels, checks every variant on
every installed runtime, times each, and writes report.json and a per-position error plot.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from pe_export.api import ExportReport, export_onnx, export_tflite
from pe_export.bench import time_calls
from pe_export.converters.options import ExportOptions
from pe_export.errors import BadInputError, ExitCode, PeExportError
from pe_export.fileio import atomic_write_bytes
from pe_export.parity.harness import ParityOptions, ParityReport, check_parity
from pe_export.runners import create_runner, first_installed_runner, installed_runners
from pe_export.tables.pipeline import TableOptions

DEFAULT_DEMO_DIR = Path("pe-export-demo")
DEMO_SAMPLES = 256
BENCH_RUNS = 50
DEMO_COMPRESS = 16  # the reference table is 64x32: a budget under 32 values per position
# (name, target, quantize, table options), in the order the summary prints them. The last one
# is the source write-up's lossy recipe, kept as a visible counter-example (--allow-lossy).
# Rows named "learned …" run on the same encoder trained with a learned 64x32 table instead: how far its
# table shrinks (svd rank 8 of 32 keeps every answer, rank 4 does not), accepted as lossy on purpose.
DEMO_VARIANTS: tuple[tuple[str, str, str, TableOptions], ...] = (
    ("tflite fp32", "tflite", "none", TableOptions()),
    ("tflite float16", "tflite", "float16", TableOptions()),
    ("tflite dynamic-int8", "tflite", "dynamic-int8", TableOptions()),
    ("onnx fp32", "onnx", "none", TableOptions()),
    ("onnx float16", "onnx", "float16", TableOptions()),
    ("onnx dynamic-int8", "onnx", "dynamic-int8", TableOptions()),
    # angle by name: auto would write the plain file here (the rebuild outweighs a 64x32 table's bytes).
    ("tflite compress 16", "tflite", "none", TableOptions(compress=DEMO_COMPRESS, method="angle")),
    ("onnx compress 16", "onnx", "none", TableOptions(compress=DEMO_COMPRESS, method="angle")),
    ("tflite seed interp", "tflite", "none", TableOptions(compress=8, method="interp", allow_lossy=True)),
    ("learned tflite fp32", "tflite", "none", TableOptions()),
    ("learned svd rank 8", "tflite", "none", TableOptions(compress=12, method="svd", allow_lossy=True)),
    ("learned svd rank 4", "tflite", "none", TableOptions(compress=6, method="svd", allow_lossy=True)),
)
LEARNED_PREFIX = "learned "


@dataclass
class VariantResult:
    name: str
    export: ExportReport
    checks: list[ParityReport]  # one per installed runtime
    p50_ms: float | None
    errors: list[str]

    @property
    def lossy(self) -> bool:
        return bool(self.export.lossy_tables)

    @property
    def verdict(self) -> str:
        if self.errors:
            return "ERROR"
        if all(check.passed for check in self.checks):
            return "PASS"
        # accepted only where the export found the loss to be the tables' (lossy_reference.py)
        accepted = self.lossy and self.export.options.tables.allow_lossy and self.export.exit_code == 0
        return "LOSSY (accepted)" if accepted else "FAIL"

    def row(self) -> dict[str, Any]:
        first = self.checks[0] if self.checks else None
        logits = next((m for m in first.outputs if m.task_accuracy is not None), None) if first else None
        return {
            "variant": self.name,
            "file": self.export.output.name,
            "file_bytes": self.export.summary.file_bytes,
            "table_bytes": sum(t.bytes_after for t in self.export.tables) or None,
            "table_max_error": max((t.max_error for t in self.export.tables), default=None),
            "runtimes": [check.runtime for check in self.checks],
            "max_abs_error": max((c.outputs[0].max_abs for c in self.checks), default=None),
            "min_cosine": min((c.outputs[0].cosine for c in self.checks), default=None),
            "task_accuracy": logits.task_accuracy if logits else None,
            "reference_accuracy": logits.reference_accuracy if logits else None,
            "p50_ms": self.p50_ms,
            "verdict": self.verdict,
            "errors": self.errors,
        }


@dataclass
class DemoResult:
    directory: Path
    saved_model: Path
    variants: list[VariantResult]
    plot: Path | None

    @property
    def exit_code(self) -> ExitCode:
        failed = any(v.verdict in ("FAIL", "ERROR") for v in self.variants)
        return ExitCode.PARITY_FAILED if failed else ExitCode.OK

    def rows(self) -> list[dict[str, Any]]:
        return [variant.row() for variant in self.variants]


# What the demo writes in its folder; a folder that holds any of them and is not the demo's own (no marker)
# is the user's, and is not written into without --overwrite.
DEMO_MARKER = ".pe-export-demo"
DEMO_OUTPUTS = (
    "task_encoder",
    "learned_table_encoder",
    "golden",
    "golden_learned",
    "task_inputs.npz",
    "task_labels.npz",
    "report.json",
    "position_error.png",
    "encoder.*",
    "learned-table.encoder.*",
)


def check_demo_folder(directory: Path, *, overwrite: bool) -> None:
    """Before any work: the demo may write in ``directory`` (absent, its own, empty of its names, or
    --overwrite), and can."""
    from pe_export.errors import OutputExistsError
    from pe_export.fileio import check_output_folder

    directory = Path(directory)
    if directory.exists() and not directory.is_dir():
        raise BadInputError(f"--out {directory} is a file; expected a directory for the demo's outputs")
    if not directory.exists():
        check_output_folder(directory.parent, flag="--out", what=str(directory))
        return
    check_output_folder(directory, flag="--out", what=str(directory))
    if overwrite or (directory / DEMO_MARKER).is_file():
        return
    taken = sorted({path.name for pattern in DEMO_OUTPUTS for path in directory.glob(pattern)})
    if taken:
        raise OutputExistsError(
            f"--out {directory} already holds {', '.join(taken[:4])}{', …' if len(taken) > 4 else ''}, which the demo "
            "would replace; pass --overwrite to replace them, or --out a new folder"
        )


def run_demo(
    directory: Path = DEFAULT_DEMO_DIR,
    *,
    progress: Callable[[str], None] | None = None,
    quiet: bool = True,
    overwrite: bool = False,
) -> DemoResult:
    from pe_export.encoders import task
    from pe_export.fileio import folder_mode
    from pe_export.golden import GoldenOptions, make_golden
    from pe_export.native import import_tensorflow
    from pe_export.parity.bundle import IGNORED_LABEL

    directory = Path(directory)
    check_demo_folder(directory, overwrite=overwrite)
    directory.mkdir(parents=True, exist_ok=True, mode=folder_mode())
    (directory / DEMO_MARKER).write_text("written by pe-export demo; a rerun may replace this folder's files\n")
    steps = 3 + len(DEMO_VARIANTS)
    say = progress or (lambda _message: None)
    import_tensorflow()
    say(f"[1/{steps}] loading the trained task encoder (shift task, {task.WEIGHTS.stat().st_size:,} B of weights)")
    saved_model, learned_model = directory / "task_encoder", directory / "learned_table_encoder"
    task.load_trained_model().export(str(saved_model), verbose=False)
    task.load_trained_model(task.LEARNED_WEIGHTS, table_kind="learned").export(str(learned_model), verbose=False)

    say(f"[2/{steps}] writing a golden bundle of {DEMO_SAMPLES} task samples with labels")
    tokens, labels = task.task_data(DEMO_SAMPLES, task.TEST_SEED)
    labels[:, : task.SHIFT] = IGNORED_LABEL  # the first positions have nothing to copy
    np.savez(directory / "task_inputs.npz", token_ids=tokens)
    np.savez(directory / "task_labels.npz", **{task.LABEL_OUTPUT: labels})  # type: ignore[arg-type]  # numpy stub
    goldens = {saved_model: directory / "golden", learned_model: directory / "golden_learned"}
    for model, golden in goldens.items():
        make_golden(
            model,
            golden,
            GoldenOptions(
                inputs=directory / "task_inputs.npz", labels=directory / "task_labels.npz", batch=32, overwrite=True
            ),
        )

    variants = []
    for step, (name, target, quantize, tables) in enumerate(DEMO_VARIANTS, start=3):
        say(f"[{step}/{steps}] {name}: export, parity on every installed runtime, {BENCH_RUNS} timed runs")
        model = learned_model if name.startswith(LEARNED_PREFIX) else saved_model
        stem = name.removeprefix(LEARNED_PREFIX).split(" ", 1)[1].replace(" ", "-")
        output = directory / f"{'learned-table.' if model == learned_model else ''}encoder.{stem}.{target}"
        export = export_tflite if target == "tflite" else export_onnx
        # Verified as a user's export is (dynamic int8 is smoothed and judged on those inputs), then
        # checked on the golden bundle with every installed runtime.
        options = ExportOptions(quantize=quantize, overwrite=True, tables=tables)
        report = export(model, output, options, quiet=quiet)
        variants.append(_check_variant(name, report, goldens[model]))

    say(f"[{steps}/{steps}] writing report.json and the per-position error plot")
    plot = _plot(variants, directory / "position_error.png")
    result = DemoResult(directory, saved_model, variants, plot)
    atomic_write_bytes(
        directory / "report.json", json.dumps({"variants": result.rows()}, indent=2).encode(), overwrite=True
    )
    return result


def _check_variant(name: str, report: ExportReport, golden: Path) -> VariantResult:
    if not report.written:  # failed its own verification: nothing to check or time
        return VariantResult(name, report, [], None, [f"not written: it failed verification ({report.output})"])
    checks, errors = [], []
    for runtime in installed_runners(report.output):
        try:
            checks.append(check_parity(report.output, golden, ParityOptions(runtime=runtime, isolate=False)))
        except PeExportError as err:
            errors.append(f"{runtime}: {err}")
    return VariantResult(name, report, checks, _p50_ms(report.output, golden), errors)


def _p50_ms(path: Path, golden: Path) -> float | None:
    from pe_export.parity.bundle import load_bundle

    runtime = first_installed_runner(path)
    if runtime is None:
        return None
    feed = {k: v[:1] for k, v in next(load_bundle(golden).batches()).inputs.items()}
    with create_runner(runtime, path, threads=1) as runner:
        return statistics.median(time_calls(runner, feed, BENCH_RUNS, warmup=5))


def _plot(variants: list[VariantResult], path: Path) -> Path | None:
    try:
        from pe_export.parity.plot import write_profile_plot

        write_profile_plot([(v.name, v.checks[0]) for v in variants if v.checks], path)
    except PeExportError:  # matplotlib missing: the table still says everything
        return None
    return path
