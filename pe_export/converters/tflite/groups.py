"""A hybrid FULLY_CONNECTED computed in groups of its input channels: ``x·Wᵀ = Σ_g x_g·W_gᵀ``, the input split
into G slices (one SPLIT per input tensor), one hybrid FC per slice with the weight's columns of that slice as int8
with a step per output channel of the group, the products added (a chain of ADDs, which XNNPACK runs in the same
partition as the FCs; an ADD_N left its partition and ran 1.3x slower). So the weights get a step per group of
input channels and each output channel, and the activations, which the hybrid kernel quantizes over each row's
range, a range per row and group: what onnxruntime's block-wise MatMulNBits does with blocks of 32, with builtin
ops only, at int8 bytes.

Measured on all-MiniLM-L6-v2 (48 varied sentences chosen on, 32 others held out, worst pooled cosine; p50 on 14
tokens, one thread, LiteRT with XNNPACK on an EPYC with AVX-512 VNNI, float32 4.1-4.5 ms): every weight int8 as
the converter groups them (one group) 0.99628 at 1.16 ms; groups of 96 channels 0.99865 at 1.5-1.8 ms; of 48
0.99905 at 1.9-2.5 ms; eight groups whatever the width 0.99859 at 1.8 ms. The search (``tflite.dynamic_int8``) moves the
FCs that cost the most accuracy to groups before it keeps any weight float, and cuts the groups back after.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import numpy as np

from pe_export.converters.tflite.objects import add_constant, add_like, new_op, per_output_channel_int8

GROUP_WIDTH = 48  # input channels per group at least: the narrowest that reached 0.999 held out (above)
STEP_BYTES = 12  # a step in the file: its float32 scale and its int64 zero point
ESCALATED_TO = f"int8 in groups of {GROUP_WIDTH} input channels (a step per group and output channel)"


def group_count(inputs: int, width: int = GROUP_WIDTH) -> int:
    """Groups of ``inputs`` channels: the smallest divisor of ``inputs`` that is at least ``width`` sets their
    width (SPLIT takes equal parts); 1 where there is none below ``inputs`` (nothing to split)."""
    for size in range(max(width, 1), inputs):
        if inputs % size == 0:
            return inputs // size
    return 1


@dataclass(frozen=True)
class GroupedFC:
    """One hybrid FC to split: its operator, its weight's tensor index and float values [outputs, inputs]."""

    op: Any
    weight: int
    values: np.ndarray


def step_bytes(outputs: int, inputs: int, width: int = GROUP_WIDTH) -> int:
    """What an FC's group steps add to the file over its per-channel ones."""
    return STEP_BYTES * outputs * (group_count(inputs, width) - 1)


def split_into_groups(model: Any, fcs: list[GroupedFC], width: int = GROUP_WIDTH) -> None:
    """In place on ``model`` (flatbuffer objects): each FC of ``fcs`` replaced by its groups, which write its output
    tensor; FCs that read the same input share its SPLIT. The old weights' buffers are replaced by empty ones in
    ``model.buffers`` (the buffer objects themselves are left as they were, for a caller that restores the lists)."""
    from tensorflow.lite.python import schema_py_generated as schema

    graph = model.subgraphs[0]
    axis = add_constant(model, "pe_export_groups_axis", np.array(-1, np.int32), schema.TensorType.INT32)
    slices: dict[tuple[int, int], list[int]] = {}
    for fc in sorted(fcs, key=lambda f: graph.operators.index(f.op)):
        inputs = fc.values.shape[1]
        groups = group_count(inputs, width)
        if groups < 2:
            continue
        source = int(fc.op.inputs[0])
        position = graph.operators.index(fc.op)
        if (source, groups) not in slices:
            slices[(source, groups)] = _split(model, source, groups, inputs // groups, axis, position)
            position += 1
        parts = slices[(source, groups)]
        output = int(fc.op.outputs[0])
        activation = fc.op.builtinOptions.fusedActivationFunction
        bias = [int(fc.op.inputs[2])] if len(fc.op.inputs) > 2 else []
        replacement, products = [], []
        for group, part in enumerate(parts):
            columns = fc.values[:, group * (inputs // groups) : (group + 1) * (inputs // groups)]
            weight = _int8_weight(model, f"{graph.tensors[fc.weight].name.decode()}/group{group}", columns)
            product = add_like(model, output, f"/group{group}")
            op = copy.deepcopy(fc.op)
            op.builtinOptions.fusedActivationFunction = schema.ActivationFunctionType.NONE  # after the sum
            op.inputs = [part, weight, *([bias[0] if group == 0 else -1] if bias else [])]
            op.outputs = [product]
            replacement.append(op)
            products.append(product)
        total = products[0]
        for number, product in enumerate(products[1:], start=1):
            last = number == len(products) - 1
            target = output if last else add_like(model, output, f"/sum{number}")
            options = schema.AddOptionsT()
            options.fusedActivationFunction = activation if last else schema.ActivationFunctionType.NONE
            replacement.append(new_op(model, schema.BuiltinOperator.ADD, [total, product], [target], options))
            total = target
        graph.operators[position : position + 1] = replacement
        model.buffers[graph.tensors[fc.weight].buffer] = schema.BufferT()  # the whole weight is read no more


def _split(model: Any, source: int, groups: int, width: int, axis: int, position: int) -> list[int]:
    """``groups`` tensors, the slices of ``source`` along its last axis, from a SPLIT inserted at ``position``."""
    from tensorflow.lite.python import schema_py_generated as schema

    graph = model.subgraphs[0]
    tensor = graph.tensors[source]
    shape = [int(d) for d in tensor.shape]
    signature = [int(d) for d in (tensor.shapeSignature if tensor.shapeSignature is not None else shape)]
    parts = [add_like(model, source, f"/group{group}_of_{groups}") for group in range(groups)]
    for part in parts:
        graph.tensors[part].shape, graph.tensors[part].shapeSignature = [*shape[:-1], width], [*signature[:-1], width]
    options = schema.SplitOptionsT()
    options.numSplits = groups
    graph.operators.insert(position, new_op(model, schema.BuiltinOperator.SPLIT, [axis, source], parts, options))
    return parts


def _int8_weight(model: Any, name: str, values: np.ndarray) -> int:
    """An int8 weight tensor of ``values`` [outputs, inputs], symmetric with a step per output channel."""
    from tensorflow.lite.python import schema_py_generated as schema

    quantized, parameters = per_output_channel_int8(values)
    index = add_constant(model, name, quantized, schema.TensorType.INT8)
    model.subgraphs[0].tensors[index].quantization = parameters
    return index
