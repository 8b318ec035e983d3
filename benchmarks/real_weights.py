"""Real weights, side by side: all-MiniLM-L6-v2 exported in every precision and with --compress 64,
each judged on real sentences (worst sentence's cosine of mean-pooled embeddings against float32
TensorFlow, one sentence per call, unpadded), with file bytes and p50 latency (batch 1, one thread; each file
timed taking turns with its format's fp32 file, the ratio the median of the rounds' ratios).

    python benchmarks/real_weights.py [--runs 100] [--formats tflite onnx] [--sentences varied] [--only int8]

Two cosines: on the sentences the export was given with --text (what it calibrated, smoothed and
judged on), and on held-out sentences it never saw; with ``--sentences varied`` a third, ``fresh``: 24
sentences written after the flow was set (benchmarks/data/varied_fresh.txt), which no export is given, not even
as --holdout (whose figure the gate, and so the search's target, sees), and a fourth, ``unseen``: 24 more
(benchmarks/data/varied_unseen.txt) written before dynamic int8's choice margin was set, after the fresh ones had
been looked at in choosing it. ``--sentences suite``: the suite's 8 and 12 (the
shortest a 3-token "yes"); ``--sentences varied``: benchmarks/data's 48 and 32 (issue 25's flow), the 32
also passed as --holdout, which judges int8's choices and gates the file (a file its gate refuses, exit 1,
is measured as --keep-failed keeps it). pe-export's int8 rows are set beside the converters' own
defaults: the TFLite converter's dynamic-range mode and onnxruntime's `quantize_dynamic` with its default
per-tensor weights. ``--only TEXT`` keeps the rows whose label holds
TEXT (and each format's fp32 row, the base of the ratios).
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from pe_export.api import export_onnx, export_tflite  # noqa: E402
from pe_export.converters.options import ExportOptions  # noqa: E402
from pe_export.errors import PeExportError  # noqa: E402
from pe_export.host import describe_host  # noqa: E402
from pe_export.native import import_tensorflow  # noqa: E402
from pe_export.runners import create_runner  # noqa: E402
from pe_export.tables.pipeline import TableOptions  # noqa: E402
from pe_export.text_inputs import TextInputs  # noqa: E402
from tests.fixtures.pretrained import HELD_OUT, SENTENCES, minilm  # noqa: E402

RUNNERS = {"tflite": "litert", "onnx": "onnxruntime"}
VARIANTS = (  # label, format, options beyond --text; a string: a converter's own mode (``runtime_default``)
    ("fp32", "tflite", {}),
    ("float16", "tflite", {"quantize": "float16"}),
    ("float16 --compress 64", "tflite", {"quantize": "float16", "tables": TableOptions(compress=64)}),
    ("--compress 64", "tflite", {"tables": TableOptions(compress=64)}),
    ("TFLite converter dynamic-range default", "tflite", "tflite-dynamic"),
    ("TFLite converter full int8 (the given sentences)", "tflite", "tflite-full-int8"),
    ("TFLite converter 16x8 (int16 activations, int8 weights)", "tflite", "tflite-16x8"),
    ("int8 (full integer)", "tflite", {"quantize": "int8"}),
    # at the fixed shape an NPU compiles: each sentence padded to 64 (p50 then at 64 positions, not the median's)
    ("int8 (full integer) --batch 1 --seq-len 64", "tflite", {"quantize": "int8", "batch": 1, "seq_len": 64}),
    ("dynamic-int8", "tflite", {"quantize": "dynamic-int8"}),
    ("dynamic-int8 --min-cosine 0.999", "tflite", {"quantize": "dynamic-int8", "min_cosine": 0.999}),
    ("fp32", "onnx", {}),
    ("float16 (float16 arithmetic)", "onnx", {"quantize": "float16"}),
    ("weight-float16 (storage only)", "onnx", {"quantize": "weight-float16"}),
    ("--compress 64", "onnx", {"tables": TableOptions(compress=64)}),
    ("dynamic-int8 --int8-kernel matmulinteger", "onnx", {"quantize": "dynamic-int8", "int8_kernel": "matmulinteger"}),
    (
        "dynamic-int8 --int8-kernel matmulinteger --min-cosine 0.999",
        "onnx",
        {"quantize": "dynamic-int8", "int8_kernel": "matmulinteger", "min_cosine": 0.999},
    ),
    ("dynamic-int8 --int8-kernel blocks", "onnx", {"quantize": "dynamic-int8", "int8_kernel": "blocks"}),
    (
        "dynamic-int8 --int8-kernel blocks --min-cosine 0.999",
        "onnx",
        {"quantize": "dynamic-int8", "int8_kernel": "blocks", "min_cosine": 0.999},
    ),
    ("dynamic-int8 --int8-kernel mixed", "onnx", {"quantize": "dynamic-int8", "int8_kernel": "mixed"}),
    (
        "dynamic-int8 --int8-kernel mixed --min-cosine 0.999",
        "onnx",
        {"quantize": "dynamic-int8", "int8_kernel": "mixed", "min_cosine": 0.999},
    ),
    ("dynamic-int8 --outlier-channels 0", "onnx", {"quantize": "dynamic-int8", "outlier_channels": 0}),
    ("dynamic-int8", "onnx", {"quantize": "dynamic-int8"}),
    (
        "dynamic-int8 --outlier-channels 0 --min-cosine 0.999",
        "onnx",
        {"quantize": "dynamic-int8", "min_cosine": 0.999, "outlier_channels": 0},
    ),
    ("dynamic-int8 --min-cosine 0.999", "onnx", {"quantize": "dynamic-int8", "min_cosine": 0.999}),
    ("int8 (static QDQ)", "onnx", {"quantize": "int8"}),
    ("int8 (static QDQ) --min-cosine 0.999", "onnx", {"quantize": "int8", "min_cosine": 0.999}),
    ("weight-int8 (storage only)", "onnx", {"quantize": "weight-int8"}),
    ("onnxruntime quantize_dynamic default", "onnx", "ort-dynamic"),
    ("onnxruntime quantize_static QDQ default", "onnx", "ort-static"),
    ("onnxruntime quantize_static QDQ per-channel, MatMul only", "onnx", "ort-static-matmul"),
)


DATA = REPO / "benchmarks" / "data"


def sentence_sets(which: str, work: Path) -> tuple[Path, tuple[str, ...], Path | None, tuple[str, ...]]:
    """(--text file, its sentences, --holdout file or None, held-out sentences) of ``--sentences``."""
    if which == "suite":
        given = work / "given.txt"
        given.write_text("\n".join(SENTENCES) + "\n", encoding="utf-8")
        return given, SENTENCES, None, HELD_OUT
    calibration, held_out = DATA / "varied_calibration.txt", DATA / "varied_held_out.txt"
    lines = [tuple(p.read_text(encoding="utf-8").splitlines()) for p in (calibration, held_out)]
    return calibration, lines[0], held_out, lines[1]


def fresh_sentences(which: str, name: str = "varied_fresh.txt") -> tuple[str, ...]:
    """Sentences no export of ``--sentences`` is given in any form (none for the suite's): benchmarks/data's
    ``name``."""
    if which == "suite":
        return ()
    return tuple((DATA / name).read_text(encoding="utf-8").splitlines())


def sentence_feeds(tokenizer: Path, sentences: tuple[str, ...]) -> list[dict[str, np.ndarray]]:
    from tokenizers import Tokenizer

    encoder = Tokenizer.from_file(str(tokenizer))
    encoder.no_padding()
    feeds = []
    for sentence in sentences:
        ids = np.array([encoder.encode(sentence).ids], np.int32)
        feeds.append({"token_ids": ids, "padding_mask": np.ones_like(ids), "segment_ids": np.zeros_like(ids)})
    return feeds


def worst_cosine(outputs: list[np.ndarray], reference: list[np.ndarray]) -> float:
    worst = 1.0
    for got, want in zip(outputs, reference, strict=True):
        a, b = got[0].mean(axis=0).astype(np.float64), want[0].mean(axis=0).astype(np.float64)
        worst = min(worst, float(a @ b / np.linalg.norm(a) / np.linalg.norm(b)))
    return worst


def worst_cosines(outputs: list[np.ndarray], reference: list[np.ndarray], counts: list[int]) -> str:
    """The worst cosine of each run of ``counts`` sentences in turn, as columns ("-" for none)."""
    ends = np.cumsum([0, *counts])
    return " ".join(
        f"{worst_cosine(outputs[a:b], reference[a:b]):>10.7f}" if b > a else f"{'-':>10}"
        for a, b in itertools.pairwise(ends)
    )


# Timing runs in a fresh interpreter that never imports TensorFlow: in the exporting process TF's idle
# thread pools share the two cores with the runtime, which slowed onnxruntime's int8 kernels most
# (all-int8 ONNX MiniLM: 0.68× of fp32 there, 0.43× in a clean process).
# The file and its format's fp32 file take turns in one process (``rounds`` of ``runs`` calls each), so that this
# machine's drift (20-30% between processes on a 2-core host) falls on both alike: the ratio is the median over
# rounds of the file's median against fp32's in the same round.
TIMING = """
import json, statistics, sys
import numpy as np
from pathlib import Path
from pe_export.bench import time_calls
from pe_export.runners import create_runner
paths, runtime, runs, rounds = json.loads(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
feeds = [dict(np.load(f)) for f in json.loads(sys.argv[5])]
runners = [create_runner(runtime, Path(p), threads=1) for p in paths]
for runner in runners:
    runner.activate()
medians = [[] for _ in paths]
for _ in range(rounds):
    for median, runner, feed in zip(medians, runners, feeds):
        median.append(statistics.median(time_calls(runner, feed, runs, warmup=10)))
ratios = [a / b for a, b in zip(medians[0], medians[-1])]
print(json.dumps([statistics.median(medians[0]), statistics.median(ratios)]))
"""
ROUNDS = 10


def timed_feed(feeds: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """The sentence p50 is timed on: the given one of median length (a 2-token "ok" times the runtime's call)."""
    return sorted(feeds, key=lambda feed: feed["token_ids"].shape[1])[len(feeds) // 2]


def padded(feed: dict[str, np.ndarray], length: int | None) -> dict[str, np.ndarray]:
    """A sentence as a fixed-length file takes it: zeros past its tokens (the padding mask says so)."""
    if length is None:
        return feed
    return {k: np.pad(v, ((0, 0), (0, length - v.shape[1]))) for k, v in feed.items()}


def measure(
    path: Path,
    runtime: str,
    feeds: list[dict[str, np.ndarray]],
    timed: dict[str, np.ndarray],
    runs: int,
    base: Path | None = None,
) -> tuple[list[np.ndarray], float, float]:
    """The file's outputs on ``feeds``, its p50 (ms) and its p50 against ``base``'s (timed taking turns with it;
    1.0 without one)."""
    outputs = []
    fed = []
    for timed_path in [path] if base is None else [path, base]:
        with create_runner(runtime, timed_path, threads=1) as runner:
            length = runner.input_specs()[0].shape[-1]  # None where the sequence axis is dynamic
            if timed_path == path:
                outputs = [
                    runner.infer(padded(feed, length))["sequence_output"][:, : feed["token_ids"].shape[1]]
                    for feed in feeds
                ]
        feed_file = timed_path.with_suffix(".feed.npz")
        np.savez(feed_file, **padded(timed, length))
        fed.append(feed_file)
    paths = [str(path)] if base is None else [str(path), str(base)]
    feeds_arg = [json.dumps([str(f) for f in fed])]
    result = subprocess.run(
        [sys.executable, "-c", TIMING, json.dumps(paths), runtime, str(-(-runs // ROUNDS)), str(ROUNDS), *feeds_arg],
        capture_output=True,
        text=True,
        check=True,
        cwd=REPO,
    )
    p50, ratio = json.loads(result.stdout.strip().splitlines()[-1])
    return outputs, float(p50), float(ratio)


def runtime_default(mode: str, saved: Path, fp32: Path, output: Path, given: list[dict[str, np.ndarray]]) -> None:
    """The int8 a user gets without pe-export: the TFLite converter's modes (dynamic range; full int8 and 16x8
    with the given sentences as the representative dataset, one per call), onnxruntime's quantize_dynamic and
    quantize_static with their defaults, and static per-channel on the MatMuls only (on pe-export's fp32 file,
    calibrated on the given sentences)."""
    if mode.startswith("tflite"):
        tf = import_tensorflow()
        converter = tf.lite.TFLiteConverter.from_saved_model(str(saved))
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
        if mode != "tflite-dynamic":
            converter.representative_dataset = lambda: ({k: v for k, v in feed.items()} for feed in given)
            ops = tf.lite.OpsSet
            int16 = ops.EXPERIMENTAL_TFLITE_BUILTINS_ACTIVATIONS_INT16_WEIGHTS_INT8
            converter.target_spec.supported_ops = [int16 if mode == "tflite-16x8" else ops.TFLITE_BUILTINS_INT8]
        output.write_bytes(converter.convert())
        return
    from onnxruntime.quantization import CalibrationDataReader, QuantType, quantize_dynamic, quantize_static

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.feeds = iter(given)

        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(self.feeds, None)

    logging.getLogger().setLevel(logging.ERROR)
    if mode == "ort-dynamic":
        quantize_dynamic(str(fp32), str(output), weight_type=QuantType.QInt8)
    elif mode == "ort-static":
        quantize_static(str(fp32), str(output), Reader())
    else:
        quantize_static(str(fp32), str(output), Reader(), per_channel=True, op_types_to_quantize=["MatMul"])


def make_row(
    label: str,
    target: str,
    extra: dict[str, Any] | str,
    path: Path,
    saved: Path,
    given: list[dict[str, np.ndarray]],
    text: TextInputs,
    holdout: Path | None,
) -> tuple[Path | None, str]:
    """A row's file (None where nothing was written, the row then printed) and its exit code ("-" for a
    converter's own mode)."""
    if isinstance(extra, str):
        fp32 = path.with_name(f"{VARIANTS.index(('fp32', target, {}))}.{target}")
        try:
            runtime_default(extra, saved, fp32, path, given)
        except Exception as err:  # the converter's own failure is the row's figure
            print(f"{target:<7} {label:<52} fails: {str(err).strip().splitlines()[-1][:160]}", flush=True)
            return None, "-"
        return path, "-"
    export = export_tflite if target == "tflite" else export_onnx
    options = ExportOptions(text=text, holdout=holdout, keep_failed=True, **extra)
    try:
        code = str(int(export(saved, path, options).exit_code))
    except PeExportError as err:
        code = str(int(err.exit_code))
    failed = path.with_name(f"{path.stem}.FAILED{path.suffix}")  # refused by its gate: kept to be measured
    if not path.exists() and failed.exists():
        path = failed
    if not path.exists():
        print(f"{target:<7} {label:<52} {code:>4} (nothing written)", flush=True)
        return None, code
    return path, code


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--formats", nargs="+", choices=sorted(RUNNERS), default=sorted(RUNNERS, reverse=True))
    parser.add_argument("--sentences", choices=("suite", "varied"), default="suite")
    parser.add_argument("--only", default=None, help="rows whose label holds this text (and fp32)")
    args = parser.parse_args()
    tf = import_tensorflow()
    saved, tokenizer, _ = minilm()
    work = Path(tempfile.mkdtemp(prefix="pe-export-real-"))
    sentences, given_text, holdout, held_out_text = sentence_sets(args.sentences, work)
    given, held_out = sentence_feeds(tokenizer, given_text), sentence_feeds(tokenizer, held_out_text)
    fresh = sentence_feeds(tokenizer, fresh_sentences(args.sentences))
    unseen = sentence_feeds(tokenizer, fresh_sentences(args.sentences, "varied_unseen.txt"))
    signature = tf.saved_model.load(str(saved)).signatures["serving_default"]
    reference = [
        signature(**{k: tf.constant(v) for k, v in feed.items()})["sequence_output"].numpy()
        for feed in given + held_out + fresh + unseen
    ]
    text = TextInputs(sentences, tokenizer)
    timed = timed_feed(given)
    print(
        f"sentences: {len(given)} given with --text, {len(held_out)} held out ({args.sentences}); p50 on one of "
        f"{timed['token_ids'].shape[1]} tokens, batch 1, one thread"
    )
    print(f"host: {describe_host().line()}")
    print(
        f"{'format':<7} {'variant':<52} {'exit':>4} {'file B':>12} {'× fp32':>7} {'cosine':>10} {'held-out':>10} "
        f"{'fresh':>10} {'unseen':>10} {'p50 ms':>8} {'× fp32':>7}"
    )
    base: dict[str, tuple[int, Path]] = {}  # each format's fp32 file: its bytes, where it is
    for index, (label, target, extra) in enumerate(VARIANTS):
        if target not in args.formats or (args.only and args.only not in label and label != "fp32"):
            continue
        path, code = make_row(label, target, extra, work / f"{index}.{target}", saved, given, text, holdout)
        if path is None:
            continue
        fp32 = base.get(target)
        outputs, p50, ratio = measure(
            path, RUNNERS[target], given + held_out + fresh + unseen, timed, args.runs, fp32[1] if fp32 else None
        )
        size = path.stat().st_size
        base.setdefault(target, (size, path))
        cosines = worst_cosines(outputs, reference, [len(given), len(held_out), len(fresh), len(unseen)])
        print(
            f"{target:<7} {label:<52} {code:>4} {size:>12,} {size / base[target][0]:>6.2f}x {cosines} {p50:>8.2f} "
            f"{ratio:>6.2f}x",
            flush=True,
        )


if __name__ == "__main__":
    main()
