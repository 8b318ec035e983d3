"""The wire-format reader of ONNX metadata_props (parity reads stamps without the onnx package)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from pe_export.errors import BadInputError
from pe_export.inspection.onnx_metadata import onnx_metadata
from tests.helpers import onnx_model


def test_reads_what_onnx_reads(exported_file) -> None:
    import onnx

    for quantize in ("none", "float16", "dynamic-int8"):
        path = exported_file("encoder_multi_io", "onnx", quantize)
        expected = {prop.key: prop.value for prop in onnx.load(str(path)).metadata_props}
        assert onnx_metadata(path) == expected and "pe_export.source_digest" in expected


def test_unstamped_model_has_no_metadata(tmp_path: Path) -> None:
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
    )
    onnx.save(onnx_model(graph), str(tmp_path / "plain.onnx"))
    assert onnx_metadata(tmp_path / "plain.onnx") == {}


def test_damaged_bytes_are_one_bad_input_error(exported_file, tmp_path: Path) -> None:
    whole = exported_file("encoder_multi_io", "onnx", "none").read_bytes()
    rng = np.random.default_rng(0)
    cases = [b"", b"hello world", whole[: len(whole) // 2], bytes(rng.integers(0, 256, 4096, dtype=np.uint8))]
    for _ in range(40):  # flipped bytes in the header, where the top-level fields are
        flipped = bytearray(whole)
        flipped[int(rng.integers(0, 64))] ^= int(rng.integers(1, 256))
        cases.append(bytes(flipped))
    refused = 0
    for data in cases:
        (tmp_path / "m.onnx").write_bytes(data)
        try:
            onnx_metadata(tmp_path / "m.onnx")
        except BadInputError as err:
            assert "m.onnx" in str(err) and "\n" not in str(err)
            refused += 1
    assert refused >= 4  # the first four can never parse; a flipped byte may still leave a valid message


@pytest.mark.parametrize("data", [b"", b"\x08"])
def test_empty_and_truncated(tmp_path: Path, data: bytes) -> None:
    (tmp_path / "m.onnx").write_bytes(data)
    with pytest.raises(BadInputError, match=r"empty|not an ONNX model"):
        onnx_metadata(tmp_path / "m.onnx")
