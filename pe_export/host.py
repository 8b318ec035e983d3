"""The machine a figure was measured on.

Which int8 product is fast is the CPU's to say: on all-MiniLM-L6-v2's weights, onnxruntime's MatMulNBits took
1.13x float32's time on a Xeon with AMX and 0.83x on an EPYC with AVX-512 VNNI, and the same export at
``--min-cosine 0.999`` ran 1.05x and 0.65x of its float32 file there (docs/quantization.md). A latency without
the CPU's integer instructions beside it cannot be compared with another machine's, so ``pe-export bench`` and
the benchmarks print them.
"""

from __future__ import annotations

import os
import platform
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# The instructions int8 kernels are built on, as /proc/cpuinfo names them: x86's AVX2 (pmaddubsw), VNNI (vpdpbusd)
# and AMX tiles; ARM's dot product (sdot), int8 matrix multiply (smmla) and SVE.
INT8_FEATURES = ("avx2", "avx_vnni", "avx512_vnni", "amx_int8", "asimddp", "i8mm", "sve", "sve2")
CPUINFO = Path("/proc/cpuinfo")


@dataclass(frozen=True)
class Host:
    machine: str  # platform.machine(): x86_64, aarch64, …
    cpus: int
    model: str  # the CPU's name where the system gives one
    int8_features: tuple[str, ...]  # those of INT8_FEATURES the CPU has, in that order

    def line(self) -> str:
        features = ", ".join(self.int8_features) if self.int8_features else "none of " + "/".join(INT8_FEATURES)
        return f"{self.model} ({self.machine}, {self.cpus} cores); int8 instructions: {features}"

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> Host:
        return cls(str(values["machine"]), int(values["cpus"]), str(values["model"]), tuple(values["int8_features"]))

    def to_dict(self) -> dict[str, object]:
        return {
            "machine": self.machine,
            "cpus": self.cpus,
            "model": self.model,
            "int8_features": list(self.int8_features),
        }


def describe_host(cpuinfo: Path = CPUINFO) -> Host:
    """This machine, read from ``cpuinfo`` (Linux's format) where it exists; elsewhere the model is what
    ``platform.processor()`` says and no feature is claimed."""
    fields = _first_processor(cpuinfo)
    flags = set((fields.get("flags") or fields.get("features") or "").split())
    model = fields.get("model name") or fields.get("hardware") or _arm_part(fields) or platform.processor() or "cpu"
    return Host(
        machine=platform.machine() or "unknown",
        cpus=os.cpu_count() or 1,
        model=" ".join(model.split()),
        int8_features=tuple(feature for feature in INT8_FEATURES if feature in flags),
    )


def _first_processor(cpuinfo: Path) -> dict[str, str]:
    """The first processor's fields (keys lower-cased) and the file's global ones (ARM's Hardware line)."""
    try:
        text = cpuinfo.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return {}
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, separator, value = line.partition(":")
        key = key.strip().lower()
        if separator and key and key not in fields:
            fields[key] = value.strip()
    return fields


def _arm_part(fields: dict[str, str]) -> str | None:
    """An ARM core's implementer and part numbers, where no name is given (the kernel prints none for them)."""
    implementer, part = fields.get("cpu implementer"), fields.get("cpu part")
    return f"ARM implementer {implementer} part {part}" if implementer and part else None
