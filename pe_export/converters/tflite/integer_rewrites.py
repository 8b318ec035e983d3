"""The float32 file rewritten for full-integer kernels (pe_export/converters/tflite/integer.py quantizes it): four
rewrites of
what integer arithmetic cannot hold, each decided from what the graph computes and an identity in float arithmetic:

- SQUARED_DIFFERENCE(a, b) → SUB then MUL(d, d), NEG(x) → MUL(x, -1): no int16 kernel has them, so they ran float.
- The attention mask's fill: a huge negative constant (-1e9) that SELECT_V2 puts into a SOFTMAX's input sets
  that tensor's range, and every real score then quantizes to the same level (uniform attention). The fill
  becomes -(the scores' calibrated peak + 25): a masked weight is still below e^-25 of the row's largest.
- LayerNorm's statistics: BERT's residual stream carries massive activations (MiniLM: 218 in a few channels of a
  few tokens, ~0.5 elsewhere), so its squared deviations span [0, 4.7e4] and an ordinary row's are lost in one
  int16 range. LayerNorm is scale-invariant per row, so x is divided by its row's peak |x| first (MAXIMUM,
  REDUCE_MIN, SUB, DIV: ops with int16 kernels): squares then lie in [0, 4], the variance in [1/d, 1].
- The normalized variance's calibrated upper range gets headroom (x2, tflite/integer.py): a held-out row flatter
  than any the calibration saw has a larger variance, clipped without it (MiniLM worst sentence 0.896 → 0.9915).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

import numpy as np

from pe_export.converters.tflite.objects import add_buffer, opcode_index
from pe_export.errors import ConversionError
from pe_export.provenance import pack_tflite

MASK_FILL_BELOW = -1e4  # a constant this negative selected into a softmax's input is a mask fill


class IntegerGraph:
    """The float32 file as flatbuffer objects, with the edits the integer kernels need."""

    def __init__(self, data: bytes) -> None:
        from tensorflow.lite.python import schema_py_generated as schema
        from tensorflow.lite.tools import flatbuffer_utils

        self.schema, self.size = schema, len(data)
        self.model = flatbuffer_utils.read_model_from_bytearray(bytearray(data))
        self.graph = self.model.subgraphs[0]
        self.ops = schema.BuiltinOperator

    def code(self, op: Any) -> int:
        entry = self.model.operatorCodes[op.opcodeIndex]
        return int(max(entry.builtinCode, entry.deprecatedBuiltinCode))

    def name(self, index: int) -> str:
        return self.graph.tensors[index].name.decode()

    def producers(self) -> dict[int, Any]:
        return {int(o): op for op in self.graph.operators for o in op.outputs}

    def readers(self) -> dict[int, list[Any]]:
        found: dict[int, list[Any]] = {}
        for op in self.graph.operators:
            for index in op.inputs:
                if index >= 0:
                    found.setdefault(int(index), []).append(op)
        return found

    def constant(self, index: int) -> np.ndarray | None:
        tensor = self.graph.tensors[index]
        data = self.model.buffers[tensor.buffer].data
        if tensor.type != self.schema.TensorType.FLOAT32 or data is None or not len(data):
            return None
        return np.frombuffer(np.asarray(data, np.uint8).tobytes(), np.float32)

    def tensor_like(self, index: int, suffix: str) -> int:
        """A new float32 activation shaped as tensor ``index``."""
        base, tensor = self.graph.tensors[index], self.schema.TensorT()
        tensor.name, tensor.type = base.name + suffix.encode(), self.schema.TensorType.FLOAT32
        tensor.shape, tensor.shapeSignature = base.shape, base.shapeSignature
        tensor.buffer = self._buffer(None)
        self.graph.tensors.append(tensor)
        return len(self.graph.tensors) - 1

    def scalar(self, near: int, suffix: str, value: float) -> int:
        tensor = self.schema.TensorT()
        tensor.name = self.graph.tensors[near].name + suffix.encode()
        tensor.type, tensor.shape = self.schema.TensorType.FLOAT32, [1]
        tensor.buffer = self._buffer(np.array([value], np.float32))
        self.graph.tensors.append(tensor)
        return len(self.graph.tensors) - 1

    def _buffer(self, values: np.ndarray | None) -> int:
        return add_buffer(self.model, values)

    def op(self, builtin: int, inputs: list[int], outputs: list[int], options: str | None = None) -> Any:
        op = self.schema.OperatorT()
        op.opcodeIndex = opcode_index(self.model, builtin)
        op.inputs, op.outputs = inputs, outputs
        if options is not None:
            op.builtinOptionsType = getattr(self.schema.BuiltinOptions, options)
            op.builtinOptions = getattr(self.schema, f"{options}T")()
        return op

    def bytes(self) -> bytes:
        return pack_tflite(self.model, self.size)


def set_constants_in_place(data: bytes, values: dict[int, float]) -> bytes:
    """``data`` with each float32 constant tensor (by index) of ``values`` filled with its value, written into a
    copy of the file's bytes where the tensor's data lies: no parse into objects and no re-serialization (each
    takes another copy of the model: BERT-large's 1.3 GB three times over)."""
    from tensorflow.lite.python import schema_py_generated as schema

    patched = bytearray(data)
    model = schema.Model.GetRootAs(patched, 0)
    graph = model.Subgraphs(0)
    for index, value in values.items():
        tensor = graph.Tensors(index)
        stored = model.Buffers(tensor.Buffer()).DataAsNumpy()  # a view into ``patched``
        if tensor.Type() != schema.TensorType.FLOAT32 or isinstance(stored, int) or not stored.size:
            raise ConversionError(f"tensor {index} is not a float32 constant stored in the file: a pe-export bug")
        stored[:] = np.full(stored.size // 4, value, np.float32).view(np.uint8)
    return bytes(patched)


@dataclass
class Prepared:
    data: bytes
    rewrites: Counter[str]
    fills: list[tuple[int, int, int]]  # (fill constant, scores tensor, SELECT_V2 output) by tensor index
    variances: list[str]  # the normalized LayerNorms' variance tensors (and variance + eps), by name
    names: dict[int, str]


def integer_ready(data: bytes) -> Prepared:
    """The float32 file rewritten so that every op has an integer kernel and LayerNorm's statistics fit int16.
    Its float arithmetic is the same up to rounding (each rewrite is an identity)."""
    graph = IntegerGraph(data)
    rewrites: Counter[str] = Counter()
    rewrites["SQUARED_DIFFERENCE as SUB+MUL"] = _split_squared_differences(graph)
    rewrites["NEG as MUL by -1"] = _negations_as_products(graph)
    variances = _normalize_layer_norms(graph)
    rewrites["LayerNorm(s) normalized by the row's peak"] = len(variances) // 2
    fills = _mask_fills(graph)
    rewrites["attention mask fill(s) bounded"] = len(fills)
    names = {i: graph.name(i) for fill in fills for i in fill}
    return Prepared(graph.bytes(), +rewrites, fills, variances, names)


def _split_squared_differences(graph: IntegerGraph) -> int:
    ops, out, count = graph.ops, [], 0
    for op in graph.graph.operators:
        if graph.code(op) == ops.SQUARED_DIFFERENCE:
            difference = graph.tensor_like(int(op.outputs[0]), "/difference")
            out.append(graph.op(ops.SUB, list(op.inputs), [difference], "SubOptions"))
            out.append(graph.op(ops.MUL, [difference, difference], list(op.outputs), "MulOptions"))
            count += 1
        else:
            out.append(op)
    graph.graph.operators = out
    return count


def _negations_as_products(graph: IntegerGraph) -> int:
    ops, out, count = graph.ops, [], 0
    for op in graph.graph.operators:
        if graph.code(op) == ops.NEG:
            minus = graph.scalar(int(op.inputs[0]), "/minus_one", -1.0)
            out.append(graph.op(ops.MUL, [int(op.inputs[0]), minus], list(op.outputs), "MulOptions"))
            count += 1
        else:
            out.append(op)
    graph.graph.operators = out
    return count


def _normalize_layer_norms(graph: IntegerGraph) -> list[str]:
    """For each LayerNorm (mean m = MEAN(x); d = SUB(x, m); RSQRT(MEAN(d·d) + eps); x's third reader a MUL by a
    product of that RSQRT), its three readers of x read x / (peak |x| of the row) instead. Returns the names
    of each normalized LayerNorm's variance and variance + eps."""
    ops = graph.ops
    producers, readers = graph.producers(), graph.readers()
    order, variances = list(graph.graph.operators), []
    for rsqrt in [op for op in graph.graph.operators if graph.code(op) == ops.RSQRT]:
        found = _layer_norm(graph, rsqrt, producers, readers)
        if found is None:
            continue
        x, axis, first, internal, statistics = found
        negated, magnitude = graph.tensor_like(x, "/row_peak/negated"), graph.tensor_like(x, "/row_peak/abs")
        negative_abs, low = graph.tensor_like(x, "/row_peak/negative_abs"), graph.tensor_like(x, "/row_peak/min")
        peak, scaled = graph.tensor_like(x, "/row_peak"), graph.tensor_like(x, "/row_peak/scaled")
        minus, tiny = graph.scalar(x, "/row_peak/minus_one", -1.0), graph.scalar(x, "/row_peak/tiny", 1e-30)
        reduce = graph.op(ops.REDUCE_MIN, [negative_abs, axis], [low], "ReducerOptions")
        reduce.builtinOptions.keepDims = True
        added = [
            graph.op(ops.MUL, [x, minus], [negated], "MulOptions"),
            graph.op(ops.MAXIMUM, [x, negated], [magnitude]),
            graph.op(ops.MUL, [magnitude, minus], [negative_abs], "MulOptions"),
            reduce,  # REDUCE_MAX has no int16 kernel: the peak is -min(-|x|)
            graph.op(ops.SUB, [tiny, low], [peak], "SubOptions"),
            graph.op(ops.DIV, [x, peak], [scaled], "DivOptions"),
        ]
        for op in internal:
            op.inputs = [scaled if int(i) == x else i for i in op.inputs]
        at = order.index(first)
        order[at:at] = added
        variances += [graph.name(i) for i in statistics]
    graph.graph.operators = order
    return variances


def _layer_norm(
    graph: IntegerGraph, rsqrt: Any, producers: dict[int, Any], readers: dict[int, list[Any]]
) -> tuple[int, int, Any, list[Any], list[int]] | None:
    """(x, the mean's axis tensor, x's first LN reader, x's three LN readers, [variance, variance + eps]) of the
    LayerNorm whose RSQRT this is, or None where the ops around it are not one."""
    ops = graph.ops

    def made_by(index: int, builtin: int) -> Any:
        op = producers.get(int(index))
        return op if op is not None and graph.code(op) == builtin else None

    plus_eps = made_by(rsqrt.inputs[0], ops.ADD)
    variance = None if plus_eps is None else next(filter(None, (made_by(i, ops.MEAN) for i in plus_eps.inputs)), None)
    square = None if variance is None else made_by(variance.inputs[0], ops.MUL)
    if plus_eps is None or variance is None or square is None or square.inputs[0] != square.inputs[1]:
        return None
    difference = made_by(square.inputs[0], ops.SUB)
    mean = None if difference is None else made_by(difference.inputs[1], ops.MEAN)
    if difference is None or mean is None or mean.inputs[0] != difference.inputs[0]:
        return None
    if list(mean.inputs[1:]) != list(variance.inputs[1:]):  # the same axes
        return None
    x = int(difference.inputs[0])
    downstream, frontier = set(), [int(o) for o in rsqrt.outputs]
    while frontier:  # what the RSQRT's output reaches
        index = frontier.pop()
        for op in readers.get(index, []):
            for o in op.outputs:
                if int(o) not in downstream:
                    downstream.add(int(o))
                    frontier.append(int(o))
    scales = [
        op
        for op in readers.get(x, [])
        if graph.code(op) == ops.MUL and any(int(i) in downstream for i in op.inputs if int(i) != x)
    ]
    if len(scales) != 1:
        return None
    first = min((mean, difference, scales[0]), key=graph.graph.operators.index)
    return (
        x,
        int(mean.inputs[1]),
        first,
        [mean, difference, scales[0]],
        [int(variance.outputs[0]), int(plus_eps.outputs[0])],
    )


def _mask_fills(graph: IntegerGraph) -> list[tuple[int, int, int]]:
    """(fill constant, scores, SELECT_V2 output) for every SELECT_V2 read by a SOFTMAX whose one constant
    branch is all below MASK_FILL_BELOW."""
    ops, found = graph.ops, []
    readers = graph.readers()
    for op in graph.graph.operators:
        if graph.code(op) != ops.SELECT_V2 or len(op.inputs) != 3:
            continue
        output = int(op.outputs[0])
        if not any(graph.code(r) == ops.SOFTMAX for r in readers.get(output, [])):
            continue
        branches = [int(i) for i in op.inputs[1:]]
        values = [graph.constant(i) for i in branches]
        constants = [
            i for i, v in zip(branches, values, strict=True) if v is not None and v.size and v.max() <= MASK_FILL_BELOW
        ]
        if len(constants) == 1:
            scores = next(i for i in branches if i != constants[0])
            found.append((constants[0], scores, output))
    return found
