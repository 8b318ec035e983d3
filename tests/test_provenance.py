"""Provenance stamped into a TFLite file in the converter's large-model layout (past 2 GiB: constant buffers
after the flatbuffer, found by offset), which the converter writes for a small model too when asked
(``_experimental_use_buffer_offset``): the file still runs, computes the same, and reads back its entries."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pe_export.inspection.tflite_file import summarize_tflite_bytes
from pe_export.inspection.tflite_metadata import tflite_metadata
from pe_export.provenance import embed_tflite_metadata


def _converted(saved_model: Path, offsets: bool) -> bytes:
    from pe_export.native import import_tensorflow

    tf = import_tensorflow()
    converter = tf.lite.TFLiteConverter.from_saved_model(str(saved_model))
    converter._experimental_use_buffer_offset = offsets
    return bytes(converter.convert())


def _outputs(path: Path) -> dict[str, np.ndarray]:
    from pe_export.inputs import generate_inputs
    from pe_export.runners import create_runner

    with create_runner("litert", path) as runner:
        return runner.infer(generate_inputs(runner.input_specs(), {}, batch=2, seq_len=8, seed=0, padded=True))


def test_entries_stamped_into_the_offset_layout(saved_model, tmp_path: Path) -> None:
    from tensorflow.lite.tools import flatbuffer_utils

    model = saved_model("encoder_dynamic")
    plain, offsets = _converted(model, False), _converted(model, True)
    layout = flatbuffer_utils.convert_bytearray_to_object(bytearray(offsets))
    assert any((b.offset or 0) > 1 for b in layout.buffers)  # the layout under test, not the usual one
    stamped = embed_tflite_metadata(offsets, {"pe_export.check": "stamped"})
    for name, data in (("plain", plain), ("offsets", offsets), ("stamped", stamped)):
        (tmp_path / f"{name}.tflite").write_bytes(data)
    assert tflite_metadata(tmp_path / "stamped.tflite")["pe_export.check"] == "stamped"
    want, got = _outputs(tmp_path / "plain.tflite"), _outputs(tmp_path / "stamped.tflite")
    for name, values in want.items():
        np.testing.assert_array_equal(got[name], values)
    sizes = [
        sum(c.nbytes for c in summarize_tflite_bytes(d, tmp_path / "x.tflite").constants) for d in (plain, stamped)
    ]
    assert sizes[0] == sizes[1] > 0


def test_entries_appended_without_a_re_pack(saved_model, tmp_path: Path) -> None:
    """append_tflite_metadata (the layer map added to a file the child stamped): a new root before the old bytes;
    the entries read back, the old ones stay (a same-named one replaced), the file computes the same; the offset
    layout (absolute buffer offsets a prefix would shift) is left to the re-pack."""
    from pe_export.provenance import append_tflite_metadata

    model = saved_model("encoder_dynamic")
    plain = embed_tflite_metadata(_converted(model, False), {"pe_export.check": "old", "pe_export.kept": "kept"})
    appended = append_tflite_metadata(plain, {"pe_export.check": "new", "pe_export.added": "x" * 100_000})
    assert appended is not None and appended[4:8] == b"TFL3"
    paths = {name: tmp_path / f"{name}.tflite" for name in ("plain", "appended")}
    paths["plain"].write_bytes(plain)
    paths["appended"].write_bytes(appended)
    entries = tflite_metadata(paths["appended"])
    assert entries["pe_export.check"] == "new" and entries["pe_export.kept"] == "kept"
    assert entries["pe_export.added"] == "<100000 bytes>"  # large entries are listed by size, as before
    before, after = tflite_metadata(paths["plain"]), entries
    assert {k: v for k, v in before.items() if k != "pe_export.check"}.items() <= after.items()
    summary, original = (
        summarize_tflite_bytes(appended, paths["appended"]),
        summarize_tflite_bytes(plain, paths["plain"]),
    )
    assert summary.op_counts == original.op_counts and len(appended) - len(plain) < 101_000
    for name, value in _outputs(paths["plain"]).items():
        np.testing.assert_array_equal(_outputs(paths["appended"])[name], value)
    assert append_tflite_metadata(_converted(model, True), {"pe_export.check": "x"}) is None
    assert append_tflite_metadata(b"TFL3" * 4, {"pe_export.check": "x"}) is None


def test_offset_layout_buffers_packed_whole(saved_model) -> None:
    """TF's reader gives each buffer stored past the flatbuffer (ai-edge-quantizer's layout) as a bytearray, which
    the generated packer writes a byte per Python call (BERT-base's full-integer file: 60 s); pack_tflite packs
    them as arrays, and every buffer's bytes come back as they were."""
    from tensorflow.lite.tools import flatbuffer_utils

    from pe_export.provenance import pack_tflite

    offsets = _converted(saved_model("encoder_dynamic"), True)
    model = flatbuffer_utils.read_model_from_bytearray(bytearray(offsets))
    before = [None if b.data is None else bytes(b.data) for b in model.buffers]
    assert any(type(b.data) is bytearray for b in model.buffers)  # the case under test
    packed = pack_tflite(model, len(offsets))
    assert all(b.data is None or type(b.data) is np.ndarray for b in model.buffers)
    again = flatbuffer_utils.read_model_from_bytearray(bytearray(packed))
    after = [None if b.data is None else bytes(b.data) for b in again.buffers]
    assert after == before and any(after)
