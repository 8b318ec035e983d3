"""A deployment-sized sinusoid encoder in every runtime, side by side on this CPU, with ratios to TensorFlow;
and pe-export's own conversion time against a bare converter call.

    python benchmarks/side_by_side.py [--runs 50] [--seq-len 128]

Model: the deployment-sized encoder of pe_export.encoders.variants.sinusoid_encoder (d=512,
2 blocks, 8 heads, FFN 2048, 512×512 sinusoid table, dynamic sequence length), batch 1.
Latency is the median of --runs single-threaded calls on the same runners `pe-export bench`
uses, after 10 warm-up calls.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from pe_export.api import export_onnx, export_tflite  # noqa: E402
from pe_export.bench import time_calls  # noqa: E402
from pe_export.converters.options import ExportOptions  # noqa: E402
from pe_export.encoders.variants import sinusoid_encoder  # noqa: E402
from pe_export.host import describe_host  # noqa: E402
from pe_export.native import capture_native_output, import_tensorflow  # noqa: E402
from pe_export.runners import create_runner  # noqa: E402
from pe_export.runners.savedmodel import SavedModelRunner  # noqa: E402
from pe_export.tables.pipeline import TableOptions  # noqa: E402

VARIANTS = (  # name, target, quantize, tables
    ("tflite fp32", "tflite", "none", TableOptions()),
    ("tflite fp16", "tflite", "float16", TableOptions()),
    ("tflite dynamic-int8", "tflite", "dynamic-int8", TableOptions()),
    ("tflite fp32 --compress 64", "tflite", "none", TableOptions(compress=64)),
    ("onnx fp32", "onnx", "none", TableOptions()),
    ("onnx dynamic-int8", "onnx", "dynamic-int8", TableOptions()),
    ("onnx fp32 --compress 64", "onnx", "none", TableOptions(compress=64)),
)
RUNTIMES = {"tflite": "litert", "onnx": "onnxruntime"}


def p50_ms(runner, feed: dict[str, np.ndarray], runs: int) -> float:
    with runner:
        return statistics.median(time_calls(runner, feed, runs, warmup=10))


def conversion_times(saved_model: Path, work: Path, repeats: int = 2) -> tuple[float, float]:
    """(bare TFLiteConverter.from_saved_model, pe-export tflite without verification), best of repeats."""
    tf = import_tensorflow()
    bare, ours = [], []
    for index in range(repeats):
        started = time.perf_counter()
        converter = tf.lite.TFLiteConverter.from_saved_model(str(saved_model))
        converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS, tf.lite.OpsSet.SELECT_TF_OPS]
        with capture_native_output():
            (work / f"bare{index}.tflite").write_bytes(converter.convert())
        bare.append(time.perf_counter() - started)
        started = time.perf_counter()
        export_tflite(saved_model, work / f"ours{index}.tflite", ExportOptions(verify=False, overwrite=True))
        ours.append(time.perf_counter() - started)
    return min(bare), min(ours)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--seq-len", type=int, default=128)
    args = parser.parse_args()
    import_tensorflow()
    work = Path(tempfile.mkdtemp(prefix="pe-export-side-"))
    saved_model = work / "encoder"
    sinusoid_encoder(None).export(str(saved_model), verbose=False)
    feed = {"token_ids": np.random.default_rng(0).integers(1, 64, (1, args.seq_len)).astype(np.int32)}
    print(
        f"machine: {describe_host().line()}; "
        f"Python {platform.python_version()}; TFLite and ONNX Runtime one thread, TensorFlow its default pool; "
        f"batch 1, sequence {args.seq_len}"
    )
    tf_ms = p50_ms(SavedModelRunner(saved_model), feed, args.runs)
    tf_bytes = sum(p.stat().st_size for p in saved_model.rglob("*") if p.is_file())
    print(f"{'variant':<27} {'file B':>12} {'p50 ms':>8} {'× TF':>6} {'max abs err':>11}")
    print(f"{'TF SavedModel (reference)':<27} {tf_bytes:>12,} {tf_ms:>8.2f} {1.0:>6.2f} {'-':>11}")
    for name, target, quantize, tables in VARIANTS:
        path = work / f"{name.replace(' ', '_').replace('-', '')}.{target}"
        export = export_tflite if target == "tflite" else export_onnx
        report = export(saved_model, path, ExportOptions(quantize=quantize, tables=tables))
        ms = p50_ms(create_runner(RUNTIMES[target], path, threads=1), feed, args.runs)
        error = f"{report.parity.max_abs:.2g}" if report.parity else "-"
        print(f"{name:<27} {report.summary.file_bytes:>12,} {ms:>8.2f} {ms / tf_ms:>6.2f} {error:>11}")
    bare, ours = conversion_times(saved_model, work)
    print(
        f"conversion: bare TFLiteConverter.from_saved_model {bare:.2f} s, pe-export tflite (no verify) "
        f"{ours:.2f} s: {ours / bare:.2f}x"
    )


if __name__ == "__main__":
    main()
