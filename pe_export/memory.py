"""Will the export fit? The peak memory an export needs, estimated from the model's weight bytes once it is loaded
(loading takes about twice the weights, far below an export's peak) and before any freezing or conversion,
against what the machine has available: a machine too small gets one line, not the kernel's `Killed`.

The factors come from benchmarks/scale.py (process-tree peak over weight bytes, every file verified, 2-core x86):
BERT-base shape (438 MB of float32 weights) peaked at 4.1 GB for TFLite and 4.5 GB for ONNX, BERT-large (1.34 GB)
at 11.5 and 12.1 GB: about 1 GB of TensorFlow and runtimes plus 7-8x (TFLite) and 8-8.3x (ONNX) the weights.
Dynamic int8 converts a float file beside the int8 one.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pe_export.errors import BadInputError

FIXED_BYTES = 1_000_000_000  # TensorFlow, the converter and a runtime loaded, before any weight
PEAK_PER_WEIGHT_BYTE = {"tflite": 8.0, "onnx": 9.0}
QUANTIZED_EXTRA = 1.0  # dynamic int8: the float file's conversion, once more the weights
_GB = 1e9


@dataclass(frozen=True)
class MemoryEstimate:
    weight_bytes: int
    needed_bytes: int
    available_bytes: int | None

    @property
    def fits(self) -> bool:
        return self.available_bytes is None or self.needed_bytes <= self.available_bytes


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
    factor = PEAK_PER_WEIGHT_BYTE[file_format] + (QUANTIZED_EXTRA if quantize not in ("none", "float16") else 0.0)
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
