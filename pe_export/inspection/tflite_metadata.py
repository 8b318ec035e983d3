"""A .tflite file's metadata entries (pe-export's stamps among them) read from the mapped flatbuffer, and
nothing else: what a parity check needs to know about a file before the runtime loads it (compare
onnx_metadata.py). The full summary (tflite_file.py) walks every tensor and operator."""

from __future__ import annotations

import mmap
from pathlib import Path
from typing import cast

from pe_export.errors import BadInputError
from pe_export.inspection.flatbuffer import CorruptFileError, Table, root_table

FILE_IDENTIFIER = b"TFL3"
# Field indices from the TFLite schema (schema.fbs).
MODEL_BUFFERS, MODEL_METADATA = 4, 6
METADATA_NAME, METADATA_BUFFER = 0, 1
BUFFER_DATA, BUFFER_SIZE = 0, 2
MAX_METADATA_BYTES = 1 << 16  # larger entries (e.g. TFLite support metadata) are listed, not read
LAYER_MAP_KEY = "pe_export.layer_map"  # read whatever its size (a 24-layer model's map passes 64 KiB)
MAX_LAYER_MAP_BYTES = 1 << 24


def buffer_size(buffer: Table) -> int:
    return buffer.byte_vector_length(BUFFER_DATA) or int(buffer.scalar(BUFFER_SIZE, "Q"))


def metadata_entries(model: Table, buffers: list[Table]) -> tuple[dict[str, str], set[int]]:
    """The metadata entries (name → text; large ones by size only) and the buffers they occupy."""
    metadata, used = {}, set()
    for entry in model.tables(MODEL_METADATA):
        index = int(entry.scalar(METADATA_BUFFER, "I"))
        if index >= len(buffers):
            raise CorruptFileError(f"metadata names buffer {index} of {len(buffers)}")
        used.add(index)
        size = buffer_size(buffers[index])
        name = entry.string(METADATA_NAME)
        limit = MAX_LAYER_MAP_BYTES if name == LAYER_MAP_KEY else MAX_METADATA_BYTES
        metadata[name] = (
            buffers[index].byte_vector(BUFFER_DATA).decode("utf-8", errors="replace").rstrip("\x00 ")
            if size <= limit
            else f"<{size} bytes>"
        )
    return metadata, used


def tflite_metadata(path: Path) -> dict[str, str]:
    """The metadata entries alone (pe-export's stamps among them), read from the mapped file: a parity
    check needs nothing else, and a whole summary walks every tensor and operator."""
    try:
        if path.stat().st_size < 8:
            check_identifier(b"", path)  # too short to hold one, and an empty file cannot be mapped
        with path.open("rb") as handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
            data = cast(bytes, mapped)  # read through the same bounds-checked primitives as bytes
            check_identifier(data, path)
            model = root_table(data)
            return metadata_entries(model, model.tables(MODEL_BUFFERS))[0]
    except CorruptFileError as err:
        raise BadInputError(f"{path} is a truncated or corrupt TFLite file ({err}); re-export or re-copy it") from err
    except OSError as err:
        raise BadInputError(f"{path} cannot be read ({err.strerror})") from err


def check_identifier(data: bytes, path: Path) -> None:
    if len(data) < 8 or data[4:8] != FILE_IDENTIFIER:
        raise BadInputError(
            f"{path} is not a TFLite file (no 'TFL3' identifier); expected a TFLite converter flatbuffer"
        )
