"""Find the position tables in a frozen, constant-folded GraphDef (TensorFlow side)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pe_export.tables.sinusoid import SinusoidFit, fit_sinusoid

POSITION_WORDS = ("position", "positional", "pos_emb", "pos_enc", "rotary", "rope", "relative")
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


def const_value(node: Any) -> np.ndarray:
    from tensorflow.python.framework import tensor_util

    return tensor_util.MakeNdarray(node.attr["value"].tensor)


def find_tables(
    graph_def: Any,
    *,
    original_consts: dict[str, np.ndarray],
    variables: dict[str, np.ndarray],
    hybrids: set[str],
    wanted: tuple[str, ...] = (),
) -> list[TableInfo]:
    """Every Const that is a position table: sinusoids by value; learned ones by name or ``wanted``."""
    consumers = _consumers(graph_def)
    nodes = {node.name: node for node in graph_def.node}
    tables = []
    for node in graph_def.node:
        if node.op != "Const" or node.attr["dtype"].type not in (1, 19):  # DT_FLOAT, DT_HALF
            continue
        dims = [d.size for d in node.attr["value"].tensor.tensor_shape.dim]
        if not _table_shaped(dims):
            continue
        value = const_value(node)
        rows = value.reshape(-1, value.shape[-1])
        variable = _matching_variable(value, variables)
        readable = variable or _scope_name(node.name, consumers)
        lowered = readable.lower()
        named = any(word in lowered for word in POSITION_WORDS) or any(w in readable for w in wanted)
        fit = fit_sinusoid(rows)
        index = _relative_index(node.name, consumers, nodes)
        if node.name in hybrids:
            kind = "hybrid"
        elif index is not None:
            kind = "relative"
        elif fit is not None:
            kind = {"cos-cache": "rotary-cos", "sin-cache": "rotary-sin"}.get(fit.layout, f"sinusoid-{fit.layout}")
        elif named:
            kind = "learned"
        else:
            continue
        constant = node.name in original_consts or _matching_variable(value, original_consts) is not None
        source = "variable" if variable else ("constant" if constant else "computed")
        info = TableInfo(node.name, readable, source, kind, tuple(value.shape), value.dtype.name, value, fit)
        if index is not None:
            info.notes.append(f"gathered by a {index[0]}×{index[1]} index constant ({index[0] * index[1] * 4:,} B)")
        if fit is not None and fit.base is not None:
            info.notes.append(f"base {fit.base:g}")
        masked_by = _masked_by(node.name, consumers, nodes)
        if masked_by:
            info.notes.append(f"multiplied by run-time {masked_by} (kept)")
        tables.append(info)
    return tables


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


def _table_shaped(dims: list[int]) -> bool:
    if len(dims) == 3 and dims[0] == 1:
        dims = dims[1:]
    return len(dims) == 2 and dims[0] >= 3 and dims[1] >= 2 and dims[0] * dims[1] >= MIN_TABLE_ELEMENTS


def _matching_variable(value: np.ndarray, variables: dict[str, np.ndarray]) -> str | None:
    for name, array in variables.items():
        if array.shape == value.shape and array.dtype == value.dtype and np.array_equal(array, value):
            return name
    return None


def _consumers(graph_def: Any) -> dict[str, list[tuple[Any, int]]]:
    result: dict[str, list[tuple[Any, int]]] = {}
    for node in graph_def.node:
        for position, source in enumerate(node.input):
            result.setdefault(source.split(":")[0].lstrip("^"), []).append((node, position))
    return result


def _relative_index(name: str, consumers: dict, nodes: dict) -> tuple[int, int] | None:
    """A Shaw table is gathered by a constant [T, T] integer index (clipped distances)."""
    for consumer, position in consumers.get(name, []):
        if consumer.op in ("GatherV2", "ResourceGather") and position == 0:
            index = nodes.get(consumer.input[1].split(":")[0])
            if index is not None and index.op == "Const":
                dims = [d.size for d in index.attr["value"].tensor.tensor_shape.dim]
                if len(dims) == 2 and dims[0] == dims[1] and dims[0] > 1:
                    return dims[0], dims[1]
    return None


def _masked_by(name: str, consumers: dict, nodes: dict, depth: int = 6) -> str | None:
    """Follow slices and reshapes to a Mul whose other operand is computed at run time."""
    frontier = [name]
    for _ in range(depth):
        following = []
        for current in frontier:
            for consumer, position in consumers.get(current, []):
                if consumer.op == "Mul":
                    other = nodes.get(consumer.input[1 - position].split(":")[0])
                    if other is not None and other.op != "Const":
                        return other.name.split("/")[-2] if "/" in other.name else other.name
                elif consumer.op in _PASS_THROUGH and position == 0:
                    following.append(consumer.name)
        frontier = following
    return None
