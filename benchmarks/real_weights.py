"""Real weights, side by side: all-MiniLM-L6-v2 exported in every precision and with --compress 64,
each judged on real sentences (worst sentence's cosine of mean-pooled embeddings against float32
TensorFlow, one sentence per call, unpadded), with file bytes and p50 latency (batch 1, one thread).

    python benchmarks/real_weights.py [--runs 100]

pe-export's int8 rows are set beside the converters' own defaults: the TFLite converter's
dynamic-range mode (what `--quantize dynamic-int8` runs for TFLite) and onnxruntime's
`quantize_dynamic` with its default per-tensor weights.
"""

from __future__ import annotations

import argparse
import logging
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
from pe_export.errors import PeExportError  # noqa: E402
from pe_export.native import import_tensorflow  # noqa: E402
from pe_export.runners import create_runner  # noqa: E402
from pe_export.tables.pipeline import TableOptions  # noqa: E402
from pe_export.text_inputs import TextInputs  # noqa: E402
from tests.fixtures.pretrained import SENTENCES, minilm  # noqa: E402

RUNNERS = {"tflite": "litert", "onnx": "onnxruntime"}
VARIANTS = (  # label, format, options beyond --text
    ("fp32", "tflite", {}),
    ("float16", "tflite", {"quantize": "float16"}),
    ("float16 --compress 64", "tflite", {"quantize": "float16", "tables": TableOptions(compress=64)}),
    ("--compress 64", "tflite", {"tables": TableOptions(compress=64)}),
    ("dynamic-int8 (= converter default)", "tflite", {"quantize": "dynamic-int8"}),
    ("fp32", "onnx", {}),
    ("float16", "onnx", {"quantize": "float16"}),
    ("--compress 64", "onnx", {"tables": TableOptions(compress=64)}),
    ("dynamic-int8", "onnx", {"quantize": "dynamic-int8"}),
    ("dynamic-int8 --min-cosine 0.999", "onnx", {"quantize": "dynamic-int8", "min_cosine": 0.999}),
    ("weight-int8 (storage only)", "onnx", {"quantize": "weight-int8"}),
)
ONNX_FP32 = 5  # the row whose file onnxruntime's own default quantizes


def sentence_feeds(tokenizer: Path) -> list[dict[str, np.ndarray]]:
    from tokenizers import Tokenizer

    encoder = Tokenizer.from_file(str(tokenizer))
    encoder.no_padding()
    feeds = []
    for sentence in SENTENCES:
        ids = np.array([encoder.encode(sentence).ids], np.int32)
        feeds.append({"token_ids": ids, "padding_mask": np.ones_like(ids), "segment_ids": np.zeros_like(ids)})
    return feeds


def worst_cosine(outputs: list[np.ndarray], reference: list[np.ndarray]) -> float:
    worst = 1.0
    for got, want in zip(outputs, reference, strict=True):
        a, b = got[0].mean(axis=0).astype(np.float64), want[0].mean(axis=0).astype(np.float64)
        worst = min(worst, float(a @ b / np.linalg.norm(a) / np.linalg.norm(b)))
    return worst


def measure(path: Path, runtime: str, feeds: list[dict[str, np.ndarray]], runs: int) -> tuple[list[np.ndarray], float]:
    with create_runner(runtime, path, threads=1) as runner:
        outputs = [runner.infer(feed)["sequence_output"] for feed in feeds]
        p50 = statistics.median(time_calls(runner, feeds[1], runs, warmup=10))
    return outputs, p50


def onnxruntime_default_int8(fp32: Path, output: Path) -> None:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    logging.getLogger().setLevel(logging.ERROR)
    quantize_dynamic(str(fp32), str(output), weight_type=QuantType.QInt8)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=100)
    args = parser.parse_args()
    tf = import_tensorflow()
    saved, tokenizer, sentences = minilm()
    feeds = sentence_feeds(tokenizer)
    signature = tf.saved_model.load(str(saved)).signatures["serving_default"]
    reference = [signature(**{k: tf.constant(v) for k, v in feed.items()})["sequence_output"].numpy() for feed in feeds]
    text = TextInputs(sentences, tokenizer)
    work = Path(tempfile.mkdtemp(prefix="pe-export-real-"))
    print(f"{'format':<7} {'variant':<36} {'exit':>4} {'file B':>12} {'× fp32':>7} {'cosine':>10} {'p50 ms':>8} "
          f"{'× fp32':>7}")  # fmt: skip
    base: dict[str, tuple[int, float]] = {}
    rows = [*VARIANTS, ("onnxruntime quantize_dynamic default", "onnx", None)]
    for index, (label, target, extra) in enumerate(rows):
        path = work / f"{index}.{target}"
        if extra is None:
            onnxruntime_default_int8(work / f"{ONNX_FP32}.onnx", path)
            code = "-"
        else:
            export = export_tflite if target == "tflite" else export_onnx
            try:
                code = str(int(export(saved, path, ExportOptions(text=text, **extra)).exit_code))
            except PeExportError as err:
                code = str(int(err.exit_code))
        outputs, p50 = measure(path, RUNNERS[target], feeds, args.runs)
        size = path.stat().st_size
        base.setdefault(target, (size, p50))
        print(f"{target:<7} {label:<36} {code:>4} {size:>12,} {size / base[target][0]:>6.2f}x "
              f"{worst_cosine(outputs, reference):>10.7f} {p50:>8.2f} {p50 / base[target][1]:>6.2f}x", flush=True)


if __name__ == "__main__":
    main()
