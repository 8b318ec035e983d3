"""GraphDef rewrites for the TFLite converter: builtin ops instead of Flex ones, fast kernels instead of slow.

``x[:, None]``, ``mask[:, None, None, :]`` and ``x[..., None]`` are StridedSlice ops with a
new-axis mask. With a dynamic shape the TFLite converter cannot lower them and falls back to
FlexStridedSlice, which no pip runtime runs. When the slice only inserts axes (every other
index takes the whole dimension with stride 1) it is ExpandDims, once per new axis, which is
a builtin.

``table[:, :T]`` (a constant's leading rows, T known at run time) is a StridedSlice too, and TFLite's
STRIDED_SLICE kernel copies it element by element: 0.61 ms for 512 rows of an 8192×256 table against
0.032 ms for SLICE, which copies rows (ai-edge-litert 2.3, one thread). Such a prefix slice is a Slice.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

import numpy as np

from pe_export.graphdef import DT_BOOL, DT_INT32, DT_INT64, GraphIndex, const_value, node_name

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
            axis_node = _const(
                rewritten.node.add(), f"{node.name}/new_axis_{step}/axis", np.array(axis, np.int32), DT_INT32
            )
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


@dataclass(frozen=True)
class _PrefixPlan:
    table: Any  # the Const node sliced (through any Identity)
    rank: int  # of the result: the table's rank plus the axes the slice inserts
    new_axes: tuple[int, ...]  # axes the slice inserts (table[None, :T])
    whole: tuple[bool, ...]  # per slice index: the axis is taken whole (or inserted): size -1
    ends: np.ndarray | None  # the ends when constant; None: read at run time from the slice's end input


def prefix_slices_to_slice(graph_def: Any, rebuilt: Collection[str] = ()) -> tuple[Any, int]:
    """A copy of ``graph_def`` where every prefix StridedSlice of a table is a Slice; (graph, count).

    A table is a constant, or a node in ``rebuilt`` (the table pipeline's run-time rebuild of one, a
    Reshape, whose rows the sequence length bounds). Only where the two ops agree on every input the
    model can run: every index starts at 0 with stride 1 or inserts an axis (``table[None, :T]``), none
    is removed or skipped, and each end is a constant within the table or a length read from a tensor's
    shape at run time (never negative). An end past the table, which StridedSlice clamps, is an error in
    such a model either way: the rows it adds the table to are longer than the table.
    """
    nodes = {node.name: node for node in graph_def.node}
    plans = {
        node.name: plan for node in graph_def.node if (plan := _prefix_plan(node, nodes, set(rebuilt))) is not None
    }
    if not plans:
        return graph_def, 0

    def as_slice(rewritten: Any, node: Any) -> None:
        plan = plans[node.name]
        index_type = node.attr["Index"].type
        dtype = np.int64 if index_type == DT_INT64 else np.int32
        source = node.input[0]
        if plan.new_axes and plan.table.op == "Const":  # folded into a copy: Slice cannot insert axes
            value = np.asarray(const_value(plan.table))
            for axis in plan.new_axes:
                value = np.expand_dims(value, axis)
            source = _const(rewritten.node.add(), f"{node.name}/table", value, plan.table.attr["dtype"].type).name
        for step, axis in enumerate(plan.new_axes if plan.table.op != "Const" else ()):
            axis_node = _const(rewritten.node.add(), f"{node.name}/axis_{step}", np.array(axis, np.int32), DT_INT32)
            expand = rewritten.node.add()
            expand.name, expand.op = f"{node.name}/expand_{step}", "ExpandDims"
            expand.input.extend([source, axis_node.name])
            expand.attr["T"].CopyFrom(node.attr["T"])
            expand.attr["Tdim"].type = DT_INT32
            source = expand.name
        begin = _const(rewritten.node.add(), f"{node.name}/begin", np.zeros(plan.rank, dtype), index_type)
        rest = plan.rank - len(plan.whole)  # axes after the last index: whole
        if plan.ends is not None:
            sizes = [-1 if whole else int(end) for whole, end in zip(plan.whole, plan.ends, strict=False)]
            size = _const(rewritten.node.add(), f"{node.name}/size", np.array(sizes + [-1] * rest, dtype), index_type)
            size_name = size.name
        else:
            size_name = _run_time_sizes(rewritten, node, plan, index_type, dtype, rest)
        sliced = rewritten.node.add()
        sliced.name, sliced.op = node.name, "Slice"  # its consumers need no rewiring
        sliced.input.extend([source, begin.name, size_name])
        sliced.attr["T"].CopyFrom(node.attr["T"])
        sliced.attr["Index"].type = index_type
        if node.device:
            sliced.device = node.device

    return _rewrite_nodes(graph_def, set(plans), as_slice), len(plans)


def _run_time_sizes(rewritten: Any, node: Any, plan: _PrefixPlan, index_type: int, dtype: type, rest: int) -> str:
    """Slice sizes from the slice's run-time ends: -1 where an axis is whole or inserted, -1 for the rest."""
    count = len(plan.whole)
    whole = _const(rewritten.node.add(), f"{node.name}/whole", np.array(plan.whole), DT_BOOL)
    minus_one = _const(rewritten.node.add(), f"{node.name}/minus_one", np.full(count, -1, dtype), index_type)
    select = rewritten.node.add()
    select.name, select.op = f"{node.name}/sizes", "SelectV2"
    select.input.extend([whole.name, minus_one.name, node.input[2]])
    select.attr["T"].type = index_type
    if not rest:
        return str(select.name)
    tail = _const(rewritten.node.add(), f"{node.name}/tail", np.full(rest, -1, dtype), index_type)
    axis = _const(rewritten.node.add(), f"{node.name}/axis", np.array(0, np.int32), DT_INT32)
    concat = rewritten.node.add()
    concat.name, concat.op = f"{node.name}/size", "ConcatV2"
    concat.input.extend([select.name, tail.name, axis.name])
    concat.attr["N"].i = 2
    concat.attr["T"].type = index_type
    concat.attr["Tidx"].type = DT_INT32
    return str(concat.name)


def _static_vector(reference: str, nodes: dict[str, Any]) -> np.ndarray | None:
    """An index vector known before run time: a Const, or a Pack of scalar Consts (as Keras traces them)."""
    node = nodes.get(node_name(reference))
    if node is None:
        return None
    if node.op == "Const":
        return np.asarray(const_value(node)).reshape(-1)
    if node.op == "Pack":
        parts = [nodes.get(node_name(name)) for name in node.input]
        if all(part is not None and part.op == "Const" for part in parts):
            return np.array([np.asarray(const_value(part)).reshape(-1)[0] for part in parts])
    return None


_SHAPE_KEEPS = frozenset({"Identity", "Cast", "StridedSlice", "Slice", "Reshape", "Squeeze", "ExpandDims", "GatherV2"})


def _never_negative(reference: str, nodes: dict[str, Any], depth: int = 0) -> bool:
    """True when a value is provably ≥ 0: a non-negative constant, a shape, or arithmetic that keeps either."""
    node = nodes.get(node_name(reference))
    if node is None or depth > 12 or reference.startswith("^"):
        return False
    if node.op == "Const":
        value = np.asarray(const_value(node))
        return bool(np.issubdtype(value.dtype, np.integer) and (value >= 0).all())
    if node.op in ("Shape", "Size"):
        return True
    if node.op in _SHAPE_KEEPS:
        return _never_negative(node.input[0], nodes, depth + 1)
    if node.op in ("Pack", "Add", "AddV2", "Mul", "Minimum"):
        return all(_never_negative(i, nodes, depth + 1) for i in node.input if not i.startswith("^"))
    if node.op == "ConcatV2":
        return all(_never_negative(i, nodes, depth + 1) for i in node.input[:-1] if not i.startswith("^"))
    if node.op == "Maximum":
        return any(_never_negative(i, nodes, depth + 1) for i in node.input if not i.startswith("^"))
    return False


def _table_dims(table: Any, nodes: dict[str, Any], rebuilt: set[str]) -> list[int] | None:
    """A table's dimensions (-1 where the sequence length sets them), or None when it is no table."""
    if table.op == "Const":
        return [d.size for d in table.attr["value"].tensor.tensor_shape.dim]
    if table.name in rebuilt and table.op == "Reshape":
        shape = _static_vector(table.input[1], nodes)
        return None if shape is None else [int(d) for d in shape]
    return None


def _prefix_plan(node: Any, nodes: dict[str, Any], rebuilt: set[str]) -> _PrefixPlan | None:
    if node.op != "StridedSlice" or len(node.input) != 4 or any(name.startswith("^") for name in node.input):
        return None
    if node.attr["ellipsis_mask"].i or node.attr["shrink_axis_mask"].i:
        return None
    table = nodes.get(node_name(node.input[0]))
    while table is not None and table.op == "Identity":  # a frozen variable read
        table = nodes.get(node_name(table.input[0]))
    begin, strides = _static_vector(node.input[1], nodes), _static_vector(node.input[3], nodes)
    table_dims = None if table is None else _table_dims(table, nodes, rebuilt)
    if table_dims is None or begin is None or strides is None or len(begin) != len(strides):
        return None
    masks = {key: node.attr[key].i for key in ("begin_mask", "end_mask", "new_axis_mask")}
    new = [bool(masks["new_axis_mask"] & (1 << i)) for i in range(len(begin))]
    for i in range(len(begin)):
        if not new[i] and (strides[i] != 1 or (begin[i] != 0 and not masks["begin_mask"] & (1 << i))):
            return None
    dims = list(table_dims)
    for axis in (i for i in range(len(begin)) if new[i]):
        dims.insert(axis, 1)
    if len(begin) > len(dims):
        return None
    whole = tuple(new[i] or bool(masks["end_mask"] & (1 << i)) for i in range(len(begin)))
    ends = _static_vector(node.input[2], nodes)
    if ends is not None:  # a constant end must lie within the table (where StridedSlice would clamp)
        if len(ends) != len(begin) or not all(whole[i] or 0 <= ends[i] <= dims[i] for i in range(len(begin))):
            return None
    elif not _never_negative(node.input[2], nodes):
        return None
    new_axes = tuple(i for i in range(len(begin)) if new[i])
    return _PrefixPlan(table, len(dims), new_axes, whole, ends)


def _const(node: Any, name: str, value: np.ndarray, dtype: int) -> Any:
    from tensorflow.python.framework import tensor_util

    node.name, node.op = name, "Const"
    node.attr["dtype"].type = dtype
    node.attr["value"].tensor.CopyFrom(tensor_util.make_tensor_proto(value))
    return node


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


def shrinking_slices_as_squeeze(graph_def: Any) -> tuple[Any, int]:
    """A copy of ``graph_def`` where a StridedSlice that drops axes (``x[:, 0]``: a shrink_axis_mask, the pooler's
    first token) keeps them as length 1 and a Squeeze drops them: the same values; LiteRT's GPU accelerator
    refuses the mask ("Slice does not support shrink_axis_mask parameter"). Only where begin, end and strides are
    constants and no ellipsis or new axis is asked. Returns (graph, count)."""
    nodes = {node.name: node for node in graph_def.node}
    plans: dict[str, tuple[np.ndarray, int, list[int]]] = {}
    for node in graph_def.node:
        shrink = node.attr["shrink_axis_mask"].i if node.op == "StridedSlice" else 0
        if not shrink or node.attr["ellipsis_mask"].i or node.attr["new_axis_mask"].i:
            continue
        vectors = [_static_vector(name, nodes) for name in node.input[1:4]]
        if any(vector is None for vector in vectors):
            continue
        begin, end, strides = (np.asarray(v).astype(np.int64) for v in vectors)
        axes = [axis for axis in range(len(begin)) if shrink >> axis & 1]
        end_mask = node.attr["end_mask"].i
        for axis in axes:  # a kept axis of length 1: [b, b + 1), or [-1, end of the axis)
            if strides[axis] != 1:
                break
            if begin[axis] == -1:
                end_mask |= 1 << axis
            else:
                end[axis] = begin[axis] + 1
        else:
            plans[node.name] = (end, end_mask, axes)
    if not plans:
        return graph_def, 0

    def squeezed(rewritten: Any, node: Any) -> None:
        end, end_mask, axes = plans[node.name]
        index_type = node.attr["Index"].type
        kept = rewritten.node.add()
        kept.CopyFrom(node)
        kept.name = f"{node.name}/kept_axes"
        dtype = np.int64 if index_type == DT_INT64 else np.int32
        end_node = _const(rewritten.node.add(), f"{node.name}/kept_axes/end", end.astype(dtype), index_type)
        kept.input[2] = end_node.name
        kept.attr["shrink_axis_mask"].i = 0
        kept.attr["end_mask"].i = end_mask
        squeeze = rewritten.node.add()  # takes the slice's name: its consumers need no rewiring
        squeeze.name, squeeze.op = node.name, "Squeeze"
        squeeze.input.append(kept.name)
        squeeze.attr["T"].type = node.attr["T"].type
        squeeze.attr["squeeze_dims"].list.i.extend(axes)
        for made in (kept, end_node, squeeze):
            if node.device:
                made.device = node.device

    return _rewrite_nodes(graph_def, set(plans), squeezed), len(plans)


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


def flat_lookups(graph_def: Any) -> tuple[Any, int]:
    """A copy of ``graph_def`` where a table lookup by a matrix of ids (``table[ids]``, ids of a fixed shape such as
    [1, S]) reads the table by the flattened ids, as rows of a [1, V, H] table: Reshape(ids, [-1]) → GatherV2 along
    axis 1 of ExpandDims(table, 0) → [1, N, H] → Reshape to [*ids, H]. The same values; LiteRT's GPU accelerator
    takes a GATHER with 1-D indices only ("Only support 1D indices"), and the rows must not come out 2-D: the
    accelerator lays a [N, H] tensor out as N batches, and an ADD of it and a constant [N, H] (the position rows)
    then adds row 0 of the constant to every row (measured under lavapipe: all-MiniLM-L6-v2 wrong from its
    embeddings on, cosine 0.01; the same lookup as [1, N, H] exact). Only where the table is a weight (constant or a
    frozen weight's stand-in) of rank 2, read along axis 0, and the ids' shape is fully known. Returns (graph,
    count)."""
    from pe_export.weights import is_stand_in

    graph = GraphIndex(graph_def)
    plans: dict[str, list[int]] = {}
    for node in graph_def.node:
        if node.op != "GatherV2" or node.attr["batch_dims"].i != 0:
            continue
        table = graph.source(node.input[0])
        while table is not None and table.op == "Identity":
            table = graph.source(table.input[0])
        if table is None or not (table.op == "Const" or is_stand_in(table)):
            continue
        axis = graph.const_value(node.input[2])
        table_shape, ids_shape = graph.shape(node.input[0]), graph.shape(node.input[1])
        if axis is None or int(axis) != 0 or table_shape is None or len(table_shape) != 2 or None in table_shape:
            continue
        if ids_shape is None or len(ids_shape) < 2 or None in ids_shape:
            continue
        plans[node.name] = [int(d or 0) for d in (*ids_shape, table_shape[1])]  # every one known, checked above
    if not plans:
        return graph_def, 0

    def flattened(rewritten: Any, node: Any) -> None:
        index_type = node.attr["Tindices"].type
        flat_shape = _const(rewritten.node.add(), f"{node.name}/flat/shape", np.array([-1], np.int32), DT_INT32)
        flat_ids = rewritten.node.add()
        flat_ids.name, flat_ids.op = f"{node.name}/flat/ids", "Reshape"
        flat_ids.input.extend([node.input[1], flat_shape.name])
        flat_ids.attr["T"].type = index_type
        flat_ids.attr["Tshape"].type = DT_INT32
        leading = _const(rewritten.node.add(), f"{node.name}/flat/leading", np.array(0, np.int32), DT_INT32)
        table = rewritten.node.add()
        table.name, table.op = f"{node.name}/flat/table", "ExpandDims"
        table.input.extend([node.input[0], leading.name])
        table.attr["T"].type = node.attr["Tparams"].type
        table.attr["Tdim"].type = DT_INT32
        axis = _const(rewritten.node.add(), f"{node.name}/flat/axis", np.array(1, np.int32), DT_INT32)
        gather = rewritten.node.add()
        gather.CopyFrom(node)
        gather.name = f"{node.name}/flat"
        del gather.input[:]
        gather.input.extend([table.name, flat_ids.name, axis.name, *(i for i in node.input if i.startswith("^"))])
        gather.attr["Taxis"].type = DT_INT32
        rows_shape = _const(
            rewritten.node.add(), f"{node.name}/flat/rows_shape", np.array(plans[node.name], np.int32), DT_INT32
        )
        rows = rewritten.node.add()  # takes the gather's name: its consumers need no rewiring
        rows.name, rows.op = node.name, "Reshape"
        rows.input.extend([gather.name, rows_shape.name])
        rows.attr["T"].type = node.attr["Tparams"].type
        rows.attr["Tshape"].type = DT_INT32
        for made in (flat_shape, flat_ids, leading, table, axis, gather, rows_shape, rows):
            if node.device:
                made.device = node.device

    return _rewrite_nodes(graph_def, set(plans), flattened), len(plans)
