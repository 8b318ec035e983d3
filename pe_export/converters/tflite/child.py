"""The plain TFLite conversion in a child process, run before the exporting process loads the model.

The converter's own SavedModel importer needs 3.7 GB at BERT-base shape (9.7 GB at BERT-large); the exporting
process holds the loaded SavedModel (the reference it verifies against) from the moment it loads it, and memory
TensorFlow has taken is not given back within a process. Converting first, in a child that exits before the
parent loads anything, keeps the export's peak at the converter's own: the child's memory is all returned when
it ends. The parent then checks that nothing had to be rewritten; where something did, it converts in-process as
before and this file is not used.

    python -m pe_export.converters.tflite.child REQUEST.json   (written by ``convert_in_child``)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from pe_export.precisions import precision as precision_of

# Every TFLite precision's file comes from the converter's SavedModel conversion: dynamic-int8's search edits the
# converter's dynamic-range file with the float32 file of the same graph beside it, both converted here; a precision
# made from the float32 file (full int8: calibrated and quantized in the exporting process, pe_export/converters/
# tflite/integer.py) has the child convert that file only (BERT-large's full-integer export: 18.2 -> 10.2 GB with
# the calibration changes, the converter no longer beside the loaded model).


@dataclass(frozen=True)
class ChildConversion:
    data: bytes | None  # the flatbuffer, metadata already embedded (None: a precision made from the float file)
    signature: str  # the signature it converted (resolved as LoadedSavedModel.resolve_signature_name does)
    log: str
    float_data: bytes | None = None  # the float32 conversion: dynamic-int8's with the float file asked for, int8's


def convert_in_child(
    saved_model: Path,
    signature: str | None,
    quantize: str,
    allow_flex: bool,
    digest: Callable[[], str],
    precision: str,
    *,
    with_float: bool = False,
) -> ChildConversion | None:
    """The converted file, its provenance stamped with the signature the child resolved, or None where the child
    failed: the in-process path then converts and reports. ``with_float``: the float32 file of the same
    conversion too (dynamic-int8's search reads it). ``digest`` is computed here while the child converts (it
    reads every weight: 5 s at BERT-large), and handed to it through a file for the stamp."""
    with tempfile.TemporaryDirectory(prefix="pe-export-convert-") as scratch:
        request = Path(scratch) / "request.json"
        output = Path(scratch) / "model.tflite"
        digest_file = Path(scratch) / "digest.txt"
        request.write_text(
            json.dumps(
                {
                    "saved_model": str(saved_model),
                    "signature": signature,
                    "quantize": quantize,
                    "allow_flex": allow_flex,
                    "digest_file": str(digest_file),
                    "precision": precision,
                    "with_float": with_float,
                    "output": str(output),
                }
            )
        )
        log = Path(scratch) / "child.log"
        with log.open("wb") as stderr:
            child = subprocess.Popen(
                [sys.executable, "-m", "pe_export.converters.tflite.child", str(request)],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=stderr,
            )
            try:
                partial = digest_file.with_suffix(".partial")
                partial.write_text(digest())
                partial.replace(digest_file)  # the child sees the whole digest or none
                returncode = child.wait()
            except BaseException:  # an error or an interrupt here: the child goes with it
                child.kill()
                child.wait()
                raise
        float_file = output.with_name("float.tflite")
        made = float_file if precision_of("tflite", quantize).from_float_file else output
        if returncode != 0 or not made.is_file():
            return None
        answer = json.loads((Path(scratch) / "answer.json").read_text())
        float_data = float_file.read_bytes() if float_file.is_file() else None
        text = log.read_text(errors="replace")
        data = output.read_bytes() if output.is_file() else None
        return ChildConversion(data, str(answer["signature"]), text, float_data)


def _signature_key(saved_model: Path, asked: str | None) -> str:
    """The signature the export uses, chosen from saved_model.pb as the loaded model chooses (savedmodel.py)."""
    from tensorflow.core.protobuf import saved_model_pb2

    from pe_export.savedmodel import choose_signature

    proto = saved_model_pb2.SavedModel()
    proto.ParseFromString((saved_model / "saved_model.pb").read_bytes())
    names = sorted(proto.meta_graphs[0].signature_def.keys()) if proto.meta_graphs else []
    return choose_signature(saved_model, names, asked)  # a BadInputError exits non-zero: the parent says why


def _digest(path: Path, parent: int) -> str:
    """The model's digest, written by the parent (process ``parent``) while this child converted."""
    while not path.is_file():
        if os.getppid() != parent:
            raise SystemExit("the exporting process is gone: no digest to stamp the file with")
        time.sleep(0.05)
    return path.read_text()


def _main(request_path: Path) -> None:
    parent = os.getppid()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    from pe_export.converters.tflite.convert import configure_converter
    from pe_export.native import import_tensorflow
    from pe_export.provenance import embed_tflite_metadata, provenance_entries

    request = json.loads(request_path.read_text())
    saved_model = Path(request["saved_model"])
    key = _signature_key(saved_model, request["signature"])
    tf = import_tensorflow()
    output = Path(request["output"])
    asked = precision_of("tflite", request["quantize"])
    float32 = precision_of("tflite", "none")
    if asked.from_float_file:
        modes = [float32]
    else:
        modes = [asked] + ([float32] if request.get("with_float") and not asked.plain else [])
    for mode in modes:
        converter = tf.lite.TFLiteConverter.from_saved_model(str(saved_model), signature_keys=[key])
        configure_converter(converter, mode, allow_flex=request["allow_flex"])
        data = converter.convert()
        del converter
        if mode != asked:
            output.with_name("float.tflite").write_bytes(data)
            continue
        provenance = provenance_entries(_digest(Path(request["digest_file"]), parent), request["precision"], key)
        output.write_bytes(embed_tflite_metadata(data, provenance, signature_key=key))
        del data
    (output.parent / "answer.json").write_text(json.dumps({"signature": key}))


if __name__ == "__main__":
    _main(Path(sys.argv[1]))
