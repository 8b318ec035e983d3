"""A bounds-checked reader for the few flatbuffer primitives the TFLite schema uses.

Every read checks its range, so a truncated or bit-flipped file raises CorruptFileError
instead of reading past the buffer.
"""

from __future__ import annotations

import struct


class CorruptFileError(ValueError):
    """The bytes are not a well-formed flatbuffer."""


class Table:
    """One flatbuffer table: fields by index, absent fields give the default."""

    def __init__(self, data: bytes, position: int) -> None:
        self.data = data
        self.position = position
        (soffset,) = _unpack(data, "<i", position)
        vtable = position - soffset
        vtable_size, _ = _unpack(data, "<HH", vtable)
        if vtable_size < 4 or vtable_size % 2:
            raise CorruptFileError(f"bad vtable size {vtable_size} at byte {vtable}")
        self.field_offsets = _unpack(data, f"<{(vtable_size - 4) // 2}H", vtable + 4)

    def _field(self, index: int) -> int | None:
        if index >= len(self.field_offsets) or self.field_offsets[index] == 0:
            return None
        return self.position + self.field_offsets[index]

    def field_position(self, index: int) -> int | None:
        """Where a field's value is stored (None: absent, the default): for a writer that patches in place."""
        return self._field(index)

    def scalar(self, index: int, fmt: str, default: int | float = 0) -> int | float:
        where = self._field(index)
        return default if where is None else _unpack(self.data, "<" + fmt, where)[0]

    def _referenced_offset(self, index: int) -> int | None:
        where = self._field(index)
        if where is None:
            return None
        return where + _unpack(self.data, "<I", where)[0]

    def table(self, index: int) -> Table | None:
        offset = self._referenced_offset(index)
        return None if offset is None else Table(self.data, offset)

    def string(self, index: int) -> str:
        offset = self._referenced_offset(index)
        if offset is None:
            return ""
        (length,) = _unpack(self.data, "<I", offset)
        raw = _slice(self.data, offset + 4, length)
        return raw.decode("utf-8", errors="replace")

    def vector_length(self, index: int) -> tuple[int, int]:
        offset = self._referenced_offset(index)
        if offset is None:
            return 0, 0
        (length,) = _unpack(self.data, "<I", offset)
        return offset + 4, length

    def scalars(self, index: int, fmt: str) -> tuple[int, ...]:
        start, length = self.vector_length(index)
        return _unpack(self.data, f"<{length}{fmt}", start) if length else ()

    def tables(self, index: int) -> list[Table]:
        start, length = self.vector_length(index)
        _slice(self.data, start, 4 * length)  # range check before walking
        result = []
        for item in range(length):
            where = start + 4 * item
            result.append(Table(self.data, where + _unpack(self.data, "<I", where)[0]))
        return result

    def byte_vector(self, index: int) -> bytes:
        start, length = self.vector_length(index)
        return _slice(self.data, start, length)

    def byte_vector_length(self, index: int) -> int:
        start, length = self.vector_length(index)
        _check_range(self.data, start, length)  # checked, not copied: a weight buffer can be most of the file
        return length


def root_table(data: bytes) -> Table:
    (offset,) = _unpack(data, "<I", 0)
    return Table(data, offset)


def _unpack(data: bytes, fmt: str, position: int) -> tuple:
    size = struct.calcsize(fmt)
    if position < 0 or position + size > len(data):
        raise CorruptFileError(f"read of {size} bytes at byte {position} is outside the {len(data)}-byte file")
    return struct.unpack_from(fmt, data, position)


def _slice(data: bytes, position: int, size: int) -> bytes:
    _check_range(data, position, size)
    return data[position : position + size]


def _check_range(data: bytes, position: int, size: int) -> None:
    if position < 0 or size < 0 or position + size > len(data):
        raise CorruptFileError(f"read of {size} bytes at byte {position} is outside the {len(data)}-byte file")
