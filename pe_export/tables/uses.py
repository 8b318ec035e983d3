"""How a frozen graph reads a constant: the evidence that makes a table a position table.

A table is a position table because of what the graph does with it, never because of its name:
gathered by position ids (a range, a cumulative sum of the mask, constant ids 0…n-1, any of them gated
by the mask), sliced from row 0 to the run-time length, broadcast-added to (or multiplied into) the
hidden states along their sequence axis, or gathered by a distance index (relative). A gather by a
graph input (token or segment ids) is a vocabulary lookup, and a constant that enters a MatMul or an
Einsum as its weight is a kernel: neither is ever a position table. Names only break ties (a gather by
an input called ``position_ids``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from pe_export.graphdef import GraphIndex, node_name

POSITION, RELATIVE, LOOKUP, KERNEL = "position", "relative", "lookup", "kernel"
GATHER_OPS = frozenset({"GatherV2", "ResourceGather", "Gather"})
# Ops that only re-view or copy a tensor: its rows stay its rows.
VIEW_OPS = frozenset({"Identity", "Cast", "Reshape", "ExpandDims", "Squeeze", "BroadcastTo", "Tile", "Bitcast"})
WEIGHT_OPS = frozenset({"MatMul", "BatchMatMul", "BatchMatMulV2", "BatchMatMulV3", "Einsum", "Conv2D", "Conv1D"})
ELEMENTWISE_BINARY = frozenset({"Add", "AddV2", "Mul", "Sub"})
# Integer index arithmetic that keeps what an index means (offsets, clipping, negative-index wrap).
_INDEX_KEEPS = frozenset(
    {
        "Identity",
        "Cast",
        "ExpandDims",
        "Reshape",
        "Squeeze",
        "BroadcastTo",
        "Tile",
        "Add",
        "AddV2",
        "Minimum",
        "Maximum",
        "ClipByValue",
        "SelectV2",
        "Select",
        "Mul",
        "FloorMod",
        "Pack",
        "ConcatV2",
    }
)
# Index arithmetic applied to a difference of positions: relative-position buckets (T5, DeBERTa).
_DISTANCE_KEEPS = frozenset(
    {
        "Abs",
        "Sign",
        "Neg",
        "Log",
        "Floor",
        "Ceil",
        "Round",
        "RealDiv",
        "Div",
        "FloorDiv",
        "Less",
        "Greater",
        "LessEqual",
        "GreaterEqual",
        "LogicalAnd",
        "LogicalOr",
    }
)
_MAX_DEPTH = 24
POSITION_INPUT_WORDS = ("position", "pos_id", "positions")
OWN_ZEROS = ("pe_export_tables/run_time_zero", "pe_export_relative/run_time_zero")  # tables/graph.py


@dataclass(frozen=True)
class Use:
    """One reading of a constant: what it makes the constant, and where."""

    role: str  # POSITION, RELATIVE, LOOKUP or KERNEL
    reason: str  # "sliced from row 0 to the sequence length at node …"


def short(name: str) -> str:
    """A node name without the call wrappers that inlining puts in front of it."""
    parts = [p for p in name.split("/") if p != "StatefulPartitionedCall"]
    return "/".join(parts) or name


_SOURCE_OPS = frozenset({"Placeholder", "Range", "Cumsum", "Const"})


def _source_origin(graph: GraphIndex, node: Any) -> tuple[str, str] | None:
    """The origin a node of _SOURCE_OPS states by itself: a graph input, a range, or a constant index."""
    if node.op == "Placeholder":
        return "input", node.name
    if node.op == "Range":
        return "range", "a range"
    if node.op == "Cumsum":
        return "range", "a cumulative sum (position ids counted from the mask)"
    return _constant_index(graph.const_value(node.name))


def _constant_index(value: np.ndarray | None) -> tuple[str, str] | None:
    """What constant gather indices are: ("range", how) for position ids 0…n-1 in every row, ("distance",
    how) for one index per (query, key) pair, None for anything else."""
    if value is None or not np.issubdtype(value.dtype, np.integer) or value.size < 2:
        return None
    rows = value.reshape(-1, value.shape[-1])
    if np.all(rows == np.arange(value.shape[-1])[None, :]):
        return "range", f"constant position ids 0…{value.shape[-1] - 1}"
    if value.ndim >= 2 and value.shape[-1] == value.shape[-2] > 1:
        return "distance", f"a {value.shape[-2]}x{value.shape[-1]} constant index"
    return None


def _integer_constant(node: Any) -> bool:
    return node is not None and node.op == "Const" and "dtype" in node.attr and node.attr["dtype"].type in (3, 9)


def index_origin(graph: GraphIndex, tensor: str) -> tuple[str, str]:
    """Where gather indices come from: ("input", name), ("range", how), ("distance", how) or ("other", op).

    Walks back through index arithmetic. A graph input wins over a range where it carries the values
    (token ids offset by a constant are still token ids), a difference of two position sources makes a
    distance, and an input that only gates positions (``range * mask``, ``where(mask, range, pad)``) leaves
    them positions: a select's condition carries no index, and a product of ids with a range has no meaning
    as a token id.
    """
    others: list[str] = []

    def walk(tensor: str, depth: int) -> tuple[str, str] | None:
        node = graph.source(tensor)
        if node is None or depth > _MAX_DEPTH or node.name.endswith(OWN_ZEROS):
            return None  # pe-export's own run-time zero reads an input but carries no index
        if node.op in _SOURCE_OPS:
            return _source_origin(graph, node)
        if node.op == "GatherV2" and _integer_constant(graph.source(node.input[0])):
            return walk(node.input[1], depth + 1)  # an index looked up in a table of indices (frozen buckets)
        if node.op in ("StridedSlice", "Slice", "GatherV2", "Transpose", "Pad", "PadV2"):
            return walk(node.input[0], depth + 1)
        if node.op not in _INDEX_KEEPS and node.op not in _DISTANCE_KEEPS and node.op != "Sub":
            others.append(node.op)
            return None
        operands = [i for i in node.input if not i.startswith("^")]
        if node.op in ("Select", "SelectV2"):
            operands = operands[1:]  # the condition picks between values; it is none of them
        sides = [side for side in (walk(i, depth + 1) for i in operands) if side is not None]
        kinds = [kind for kind, _ in sides]
        if node.op == "Sub" and kinds == ["range", "range"]:
            return "distance", "a difference of positions"
        if node.op == "Mul" and "input" in kinds and ("range" in kinds or "distance" in kinds):
            sides = [side for side in sides if side[0] != "input"]  # positions gated by a mask
        return next((side for kind in ("input", "distance", "range") for side in sides if side[0] == kind), None)

    found = walk(tensor, 0)
    return found if found is not None else ("other", others[0] if others else "unknown")


def uses_of(graph: GraphIndex, name: str, rows: int) -> list[Use]:
    """Every reading of Const ``name`` (a table of ``rows`` positions) that says what it is.

    A slice from row 0 to a *fixed* end says nothing by itself (the first third of a fused QKV kernel is
    one): what its rows then meet decides, so it is followed like a view, with the rows it keeps.
    """
    result: list[Use] = []
    frontier = [(name, 0, rows)]
    seen = set()
    while frontier:
        current, depth, current_rows = frontier.pop()
        if current in seen or depth > 8:
            continue
        seen.add(current)
        for consumer, position in graph.consumers.get(current, []):
            kept = _fixed_prefix_rows(graph, consumer, position, current_rows)
            if kept is not None:
                frontier.append((consumer.name, depth + 1, kept))
                continue
            use = _direct_use(graph, consumer, position, current_rows)
            if use is not None:
                result.append(use)
            elif consumer.op in VIEW_OPS and position == 0:
                frontier.append((consumer.name, depth + 1, current_rows))
            elif consumer.op in ELEMENTWISE_BINARY and consumer.name not in graph.runtime:
                frontier.append((consumer.name, depth + 1, current_rows))  # scaled or offset by another constant
    if not result:
        relative = _projected_then_gathered_by_distance(graph, name)
        if relative is not None:
            result.append(relative)
    return result


def _prefix_slice(graph: GraphIndex, consumer: Any, position: int) -> bool:
    """A Slice/StridedSlice of the operand that starts at 0 on every axis."""
    if consumer.op not in ("Slice", "StridedSlice") or position != 0:
        return False
    begin = graph.const_value(consumer.input[1])
    return begin is not None and begin.size > 0 and not np.any(begin.reshape(-1) != 0)


def _fixed_prefix_rows(graph: GraphIndex, consumer: Any, position: int, rows: int) -> int | None:
    """The rows a slice from 0 to a fixed end keeps (its first axis over 1), else None."""
    if not _prefix_slice(graph, consumer, position) or graph.const_value(consumer.input[2]) is None:
        return None
    shape = graph.shape(consumer.name)
    sizes = [size for size in (shape or [])[:-1] if size not in (1, None)]
    return sizes[0] if sizes else rows


def _direct_use(graph: GraphIndex, consumer: Any, position: int, rows: int) -> Use | None:
    at = f"at node {short(consumer.name)}"
    if consumer.op in GATHER_OPS and position == 0:
        axis = graph.const_value(consumer.input[2]) if consumer.op == "GatherV2" and len(consumer.input) > 2 else 0
        if axis is not None and int(np.asarray(axis).reshape(-1)[0]) != 0:
            return None
        origin, how = index_origin(graph, consumer.input[1])
        if origin == "input":
            if any(word in how.lower() for word in POSITION_INPUT_WORDS):
                return Use(POSITION, f"gathered by input {how} (named as position ids) {at}")
            return Use(LOOKUP, f"looked up by input {how} {at}")
        if origin == "range":
            return Use(POSITION, f"gathered by {how} {at}")
        if origin == "distance":
            return Use(RELATIVE, f"gathered by a distance index ({how}) {at}")
        return None
    if _prefix_slice(graph, consumer, position):  # to a run-time end: a fixed one is followed (uses_of)
        return Use(POSITION, f"sliced from row 0 to a run-time end {at}")
    if consumer.op in WEIGHT_OPS:
        # The second operand is the weight (Keras Dense/EinsumDense); the first is data, followed elsewhere.
        return Use(KERNEL, f"weight of {consumer.op} {at}") if position == 1 else None
    if consumer.op in ELEMENTWISE_BINARY and consumer.name in graph.runtime:
        other = consumer.input[1 - position] if len(consumer.input) == 2 else None
        if other is None or node_name(other) not in graph.runtime:
            return None
        return _broadcast_use(graph, consumer, consumer.input[position], rows)
    return None


def _broadcast_use(graph: GraphIndex, consumer: Any, table: str, rows: int) -> Use | None:
    """A table added to (or multiplied into) activations along their sequence axis: broadcasting from
    the right puts the table's row axis on axis 1 of the result, which has that many positions."""
    mine, out = graph.shape(table), graph.shape(consumer.name)
    if mine is None or out is None or len(out) < 3 or len(mine) > len(out):
        return None
    axis = next((i for i, size in enumerate(mine[:-1]) if size == rows), None)
    if axis is None:
        return None
    mapped = len(out) - len(mine) + axis
    # Activations are [batch, sequence, …, features]: the rows must land on axis 1. A [heads, head_dim]
    # bias lands on the heads axis of [B, T, H, d], a [T, T] mask on the key axis: neither is a table.
    if mapped != 1 or out[mapped] not in (rows, None):
        return None
    verb = "added to" if consumer.op in ("Add", "AddV2") else ("multiplied into" if consumer.op == "Mul" else "used by")
    return Use(
        POSITION,
        f"{verb} run-time activations along their sequence axis ({rows} positions) at node {short(consumer.name)}",
    )


def _projected_then_gathered_by_distance(graph: GraphIndex, name: str) -> Use | None:
    """DeBERTa: the relative table is normalised and projected, then the attention scores it makes are
    gathered by bucketed distances. Follow the data to such a gather; a weight input ends the search."""
    frontier, seen = [(name, 0, True)], set()
    while frontier:
        current, depth, view = frontier.pop()
        if current in seen or depth > _MAX_DEPTH:
            continue
        seen.add(current)
        for consumer, position in graph.consumers.get(current, []):
            if consumer.op in WEIGHT_OPS and view and position == 1:
                return None  # the constant itself (or a view of it) is a weight
            if consumer.op in GATHER_OPS:
                if position != 0:
                    continue
                origin, how = index_origin(graph, consumer.input[1])
                if origin == "distance":
                    return Use(
                        RELATIVE, f"projected, then gathered by a distance index ({how}) at node {short(consumer.name)}"
                    )
                if origin == "input":
                    return None
            frontier.append((consumer.name, depth + 1, view and consumer.op in VIEW_OPS))
    return None
