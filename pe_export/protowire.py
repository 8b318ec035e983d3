"""Protobuf's wire format, read without a protobuf library: the few fields pe-export needs from ONNX files
(their stamps and tensor types) and from saved_model.pb (its variables), where importing onnx or TensorFlow
would cost the process more than the whole read. Field numbers come from each format's public .proto."""

from __future__ import annotations

from collections.abc import Iterator

VARINT, FIXED64, LENGTH, FIXED32 = 0, 1, 2, 5  # wire types


class Damaged(ValueError):
    """The bytes are not a protobuf message (truncated, or of another kind)."""


def varint(data: memoryview | bytes, at: int) -> tuple[int, int]:
    """(value, the position after it) of the varint at ``at``."""
    value, shift = 0, 0
    while True:
        if at >= len(data) or shift > 63:
            raise Damaged("a varint runs past the end")
        byte = data[at]
        value |= (byte & 0x7F) << shift
        at += 1
        if not byte & 0x80:
            return value, at
        shift += 7


def fields(data: memoryview | bytes) -> list[tuple[int, int, int, int]]:
    """(field number, wire type, start, end) of each field of one message; a varint carries its value in
    start. Length-delimited fields are stepped over by their length: nothing in them is read or copied."""
    found, at = [], 0
    while at < len(data):
        key, at = varint(data, at)
        number, wire = key >> 3, key & 7
        if number == 0:
            raise Damaged("field number 0")
        if wire == VARINT:
            value, at = varint(data, at)
            found.append((number, wire, value, at))
        elif wire == LENGTH:
            size, at = varint(data, at)
            if at + size > len(data):
                raise Damaged(f"field {number} runs past the end")
            found.append((number, wire, at, at + size))
            at += size
        elif wire in (FIXED64, FIXED32):
            at += 8 if wire == FIXED64 else 4
        else:
            raise Damaged(f"wire type {wire} in field {number}")
    if at != len(data):
        raise Damaged("the last field runs past the end")
    return found


def messages(data: memoryview | bytes, wanted: int) -> Iterator[memoryview | bytes]:
    """Each length-delimited field numbered ``wanted``, as a slice of ``data``."""
    for number, wire, start, end in fields(data):
        if number == wanted and wire == LENGTH:
            yield data[start:end]


def integers(data: memoryview | bytes, wanted: int) -> list[int]:
    """Every integer of a repeated varint field, packed or not."""
    values = []
    for number, wire, start, end in fields(data):
        if number != wanted:
            continue
        if wire == VARINT:
            values.append(start)
        elif wire == LENGTH:
            at = start
            while at < end:
                value, at = varint(data, at)
                values.append(value)
    return values


def integer(data: memoryview | bytes, wanted: int, default: int = 0) -> int:
    """The last value of a varint field (protobuf's rule for a repeated scalar read as one)."""
    found = integers(data, wanted)
    return found[-1] if found else default


def text(data: memoryview | bytes, wanted: int, default: str = "") -> str:
    """The last string field numbered ``wanted``."""
    found = [bytes(m).decode("utf-8", errors="replace") for m in messages(data, wanted)]
    return found[-1] if found else default
