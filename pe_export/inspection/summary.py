"""What `inspect` and every export report show about a model file."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from pe_export.specs import TensorSpec

LARGEST_CONSTANTS_SHOWN = 10


@dataclass(frozen=True)
class ConstantInfo:
    name: str
    dtype: str
    shape: tuple[int, ...]
    nbytes: int


@dataclass(frozen=True)
class SignatureInfo:
    name: str
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]


@dataclass(frozen=True)
class RuntimeVerdict:
    runtime: str
    runs: bool
    why: str


@dataclass
class ModelSummary:
    path: Path
    format: str  # "tflite", "onnx" or "savedmodel"
    file_bytes: int
    signatures: list[SignatureInfo]
    op_counts: Counter[str]
    constants: list[ConstantInfo]
    flex_ops: list[str] = field(default_factory=list)
    custom_ops: list[str] = field(default_factory=list)
    runs_on: list[RuntimeVerdict] = field(default_factory=list)
    details: dict[str, str] = field(default_factory=dict)
    metadata: dict[str, str] = field(default_factory=dict)  # provenance stamped by pe-export, among others

    @property
    def constant_bytes(self) -> int:
        return sum(c.nbytes for c in self.constants)

    def largest_constants(self, count: int = LARGEST_CONSTANTS_SHOWN) -> list[ConstantInfo]:
        return sorted(self.constants, key=lambda c: c.nbytes, reverse=True)[:count]
