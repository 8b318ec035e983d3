"""The plain conversion in a child before the exporting process loads the model (pe_export/converters/tflite/child.py),
for full integer: the child converts the float32 file only, and the export quantizes that file, converting nothing
itself; the file still meets the int8 gate. Run on a tiny keras-hub BERT with the size threshold lowered, as a model
of 32 MiB and more takes it."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pe_export.api import export_tflite
from pe_export.converters.options import ExportOptions
from tests.helpers import token_feed

pytestmark = pytest.mark.skipif(sys.version_info < (3, 11), reason="keras-hub 0.32 needs Python 3.11+")


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.fixtures.keras_hub_models import export_random_bert

    return export_random_bert(tmp_path_factory.mktemp("child") / "bert", num_layers=2, vocabulary_size=500)


def test_the_child_converts_full_integers_float_file_only(saved: Path) -> None:
    from ai_edge_litert.interpreter import Interpreter

    from pe_export.converters.tflite.child import convert_in_child
    from pe_export.native import import_tensorflow

    child = convert_in_child(saved, None, "int8", True, lambda: "0" * 64, "int8")
    assert child is not None and child.data is None and child.float_data is not None
    runner = Interpreter(model_content=child.float_data).get_signature_runner(child.signature)
    feed = token_feed(("padding_mask", "segment_ids", "token_ids"), batch=2, seq_len=16, vocab=500, seed=3)
    feed["segment_ids"] = np.zeros_like(feed["token_ids"])
    got = runner(**feed)["sequence_output"]
    tf = import_tensorflow()
    signature = tf.saved_model.load(str(saved)).signatures[child.signature]
    want = signature(**{name: tf.constant(value) for name, value in feed.items()})["sequence_output"].numpy()
    assert got.dtype == np.float32 and np.abs(got - want).max() <= 1e-4 * np.abs(want).max()


def test_a_full_integer_export_quantizes_the_childs_float_file(
    saved: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import pe_export.api as api
    import pe_export.converters.tflite.child as tflite_child
    import pe_export.converters.tflite.convert as tflite

    children: list[Any] = []
    in_process: list[str] = []
    convert_in_child, convert = tflite_child.convert_in_child, tflite._convert

    def child_spy(*args: Any, **kwargs: Any) -> Any:
        children.append(convert_in_child(*args, **kwargs))
        return children[-1]

    def convert_spy(*args: Any, **kwargs: Any) -> Any:
        in_process.append(args[1].quantize)
        return convert(*args, **kwargs)

    monkeypatch.setattr(api, "CHILD_CONVERSION_MIN_WEIGHT_BYTES", 0)
    monkeypatch.setattr(tflite_child, "convert_in_child", child_spy)
    monkeypatch.setattr(tflite, "_convert", convert_spy)
    output = tmp_path / "m.tflite"
    report = export_tflite(saved, output, ExportOptions(quantize="int8"))
    assert report.exit_code == 0 and report.written and output.is_file(), report.notes
    assert len(children) == 1 and children[0] is not None and children[0].float_data is not None
    assert in_process == []  # the float32 file is the child's
    assert report.parity is not None and report.parity.passed
