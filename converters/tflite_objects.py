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
