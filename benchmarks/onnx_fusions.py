"""tf2onnx's graph as written beside pe-export's fused one (LayerNorms as LayerNormalization, Tensordots as one
MatMul: pe_export/converters/onnx/fusions.py), on all-MiniLM-L6-v2: nodes, bytes, the worst held-out sentence's pooled
cosine against float32 TensorFlow, and p50 (batch 1, one thread) timed in one process that never imports
TensorFlow, the files taking turns so that the machine's drift falls on all of them alike.

    python benchmarks/onnx_fusions.py [--quantize none dynamic-int8] [--runs 100] [--rounds 6]

dynamic-int8 exports are given benchmarks/data's 48 varied sentences with --text and judged on its 32 others
(--holdout), as real_weights.py's; ``--min-cosine`` is passed on where given.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from real_weights import sentence_feeds, sentence_sets, timed_feed, worst_cosine  # noqa: E402

from pe_export.api import export_onnx  # noqa: E402
from pe_export.converters.options import ExportOptions  # noqa: E402
from pe_export.host import describe_host  # noqa: E402
from pe_export.native import import_tensorflow  # noqa: E402
from pe_export.runners import create_runner  # noqa: E402
from pe_export.text_inputs import TextInputs  # noqa: E402
from tests.fixtures.pretrained import minilm  # noqa: E402

# Every file's calls, round by round: each round times every file in turn (runs calls after 10 untimed).
TIMING = """
import json, sys
import numpy as np
from pathlib import Path
from pe_export.bench import time_calls
from pe_export.runners import create_runner
paths, feed, runs, rounds = json.loads(sys.argv[1]), dict(np.load(sys.argv[2])), int(sys.argv[3]), int(sys.argv[4])
runners = [create_runner("onnxruntime", Path(p), threads=1) for p in paths]
for runner in runners:
    runner.activate()
times = {p: [] for p in paths}
for _ in range(rounds):
    for path, runner in zip(paths, runners):
        times[path] += time_calls(runner, feed, runs, warmup=10)
print(json.dumps({p: float(np.median(t)) for p, t in times.items()}))
"""


def node_count(path: Path) -> int:
    import onnx

    return len(onnx.load(str(path), load_external_data=False).graph.node)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quantize", nargs="+", default=["none", "dynamic-int8"])
    parser.add_argument("--min-cosine", type=float, default=None)
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=6)
    args = parser.parse_args()
    tf = import_tensorflow()
    saved, tokenizer, _ = minilm()
    work = Path(tempfile.mkdtemp(prefix="pe-export-fusions-"))
    sentences, given_text, holdout, held_out_text = sentence_sets("varied", work)
    given, held_out = sentence_feeds(tokenizer, given_text), sentence_feeds(tokenizer, held_out_text)
    signature = tf.saved_model.load(str(saved)).signatures["serving_default"]
    reference = [signature(**{k: tf.constant(v) for k, v in f.items()})["sequence_output"].numpy() for f in held_out]
    text = TextInputs(sentences, tokenizer)
    rows = []
    for quantize in args.quantize:
        for fuse in (False, True):
            path = work / f"{quantize}.{'fused' if fuse else 'as-written'}.onnx"
            options = ExportOptions(
                quantize=quantize, fuse=fuse, text=text, holdout=holdout, keep_failed=True, min_cosine=args.min_cosine
            )
            code = int(export_onnx(saved, path, options).exit_code)
            failed = path.with_name(f"{path.stem}.FAILED{path.suffix}")
            path = failed if not path.exists() and failed.exists() else path
            with create_runner("onnxruntime", path, threads=1) as runner:
                outputs = [runner.infer(feed)["sequence_output"] for feed in held_out]
            rows.append((quantize, fuse, code, path, worst_cosine(outputs, reference)))
    feed = work / "timed.npz"
    timed = timed_feed(given)
    np.savez(feed, **timed)
    paths = [str(row[3]) for row in rows]
    result = subprocess.run(
        [sys.executable, "-c", TIMING, json.dumps(paths), str(feed), str(args.runs), str(args.rounds)],
        capture_output=True,
        text=True,
        check=True,
        cwd=REPO,
    )
    p50 = json.loads(result.stdout.strip().splitlines()[-1])
    print(
        f"all-MiniLM-L6-v2, onnxruntime CPU, p50 on one sentence of {timed['token_ids'].shape[1]} tokens, batch 1, "
        f"one thread, {args.rounds} rounds x {args.runs} calls taking turns; held-out: worst of {len(held_out)} "
        "sentences the export never saw, pooled cosine against TensorFlow"
    )
    print(f"host: {describe_host().line()}")
    print(
        f"{'quantize':<13} {'graph':<18} {'exit':>4} {'nodes':>6} {'file B':>12} {'held-out':>10} {'p50 ms':>7} "
        f"{'x as written':>12}"
    )
    written: dict[str, float] = {}
    for quantize, fuse, code, path, cosine in rows:
        ms = p50[str(path)]
        written.setdefault(quantize, ms)
        graph = "fused" if fuse else "tf2onnx as written"
        print(
            f"{quantize:<13} {graph:<18} {code:>4} {node_count(path):>6} {path.stat().st_size:>12,} {cosine:>10.7f} "
            f"{ms:>7.2f} {ms / written[quantize]:>11.2f}x"
        )


if __name__ == "__main__":
    main()
