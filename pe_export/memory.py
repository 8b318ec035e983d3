"""Will the export fit? The peak memory an export needs, estimated from the model's weight bytes as saved_model.pb
lists them, before anything is loaded or converted, against what the machine has available: a machine too small
gets one line, not the kernel's `Killed`. The same count refuses a TFLite file past the flatbuffer's 2 GiB.

The factors come from benchmarks/scale.py (process-tree peak over weight bytes, every file verified, 2-core x86):
BERT-base shape (438 MB of float32 weights) peaked at 4.1 GB for TFLite and 4.5 GB for ONNX, BERT-large (1.34 GB)
at 11.5 and 12.1 GB: about 1 GB of TensorFlow and runtimes plus 7-8x (TFLite) and 8-8.3x (ONNX) the weights.
Dynamic int8 converts a float file beside the int8 one.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pe_export.errors import BadInputError
from pe_export.precisions import all_precisions, precision

FIXED_BYTES = 1_000_000_000  # TensorFlow, the converter and a runtime loaded, before any weight
PEAK_PER_WEIGHT_BYTE = {"tflite": 8.0, "onnx": 9.0}
QUANTIZED_EXTRA = 1.0  # dynamic int8: the float file's conversion, once more the weights
TFLITE_MAX_BYTES = 2**31 - 1  # flatbuffers use 32-bit signed offsets
ONNX_BYTES_PER_MESSAGE = 2**31 - 2**24  # protobuf's 2 GiB, less room for metadata embedded later
_GB = 1e9


@dataclass(frozen=True)
class MemoryEstimate:
    weight_bytes: int
    needed_bytes: int
    available_bytes: int | None

    @property
    def fits(self) -> bool:
        return self.available_bytes is None or self.needed_bytes <= self.available_bytes


def saved_weight_bytes(saved_model: Path) -> int:
    """Bytes of the SavedModel's variables from its object graph (no value read, no TensorFlow imported), each
    counted once: a Keras export lists every variable twice (BERT-base: 435 entries, 876 MB, of 236 variables,
    438 MB), so entries of the same name, dtype and shape count once."""
    from pe_export.saved_variables import saved_variables

    seen = {(v.name, v.dtype, v.shape): v.nbytes for v in saved_variables(saved_model)}
    return sum(seen.values())


def check_tflite_size(weights: int, quantize: str, *, converter_layout: bool = False) -> None:
    """Refuse, in one line, a TFLite file pe-export cannot write: past 2 GiB a flatbuffer cannot address its
    buffers. The converter's own SavedModel conversion (``converter_layout``: plain float32 or float16, no
    rewrites) stores them after the flatbuffer by offset (TF 2.21 writes XLM-R-large's 2.24 GB that way and
    LiteRT runs it); every other path (rewritten graphs, dynamic-int8's float file) holds them inside."""
    asked = precision("tflite", quantize)
    stored = int(weights * asked.stored_bytes_per_weight_byte)
    if stored <= TFLITE_MAX_BYTES or (converter_layout and asked.converter_external_buffers):
        return
    smaller = [p.name for p in all_precisions("tflite") if weights * p.stored_bytes_per_weight_byte <= TFLITE_MAX_BYTES]
    instead = f"pass --quantize {' or '.join(smaller)}, " if smaller else ""
    what = (
        "a float32 TFLite file"
        if asked.plain
        else f"the float32 TFLite file {quantize} converts beside"
        if asked.edits_converter_file
        else f"a {quantize} TFLite file"
    )
    raise BadInputError(
        f"this model's weights come to {stored / 2**30:.2f} GiB in {what} "
        "and past 2 GiB pe-export writes only the converter's own float32 conversion (no --seq-len, --batch, "
        f"--dynamic-seq or table rewrites); {instead}drop those options, or export ONNX (`pe-export onnx`), which "
        "stores weights past 2 GiB as external data beside the file"
    )


def check_onnx_size(weights: int, quantize: str) -> None:
    """Refuse, in one line, the ONNX modes that cannot go past 2 GiB: dynamic-int8's and float16's searches run
    the model from bytes in onnxruntime. Float32, weight-float16 and weight-int8 files go past it with external
    data."""
    if not precision("onnx", quantize).searches or weights <= ONNX_BYTES_PER_MESSAGE:
        return
    raise BadInputError(
        f"this model's weights come to {weights / 2**30:.2f} GiB of float32 and --quantize {quantize} for ONNX "
        "works on models up to 2 GiB; pass --quantize weight-int8 or weight-float16, or export the float32 model "
        "(its weights go to external data beside the file)"
    )


def weight_bytes(variables: list[Any]) -> int:
    """Bytes of the model's variables, each counted once (a Keras export stores most of them twice on disk)."""
    seen: dict[int, int] = {}
    for variable in variables:
        seen[id(variable)] = int(variable.shape.num_elements() or 0) * variable.dtype.size
    return sum(seen.values())


def available_memory() -> int | None:
    """MemAvailable, lowered to a cgroup's remaining limit where one is set (containers); None where unknown."""
    available = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                available = int(line.split()[1]) * 1024
    except OSError:
        return None
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        used = int(Path("/sys/fs/cgroup/memory.current").read_text())
        if limit != "max" and available is not None:
            available = min(available, int(limit) - used)
    except (OSError, ValueError):
        pass
    return available


def estimate(weights: int, file_format: str, quantize: str, available: int | None = None) -> MemoryEstimate:
    second_copy = precision(file_format, quantize).holds_second_copy
    factor = PEAK_PER_WEIGHT_BYTE[file_format] + (QUANTIZED_EXTRA if second_copy else 0.0)
    needed = FIXED_BYTES + int(factor * weights)
    return MemoryEstimate(weights, needed, available_memory() if available is None else available)


def check_fits(weights: int, file_format: str, quantize: str, *, available: int | None = None) -> None:
    """Refuse, in one line, an export the machine's memory cannot hold (the caller skips it for --force)."""
    found = estimate(weights, file_format, quantize, available)
    if found.fits:
        return
    assert found.available_bytes is not None
    other = "onnx" if file_format == "tflite" else "tflite"
    raise BadInputError(
        f"this {file_format} export needs about {found.needed_bytes / _GB:.1f} GB of memory "
        f"({found.weight_bytes / 1e6:,.0f} MB of weights) and {found.available_bytes / _GB:.1f} GB is available; "
        f"free memory or use a bigger machine, try `pe-export {other}`, or pass --force to try anyway"
    )


def check_before_work(
    file_format: str,
    saved_model: Path,
    quantize: str,
    force: bool,
    *,
    converter_layout: bool = False,
    weights: int | None = None,
) -> None:
    """What the model's size rules out, from saved_model.pb alone, before anything is loaded or converted: a
    file its format cannot hold, and (unless ``force``) a machine whose memory the export would exhaust.
    ``weights``: ``saved_weight_bytes`` where the caller has it."""
    weights = saved_weight_bytes(saved_model) if weights is None else weights
    if file_format == "tflite":
        check_tflite_size(weights, quantize, converter_layout=converter_layout)
    else:
        check_onnx_size(weights, quantize)
    if not force:
        check_fits(weights, file_format, quantize)


def release_freed_memory() -> None:
    """Hand the heap's freed pages back to the system (glibc's malloc_trim; nothing elsewhere). The converter's
    buffers, freed, stay in the process's heap: after BERT-large's float32 conversion the process held 9.8 GB, and
    the full-integer search that follows adds its own copies of the model on top."""
    if not sys.platform.startswith("linux"):
        return
    name = ctypes.util.find_library("c")
    try:
        trim = ctypes.CDLL(name or "libc.so.6").malloc_trim
    except (OSError, AttributeError):  # not glibc (musl has no malloc_trim)
        return
    trim(0)
