"""Edits on a TFLite file held as flatbuffer objects (``flatbuffer_utils.read_model_from_bytearray``): the
buffers and op codes that new tensors and operators need, shared by the files that rewrite one."""

from __future__ import annotations

from typing import Any

import numpy as np


def add_buffer(model: Any, values: np.ndarray | None) -> int:
    """A new buffer holding ``values`` (None: an activation's empty buffer); its index."""
    from tensorflow.lite.python import schema_py_generated as schema

    buffer = schema.BufferT()
    if values is not None:
        buffer.data = np.frombuffer(np.ascontiguousarray(values).tobytes(), np.uint8).copy()
    model.buffers.append(buffer)
    return len(model.buffers) - 1


def opcode_index(model: Any, builtin: int) -> int:
    """The index of the builtin op's code in ``model``, added at version 1 where the file has none."""
    from tensorflow.lite.python import schema_py_generated as schema

    for index, code in enumerate(model.operatorCodes):
        if max(code.builtinCode, code.deprecatedBuiltinCode) == builtin:
            return index
    code = schema.OperatorCodeT()
    code.builtinCode, code.deprecatedBuiltinCode, code.version = builtin, min(builtin, 127), 1
    model.operatorCodes.append(code)
    return len(model.operatorCodes) - 1


def add_constant(model: Any, name: str, values: np.ndarray, kind: int) -> int:
    """A new constant tensor of ``values`` (``kind``: its schema TensorType) in the first subgraph; its index."""
    from tensorflow.lite.python import schema_py_generated as schema

    tensor = schema.TensorT()
    tensor.name, tensor.type, tensor.shape = name.encode(), kind, list(values.shape)
    tensor.buffer = add_buffer(model, values)
    model.subgraphs[0].tensors.append(tensor)
    return len(model.subgraphs[0].tensors) - 1


def add_like(model: Any, source: int, suffix: str, kind: int | None = None) -> int:
    """A new activation tensor with tensor ``source``'s shapes, named after it with ``suffix``, of ``source``'s type
    or ``kind``; its index."""
    from tensorflow.lite.python import schema_py_generated as schema

    graph = model.subgraphs[0]
    tensor = graph.tensors[source]
    like = schema.TensorT()
    like.name, like.type = tensor.name + suffix.encode(), tensor.type if kind is None else kind
    like.shape = list(tensor.shape)
    like.shapeSignature = None if tensor.shapeSignature is None else list(tensor.shapeSignature)
    like.buffer = add_buffer(model, None)
    graph.tensors.append(like)
    return len(graph.tensors) - 1


def new_op(model: Any, builtin: int, inputs: list[int], outputs: list[int], options: Any = None) -> Any:
    """An operator of ``builtin`` (its code added to ``model`` where missing), with ``options`` (a schema
    ``…OptionsT`` object, its type named after its class) or none; not yet placed in a graph."""
    from tensorflow.lite.python import schema_py_generated as schema

    op = schema.OperatorT()
    op.opcodeIndex = opcode_index(model, builtin)
    op.inputs, op.outputs = inputs, outputs
    if options is not None:
        op.builtinOptionsType = getattr(schema.BuiltinOptions, type(options).__name__.removesuffix("T"))
        op.builtinOptions = options
    return op


def per_output_channel_int8(values: np.ndarray) -> tuple[np.ndarray, Any]:
    """``values`` [outputs, inputs] as int8, symmetric with a step per output channel (axis 0), as the converter
    writes a hybrid FC's weight, and the quantization parameters that say so."""
    from tensorflow.lite.python import schema_py_generated as schema

    from pe_export.converters.search.smoothing import symmetric_int8

    quantized, step = symmetric_int8(values, axis=1)
    parameters = schema.QuantizationParametersT()
    parameters.scale = step.reshape(-1).astype(np.float32).tolist()
    parameters.zeroPoint = [0] * len(parameters.scale)
    parameters.quantizedDimension = 0
    return quantized, parameters
