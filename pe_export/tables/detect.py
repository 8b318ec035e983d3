"""Find the position tables in a frozen, constant-folded GraphDef, by how the graph reads them (TensorFlow side)."""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pe_export.graphdef import DT_FLOAT, DT_HALF, GraphIndex, const_value, node_name
from pe_export.tables.sinusoid import SinusoidFit, fit_sinusoid
from pe_export.tables.uses import KERNEL, LOOKUP, POSITION, RELATIVE, uses_of

MIN_TABLE_ELEMENTS = 64
_PASS_THROUGH = {"Identity", "StridedSlice", "Slice", "ExpandDims", "Reshape", "Squeeze", "GatherV2", "Cast"}


@dataclass
class TableInfo:
    node: str  # the Const node in the frozen graph
    name: str  # readable name: the SavedModel variable's path where known
    source: str  # "constant", "variable" or "computed" (folded at the export length)
    kind: str  # sinusoid-interleaved, sinusoid-halves, rotary-cos, rotary-sin, learned, relative, hybrid
    shape: tuple[int, ...]
    dtype: str
    value: np.ndarray = field(repr=False)
    fit: SinusoidFit | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def nbytes(self) -> int:
        return int(self.value.nbytes)

    @property
    def rows(self) -> np.ndarray:
        """The table as [L, d] float64."""
        return self.value.reshape(-1, self.value.shape[-1]).astype(np.float64)


def find_tables(
    graph_def: Any,
    *,
    original_consts: dict[str, np.ndarray],
    variables: dict[str, Any],
    hybrids: dict[str, np.ndarray],
    wanted: tuple[str, ...] = (),
) -> list[TableInfo]:
    """Every Const the graph reads by position (see tables/uses.py); its kind from its values.

    A constant gathered by an input (token ids) or used as a weight is never a position table,
    whatever its name; ``wanted`` (--table NAME) forces one in.
    """
    graph = GraphIndex(graph_def)
    tables = []
    for node in graph_def.node:
        if node.op != "Const" or node.attr["dtype"].type not in (DT_FLOAT, DT_HALF):
            continue
        dims = [d.size for d in node.attr["value"].tensor.tensor_shape.dim]
        squeezed = table_dims(dims)
        if squeezed is None:
            continue
        uses = uses_of(graph, node.name, squeezed[0])
        roles = {use.role for use in uses}
        # Not read by position, or a vocabulary lookup or a weight: its value is never read, unless --table
        # NAME may force it in (its readable name needs the value, to find its variable).
        excluded = not roles & {POSITION, RELATIVE} or bool(roles & {LOOKUP, KERNEL})
        if excluded and not wanted:
            continue
        value = const_value(node)
        rows = value.reshape(-1, value.shape[-1])
        # At a fixed length the slice table[:T] is folded too: match leading rows to find the origin.
        variable = origin(rows, variables)
        readable = variable or _scope_name(node.name, graph.consumers)
        forced = any(w in readable or w in node.name for w in wanted)
        if excluded and not forced:
            continue
        if not forced and np.unique(rows[: min(len(rows), 64)]).size <= 2:
            continue  # a 0/1 mask (causal or padding), not a table of positions
        fit = fit_sinusoid(rows)
        hybrid = node.name in hybrids or origin(rows, hybrids) is not None
        offset = None if hybrid or fit is not None or variable else _sinusoid_plus_variable(rows, variables)
        kind = _table_kind(hybrid or offset is not None, RELATIVE in roles, fit)
        constant = node.name in original_consts or origin(rows, original_consts) is not None
        source = "variable" if variable else ("constant" if constant else "computed")
        info = TableInfo(node.name, readable, source, kind, tuple(value.shape), value.dtype.name, value, fit)
        info.notes.append(uses[0].reason if uses else "named by --table")
        info.notes.extend(_notes(info, squeezed, offset, _masked_by(node.name, graph.consumers, graph.nodes)))
        tables.append(info)
    return tables


def _table_kind(hybrid: bool, relative: bool, fit: Any) -> str:
    if hybrid:
        return "hybrid"
    if relative:
        return "relative"
    if fit is not None:
        return {"cos-cache": "rotary-cos", "sin-cache": "rotary-sin"}.get(fit.layout, f"sinusoid-{fit.layout}")
    return "learned"


def _notes(info: TableInfo, squeezed: list[int], offset: str | None, masked_by: str | None) -> list[str]:
    """What the report says about a table beyond its kind."""
    notes = []
    if info.kind == "learned" and len(squeezed) == 2 and _is_grid_with_class_token(squeezed[0]):
        side = math.isqrt(squeezed[0] - 1)
        notes.append(f"{squeezed[0]} rows: a {side}x{side} patch grid plus a class token (by its shape)")
    if offset is not None:
        notes.append(f"a sinusoid plus {offset}, folded into one constant")
    if info.fit is not None and info.fit.base is not None:
        notes.append(f"base {info.fit.base:g}")
    if masked_by:
        notes.append(f"multiplied by the run-time mask from {masked_by} (the mask stays)")
    return notes


def table_dims(dims: list[int]) -> list[int] | None:
    """[positions, features] of a table-shaped constant ([L, d], [1, L, d], [1, L, 1, d], …), else None."""
    if len(dims) < 2:
        return None
    squeezed = [d for d in dims[:-1] if d != 1] + [dims[-1]]
    if len(squeezed) != 2:
        return None
    length, width = squeezed
    return squeezed if length >= 3 and width >= 2 and length * width >= MIN_TABLE_ELEMENTS else None


def _sinusoid_plus_variable(rows: np.ndarray, variables: dict[str, Any]) -> str | None:
    """A folded constant that is a sinusoid plus a scaled learned offset: "scale × variable", else None.

    Row 0 of a sinusoid is 0 (sine columns) or 1 (cosine columns), interleaved or in halves: that
    fixes the scale by least squares; the remainder must then fit a sinusoid.
    """
    length, width = rows.shape
    patterns = [np.tile([0.0, 1.0], width // 2), np.repeat([0.0, 1.0], width // 2)] if width % 2 == 0 else []
    for name, table in _covering(rows, variables):
        offset = table[:length].astype(np.float64)
        denominator = float(offset[0] @ offset[0])
        if denominator == 0.0:
            continue
        for pattern in patterns:
            scale = float((rows[0] - pattern) @ offset[0]) / denominator
            if abs(scale) > 1e-6 and fit_sinusoid(rows - scale * offset) is not None:
                return f"{scale:.4g} × {name}"
    return None


def position_axis(shape: tuple[int, ...] | list[int]) -> int:
    """The axis of a table-shaped constant that holds its positions: the first one (not the features) over 1."""
    return next((axis for axis, size in enumerate(shape[:-1]) if size != 1), len(shape) - 2)


def _is_grid_with_class_token(rows: int) -> bool:
    side = math.isqrt(rows - 1)
    return side >= 2 and side * side == rows - 1


def _input_behind(node: Any, nodes: dict[str, Any], depth: int = 8) -> str | None:
    """The graph input a run-time operand comes from (through casts and reshapes), for the report."""
    current = node
    for _ in range(depth):
        if current.op == "Placeholder":
            return f"input {current.name}"
        sources = [nodes.get(node_name(name)) for name in current.input]
        sources = [s for s in sources if s is not None and s.op != "Const"]
        if not sources:
            break
        current = sources[0]
    return None


def _scope_name(name: str, consumers: dict[str, list[tuple[Any, int]]]) -> str:
    """Inlining renames captured constants (Func/…/input/_20): name them after their first consumer's scope."""
    for consumer, _ in consumers.get(name, []):
        if "/" in consumer.name and not consumer.name.startswith("Func/"):
            return _readable(consumer.name.rsplit("/", 1)[0] + "/table")
    return _readable(name)


def _readable(name: str) -> str:
    """Drop the call wrappers that inlining leaves in front of every node name."""
    while name.startswith("StatefulPartitionedCall/"):
        name = name[len("StatefulPartitionedCall/") :]
    return name


def origin(rows: np.ndarray, candidates: dict[str, Any]) -> str | None:
    """The candidate whose leading rows are exactly ``rows`` ([L, d] or a folded slice of it)."""
    for name, table in _covering(rows, candidates):
        if table.dtype == rows.dtype and np.array_equal(table[: rows.shape[0]], rows):
            return name
    return None


def _covering(rows: np.ndarray, candidates: dict[str, Any]) -> Iterator[tuple[str, np.ndarray]]:
    """(name, value as [L, d]) of each candidate with ``rows``' width and at least its rows. A candidate is an
    array or a TensorFlow variable: a variable's value is read only once its shape matches, and not kept."""
    length, width = rows.shape
    for name, candidate in candidates.items():
        shape = tuple(int(d) for d in candidate.shape)
        if len(shape) < 2 or shape[-1] != width or int(np.prod(shape[:-1])) < length:
            continue
        value = candidate if isinstance(candidate, np.ndarray) else np.asarray(candidate.numpy())
        yield name, value.reshape(-1, width)


def _masked_by(name: str, consumers: dict, nodes: dict, depth: int = 6) -> str | None:
    """Follow slices and reshapes to a Mul whose other operand is computed at run time."""
    frontier = [name]
    for _ in range(depth):
        following = []
        for current in frontier:
            for consumer, position in consumers.get(current, []):
                if consumer.op == "Mul":
                    other = nodes.get(node_name(consumer.input[1 - position]))
                    source = _input_behind(other, nodes) if other is not None and other.op != "Const" else None
                    if source and "mask" in source.lower():
                        return source
                elif consumer.op in _PASS_THROUGH and position == 0:
                    following.append(consumer.name)
        frontier = following
    return None
