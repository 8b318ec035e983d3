"""Provenance stamped into every exported file: which SavedModel it came from, at what precision.

A golden bundle records the SavedModel's digest; `pe-export parity` compares it with the
digest stamped in the file, so a bundle is refused for another model. TFLite keeps the
entries in the flatbuffer's metadata table, ONNX in ``metadata_props``.
"""

from __future__ import annotations

import struct
from typing import Any

from pe_export import __version__

SOURCE_DIGEST = "pe_export.source_digest"
PRECISION = "pe_export.precision"
SIGNATURE = "pe_export.signature"
VERSION = "pe_export.version"


def provenance_entries(digest: str, precision: str, signature: str) -> dict[str, str]:
    return {SOURCE_DIGEST: digest, PRECISION: precision, SIGNATURE: signature, VERSION: __version__}


def embed_tflite_metadata(data: bytes, entries: dict[str, str], signature_key: str | None = None) -> bytes:
    """Add metadata entries to a .tflite flatbuffer (conversion side: uses TF's flatbuffer tools).

    ``signature_key`` renames the file's one signature: converting a concrete function always
    names it serving_default, where TFLiteConverter.from_saved_model keeps the SavedModel's name.
    """
    from tensorflow.lite.python import schema_py_generated as schema
    from tensorflow.lite.tools import flatbuffer_utils

    model = flatbuffer_utils.convert_bytearray_to_object(bytearray(data))
    if signature_key and len(model.signatureDefs or []) == 1:
        model.signatureDefs[0].signatureKey = signature_key
    model.metadata = [m for m in (model.metadata or []) if _decode(m.name) not in entries]
    for name, value in entries.items():
        buffer = schema.BufferT()
        buffer.data = list(value.encode())
        model.buffers.append(buffer)
        metadata = schema.MetadataT()
        metadata.name = name
        metadata.buffer = len(model.buffers) - 1
        model.metadata.append(metadata)
    outside = [b for b in model.buffers if (b.offset or 0) > 1 and (b.size or 0) > 0]
    if not outside:
        return pack_tflite(model, len(data))
    # A file past 2 GiB in the converter's large-model layout: constant buffers stored after the flatbuffer and
    # found by their offset from the start of the file. The flatbuffer grows by the entries; the data after it
    # moves with it, its alignment (modulo 4 KiB) kept, and every offset with it.
    start = min(int(b.offset) for b in outside)
    packed = flatbuffer_utils.convert_object_to_bytearray(model)  # offsets are fixed-width: moving keeps the size
    moved = len(packed) + (start - len(packed)) % 4096
    for buffer in outside:
        buffer.offset = int(buffer.offset) + moved - start
    packed = flatbuffer_utils.convert_object_to_bytearray(model)
    return b"".join([bytes(packed), bytes(moved - len(packed)), memoryview(data)[start:]])


def pack_tflite(model: Any, size: int) -> bytes:
    """``model`` (TFLite flatbuffer objects) as file bytes, in a builder sized for ``size`` bytes up front: TF's
    helper starts at 1 KiB and doubles, copying the whole file each time (BERT-large: 8 s of stamping). Buffer
    data held as bytes (TF's reader gives a bytearray for each buffer stored past the flatbuffer, as
    ai-edge-quantizer writes them) goes in as numpy: the generated ``BufferT.Pack`` writes anything else a byte per
    Python call (BERT-base's full-integer file: 60 s, 133 M calls)."""
    import flatbuffers
    import numpy as np

    for buffer in model.buffers:
        if isinstance(buffer.data, bytes | bytearray):  # a view, not a copy of the data
            buffer.data = np.frombuffer(buffer.data, np.uint8)
        elif buffer.data is not None and type(buffer.data) is not np.ndarray:  # a list of ints (metadata entries)
            buffer.data = np.asarray(buffer.data, np.uint8)
    builder = flatbuffers.Builder(size + (1 << 20))
    builder.Finish(model.Pack(builder), file_identifier=b"TFL3")
    return bytes(memoryview(builder.Bytes)[builder.Head() :])  # one copy: Output() is a copy of its own


def embed_onnx_metadata(model: Any, entries: dict[str, str]) -> None:
    kept = [p for p in model.metadata_props if p.key not in entries]
    del model.metadata_props[:]
    model.metadata_props.extend(kept)
    for key, value in entries.items():
        prop = model.metadata_props.add()
        prop.key, prop.value = key, value


def _decode(name: Any) -> str:
    return name.decode() if isinstance(name, bytes) else str(name)


# Model table fields (schema.fbs): 0 version (uint32); 1 operator_codes … 9 external_buffers are offsets.
_MODEL_FIELDS, _MODEL_BUFFERS, _MODEL_METADATA = 10, 4, 6
_BUFFER_OFFSET = 1  # Buffer.offset: set in the large-model layout, where data lies past the flatbuffer
_PREFIX_ALIGN = 64  # the old bytes keep their alignment (the converter aligns buffer data to 16)


def append_tflite_metadata(data: bytes, entries: dict[str, str]) -> bytes | None:
    """``data`` with metadata entries added (same-named ones replaced) without re-packing the file: a new root
    Model table is written before the old bytes, pointing at the old operators, subgraphs, buffers and signatures
    where they are (flatbuffer offsets point forward), with new metadata and buffer vectors. Numpy-free, no copy
    of the model's objects: stamping a child-converted BERT-base file this way takes milliseconds where a re-pack
    took 7.8 s and a copy of the file's object tree. None where the file does not allow it (fields this schema
    does not know, buffers stored past the flatbuffer): then re-pack with embed_tflite_metadata."""
    from pe_export.inspection.flatbuffer import CorruptFileError, root_table
    from pe_export.inspection.tflite_metadata import METADATA_NAME

    try:
        model = root_table(data)
        if len(model.field_offsets) > _MODEL_FIELDS or not model.field_offsets[_MODEL_BUFFERS]:
            return None
        buffers = model.tables(_MODEL_BUFFERS)
        if any(int(buffer.scalar(_BUFFER_OFFSET, "Q")) > 1 for buffer in buffers):
            return None
        kept = [entry for entry in model.tables(_MODEL_METADATA) if entry.string(METADATA_NAME) not in entries]
        prefix = _Prefix()
        fields = prefix.root(model, data)
        buffer_slots = prefix.vector(fields[_MODEL_BUFFERS], [b.position for b in buffers], len(entries))
        metadata_slots = prefix.vector(fields[_MODEL_METADATA], [e.position for e in kept], len(entries))
    except CorruptFileError:
        return None
    for slot, (buffer_slot, (name, value)) in enumerate(zip(buffer_slots, entries.items(), strict=True)):
        prefix.entry(buffer_slot, metadata_slots[slot], len(buffers) + slot, name, value)
    return prefix.before(data)


class _Prefix:
    """Flatbuffer objects written front to back, each before what it refers to (offsets only point forward): the
    offsets are patched once everything is placed, those into the old bytes shifted by the prefix's length."""

    def __init__(self) -> None:
        self.out = bytearray(bytes(4) + b"TFL3")  # the root offset, patched by ``root``; the file identifier
        self.patches: list[tuple[int, int]] = []  # (where a uoffset is written, the new position it points to)
        self.old: list[tuple[int, int]] = []  # (where, the position in the old bytes)

    def u32(self, value: int = 0) -> int:
        self.out.extend(struct.pack("<I", value))
        return len(self.out) - 4

    def align(self, size: int = 4) -> None:
        self.out.extend(bytes(-len(self.out) % size))

    def table(self, vtable: list[int], values: list[int]) -> tuple[int, list[int]]:
        """A table of 4-byte fields (``vtable``: each field's slot offset, 0 absent) after its vtable: its
        position and its fields' positions."""
        start_vtable = len(self.out)
        self.out.extend(struct.pack(f"<HH{len(vtable)}H", 4 + 2 * len(vtable), 4 + 4 * len(values), *vtable))
        self.align()
        start = len(self.out)
        self.out.extend(struct.pack("<i", start - start_vtable))
        return start, [self.u32(value) for value in values]

    def root(self, model: Any, data: bytes) -> dict[int, int]:
        """A new Model table with the old one's fields (metadata added where it had none); the positions of its
        fields by field index. Buffers and metadata are left for ``vector``; the rest point at the old objects."""
        present = sorted({i for i, offset in enumerate(model.field_offsets) if offset} | {_MODEL_METADATA})
        vtable = [0] * (max(present) + 1)
        for slot, index in enumerate(present):
            vtable[index] = 4 + 4 * slot
        values = [
            struct.unpack_from("<I", data, model.position + model.field_offsets[0])[0] if index == 0 else 0
            for index in present
        ]
        root, positions = self.table(vtable, values)
        struct.pack_into("<I", self.out, 0, root)
        fields = dict(zip(present, positions, strict=True))
        for index, where in fields.items():
            if index not in (0, _MODEL_BUFFERS, _MODEL_METADATA):
                field = model.position + model.field_offsets[index]
                self.old.append((where, field + struct.unpack_from("<I", data, field)[0]))
        return fields

    def vector(self, field: int, old: list[int], new: int) -> list[int]:
        """A vector of offsets at ``field``: to the ``old`` objects, then ``new`` slots; the new slots' positions."""
        self.patches.append((field, self.u32(len(old) + new)))
        slots = [self.u32() for _ in range(len(old) + new)]
        self.old.extend(zip(slots, old, strict=False))
        return slots[len(old) :]

    def entry(self, buffer_slot: int, metadata_slot: int, buffer_index: int, name: str, value: str) -> None:
        """One metadata entry: its Buffer (the value's bytes) and its Metadata (name, buffer index)."""
        buffer_at, (data_field,) = self.table([4], [0])
        self.patches.append((buffer_slot, buffer_at))
        entry_at, (name_field, _) = self.table([4, 8], [0, buffer_index])
        self.patches.append((metadata_slot, entry_at))
        for where, payload, end in ((name_field, name.encode(), b"\x00"), (data_field, value.encode(), b"")):
            self.patches.append((where, self.u32(len(payload))))
            self.out.extend(payload + end)
            self.align()

    def before(self, data: bytes) -> bytes:
        self.align(_PREFIX_ALIGN)
        shift = len(self.out)
        for where, target in self.patches:
            struct.pack_into("<I", self.out, where, target - where)
        for where, target in self.old:
            struct.pack_into("<I", self.out, where, shift + target - where)
        return b"".join([bytes(self.out), data])
