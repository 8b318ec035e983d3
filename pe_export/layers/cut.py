"""A TFLite file cut at a layer: the same file with one intermediate tensor as its only output (numpy-free).

Runtimes that keep no intermediate (LiteRT's GPU accelerator) compute a tensor they hand back exactly as they
compute it inside the graph; making the layer's tensor the file's output is the one way to read it there. The cut
is made in place on a copy of the bytes: the subgraph's output vector and the signature's output list shrink to
one entry (their length prefixes), and that entry names the layer's tensor. Every op stays in the file.
"""

from __future__ import annotations

import struct

from pe_export.errors import BadInputError
from pe_export.inspection.flatbuffer import CorruptFileError, Table, root_table
from pe_export.inspection.tflite_file import (
    MODEL_SIGNATURE_DEFS,
    MODEL_SUBGRAPHS,
    SIGNATURE_OUTPUTS,
    SIGNATURE_SUBGRAPH,
    SUBGRAPH_TENSORS,
    TENSOR_NAME,
    TENSORMAP_INDEX,
)

SUBGRAPH_OUTPUTS = 2  # SubGraph.outputs in schema.fbs


def tensor_indices(data: bytes) -> dict[str, int]:
    """The first signature's subgraph: tensor name → index (a repeated name: its first tensor)."""
    subgraph = _subgraph(root_table(data))
    indices: dict[str, int] = {}
    for index, tensor in enumerate(subgraph.tables(SUBGRAPH_TENSORS)):
        indices.setdefault(tensor.string(TENSOR_NAME), index)
    return indices


def cut_at(data: bytes, tensor: str) -> bytes:
    """``data`` (a .tflite file) whose only output is the tensor named ``tensor``."""
    try:
        model = root_table(data)
        index = tensor_indices(data).get(tensor)
        if index is None:
            raise BadInputError(f"the file has no tensor {tensor!r} to cut at; its layer map does not fit it")
        result = bytearray(data)
        start, length = _subgraph(model).vector_length(SUBGRAPH_OUTPUTS)
        if length < 1:
            raise CorruptFileError("the subgraph has no output")
        struct.pack_into("<II", result, start - 4, 1, index)
        signature = model.tables(MODEL_SIGNATURE_DEFS)[0]
        outputs = signature.tables(SIGNATURE_OUTPUTS)
        first = outputs[0].field_position(TENSORMAP_INDEX)
        if first is None:  # tensor 0 was the output: the index is the schema default and not stored
            raise BadInputError("the file's first signature output is tensor 0, which cannot be re-pointed in place")
        struct.pack_into("<I", result, first, index)
        vector_start, _ = signature.vector_length(SIGNATURE_OUTPUTS)
        struct.pack_into("<I", result, vector_start - 4, 1)
        return bytes(result)
    except (CorruptFileError, IndexError) as err:
        raise BadInputError(f"the file cannot be cut at {tensor!r}: {err}") from None


def _subgraph(model: Table) -> Table:
    signatures = model.tables(MODEL_SIGNATURE_DEFS)
    if not signatures:
        raise CorruptFileError("no signature")
    return model.tables(MODEL_SUBGRAPHS)[int(signatures[0].scalar(SIGNATURE_SUBGRAPH, "I"))]
