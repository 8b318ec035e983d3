"""Tensor specs shared by both sides (numpy only): what a model takes and gives."""

from __future__ import annotations

from dataclasses import dataclass


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
    """Fill dynamic axes: axis 0 is the batch, axis 1 the sequence, others default to 1."""
    dims = []
    for axis, dim in enumerate(spec.shape):
        if dim is not None:
            dims.append(dim)
        elif axis == 0:
            dims.append(batch)
        elif axis == 1:
            dims.append(seq_len)
        else:
            dims.append(1)
    return tuple(dims)
