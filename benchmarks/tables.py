"""Position-table compression, side by side: table bytes, file bytes with and without
`--compress 64`, and inference latency of the compressed file against the plain one.

    python benchmarks/tables.py [--runs 200]

Cases: the 512×512 table in a minimal model (embedding + table + LayerNorm + Dense, so the
table rebuild dominates) at a fixed and a dynamic length, an 8192×256 table, and the same
512×512 table in a deployment-sized encoder (d=512, 2 blocks, 8 heads, FFN 2048).
Latency is the median over --runs calls of the same runners that
`pe-export parity` uses (ai-edge-litert, onnxruntime CPU), after 20 warm-up calls.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from pe_export.api import export_onnx, export_tflite  # noqa: E402
from pe_export.bench import time_calls  # noqa: E402
from pe_export.converters.options import ExportOptions  # noqa: E402
from pe_export.encoders.variants import sinusoid_constant, sinusoid_encoder  # noqa: E402
from pe_export.native import import_tensorflow  # noqa: E402
from pe_export.runners import create_runner  # noqa: E402
from pe_export.tables.pipeline import TableOptions  # noqa: E402

CASES = (  # name, builder, builder options, sequence length in the SavedModel, length to run at
    ("512x512 fixed", sinusoid_constant, {"length": 512, "width": 512}, 512, 512),
    ("512x512 dynamic", sinusoid_constant, {"length": 512, "width": 512}, None, 128),
    ("8192x256 dynamic", sinusoid_constant, {"length": 8192, "width": 256, "head": False}, None, 512),
    ("encoder fixed", sinusoid_encoder, {}, 512, 512),
    ("encoder dynamic", sinusoid_encoder, {}, None, 128),
)
RUNNERS = {"tflite": "litert", "onnx": "onnxruntime"}


def median_latency_ms(path: Path, runtime: str, feed: dict[str, np.ndarray], runs: int) -> float:
    with create_runner(runtime, path, threads=1) as runner:
        return statistics.median(time_calls(runner, feed, runs, warmup=20))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=200)
    args = parser.parse_args()
    import_tensorflow()
    work = Path(tempfile.mkdtemp(prefix="pe-export-tables-"))
    header = (
        f"{'case':<17} {'file':<6} {'table B':>10} {'stored B':>9} {'plain file B':>13} {'--compress 64 B':>15} "
        f"{'saved B':>10} {'plain ms':>9} {'compressed ms':>13} {'ratio':>6} {'max abs err':>11}"
    )
    print(header)
    for name, builder, builder_options, seq_len, run_len in CASES:
        saved_model = work / name.replace(" ", "_")
        builder(seq_len, **builder_options).export(str(saved_model), verbose=False)
        feed = {"token_ids": np.random.default_rng(0).integers(1, 64, (1, run_len)).astype(np.int32)}
        for target, export in (("tflite", export_tflite), ("onnx", export_onnx)):
            plain_path, small_path = work / f"{saved_model.name}.{target}", work / f"{saved_model.name}.64.{target}"
            plain = export(saved_model, plain_path, ExportOptions(verify=False))
            small = export(saved_model, small_path, ExportOptions(tables=TableOptions(compress=64)))
            (table,) = small.tables
            plain_ms = median_latency_ms(plain_path, RUNNERS[target], feed, args.runs)
            small_ms = median_latency_ms(small_path, RUNNERS[target], feed, args.runs)
            error = small.parity.max_abs if small.parity else float("nan")
            print(
                f"{name:<17} {target:<6} {table.bytes_before:>10,} {table.bytes_after:>9,} "
                f"{plain.summary.file_bytes:>13,} {small.summary.file_bytes:>15,} "
                f"{plain.summary.file_bytes - small.summary.file_bytes:>10,} {plain_ms:>9.3f} {small_ms:>13.3f} "
                f"{small_ms / plain_ms:>5.2f}x {error:>11.2g}"
            )


if __name__ == "__main__":
    main()
