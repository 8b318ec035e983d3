"""Tensor specs shared by both sides (numpy only): what a model takes and gives.

The one convention for encoder tensors lives here: axis 0 is the batch, axis 1 the sequence (token ids,
masks, hidden states, logits alike). Ask a spec (``sequence_length``, ``dynamic_length``) or a feed
(``feed_shape``) rather than indexing shapes by hand.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

BATCH_AXIS, SEQUENCE_AXIS = 0, 1


@dataclass(frozen=True)
class TensorSpec:
    """A named tensor; ``None`` in ``shape`` is a dynamic axis."""

    name: str
    dtype: str  # numpy dtype name: "int32", "float32", ...
    shape: tuple[int | None, ...]

    @property
    def is_integer(self) -> bool:
        import numpy as np  # here, not at import: the supervising parity process never loads numpy

        return np.issubdtype(np.dtype(self.dtype), np.integer)

    @property
    def has_sequence(self) -> bool:
        return len(self.shape) > SEQUENCE_AXIS

    @property
    def sequence_length(self) -> int | None:
        """The fixed sequence length; None where the axis is dynamic or absent."""
        return self.shape[SEQUENCE_AXIS] if self.has_sequence else None

    @property
    def dynamic_length(self) -> bool:
        return self.has_sequence and self.shape[SEQUENCE_AXIS] is None

    def at_length(self, seq_len: int) -> TensorSpec:
        """The spec with a dynamic sequence axis set to ``seq_len`` and a dynamic batch (a bundle's entry)."""
        spec = self.with_axis(BATCH_AXIS, None)
        return spec.with_axis(SEQUENCE_AXIS, seq_len) if spec.dynamic_length else spec

    def describe(self) -> str:
        dims = ",".join("?" if d is None else str(d) for d in self.shape)
        return f"{self.name}: {self.dtype}[{dims}]"

    def with_axis(self, axis: int, size: int | None) -> TensorSpec:
        if axis >= len(self.shape):
            return self
        shape = list(self.shape)
        shape[axis] = size
        return TensorSpec(self.name, self.dtype, tuple(shape))


def concrete_shape(spec: TensorSpec, batch: int, seq_len: int) -> tuple[int, ...]:
    """Fill dynamic axes: the batch axis with ``batch``, the sequence axis with ``seq_len``, others with 1."""
    fill = {BATCH_AXIS: batch, SEQUENCE_AXIS: seq_len}
    return tuple(fill.get(axis, 1) if dim is None else dim for axis, dim in enumerate(spec.shape))


def fixed_length(specs: Iterable[TensorSpec]) -> int | None:
    """The one fixed sequence length the specs share; None when none is fixed (or they disagree)."""
    lengths = {spec.sequence_length for spec in specs if spec.sequence_length is not None}
    return lengths.pop() if len(lengths) == 1 else None


def sequence_outputs(inputs: Iterable[TensorSpec], outputs: Iterable[TensorSpec]) -> set[str]:
    """The outputs whose axis 1 is the inputs' sequence axis (a padding mask applies to them), from the
    signature: with a dynamic length, those whose axis 1 is dynamic too; with a fixed length L, those of rank 3
    or more whose axis 1 is L. A [batch, L] output of a fixed-length model may be [batch, hidden] with hidden
    equal to L (MiniLM's pooled output at 384): it is left unmasked, where masking it would skip hidden units."""
    inputs = list(inputs)
    if any_dynamic_length(inputs):
        return {spec.name for spec in outputs if spec.dynamic_length}
    length = fixed_length(inputs)
    return {spec.name for spec in outputs if length is not None and len(spec.shape) >= 3 and spec.shape[1] == length}


def any_dynamic_length(specs: Iterable[TensorSpec]) -> bool:
    return any(spec.dynamic_length for spec in specs)


def any_fixed_length(specs: Iterable[TensorSpec]) -> bool:
    return any(spec.sequence_length is not None for spec in specs)


def feed_shape(feed: Mapping[str, Any]) -> tuple[int, int] | None:
    """(batch, sequence length) of a feed's first array with a sequence axis; None when none has one."""
    for array in feed.values():
        if array.ndim > SEQUENCE_AXIS:
            return int(array.shape[BATCH_AXIS]), int(array.shape[SEQUENCE_AXIS])
    return None
