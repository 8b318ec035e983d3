"""Per-row int8 products for onnxruntime: each MatMul by a constant weight with one activation range per row
(token) of each call, as TFLite's hybrid kernels quantize, at the speed of onnxruntime's integer GEMM.

``quantize_dynamic`` (DynamicQuantizeLinear → MatMulInteger) takes one range per tensor per call. A trained
encoder's [CLS] and [SEP] rows carry massive values, and every other row of that call gets the few levels the
range leaves. onnxruntime's MatMulInteger takes only one activation zero point per call (its CPU kernel refuses a
per-row one), so the rows are quantized symmetrically around the fixed zero point 128, each with its own step,
and the step multiplies the row's products afterwards:

    peak = max(|x_row|)              (a row of zeros takes a tiny peak, so the division stays finite)
    q = QuantizeLinear(x / peak, 1/127, 128)                         uint8, 1…255
    y = MatMulIntegerToFloat(q, W int8, 1/127, w_step, 128) · peak

W keeps one symmetric step per output channel. The row's range is computed once per input tensor and shared by
every MatMul that reads it (a layer's query, key and value). Measured on all-MiniLM-L6-v2's shapes (14 tokens,
one thread, EPYC with AVX-512 VNNI): 0.44x float32's time against 0.39x for DynamicQuantizeMatMul and 0.82x for
block-wise MatMulNBits (``benchmarks/int8_kernels.py``). A signed int8 activation (zero point 0) would save the
shift, but onnxruntime's int8 × int8 GEMM on x86 ran 5x slower than float32.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from typing import Any

import numpy as np

from pe_export.converters.onnx.block_int8 import MICROSOFT, constant_weight, with_microsoft_domain
from pe_export.converters.search.smoothing import symmetric_int8

LEVELS = 127  # symmetric rows around the fixed zero point
ZERO_POINT = 128
TINY_PEAK = 1e-30  # a row of zeros: divided by any finite peak, it quantizes to the zero point exactly
OP = "MatMulIntegerToFloat"


def row_quantized(x: np.ndarray) -> np.ndarray:
    """``x`` [..., K] as this kernel sees it: each row (last axis) symmetric int8 by its own largest value,
    dequantized (the simulation smoothing chooses by)."""
    step = np.maximum(np.abs(x).max(axis=-1, keepdims=True), TINY_PEAK) / LEVELS
    return np.clip(np.round(x / step), -LEVELS, LEVELS) * step


# a MatMul's name and its weight's per-output-channel steps [N] → the int8 values [K, N] to store (GPTQ's), or None
# to round to nearest
Rounding = Callable[[str, np.ndarray], "np.ndarray | None"]


def row_int8_matmuls(model: Any, excluded: set[str], rounding: Rounding | None = None) -> int:
    """In place: every MatMul of ``model`` by a 2-D float constant, ``excluded`` aside, as a per-row int8 product
    (the MatMul's output name kept, its name on the last node); the row quantization once per input tensor, before
    its first reader; weights rounded by ``rounding`` where it gives values. Returns how many were replaced."""
    from pe_export.converters.onnx.rewrites import drop_unread_initializers

    graph = model.graph
    initializers = {init.name: init for init in graph.initializer}
    chosen = [node for node in graph.node if constant_weight(node, initializers, excluded) is not None]
    if not chosen:
        return 0
    readers: dict[str, list[Any]] = defaultdict(list)
    for node in chosen:
        readers[node.input[0]].append(node)
    shared = _shared_constants(graph)
    rows = {tensor: f"row_int8_{index}" for index, tensor in enumerate(readers)}
    replacing = {node.name for node in chosen}
    reduce_axes_input = _opset(model) >= 18  # ReduceMax's axes: an attribute before opset 18, an input from it
    nodes = []
    for node in graph.node:
        if node.name not in replacing:
            nodes.append(node)
            continue
        prefix = rows[node.input[0]]
        if node is readers[node.input[0]][0]:
            nodes.extend(_row_quantization(node.input[0], prefix, shared, reduce_axes_input))
        product, weights = _product(node, initializers[node.input[1]], prefix, shared, rounding)
        nodes.extend(product)
        graph.initializer.extend(weights)
    del graph.node[:]
    graph.node.extend(nodes)
    with_microsoft_domain(model)
    drop_unread_initializers(graph)
    return len(chosen)


def _opset(model: Any) -> int:
    return max((entry.version for entry in model.opset_import if entry.domain in ("", "ai.onnx")), default=0)


def _shared_constants(graph: Any) -> dict[str, str]:
    """The scalars every per-row product reads, added to ``graph`` once: name by role."""
    from onnx import numpy_helper

    values: dict[str, np.ndarray] = {
        "step": np.array(1.0 / LEVELS, np.float32),  # of a row divided by its peak
        "tiny": np.array(TINY_PEAK, np.float32),
        "zero_point": np.array(ZERO_POINT, np.uint8),
        "axes": np.array([-1], np.int64),
    }
    present = {init.name for init in graph.initializer}
    names = {}
    for role, value in values.items():
        name = f"row_int8__{role}"
        if name not in present:
            graph.initializer.append(numpy_helper.from_array(value, name))
        names[role] = name
    return names


def _row_quantization(tensor: str, prefix: str, shared: dict[str, str], axes_input: bool) -> list[Any]:
    """``tensor``'s rows as uint8 (``{prefix}__q``) and their peaks (``{prefix}__range``, [..., 1]): each row
    divided by its peak, then quantized with the step 1/127 (the products take that step back as A's scale, and
    the peak as a Mul)."""
    from onnx import helper

    reduce = (
        helper.make_node("ReduceMax", [f"{prefix}__abs", shared["axes"]], [f"{prefix}__peak"], keepdims=1)
        if axes_input
        else helper.make_node("ReduceMax", [f"{prefix}__abs"], [f"{prefix}__peak"], keepdims=1, axes=[-1])
    )
    reduce.name = f"{prefix}__peak"
    return [
        helper.make_node("Abs", [tensor], [f"{prefix}__abs"], name=f"{prefix}__abs"),
        reduce,
        helper.make_node("Max", [f"{prefix}__peak", shared["tiny"]], [f"{prefix}__range"], name=f"{prefix}__range"),
        helper.make_node("Div", [tensor, f"{prefix}__range"], [f"{prefix}__unit"], name=f"{prefix}__unit"),
        helper.make_node(
            "QuantizeLinear",
            [f"{prefix}__unit", shared["step"], shared["zero_point"]],
            [f"{prefix}__q"],
            name=f"{prefix}__q",
        ),
    ]


def _product(
    node: Any, weight: Any, prefix: str, shared: dict[str, str], rounding: Rounding | None
) -> tuple[list[Any], list[Any]]:
    """``node``'s product from its input's quantized rows: the integer GEMM scaled per output channel, then per
    row; and the int8 weight and steps it reads."""
    from onnx import helper, numpy_helper

    values, steps = symmetric_int8(numpy_helper.to_array(weight), 0, LEVELS)
    rounded = rounding(node.name, steps.reshape(-1)) if rounding else None
    values = values if rounded is None or rounded.shape != values.shape else rounded
    stored = numpy_helper.from_array(values, f"{node.name}__row_int8")
    column_steps = numpy_helper.from_array(steps.reshape(-1).astype(np.float32), f"{node.name}__row_int8_steps")
    unscaled = f"{node.name}__per_column"
    return [
        helper.make_node(
            OP,
            [f"{prefix}__q", stored.name, shared["step"], column_steps.name, shared["zero_point"]],
            [unscaled],
            name=f"{node.name}__integer",
            domain=MICROSOFT,
        ),
        helper.make_node("Mul", [unscaled, f"{prefix}__range"], list(node.output), name=node.name),
    ], [stored, column_steps]
