"""An ONNX file's metadata_props read straight from the protobuf wire format, without the onnx package.

A parity check needs only the stamps pe-export wrote (digest, precision); parsing the whole model with
onnx would cost the checking process the package's import and a copy of every weight. The file is
mapped, and the graph (field 7) is stepped over by its length, so only the top-level fields are read.
"""

from __future__ import annotations

import mmap
from pathlib import Path

from pe_export.errors import BadInputError
from pe_export.protowire import LENGTH, Damaged, fields, text

GRAPH, METADATA_PROPS, OPSET_IMPORT = 7, 14, 8  # ModelProto field numbers (onnx.proto)


def onnx_metadata(path: Path) -> dict[str, str]:
    """metadata_props of the ONNX model at ``path``; BadInputError when the file is not one."""
    size = Path(path).stat().st_size
    if size == 0:
        raise BadInputError(f"{path} is empty (0 bytes); expected an ONNX model file")
    with open(path, "rb") as handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
        data = memoryview(mapped)
        try:
            top = fields(data)
            numbers = {number for number, *_ in top}
            if GRAPH not in numbers or OPSET_IMPORT not in numbers:
                raise Damaged("no graph or opset")
            metadata = {}
            for number, wire, start, end in top:
                if number == METADATA_PROPS and wire == LENGTH:
                    prop = bytes(data[start:end])  # small; a view would pin the mapping open
                    metadata[text(prop, 1)] = text(prop, 2)
        except Damaged as why:
            raise BadInputError(
                f"{path} is not an ONNX model ({why}); the file is damaged or of another kind"
            ) from None
        finally:
            data.release()
    return metadata
