"""Static int8 ONNX (QDQ) on real weights: all-MiniLM-L6-v2 calibrated on 48 varied sentences and judged on 32
others it never saw (issue 25's flow, benchmarks/data), through the CLI. Apart from test_pretrained.py so that
the two run side by side (--dist loadfile)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from tests.helpers import run_cli

pytestmark = [
    pytest.mark.slow,  # minutes: excluded from the quick run (-m "not slow")
    pytest.mark.skipif(sys.version_info < (3, 11), reason="keras-hub 0.32 needs Python 3.11+"),
]


DATA = Path(__file__).resolve().parents[1] / "benchmarks" / "data"
TASK = re.compile(r"task level: sequence_output mean-pooled rows, worst cosine ([\d.]+)")
KEPT = re.compile(r"(\d+) of (\d+) quantizable nodes kept in float")


@pytest.fixture(scope="module")
def minilm() -> tuple[Path, Path, Path]:
    from tests.fixtures.pretrained import minilm_for_tests

    return minilm_for_tests()


def independent_held_out_cosine(
    path: Path, saved: Path, tokenizer: Path, sentences: str = "varied_held_out.txt"
) -> float:
    """The held-out sentences' worst pooled cosine, each unpadded in onnxruntime: apart from the export's gate."""
    import onnxruntime as ort

    from tests.fixtures.pretrained import held_out_worst_cosine

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    run = lambda feed: session.run(["sequence_output"], feed)[0]  # noqa: E731
    return held_out_worst_cosine(run, saved, tokenizer, DATA / sentences)


@pytest.fixture(scope="module")
def float32_bytes(minilm, tmp_path_factory: pytest.TempPathFactory) -> int:
    """The float32 file's size, what the int8 files are measured against."""
    from pe_export.api import export_onnx
    from pe_export.converters.options import ExportOptions

    path = tmp_path_factory.mktemp("fp32") / "fp32.onnx"
    export_onnx(minilm[0], path, ExportOptions(verify=False, layer_map=False))
    return path.stat().st_size


def test_static_int8_holds_the_int8_tolerance_on_sentences_it_never_saw(
    minilm, float32_bytes: int, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """QDQ around the MatMuls, calibration method chosen on inputs it did not calibrate on: at the int8 target
    (0.99) on the held-out sentences, every MatMul int8 at about a quarter of the float32 file's bytes. (Issue 25
    item 3 asks 0.999 at <= 0.35x: met in 2 of 3 runs on this AVX2 host, whose held-out part refused the file
    once at 0.99858 — the gate's margin there is ~2e-4; benchmarks/real_weights.py measures it.)"""
    import onnx

    from pe_export.converters.onnx.gptq import weight_dequantizers
    from pe_export.converters.onnx.outliers import is_side_node
    from pe_export.converters.onnx.static_int8 import qdq_counts

    saved, tokenizer, _ = minilm
    output = tmp_path / "int8.onnx"
    given, held_out = DATA / "varied_calibration.txt", DATA / "varied_held_out.txt"
    result = run_cli(
        capfd, "onnx", saved, "-o", output, "--quantize", "int8", "--text", given, "--holdout", held_out,
        "--tokenizer", tokenizer, "--no-layer-map",
    )  # fmt: skip
    assert result.exit_code == 0, (result.stderr, result.stdout[-3000:])
    out = result.stdout
    assert "int8 chose on the 48 samples given, judged on the 32 of --holdout" in out
    assert re.search(r"activation ranges by (min-max|percentile|entropy) \(worst cosine of each method", out), out
    gate = float(TASK.search(out)[1])
    assert gate >= 0.99, out
    assert output.stat().st_size <= 0.30 * float32_bytes, (output.stat().st_size, float32_bytes)
    # Integer MatMuls remain, and their activations are symmetric (TensorRT takes zero points of 0 only).
    written = onnx.load(str(output))
    counts = qdq_counts(written)
    kept = KEPT.search(out)
    assert kept is None or int(kept[1]) < int(kept[2]), out
    # The weight products (what the bytes are) nearly all read int8 activations. The attention's two activation
    # products cost no bytes kept float, so the search ranks them first: 6 or all 12 of them stay float as its
    # probe decides at this target (43 and 36 int8 MatMuls of 49 with tf2onnx's graph and the fused one, the same
    # held-out cosine within 6e-4), which a bound on every MatMul would read as a regression.
    weights = weight_dequantizers(written)
    producers = {name: node.op_type for node in written.graph.node for name in node.output}
    int8_input = [node for node in written.graph.node if node.name in weights and not is_side_node(node.name)]
    int8_input = [node for node in int8_input if producers.get(node.input[0]) == "DequantizeLinear"]
    products = [name for name in weights if not is_side_node(name)]
    assert len(int8_input) >= 0.9 * len(products), (counts, out)
    zero_points = [i for i in written.graph.initializer if i.name.endswith("_zero_point")]
    assert zero_points and all(not onnx.numpy_helper.to_array(z).any() for z in zero_points)
    # The same held-out figure measured apart from the gate (one sentence per call, unpadded), and 48 sentences no
    # export is given, not even to judge: the choice's margin is what holds them (0.967 on new text without it)
    for sentences in ("varied_held_out.txt", "varied_fresh.txt", "varied_unseen.txt"):
        assert independent_held_out_cosine(output, saved, tokenizer, sentences) >= 0.99, sentences


def test_static_int8_at_0_999_holds_on_sentences_it_never_saw_within_a_third_of_the_bytes(
    minilm, float32_bytes: int, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """Issue 25 item 3's bar: >= 0.999 held-out at <= 0.35x the float32 file's bytes. Every weight stays int8 or
    float16 (no float32 weight): what misses reads its activations float (weight-only int8), and where that is not
    enough the weights that cost most go float16; GPTQ rounds the int8 ones."""
    import onnx

    from pe_export.converters.onnx.gptq import weight_dequantizers
    from pe_export.converters.onnx.outliers import is_side_node

    saved, tokenizer, _ = minilm
    output = tmp_path / "int8.onnx"
    given, held_out = DATA / "varied_calibration.txt", DATA / "varied_held_out.txt"
    result = run_cli(
        capfd, "onnx", saved, "-o", output, "--quantize", "int8", "--min-cosine", "0.999", "--text", given,
        "--holdout", held_out, "--tokenizer", tokenizer, "--no-layer-map",
    )  # fmt: skip
    assert result.exit_code == 0, (result.stderr, result.stdout[-3000:])
    out = result.stdout
    assert "int8 weights rounded by GPTQ" in out and "chosen against cosine >= 0.9995" in out, out
    assert float(TASK.search(out)[1]) >= 0.999, out
    assert output.stat().st_size <= 0.35 * float32_bytes, (output.stat().st_size, float32_bytes)
    written = onnx.load(str(output))
    initializers = {init.name: init for init in written.graph.initializer}
    int8_weights = set(weight_dequantizers(written))
    for node in written.graph.node:
        if node.op_type != "MatMul" or is_side_node(node.name) or node.name in int8_weights:
            continue
        weight = initializers.get(node.input[1])
        # not int8: an attention product (no weight), or a weight stored float16 behind its Cast
        assert weight is None, (node.name, weight.data_type)
    assert len(int8_weights) >= 0.5 * 37, len(int8_weights)  # most of MiniLM's 37 weight MatMuls stay int8
    assert independent_held_out_cosine(output, saved, tokenizer) >= 0.999
    # The choice's margin was set after seeing the held-out figure: 24 sentences written after it judge it too.
    assert independent_held_out_cosine(output, saved, tokenizer, "varied_fresh.txt") >= 0.999
