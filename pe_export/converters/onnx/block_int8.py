"""Block-wise int8 products for onnxruntime: each MatMul by a constant weight as com.microsoft ``MatMulNBits``
with 8-bit weights, one scale per ``BLOCK`` input channels of each output channel, and ``accuracy_level`` 4:
onnxruntime then quantizes each row of the activations to int8 per block as well and computes the products in
integer arithmetic (MLAS's SQNBitGemm, CompInt8), as TFLite's hybrid kernels quantize each row.

``quantize_dynamic`` (DynamicQuantizeLinear → MatMulInteger) takes one activation range per tensor per call and
one weight scale per output channel. A trained encoder's activations hold massive values in a few channels of a
few tokens ([CLS], [SEP]), and every other value of that call gets the few levels the range leaves; a block's
range holds only its own 32 channels of its own row. Measured on all-MiniLM-L6-v2 (48 varied sentences given,
32 others judged, worst mean-pooled cosine one sentence per call, smoothing as for ``quantize_dynamic``, tables
float): every MatMul block-wise int8 0.99919, every MatMul through ``quantize_dynamic`` 0.99678 (weights alone at
per-channel int8 with float activations: 0.99899, in blocks of 32: 0.99955).

Weights are symmetric (int8 values stored as uint8 with the format's default zero point of 128); K that is not a
multiple of the block is padded with zero rows (the op's blocks per column round up).
"""

from __future__ import annotations

from typing import Any

import numpy as np

BLOCK = 32  # input channels per weight scale and per activation range
ACCURACY_LEVEL = 4  # MatMulNBits: int8 activations, integer products (0-3 dequantize the weights to float)
BITS = 8
LEVELS = 2 ** (BITS - 1) - 1  # symmetric: -127…127
MICROSOFT = "com.microsoft"
OP = "MatMulNBits"


def block_int8_weight(weight: np.ndarray, block: int = BLOCK) -> tuple[np.ndarray, np.ndarray]:
    """``weight`` [K, N] as MatMulNBits stores it: (B uint8 [N, blocks, block], scales float32 [N * blocks])."""
    k, n = weight.shape
    padded = np.pad(weight.astype(np.float32), ((0, (-k) % block), (0, 0))).T  # [N, K rounded up]
    blocks = padded.reshape(n, -1, block)
    scales = np.maximum(np.abs(blocks).max(axis=2), np.float32(1e-12)) / np.float32(LEVELS)
    values = np.clip(np.round(blocks / scales[:, :, None]), -LEVELS, LEVELS).astype(np.int16) + 2 ** (BITS - 1)
    return values.astype(np.uint8), scales.reshape(-1).astype(np.float32)


def dequantized(values: np.ndarray, scales: np.ndarray, k: int) -> np.ndarray:
    """The weight [K, N] that ``block_int8_weight``'s (values, scales) stand for."""
    n, blocks, block = values.shape
    steps = scales.reshape(n, blocks, 1)
    return ((values.astype(np.float32) - 2 ** (BITS - 1)) * steps).reshape(n, blocks * block)[:, :k].T


def block_int8_node(node: Any, weight: np.ndarray, block: int = BLOCK) -> tuple[Any, list[Any]]:
    """A MatMul ``node`` (x times the constant ``weight`` [K, N]) as a MatMulNBits node of the same name, inputs
    and outputs, and the initializers it reads."""
    from onnx import helper, numpy_helper

    k, n = weight.shape
    values, scales = block_int8_weight(weight, block)
    stored = numpy_helper.from_array(values, f"{node.name}__block_int8")
    steps = numpy_helper.from_array(scales, f"{node.name}__block_scales")
    replaced = helper.make_node(
        OP,
        [node.input[0], stored.name, steps.name],
        list(node.output),
        name=node.name,
        domain=MICROSOFT,
        K=int(k),
        N=int(n),
        bits=BITS,
        block_size=block,
        accuracy_level=ACCURACY_LEVEL,
    )
    return replaced, [stored, steps]


def with_microsoft_domain(model: Any) -> None:
    """Import the com.microsoft domain MatMulNBits belongs to, once."""
    from onnx import helper

    if not any(entry.domain == MICROSOFT for entry in model.opset_import):
        model.opset_import.append(helper.make_opsetid(MICROSOFT, 1))


def constant_weight(node: Any, initializers: dict[str, Any], excluded: set[str]) -> Any | None:
    """The 2-D float32 initializer a MatMul ``node`` multiplies by, where it has one and is not ``excluded``: what
    the int8 products (block-wise here, per row in ``onnx.row_int8``) replace."""
    from onnx import TensorProto

    if node.op_type != "MatMul" or len(node.input) != 2 or node.name in excluded:
        return None
    weight = initializers.get(node.input[1])
    if weight is None or len(weight.dims) != 2 or weight.data_type != TensorProto.FLOAT:
        return None
    return weight


def block_int8_matmuls(model: Any, excluded: set[str], block: int = BLOCK) -> int:
    """In place: every MatMul of ``model`` by a 2-D float constant, ``excluded`` aside, as MatMulNBits; its float
    weight dropped where nothing else reads it. Returns how many were replaced."""
    from onnx import numpy_helper

    from pe_export.converters.onnx.rewrites import drop_unread_initializers

    graph = model.graph
    initializers = {init.name: init for init in graph.initializer}
    nodes, replaced = [], 0
    for node in graph.node:
        weight = constant_weight(node, initializers, excluded)
        if weight is None:
            nodes.append(node)
            continue
        blocked, stored = block_int8_node(node, numpy_helper.to_array(weight), block)
        graph.initializer.extend(stored)
        nodes.append(blocked)
        replaced += 1
    del graph.node[:]
    graph.node.extend(nodes)
    if replaced:
        with_microsoft_domain(model)
    drop_unread_initializers(graph)
    return replaced
