"""Weight-only int8 for ONNX, for storage-bound targets: weights stored as int8 with small float scales,
dequantized by constant ops that onnxruntime folds when it creates the session.

MatMul and Gemm weights [K, N] take one scale per block of 32 inputs of each output (finer than per channel:
an outlier input row no longer sets the scale of the whole column); embedding tables one scale per
row. The file shrinks to about a quarter; the arithmetic, the speed and the memory after loading are
float32's — this trades nothing but bytes on disk and in transit.
"""

from __future__ import annotations

from typing import Any

import numpy as np

BLOCK = 32
MIN_ELEMENTS = 1024  # small weights (biases reshaped, LayerNorm vectors) stay float


def weight_only_int8(model: Any) -> tuple[Any, int, int]:
    """Rewrite ``model`` in place; returns (model, weights quantized, float bytes replaced)."""
    from onnx import helper, numpy_helper

    graph = model.graph
    initializers = {i.name: i for i in graph.initializer}
    uses: dict[str, str] = {}
    for node in graph.node:
        if node.op_type == "MatMul" and node.input[1] in initializers:
            uses.setdefault(node.input[1], "columns")
        elif node.op_type == "Gemm" and node.input[1] in initializers:
            transposed = any(a.name == "transB" and a.i for a in node.attribute)
            uses.setdefault(node.input[1], "transposed" if transposed else "columns")
        elif node.op_type == "Gather" and node.input[0] in initializers:
            uses.setdefault(node.input[0], "rows")
    consumers = {name for node in graph.node for name in node.input}
    added_nodes, added_inits, replaced, count = [], [], 0, 0
    for name, layout in uses.items():
        weight = numpy_helper.to_array(initializers[name])
        if weight.dtype != np.float32 or weight.ndim != 2 or weight.size < MIN_ELEMENTS or name not in consumers:
            continue
        quantized, scales, blocked = _quantize(weight, layout)
        q_name, s_name = f"{name}__int8", f"{name}__scale"
        added_inits += [numpy_helper.from_array(quantized, q_name), numpy_helper.from_array(scales, s_name)]
        cast = f"{name}__float"
        added_nodes.append(helper.make_node("Cast", [q_name], [cast], name=f"{name}__cast", to=1))
        if blocked:
            shape_in = numpy_helper.from_array(np.array(blocked, np.int64), f"{name}__blocks")
            shape_out = numpy_helper.from_array(np.array(weight.shape, np.int64), f"{name}__shape")
            added_inits += [shape_in, shape_out]
            added_nodes += [
                helper.make_node("Reshape", [cast, shape_in.name], [f"{name}__blocked"], name=f"{name}__reshape"),
                helper.make_node("Mul", [f"{name}__blocked", s_name], [f"{name}__scaled"], name=f"{name}__mul"),
                helper.make_node("Reshape", [f"{name}__scaled", shape_out.name], [name], name=f"{name}__dequant"),
            ]
        else:
            added_nodes.append(helper.make_node("Mul", [cast, s_name], [name], name=f"{name}__dequant"))
        replaced += weight.nbytes
        count += 1
    quantized_names = {n.output[0] for n in added_nodes if n.name.endswith("__dequant")}
    kept = [i for i in graph.initializer if i.name not in quantized_names]
    del graph.initializer[:]
    graph.initializer.extend(kept + added_inits)
    nodes = added_nodes + list(graph.node)
    del graph.node[:]
    graph.node.extend(nodes)
    return model, count, replaced


def _quantize(weight: np.ndarray, layout: str) -> tuple[np.ndarray, np.ndarray, tuple[int, ...] | None]:
    """(int8 values, float32 scales, the [blocks, BLOCK, N] shape when blocked) — symmetric, round to nearest."""
    if layout == "rows":  # an embedding table: one scale per row
        scales = np.abs(weight).max(axis=1, keepdims=True) / 127.0
        blocked = None
    elif layout == "transposed" and weight.shape[1] % BLOCK == 0:  # Gemm with transB: [N, K], blocks along K
        blocks = weight.reshape(weight.shape[0], weight.shape[1] // BLOCK, BLOCK)
        scales = np.abs(blocks).max(axis=2, keepdims=True) / 127.0
        blocked = blocks.shape
    elif layout == "transposed":
        scales = np.abs(weight).max(axis=1, keepdims=True) / 127.0
        blocked = None
    elif weight.shape[0] % BLOCK == 0:
        blocks = weight.reshape(weight.shape[0] // BLOCK, BLOCK, weight.shape[1])
        scales = np.abs(blocks).max(axis=1, keepdims=True) / 127.0
        blocked = blocks.shape
    else:  # rows not a multiple of the block: one scale per column
        scales = np.abs(weight).max(axis=0, keepdims=True) / 127.0
        blocked = None
    scales = np.where(scales == 0, 1.0, scales).astype(np.float32)
    source = weight.reshape(blocked) if blocked else weight
    quantized = np.clip(np.round(source / scales), -127, 127).astype(np.int8).reshape(weight.shape)
    return quantized, scales, blocked
