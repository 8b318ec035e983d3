"""Block-wise int8 products (MatMulNBits): the stored weight is the per-block rounding of the float one, onnxruntime
computes with it within int8's error, and a row of massive activations no longer costs the other rows their
precision, as one range per call (quantize_dynamic) does."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

from pe_export.converters.onnx.block_int8 import BLOCK, LEVELS, block_int8_matmuls, block_int8_weight, dequantized
from pe_export.converters.onnx.quantize import QuantizedVariants, _quantize, _run
from tests.helpers import matmul_model

K, N = 72, 24  # K not a multiple of the block: the last block is padded


def test_the_stored_weight_is_each_blocks_symmetric_rounding() -> None:
    rng = np.random.default_rng(0)
    weight = rng.normal(size=(K, N)).astype(np.float32)
    weight[5, 3] = 40.0  # an outlier costs its own block of its own column only
    values, scales = block_int8_weight(weight)
    assert values.shape == (N, -(-K // BLOCK), BLOCK) and values.dtype == np.uint8
    back = dequantized(values, scales, K)
    for column in range(N):
        for start in range(0, K, BLOCK):
            block = weight[start : start + BLOCK, column]
            step = np.abs(block).max() / LEVELS
            np.testing.assert_allclose(back[start : start + BLOCK, column], np.round(block / step) * step, atol=1e-6)
    assert np.abs(back - weight)[BLOCK:, 3].max() <= np.abs(weight[BLOCK:, 3]).max() / LEVELS / 2 + 1e-6


def test_onnxruntime_runs_it_and_a_massive_row_costs_the_others_nothing() -> None:
    rng = np.random.default_rng(1)
    weight = rng.normal(size=(K, N)).astype(np.float32)
    x = rng.normal(size=(6, K)).astype(np.float32)
    x[0] *= 200.0  # a [CLS]-like row of massive activations
    exact = x.astype(np.float64) @ weight.astype(np.float64)
    blocks = matmul_model(weight)
    assert block_int8_matmuls(blocks, set()) == 1
    assert [node.op_type for node in blocks.graph.node] == ["MatMulNBits"]
    assert not [init for init in blocks.graph.initializer if init.name == "W"]  # the float weight is dropped
    onnx.checker.check_model(blocks)
    (got,) = _run(blocks, [{"x": x}])
    (per_call,) = _run(_quantize(matmul_model(weight), [], "matmulinteger"), [{"x": x}])

    def error(y: np.ndarray) -> np.ndarray:  # each row's, relative to that row's exact product
        return np.linalg.norm(y - exact, axis=1) / np.linalg.norm(exact, axis=1)

    assert error(got["y"]).max() < 0.02  # int8 weights and activations, every row
    assert error(got["y"])[1:].max() * 10 < error(per_call["y"])[1:].max()  # the other rows kept their levels


def test_a_kept_node_goes_back_to_its_float_matmul() -> None:
    rng = np.random.default_rng(2)
    weight = rng.normal(size=(K, N)).astype(np.float32)
    x = rng.normal(size=(3, K)).astype(np.float32)
    model = matmul_model(weight)
    variants = QuantizedVariants(model, _quantize(model, [], "blocks"))
    kept = variants.build(["product"])
    assert [node.op_type for node in kept.graph.node] == ["Cast", "MatMul"]  # float16 storage, cast once at load
    (got,) = _run(kept, [{"x": x}])
    np.testing.assert_allclose(got["y"], x @ weight.astype(np.float16).astype(np.float32), rtol=1e-4, atol=1e-4)


def test_inspect_names_the_onnxruntime_release_it_needs(tmp_path: Path) -> None:
    from pe_export.inspection.onnx_file import summarize_onnx_model

    model = matmul_model(np.ones((K, N), np.float32))
    plain = summarize_onnx_model(model, tmp_path / "m.onnx", 0).runs_on[0]
    block_int8_matmuls(model, set())
    blocked = summarize_onnx_model(model, tmp_path / "m.onnx", 0).runs_on[0]
    assert "1.22" not in plain.why and "MatMulNBits with 8-bit weights (onnxruntime 1.22 or later)" in blocked.why


def test_an_older_onnxruntime_is_told_what_the_file_needs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """JetPack's onnxruntime may predate 8-bit MatMulNBits: the runner says so in one line, with the way out,
    before onnxruntime's own error. The release installed here is made to read as an older one; the check is ours."""
    import onnxruntime

    from pe_export.errors import RuntimeUnavailableError
    from pe_export.runners import create_runner

    x = np.ones((2, K), np.float32)
    blocked, standard = tmp_path / "blocks.onnx", tmp_path / "standard.onnx"
    model = matmul_model(np.ones((K, N), np.float32))
    onnx.save(_quantize(model, [], "matmulinteger"), str(standard))
    block_int8_matmuls(model, set())
    onnx.save(model, str(blocked))
    with create_runner("onnxruntime", blocked) as runner:  # the release installed here runs it
        assert runner.infer({"x": x})["y"].shape == (2, N)
    monkeypatch.setattr(onnxruntime, "__version__", "1.20.1")
    with pytest.raises(RuntimeUnavailableError) as refused:
        create_runner("onnxruntime", blocked).activate()
    message = str(refused.value)
    assert "needs MatMulNBits with 8-bit weights (onnxruntime 1.22 or later)" in message and "1.20.1" in message
    assert "--int8-kernel matmulinteger" in message and "\n" not in message
    with create_runner("onnxruntime", standard) as runner:  # standard ops: no refusal
        assert runner.infer({"x": x})["y"].shape == (2, N)
