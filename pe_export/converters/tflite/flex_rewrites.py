"""Exact rewrites of ops the TFLite converter leaves as Flex at dynamic shapes, into builtins.

Seen in Longformer's sliding-window attention (transformers 4.x, TF), each the same values by construction:

- ``Einsum`` of two operands, each with one free label beside the shared (batch) labels and one summed label
  (``bcxd,bcyd->bcxy``, ``blhd,bshd->blhs``): Transpose → BatchMatMulV2 → Transpose. The converter lowers such an
  einsum only where every shape is known; at a dynamic sequence length it stays FlexEinsum.
- ``Roll`` by constant shifts along constant axes: a gather of ``(range(n) - shift) mod n`` along each axis
  (RANGE, SUB, FLOOR_MOD, GATHER), n read from the tensor's shape at run time.
- int64 ``Abs`` and ``Sign`` (TFLite's kernels take int32 and floats only): ``select(x < 0, -x, x)`` and
  ``(x > 0) - (x < 0)``, for every int64 value (no narrowing; graph_rewrites.int64_ops_through_int32 narrows
  the position arithmetic it can bound).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from pe_export.converters.tflite.graph_rewrites import _cast, _const, _rewrite_nodes
from pe_export.graphdef import DT_BOOL, DT_INT32, DT_INT64, GraphIndex

FLEX_EINSUM, FLEX_ROLL = "FlexEinsum", "FlexRoll"


def _operands(node: Any) -> list[str]:
    return [tensor for tensor in node.input if not tensor.startswith("^")]


def _controls(node: Any) -> list[str]:
    return [tensor for tensor in node.input if tensor.startswith("^")]


def _matmul_plan(equation: str) -> tuple[list[int], list[int], list[int]] | None:
    """(left permutation, right permutation, output permutation) of an einsum that is one batched matrix product,
    else None. Left becomes [batch…, free, summed], right [batch…, summed, free]; the product [batch…, left free,
    right free] is permuted to the output's order."""
    if "..." in equation or "->" not in equation:
        return None
    inputs, output = equation.split("->")
    operands = inputs.split(",")
    if len(operands) != 2:
        return None
    left, right = operands
    if any(len(set(labels)) != len(labels) for labels in (left, right, output)):
        return None  # a repeated label is a diagonal or a trace
    shared = [label for label in output if label in left and label in right]
    summed = [label for label in left if label in right and label not in output]
    left_free = [label for label in left if label not in right]
    right_free = [label for label in right if label not in left]
    if len(summed) != 1 or len(left_free) != 1 or len(right_free) != 1:
        return None
    if set(output) != {*shared, *left_free, *right_free}:
        return None
    left_order = [*shared, left_free[0], summed[0]]
    right_order = [*shared, summed[0], right_free[0]]
    product = [*shared, left_free[0], right_free[0]]
    return (
        [left.index(label) for label in left_order],
        [right.index(label) for label in right_order],
        [product.index(label) for label in output],
    )


def _transpose(graph: Any, name: str, source: str, permutation: list[int], dtype: int, device: str) -> str:
    if permutation == sorted(permutation):
        return source
    perm = _const(graph.node.add(), f"{name}/perm", np.array(permutation, np.int32), DT_INT32)
    node = graph.node.add()
    node.name, node.op = name, "Transpose"
    node.input.extend([source, perm.name])
    node.attr["T"].type = dtype
    node.attr["Tperm"].type = DT_INT32
    node.device = perm.device = device
    return name


def einsums_as_matmul(graph_def: Any) -> tuple[Any, int]:
    """A copy of ``graph_def`` with every two-operand einsum that is one batched matrix product rewritten;
    returns (graph, count)."""
    plans = {
        node.name: plan
        for node in graph_def.node
        if node.op == "Einsum"
        and len(_operands(node)) == 2
        and (plan := _matmul_plan(node.attr["equation"].s.decode())) is not None
    }
    if not plans:
        return graph_def, 0

    def as_matmul(rewritten: Any, node: Any) -> None:
        left_perm, right_perm, output_perm = plans[node.name]
        dtype, device = node.attr["T"].type, node.device
        left, right = _operands(node)
        left = _transpose(rewritten, f"{node.name}/left", left, left_perm, dtype, device)
        right = _transpose(rewritten, f"{node.name}/right", right, right_perm, dtype, device)
        last = output_perm == sorted(output_perm)
        matmul = rewritten.node.add()
        matmul.name, matmul.op = (node.name if last else f"{node.name}/matmul"), "BatchMatMulV2"
        matmul.input.extend([left, right, *_controls(node)])
        matmul.attr["T"].type = dtype
        matmul.attr["adj_x"].b = matmul.attr["adj_y"].b = False
        matmul.device = device
        if not last:  # the last node takes the einsum's name: its readers need no rewiring
            _transpose(rewritten, node.name, matmul.name, output_perm, dtype, device)

    return _rewrite_nodes(graph_def, set(plans), as_matmul), len(plans)


def rolls_as_gathers(graph_def: Any) -> tuple[Any, int]:
    """A copy of ``graph_def`` with every Roll by constant shifts along constant, non-negative axes rewritten as
    gathers; returns (graph, count)."""
    graph = GraphIndex(graph_def)
    plans: dict[str, list[tuple[int, int]]] = {}
    for node in graph_def.node:
        if node.op != "Roll":
            continue
        shift, axis = graph.const_value(node.input[1]), graph.const_value(node.input[2])
        if shift is None or axis is None:
            continue
        shifts, axes = np.atleast_1d(shift).astype(np.int64), np.atleast_1d(axis).astype(np.int64)
        if shifts.shape != axes.shape or (axes < 0).any():
            continue
        plans[node.name] = [(int(s), int(a)) for s, a in zip(shifts, axes, strict=True)]
    if not plans:
        return graph_def, 0

    def as_gathers(rewritten: Any, node: Any) -> None:
        device, dtype = node.device, node.attr["T"].type
        current = _operands(node)[0]
        steps = plans[node.name]
        for step, (shift, axis) in enumerate(steps):
            prefix = f"{node.name}/roll_{step}"
            consts = {
                key: _const(rewritten.node.add(), f"{prefix}/{key}", np.array(value, np.int32), DT_INT32)
                for key, value in (("axis", axis), ("zero", 0), ("one", 1), ("shift", shift))
            }
            shape = rewritten.node.add()
            shape.name, shape.op = f"{prefix}/shape", "Shape"
            shape.input.append(current)
            shape.attr["T"].type, shape.attr["out_type"].type = dtype, DT_INT32
            length = _op(
                rewritten, f"{prefix}/length", "GatherV2", [shape.name, consts["axis"].name, consts["zero"].name]
            )
            length.attr["Tparams"].type = length.attr["Tindices"].type = length.attr["Taxis"].type = DT_INT32
            length.attr["batch_dims"].i = 0
            positions = _op(
                rewritten, f"{prefix}/range", "Range", [consts["zero"].name, length.name, consts["one"].name]
            )
            positions.attr["Tidx"].type = DT_INT32
            moved = _op(rewritten, f"{prefix}/moved", "Sub", [positions.name, consts["shift"].name])
            source = _op(rewritten, f"{prefix}/source", "FloorMod", [moved.name, length.name])
            moved.attr["T"].type = source.attr["T"].type = DT_INT32
            name = node.name if step == len(steps) - 1 else f"{prefix}/gathered"
            inputs = [current, source.name, consts["axis"].name]
            gathered = _op(rewritten, name, "GatherV2", inputs + (_controls(node) if step == 0 else []))
            gathered.attr["Tparams"].type = dtype
            gathered.attr["Tindices"].type = gathered.attr["Taxis"].type = DT_INT32
            gathered.attr["batch_dims"].i = 0
            made = [shape, length, positions, moved, source, gathered, *consts.values()]
            for each in made:
                each.device = device
            current = name

    return _rewrite_nodes(graph_def, set(plans), as_gathers), len(plans)


def _op(graph: Any, name: str, op: str, inputs: list[str]) -> Any:
    node = graph.node.add()
    node.name, node.op = name, op
    node.input.extend(inputs)
    return node


INT64_SIGN_OPS = ("Abs", "Sign")


def int64_signs_by_comparison(graph_def: Any) -> tuple[Any, int]:
    """A copy of ``graph_def`` with every int64 Abs and Sign computed by comparisons; returns (graph, count)."""
    targets = {node.name for node in graph_def.node if node.op in INT64_SIGN_OPS and node.attr["T"].type == DT_INT64}
    if not targets:
        return graph_def, 0

    def compared(rewritten: Any, node: Any) -> None:
        value, device = _operands(node)[0], node.device
        zero = _const(rewritten.node.add(), f"{node.name}/zero", np.array(0, np.int64), DT_INT64)
        below = _op(rewritten, f"{node.name}/negative", "Less", [value, zero.name, *_controls(node)])
        below.attr["T"].type = DT_INT64
        made = [zero, below]
        if node.op == "Abs":
            negated = _op(rewritten, f"{node.name}/negated", "Neg", [value])
            negated.attr["T"].type = DT_INT64
            select = _op(rewritten, node.name, "SelectV2", [below.name, negated.name, value])
            select.attr["T"].type = DT_INT64
            made += [negated, select]
        else:
            above = _op(rewritten, f"{node.name}/positive", "Greater", [value, zero.name])
            above.attr["T"].type = DT_INT64
            up = _cast(rewritten.node.add(), f"{node.name}/positive_as_int", above.name, DT_BOOL, DT_INT64)
            down = _cast(rewritten.node.add(), f"{node.name}/negative_as_int", below.name, DT_BOOL, DT_INT64)
            sign = _op(rewritten, node.name, "Sub", [up.name, down.name])
            sign.attr["T"].type = DT_INT64
            made += [above, up, down, sign]
        for each in made:
            each.device = device

    return _rewrite_nodes(graph_def, targets, compared), len(targets)
