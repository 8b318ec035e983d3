"""Provenance stamped into every exported file: which SavedModel it came from, at what precision.

A golden bundle records the SavedModel's digest; `pe-export parity` compares it with the
digest stamped in the file, so a bundle is refused for another model. TFLite keeps the
entries in the flatbuffer's metadata table, ONNX in ``metadata_props``.
"""

from __future__ import annotations

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
    helper starts at 1 KiB and doubles, copying the whole file each time (BERT-large: 8 s of stamping)."""
    import flatbuffers

    builder = flatbuffers.Builder(size + (1 << 20))
    builder.Finish(model.Pack(builder), file_identifier=b"TFL3")
    return bytes(builder.Output())


def embed_onnx_metadata(model: Any, entries: dict[str, str]) -> None:
    kept = [p for p in model.metadata_props if p.key not in entries]
    del model.metadata_props[:]
    model.metadata_props.extend(kept)
    for key, value in entries.items():
        prop = model.metadata_props.add()
        prop.key, prop.value = key, value


def _decode(name: Any) -> str:
    return name.decode() if isinstance(name, bytes) else str(name)
