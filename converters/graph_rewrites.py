"""GraphDef rewrites that keep a .tflite file on builtin ops.

``x[:, None]``, ``mask[:, None, None, :]`` and ``x[..., None]`` are StridedSlice ops with a
new-axis mask. With a dynamic shape the TFLite converter cannot lower them and falls back to
FlexStridedSlice, which no pip runtime runs. When the slice only inserts axes (every other
index takes the whole dimension with stride 1) it is ExpandDims, once per new axis, which is
a builtin.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from pe_export.graphdef import DT_INT32, DT_INT64, GraphIndex, const_value, node_name

SLICE_FLEX_OP = "FlexStridedSlice"


@dataclass(frozen=True)
class _AxisPlan:
    source: str  # the sliced tensor
    dtype: int  # DataType enum of the sliced tensor
    axes: tuple[int, ...]  # ExpandDims axes, in the order to apply them


def new_axis_slices_to_expand_dims(graph_def: Any) -> tuple[Any, int]:
    """A copy of ``graph_def`` with every axis-inserting StridedSlice replaced; returns (graph, count)."""

    nodes = {node.name: node for node in graph_def.node}
    plans = {node.name: plan for node in graph_def.node if (plan := _plan(node, nodes)) is not None}
    if not plans:
        return graph_def, 0

    def as_expand_dims(rewritten: Any, node: Any) -> None:
        plan = plans[node.name]
        current = plan.source
        for step, axis in enumerate(plan.axes):
            last = step == len(plan.axes) - 1
            # The last ExpandDims takes the slice's name, so its consumers need no rewiring.
            name = node.name if last else f"{node.name}/new_axis_{step}"
            axis_node = rewritten.node.add()
            axis_node.name, axis_node.op = f"{node.name}/new_axis_{step}/axis", "Const"
            axis_node.attr["dtype"].type = DT_INT32
            axis_node.attr["value"].tensor.CopyFrom(_int32_scalar(axis))
            expand = rewritten.node.add()
            expand.name, expand.op = name, "ExpandDims"
            expand.input.extend([current, axis_node.name])
            expand.attr["T"].type = plan.dtype
            expand.attr["Tdim"].type = DT_INT32
            if node.device:
                expand.device = node.device
            current = name

    return _rewrite_nodes(graph_def, set(plans), as_expand_dims), len(plans)


def _plan(node: Any, nodes: dict[str, Any]) -> _AxisPlan | None:
    if node.op != "StridedSlice" or not node.attr["new_axis_mask"].i or node.attr["shrink_axis_mask"].i:
        return None
    if len(node.input) != 4 or any(name.startswith("^") for name in node.input):
        return None
    specs = [nodes.get(node_name(name)) for name in node.input[1:]]
    if any(spec is None or spec.op != "Const" for spec in specs):
        return None
    begin, _end, strides = (np.asarray(const_value(spec)).reshape(-1) for spec in specs)
    masks = {key: node.attr[key].i for key in ("begin_mask", "end_mask", "ellipsis_mask", "new_axis_mask")}
    kinds = []
    for index in range(len(begin)):
        bit = 1 << index
        if masks["ellipsis_mask"] & bit:
            kinds.append("...")
        elif masks["new_axis_mask"] & bit:
            kinds.append("new")
        elif strides[index] == 1 and (masks["begin_mask"] & bit or begin[index] == 0) and masks["end_mask"] & bit:
            kinds.append("all")
        else:
            return None  # a real slice: leave it to the converter
    if kinds.count("...") > 1:
        return None
    split = kinds.index("...") if "..." in kinds else len(kinds)
    # Axes before an ellipsis count from the front, after it from the back (the rank may be unknown).
    front = [position for position, kind in enumerate(kinds[:split]) if kind == "new"]
    back = [-1 - position for position, kind in enumerate(reversed(kinds[split + 1 :])) if kind == "new"]
    return _AxisPlan(source=node.input[0], dtype=node.attr["T"].type, axes=(*front, *back))


def _int32_scalar(value: int) -> Any:
    from tensorflow.core.framework import tensor_pb2

    tensor = tensor_pb2.TensorProto()
    tensor.dtype = DT_INT32
    tensor.int_val.append(value)
    return tensor


# TFLite has ABS and SIGN for int32 (and floats) only: int64 ones become FlexAbs / FlexSign.
INT32_ONLY_OPS = {"Abs": "FlexAbs", "Sign": "FlexSign"}


def int64_ops_through_int32(graph_def: Any) -> tuple[Any, int]:
    """A copy of ``graph_def`` where int64 Abs/Sign of position arithmetic run in int32; returns (graph, count).

    Only where the operand provably fits: it is computed from positions (ranges, differences of
    ranges; DeBERTa's relative-position buckets), which are bounded by a tensor dimension. The op
    keeps its name and dtype for its consumers: Cast(int64→int32) → op → Cast(int32→int64).
    """

    from pe_export.tables.uses import index_origin

    graph = GraphIndex(graph_def)
    targets = {
        node.name
        for node in graph_def.node
        if node.op in INT32_ONLY_OPS
        and node.attr["T"].type == DT_INT64
        and index_origin(graph, node.input[0])[0] in ("range", "distance")
    }
    if not targets:
        return graph_def, 0

    def through_int32(rewritten: Any, node: Any) -> None:
        narrow = _cast(rewritten.node.add(), f"{node.name}/to_int32", node.input[0], DT_INT64, DT_INT32)
        core = rewritten.node.add()
        core.CopyFrom(node)
        core.name = f"{node.name}/int32"
        del core.input[:]
        core.input.extend([narrow.name, *node.input[1:]])
        core.attr["T"].type = DT_INT32
        _cast(rewritten.node.add(), node.name, core.name, DT_INT32, DT_INT64)

    return _rewrite_nodes(graph_def, targets, through_int32), len(targets)


def _rewrite_nodes(graph_def: Any, targets: set[str], emit: Callable[[Any, Any], None]) -> Any:
    """A copy of ``graph_def`` in which ``emit(graph, node)`` writes the replacement of each target node."""
    from tensorflow.core.framework import graph_pb2

    rewritten = graph_pb2.GraphDef()
    rewritten.versions.CopyFrom(graph_def.versions)
    rewritten.library.CopyFrom(graph_def.library)
    for node in graph_def.node:
        if node.name in targets:
            emit(rewritten, node)
        else:
            rewritten.node.add().CopyFrom(node)
    return rewritten


def _cast(node: Any, name: str, source: str, from_type: int, to_type: int) -> Any:
    node.name, node.op = name, "Cast"
    node.input.append(source)
    node.attr["SrcT"].type = from_type
    node.attr["DstT"].type = to_type
    node.attr["Truncate"].b = False
    return node
