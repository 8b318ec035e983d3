"""Full-integer TFLite on real weights: all-MiniLM-L6-v2 at the fixed shape an NPU compiles ([1, 64]),
calibrated on 48 varied sentences and judged on 32 others it never saw (issue 25's flow, benchmarks/data),
through the CLI. Apart from the other pretrained modules so that they run side by side (--dist loadfile)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.helpers import run_cli

pytestmark = [
    pytest.mark.slow,  # minutes: excluded from the quick run (-m "not slow")
    pytest.mark.skipif(sys.version_info < (3, 11), reason="keras-hub 0.32 needs Python 3.11+"),
]


DATA = Path(__file__).resolve().parents[1] / "benchmarks" / "data"
TASK = re.compile(r"task level: sequence_output mean-pooled rows, worst cosine ([\d.]+)")
LENGTH = 64


@pytest.fixture(scope="module")
def minilm() -> tuple[Path, Path, Path]:
    from tests.fixtures.pretrained import minilm_for_tests

    return minilm_for_tests()


def independent_held_out_cosine(path: Path, saved: Path, tokenizer: Path, sentences: str) -> float:
    """The worst pooled cosine of benchmarks/data's ``sentences`` over their real tokens, each padded to the file's
    length in LiteRT: apart from the export's gate."""
    from ai_edge_litert.interpreter import Interpreter

    from tests.fixtures.pretrained import held_out_worst_cosine

    runner = Interpreter(model_path=str(path)).get_signature_runner()

    def run(feed: dict[str, np.ndarray]) -> np.ndarray:
        n = feed["token_ids"].shape[1]
        padded = {k: np.pad(v, ((0, 0), (0, LENGTH - n))) for k, v in feed.items()}
        return np.asarray(runner(**padded)["sequence_output"])[:, :n]

    return held_out_worst_cosine(run, saved, tokenizer, DATA / sentences)


def test_full_integer_keeps_the_answers_on_sentences_it_never_saw(
    minilm, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """Issue 25 item 2's done-when: held-out >= 0.99 with no float op between the inputs and the outputs'
    DEQUANTIZE, exit 0 through the CLI, its activations int8 or int16 by measured error (measured: held-out 0.99675,
    later sentences 0.99526 and 0.99667; 35.1 MB against 91.0 MB float32)."""
    from ai_edge_litert.interpreter import Interpreter

    saved, tokenizer, _ = minilm
    output = tmp_path / "int8.tflite"
    given, held_out = DATA / "varied_calibration.txt", DATA / "varied_held_out.txt"
    result = run_cli(
        capfd, "tflite", saved, "-o", output, "--quantize", "int8", "--batch", "1", "--seq-len", str(LENGTH),
        "--text", given, "--holdout", held_out, "--tokenizer", tokenizer, "--no-layer-map",
    )  # fmt: skip
    assert result.exit_code == 0, (result.stderr, result.stdout[-3000:])
    out = result.stdout
    assert "int8 chose on the 48 samples given, judged on the 32 of --holdout" in out
    assert "LayerNorm(s) normalized by the row's peak" in out and "still float" not in out, out
    # int8 or int16 by measured error (measured: 2 of 379 int8; the file is no worse than every activation int16)
    assert "activations by measured error:" in out, out
    assert float(TASK.search(out)[1]) >= 0.99, out
    # Integer from the int32 ids to the outputs' DEQUANTIZE, read from the file itself.
    interpreter = Interpreter(model_path=str(output))
    details = {t["index"]: t for t in interpreter.get_tensor_details()}
    outputs = {d["index"] for d in interpreter.get_output_details()}
    floats = [
        op["op_name"]
        for op in interpreter._get_ops_details()
        if not (op["op_name"] == "DEQUANTIZE" and set(op["outputs"]) <= outputs)
        and any(np.dtype(details[i]["dtype"]).kind == "f" for i in [*op["inputs"], *op["outputs"]] if i >= 0)
    ]
    assert floats == [], floats
    # and on 48 sentences no export is given, not even to judge: static ranges calibrated on the 48 given ones
    # clipped a short sentence's attention ("Thanks a lot!" 0.978) before the ranges had headroom
    for sentences in ("varied_held_out.txt", "varied_fresh.txt", "varied_unseen.txt"):
        assert independent_held_out_cosine(output, saved, tokenizer, sentences) >= 0.99, sentences
