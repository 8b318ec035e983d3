"""Dynamic int8 asked for 0.999 on real weights: all-MiniLM-L6-v2 chosen on 48 varied sentences and judged on 32
others it never saw (issue 25's flow, benchmarks/data), through the CLI, in both formats. Apart from
test_pretrained.py so that they run beside it (--dist loadfile). p50 is the benchmark's
(benchmarks/real_weights.py --sentences varied --only dynamic), not a timed test."""

from __future__ import annotations

import json
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
TARGET = 0.999
MOST_BYTES = 0.45  # of the float32 weights: issue 25's bar for this flow


@pytest.fixture(scope="module")
def minilm() -> tuple[Path, Path, Path]:
    from tests.fixtures.pretrained import minilm_for_tests

    return minilm_for_tests()


def independent_held_out_cosine(path: Path, saved: Path, tokenizer: Path, sentences: str) -> float:
    """The worst pooled cosine of benchmarks/data's ``sentences``, each unpadded in the format's runtime: apart
    from the gate."""
    from tests.fixtures.pretrained import held_out_worst_cosine

    if path.suffix == ".onnx":
        import onnxruntime as ort

        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        run = lambda feed: session.run(["sequence_output"], feed)[0]  # noqa: E731
    else:
        from ai_edge_litert.interpreter import Interpreter

        runner = Interpreter(model_path=str(path)).get_signature_runner()
        run = lambda feed: np.asarray(runner(**feed)["sequence_output"])  # noqa: E731
    return held_out_worst_cosine(run, saved, tokenizer, DATA / sentences)


@pytest.mark.parametrize("file_format", ["onnx", "tflite"])
def test_dynamic_int8_at_0999_holds_on_sentences_it_never_saw(
    minilm, file_format: str, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """The target met on the held-out sentences (the gate's verdict, and the same figure computed apart) and on
    sentences no export saw, at under half the float32 weights' bytes, with most products int8. ONNX's products
    take a range per row (MatMulIntegerToFloat, ``onnx.row_int8``), the weights its search keeps float."""
    import onnx

    from pe_export.memory import saved_weight_bytes

    saved, tokenizer, _ = minilm
    output, report = tmp_path / f"int8.{file_format}", tmp_path / "report.json"
    given, held_out = DATA / "varied_calibration.txt", DATA / "varied_held_out.txt"
    result = run_cli(
        capfd, file_format, saved, "-o", output, "--quantize", "dynamic-int8", "--min-cosine", str(TARGET),
        "--text", given, "--holdout", held_out, "--tokenizer", tokenizer, "--no-layer-map", "--json", report,
    )  # fmt: skip
    assert result.exit_code == 0, (result.stderr, result.stdout[-3000:])
    out = result.stdout
    assert "int8 chose on the 48 samples given, judged on the 32 of --holdout" in out
    assert float(TASK.search(out)[1]) >= TARGET, out
    assert output.stat().st_size <= MOST_BYTES * saved_weight_bytes(saved), output.stat().st_size
    # one search where every product escalated (TFLite: FCs in groups; ONNX: MatMuls block-wise) meets the target
    # it chooses against; else two: the weights kept float with every other product escalated, then the
    # escalations cut back to those the target needs
    searches = json.loads(report.read_text())["searches"]
    search = searches[0]
    assert len(search["kept_float"]) < search["candidates"] and len(searches) in (1, 2)
    floated = search["kept_float"] if search["kept_as"] == "float" else search["asked"]
    assert len(floated) < 0.5 * search["candidates"], searches  # not half the model float (the finding)
    if len(searches) == 2:
        escalated = searches[1]["kept_float"]
        assert search["kept_as"] == "float" and searches[1]["kept_as"] != "float" and not set(escalated) & set(floated)
        assert "missed the target: the weights kept float were chosen" in out
    if file_format == "onnx":  # a range per row, inputs rotated where it pays, GPTQ's weights
        assert "rotated by a block Hadamard" in out and "weights rounded by GPTQ" in out, out
        written = onnx.load(str(output))
        ops = [node.op_type for node in written.graph.node]
        integer = ops.count("MatMulNBits") + ops.count("MatMulInteger") + ops.count("MatMulIntegerToFloat")
        # every weight's MatMul int8 but those float; the three embedding tables aside (a Gather, not a MatMul)
        assert integer >= search["candidates"] - len(floated) - 3, (integer, searches)
        blocked = searches[-1] if searches[-1]["kept_as"].startswith("block-wise") else None
        if blocked is not None:  # escalated, not float: every such MatMul is MatMulNBits
            kept = {name for name in blocked["kept_float"] if "Gather" not in name} - set(blocked["asked"])
            assert kept <= {node.name for node in written.graph.node if node.op_type == "MatMulNBits"}
            assert "8-bit MatMulNBits' speed depends on the CPU" in out and "benchmarks/int8_kernels.py" in out
    else:  # TFLite moves FCs to groups of input channels before it keeps any float: most products stay int8
        # weights kept float are stored float16 (cast on load), grouped ones int8
        assert search["kept_as"] != "float" or not search["kept_float"] or "float16 storage" in out, out
        int8, total = _int8_fully_connected(output)
        assert int8 >= total - len(floated), (int8, total, searches)
    # The same held-out figure measured apart from the gate (one sentence per call, unpadded), and 48 sentences no
    # export is given, not even to judge (chosen at the target itself, the files read 0.99891 / 0.99883 on the first
    # 24: what the choice margin is for)
    for sentences in ("varied_held_out.txt", "varied_fresh.txt", "varied_unseen.txt"):
        assert independent_held_out_cosine(output, saved, tokenizer, sentences) >= TARGET, sentences


def _int8_fully_connected(path: Path) -> tuple[int, int]:
    """(FULLY_CONNECTED ops whose weight is int8, those whose weight is one of the model's: int8, or float16 kept
    float and dequantized) of a TFLite file; a group is one op. A rotation's FC by its Hadamard block reads a float32
    constant, which is neither."""
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_path=str(path))
    details = {d["index"]: d for d in interpreter.get_tensor_details()}
    ops = interpreter._get_ops_details()
    dequantized = {output for op in ops if op["op_name"] == "DEQUANTIZE" for output in op["outputs"]}
    fcs = [op for op in ops if op["op_name"] == "FULLY_CONNECTED"]
    int8 = sum(1 for op in fcs if details[op["inputs"][1]]["dtype"] == np.int8)
    return int8, sum(1 for op in fcs if details[op["inputs"][1]]["dtype"] == np.int8 or op["inputs"][1] in dequantized)
