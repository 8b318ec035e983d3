"""An ONNX file's metadata_props read straight from the protobuf wire format, without the onnx package.

A parity check needs only the stamps pe-export wrote (digest, precision); parsing the whole model with
onnx would cost the checking process the package's import and a copy of every weight. The file is
mapped, and the graph (field 7) is stepped over by its length, so only the top-level fields are read.
"""

from __future__ import annotations

import mmap
from pathlib import Path

from pe_export.errors import BadInputError

_GRAPH, _METADATA_PROPS, _OPSET_IMPORT = 7, 14, 8  # ModelProto field numbers (onnx.proto)
_VARINT, _FIXED64, _LENGTH, _FIXED32 = 0, 1, 2, 5


class _Damaged(Exception):
    pass


def _varint(data: memoryview | bytes, at: int) -> tuple[int, int]:
    value, shift = 0, 0
    while True:
        if at >= len(data) or shift > 63:
            raise _Damaged("a varint runs past the end")
        byte = data[at]
        value |= (byte & 0x7F) << shift
        at += 1
        if not byte & 0x80:
            return value, at
        shift += 7


def _fields(data: memoryview | bytes) -> list[tuple[int, int, int, int]]:
    """(field number, wire type, start, end) of each top-level field; varints carry their value in start."""
    fields, at = [], 0
    while at < len(data):
        key, at = _varint(data, at)
        number, wire = key >> 3, key & 7
        if wire == _VARINT:
            value, at = _varint(data, at)
            fields.append((number, wire, value, at))
        elif wire == _LENGTH:
            size, at = _varint(data, at)
            if at + size > len(data):
                raise _Damaged(f"field {number} runs past the end")
            fields.append((number, wire, at, at + size))
            at += size
        elif wire in (_FIXED64, _FIXED32):
            at += 8 if wire == _FIXED64 else 4
        else:
            raise _Damaged(f"wire type {wire} in field {number}")
        if number == 0:
            raise _Damaged("field number 0")
    if at != len(data):
        raise _Damaged("the last field runs past the end")
    return fields


def onnx_metadata(path: Path) -> dict[str, str]:
    """metadata_props of the ONNX model at ``path``; BadInputError when the file is not one."""
    size = Path(path).stat().st_size
    if size == 0:
        raise BadInputError(f"{path} is empty (0 bytes); expected an ONNX model file")
    with open(path, "rb") as handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
        data = memoryview(mapped)
        try:
            fields = _fields(data)
            numbers = {number for number, *_ in fields}
            if _GRAPH not in numbers or _OPSET_IMPORT not in numbers:
                raise _Damaged("no graph or opset")
            metadata = {}
            for number, wire, start, end in fields:
                if number == _METADATA_PROPS and wire == _LENGTH:
                    prop = bytes(data[start:end])  # small; a view would pin the mapping open
                    entry = {
                        n: bytes(prop[s:e]).decode("utf-8", errors="replace")
                        for n, w, s, e in _fields(prop)
                        if w == _LENGTH
                    }
                    metadata[entry.get(1, "")] = entry.get(2, "")
        except _Damaged as why:
            raise BadInputError(
                f"{path} is not an ONNX model ({why}); the file is damaged or of another kind"
            ) from None
        finally:
            data.release()
    return metadata
