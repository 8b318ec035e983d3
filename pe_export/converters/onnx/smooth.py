"""Activation smoothing before dynamic int8 (SmoothQuant, Xiao et al. 2022), sized per layer on the
export's own inputs.

onnxruntime's dynamic int8 takes one range per activation tensor per call. A trained encoder's
activations carry a few outlier channels (all-MiniLM-L6-v2: the LayerNorm outputs that feed every
projection), and one range stretched to them leaves the other channels a handful of levels. For
``Y = X·W`` with a constant W, ``Y = (X / s)·(s·W)`` for any positive per-input-channel s: a Mul by
1/s on the activation and rows of W scaled by s, the same arithmetic in float. s is chosen as
``max|X_k|^α / max|W_k|^(1-α)`` (one s for all MatMuls that read the same tensor), and α per tensor
from a grid, by the error of a simulation of onnxruntime's quantization of that product on the
captured activations (α 0 is no smoothing, so a tensor never gets worse in the simulation).
Measured on MiniLM, every weight int8, worst of 8 real sentences' pooled cosine: 0.9921 → 0.9981.
With ``outliers_per_input`` > 0 each input's few outlier channels (``smoothing.outlier_channels``) leave the int8
product and are computed in float beside it (``onnx.outliers``), the α then chosen on the rest, where the
simulation says the split cuts that input's error by ``OUTLIER_GAIN`` or more: each split adds three nodes
per MatMul, and onnxruntime's dispatch of small nodes is what they cost (MiniLM, 14 tokens, one thread: every
candidate input split, 19 of 25, took the all-int8 p50 from 2.25 to 3.10 ms).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import replace
from typing import Any

import numpy as np

from pe_export.converters.onnx.outliers import OutlierSide, add_outlier_paths
from pe_export.converters.search.hadamard import ROTATION_BLOCK, choose_rotations, hadamard, rotated_weight
from pe_export.converters.search.smoothing import (
    OUTLIER_GAIN,
    Activations,
    QuantizedActivations,
    Smoothing,
    TensorChoice,
    best_scale,
    call_quota,
    outlier_channels,
    range_quantized,
    scales_of,
    thin_call,
)

LEVELS = 255  # onnxruntime's dynamic activations: uint8, asymmetric, one range per tensor per call


def smooth_activations(
    model: Any,
    feeds: list[dict[str, np.ndarray]],
    run: Any,
    outliers_per_input: int = 0,
    quantized: QuantizedActivations | None = None,
    rotate: bool = False,
) -> tuple[Any, Smoothing, list[dict[str, np.ndarray]]]:
    """A smoothed copy of ``model`` (float, same outputs up to rounding), what was done, and the model's
    outputs on ``feeds`` (from the same runs: the search needs them as its reference).

    ``run(model, feeds, names)`` gives the named tensors for every feed (a real onnxruntime run), one feed
    after another; the activations are thinned call by call as they come (BERT-base, 16 calls of 512
    positions: 2 GB if held). ``quantized``: how the int8 kernel sees an activation (default: one range per call,
    ``quantize_dynamic``'s; ``onnx_row_int8.row_quantized`` for a range per row). ``rotate``: inputs may be rotated
    by the block Hadamard where the simulation says it pays (``search.hadamard``): with a range per row only, since one
    range per call is set by the [CLS] row's peaks, which no rotation within a row moves.
    """
    import onnx
    from onnx import numpy_helper

    smoothed = onnx.ModelProto()
    smoothed.CopyFrom(model)
    graph = smoothed.graph
    initializers = {init.name: init for init in graph.initializer}
    readers: dict[str, list[Any]] = defaultdict(list)
    for node in graph.node:
        if node.op_type == "MatMul" and node.input[1] in initializers and len(initializers[node.input[1]].dims) == 2:
            readers[node.input[0]].append(node)
    outputs = [output.name for output in model.graph.output]
    if not readers:
        return smoothed, Smoothing("MatMul", 0, 0, 0.0, 0.0), list(run(model, feeds, outputs))
    capturing, quota = _with_outputs(model, list(readers)), call_quota(len(feeds))
    expected: list[dict[str, np.ndarray]] = []
    calls: dict[str, list[np.ndarray]] = defaultdict(list)
    channel_max: dict[str, np.ndarray] = {}
    for captured in run(capturing, feeds, outputs + [name for name in readers if name not in outputs]):
        expected.append({name: captured[name] for name in outputs})
        for tensor in readers:
            # each call's rows: one range per call, padding included (the runtime's range includes it)
            rows = np.asarray(captured[tensor], np.float32)
            if rows.size:
                rows = rows.reshape(-1, rows.shape[-1])
                peak = np.abs(rows).max(axis=0)
                channel_max[tensor] = np.maximum(channel_max.get(tensor, peak), peak)
                calls[tensor].append(thin_call(rows, quota))
    groups = {}
    for tensor, nodes in readers.items():
        joined = np.concatenate([numpy_helper.to_array(initializers[node.input[1]]) for node in nodes], axis=1)
        if calls[tensor] and calls[tensor][0].shape[-1] == joined.shape[0]:
            groups[tensor] = (Activations(calls[tensor], channel_max[tensor]), joined)
    quantized = quantized or _quantized_activations
    choices = {tensor: best_scale(*group, quantized) for tensor, group in groups.items()}
    rotations = choose_rotations(groups, choices, quantized) if rotate else {}
    choices.update(rotations)  # smoothed (where their α > 0), then rotated
    unrotated = {tensor: group for tensor, group in groups.items() if tensor not in rotations}
    outliers = _split_outliers(unrotated, choices, outliers_per_input, quantized)
    scaled, smoothing = scales_of(choices, "MatMul")
    sides, rotation_products = _rewrite(
        graph, readers, scaled, initializers, outliers, list(rotations)
    )  # graph order: a set's differs per process
    return (
        smoothed,
        replace(
            smoothing,
            tensors=len(readers),
            outlier_tensors=len(outliers),
            rotated=len(rotations),
            rotation_block=ROTATION_BLOCK if rotations else 0,
            outlier_channels=sum(len(c) for c in outliers.values()),
            outlier_bytes=sum(side.float_bytes for side in sides),
            beside=tuple(name for side in sides for name in side.nodes) + tuple(rotation_products),
        ),
        expected,
    )


def _split_outliers(
    groups: dict[str, tuple[Activations, np.ndarray]],
    choices: dict[str, TensorChoice],
    most: int,
    quantized: QuantizedActivations,
) -> dict[str, np.ndarray]:
    """The inputs whose outlier channels (up to ``most``) are worth a float product beside the int8 one, with
    those channels; ``choices`` updated in place to the α chosen on the rest."""
    outliers = {}
    for tensor, group in groups.items():
        channels = outlier_channels(group[0].channel_max, most)
        if not channels.size:
            continue
        # the int8 products of the rest, α chosen on them; the side products are float, so no error of their own
        split = best_scale(*_without(group, channels), quantized)
        whole = choices[tensor]
        if split.best * OUTLIER_GAIN <= whole.best:  # worth its nodes (each costs a call's dispatch)
            outliers[tensor] = channels
            choices[tensor] = replace(whole, best=split.best, alpha=split.alpha, scale=split.scale)
    return outliers


def _without(group: tuple[Activations, np.ndarray], channels: np.ndarray) -> tuple[Activations, np.ndarray]:
    """A tensor's activations and joined weight with ``channels`` zeroed: what its int8 products see once
    those channels are split off (their exact products lose the side's share, which is float)."""
    activations, weight = group
    rows = [r.copy() for r in activations.rows]
    for r in rows:
        r[:, channels] = 0.0
    channel_max, weight = activations.channel_max.copy(), weight.copy()
    channel_max[channels], weight[channels] = 0.0, 0.0
    return Activations(rows, channel_max), weight


def _quantized_activations(x: np.ndarray) -> np.ndarray:
    """``x`` as onnxruntime's dynamic int8 sees it: one uint8 range over the whole call, dequantized."""
    return range_quantized(x, LEVELS, axis=None)


def _with_outputs(model: Any, names: list[str]) -> Any:
    """A copy of ``model`` that also returns the named intermediate tensors."""
    import onnx

    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    present = {output.name for output in probe.graph.output}
    for name in names:
        if name not in present:
            probe.graph.output.append(onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None))
    return probe


def _rewrite(
    graph: Any,
    readers: dict[str, list[Any]],
    scaled: dict[str, np.ndarray],
    initializers: dict[str, Any],
    outliers: dict[str, np.ndarray] | None = None,
    rotated: list[str] | None = None,
) -> tuple[list[OutlierSide], list[str]]:
    """Mul(x, 1/s) before the MatMuls that read x; their weights' rows times s. Split channels take a 0 in
    the Mul and in the weights' rows, and a float product beside each MatMul (``add_outlier_paths``). A
    ``rotated`` input then goes through the block Hadamard (``_rotation``) and its weights' rows are mixed by it.
    Returns the side products and the rotations' float MatMuls (neither to be quantized)."""
    from onnx import helper, numpy_helper

    from pe_export.converters.onnx.rewrites import drop_unread_initializers

    outliers, rotated = outliers or {}, rotated or []
    inserted: dict[str, list[Any]] = {}
    sides: list[OutlierSide] = []
    rotation_products: list[str] = []
    for index, tensor in enumerate(dict.fromkeys([*scaled, *outliers, *rotated])):
        channels = outliers.get(tensor, np.zeros(0, np.int64))
        scale = scaled.get(tensor, np.ones(initializers[readers[tensor][0].input[1]].dims[0], np.float32))
        output, added = tensor, []
        if tensor in scaled or channels.size:
            inverse_values = (1.0 / scale).astype(np.float32)
            inverse_values[channels] = 0.0
            inverse = numpy_helper.from_array(inverse_values, f"smooth_{index}__inverse")
            graph.initializer.append(inverse)
            output = f"smooth_{index}__x"
            added.append(helper.make_node("Mul", [tensor, inverse.name], [output], name=f"smooth_{index}"))
        if tensor in rotated:
            nodes, constants, output = _rotation(output, f"rotate_{index}", len(scale))
            added += nodes
            rotation_products += [node.name for node in nodes if node.op_type == "MatMul"]
            graph.initializer.extend(constants)
        inserted[output] = added  # before the first node that reads the smoothed (and rotated) input
        for node in readers[tensor]:
            original = numpy_helper.to_array(initializers[node.input[1]])
            weight = original * scale[:, None]
            weight[channels] = 0.0
            if tensor in rotated:
                weight = rotated_weight(weight)
            name = f"{node.input[1]}__smoothed_{index}"
            graph.initializer.append(numpy_helper.from_array(weight.astype(np.float32), name))
            node.input[0], node.input[1] = output, name
            if channels.size:
                sides.append(add_outlier_paths(graph, node, channels, tensor, original))
    _in_order(graph, inserted, sides)
    drop_unread_initializers(graph)
    return sides, rotation_products


def _rotation(tensor: str, prefix: str, channels: int) -> tuple[list[Any], list[Any], str]:
    """Nodes that rotate ``tensor``'s last axis (``channels``) by the block Hadamard: rows reshaped to blocks,
    a float product by H, the tensor's own shape back; their constants and the rotated tensor's name."""
    from onnx import helper, numpy_helper

    blocks = numpy_helper.from_array(
        np.array([-1, channels // ROTATION_BLOCK, ROTATION_BLOCK], np.int64), f"{prefix}__blocks"
    )
    matrix = numpy_helper.from_array(hadamard(ROTATION_BLOCK), f"{prefix}__hadamard")
    output = f"{prefix}__x"
    nodes = [
        helper.make_node("Shape", [tensor], [f"{prefix}__shape"], name=f"{prefix}__shape"),
        helper.make_node("Reshape", [tensor, blocks.name], [f"{prefix}__blocked"], name=f"{prefix}__blocked"),
        helper.make_node("MatMul", [f"{prefix}__blocked", matrix.name], [f"{prefix}__mixed"], name=f"{prefix}__mixed"),
        helper.make_node("Reshape", [f"{prefix}__mixed", f"{prefix}__shape"], [output], name=prefix),
    ]
    return nodes, [blocks, matrix], output


def _in_order(graph: Any, inserted: dict[str, list[Any]], sides: list[OutlierSide]) -> None:
    """Each input's inserted nodes (smoothing's Mul, the rotation) right before its first reader and each side
    product right after its MatMul (they were appended): the order stays topological, and the MatMuls keep their
    order (the search's places)."""
    side_nodes = {name for side in sides for name in side.nodes}
    by_name = {node.name: node for node in graph.node if node.name in side_nodes}
    after = {side.matmul: [by_name[name] for name in side.nodes] for side in sides}
    nodes = []
    for node in graph.node:
        if node.name in side_nodes:
            continue
        for name in node.input:
            if name in inserted:
                nodes.extend(inserted.pop(name))
        nodes.append(node)
        nodes.extend(after.get(node.name, []))
    del graph.node[:]
    graph.node.extend(nodes)
