"""Embedding tables in int8 with one step per row for TFLite's dynamic int8, as ``onnx.table_int8`` does for ONNX.

The converter's dynamic-range file stores a GATHER's table with one step for the whole table: all-MiniLM-L6-v2's
30,522 x 384 token table shares the step of its largest value (1.05), where a row's peak is 0.18 at the median, so
a looked-up row comes back 4.2% off (median relative error; 0.7% with a step per row). With every
FULLY_CONNECTED float that table alone cost 4.4e-4 of cosine, more than half of what 0.999 allows. Here the table's
int8 values take a step per row and the rows looked up are scaled after their DEQUANTIZE:
``GATHER(int8 table, ids)`` → DEQUANTIZE (step 1) → MUL by ``GATHER(steps [rows, 1], ids)``; same bytes plus 4 per
row, three ops on the looked-up rows only.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from pe_export.converters.search.smoothing import symmetric_int8
from pe_export.converters.tflite.objects import add_constant, add_like, new_op


def rowwise_steps(model: Any, gather: Any, dequantize: Any, values: np.ndarray) -> list[Any]:
    """In place: the int8 table ``gather`` reads (its float32 ``values``) requantized with a step per row, the
    ``dequantize`` of its rows followed by a MUL by each row's step (read by a second GATHER of the same ids);
    the MUL writes what the DEQUANTIZE wrote, so readers are unchanged. Returns the ops after ``gather`` that
    make its rows float, in order (the DEQUANTIZE, the steps' GATHER, the MUL)."""
    from tensorflow.lite.python import schema_py_generated as schema

    graph = model.subgraphs[0]
    table, rows = graph.tensors[int(gather.inputs[0])], graph.tensors[int(gather.outputs[0])]
    quantized, steps = symmetric_int8(values, axis=1)
    model.buffers[table.buffer].data = np.frombuffer(quantized.tobytes(), np.uint8)
    for tensor in (table, rows):  # the int8 values are the row's multiples of its step
        tensor.quantization = _unit_step()
    output = int(dequantize.outputs[0])
    # The float rows take the lookup's own name (the float32 file's, which the layer map carries over by name); its
    # int8 rows, with a step of 1 now, would read as multiples of the step there
    graph.tensors[output].name, rows.name = rows.name, rows.name + b"/int8"
    unscaled = add_like(model, output, "/unscaled")
    dequantize.outputs = [unscaled]
    step_table = add_constant(
        model, f"{table.name.decode()}/row_steps", steps.astype(np.float32), schema.TensorType.FLOAT32
    )
    row_steps = add_like(model, output, "/row_steps")
    for shape in (graph.tensors[row_steps].shape, graph.tensors[row_steps].shapeSignature):
        if shape is not None:  # one step per looked-up row: [..., 1]
            shape[-1] = 1
    options = schema.GatherOptionsT()
    if gather.builtinOptions is not None:
        options.axis, options.batchDims = gather.builtinOptions.axis, gather.builtinOptions.batchDims
    steps_gather = new_op(
        model, schema.BuiltinOperator.GATHER, [step_table, int(gather.inputs[1])], [row_steps], options
    )
    mul = new_op(model, schema.BuiltinOperator.MUL, [unscaled, row_steps], [output], schema.MulOptionsT())
    at = graph.operators.index(dequantize) + 1
    graph.operators[at:at] = [steps_gather, mul]
    return [dequantize, steps_gather, mul]


def _unit_step() -> Any:
    from tensorflow.lite.python import schema_py_generated as schema

    parameters = schema.QuantizationParametersT()
    parameters.scale, parameters.zeroPoint, parameters.quantizedDimension = [1.0], [0], 0
    return parameters
