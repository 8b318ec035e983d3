"""tf2onnx handlers for TensorFlow ops that tf2onnx 1.17 leaves unconverted or converts wrongly.

Keras 3's exact GELU lowers to ``Erfc``; tf2onnx has no handler for it, logs an error,
exits 0 and writes an ``Erfc`` node that ONNX does not define. A float ``Select`` it writes as a
sum of products, which a NaN in the branch not taken poisons. Its integer segment min and max fail. Importing
this module registers
the conversions with tf2onnx's handler registry.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from onnx import TensorProto
from tf2onnx import (
    onnx_opset,  # noqa: F401  (tf2onnx's own handlers first: those registered here replace them)
    utils,
)
from tf2onnx.handler import tf_op


@tf_op("Erfc")
class Erfc:
    """erfc(x) = 1 - erf(x); ONNX has Erf since opset 9."""

    @classmethod
    def version_9(cls, ctx: Any, node: Any, **kwargs: Any) -> None:
        source = node.input[0]
        dtype = ctx.get_dtype(source)
        erf = ctx.make_node("Erf", [source], op_name_scope=node.name, name="erf")
        ctx.set_dtype(erf.output[0], dtype)
        ctx.copy_shape(source, erf.output[0])
        one = ctx.make_const(
            utils.make_name(f"{node.name}_one"), np.array(1, dtype=utils.map_onnx_to_numpy_type(dtype))
        )
        node.type = "Sub"
        ctx.replace_inputs(node, [one.output[0], erf.output[0]])


@tf_op(["Select", "SelectV2"])
class SelectAsWhere:
    """A float ``tf.where`` as ONNX ``Where``. tf2onnx writes it as cond·x + (1 − cond)·y wherever it sees no
    NaN or Inf among the constants, which is wrong when the branch not taken holds one at run time: DeBERTa's
    masked softmax of a fully masked row is NaN, ``tf.where(mask, 0, softmax)`` zero in TensorFlow, NaN·0 = NaN in
    that sum. Integer selects keep tf2onnx's form (exact for every integer)."""

    @classmethod
    def version_9(cls, ctx: Any, node: Any, **kwargs: Any) -> None:
        from tf2onnx.onnx_opset.controlflow import Select

        if ctx.get_dtype(node.output[0]) in (TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.FLOAT16):
            node.set_attr("handles_nan", True)
        Select.version_9(ctx, node, **kwargs)


class _IntegerLimits:
    """numpy's ``iinfo`` with the limits as numpy scalars (numpy itself gives Python ints)."""

    def __init__(self, dtype: Any) -> None:
        info = np.iinfo(dtype)
        self.min, self.max = np.array(info.min, dtype), np.array(info.max, dtype)


class _NumpyWithScalarLimits:
    def __getattr__(self, name: str) -> Any:
        return _IntegerLimits if name == "iinfo" else getattr(np, name)


@tf_op(["SegmentMax", "SegmentMin", "UnsortedSegmentMax", "UnsortedSegmentMin"])
class SegmentExtremes:
    """tf2onnx's segment handler, for integer data too. It takes an integer min or max segment's identity (the
    dtype's largest or smallest value) from ``np.iinfo`` as a Python int and calls ``.tolist()`` on it, so every
    integer one failed and was left as a ``SegmentMin`` node ONNX does not define (TAPAS resets its position ids
    per table cell with one). The same handler, run with numpy scalars for those limits."""

    @classmethod
    def version_11(cls, ctx: Any, node: Any, **kwargs: Any) -> None:
        cls._convert(11, ctx, node, **kwargs)

    @classmethod
    def version_13(cls, ctx: Any, node: Any, **kwargs: Any) -> None:
        cls._convert(13, ctx, node, **kwargs)

    @staticmethod
    def _convert(opset: int, ctx: Any, node: Any, **kwargs: Any) -> None:
        from tf2onnx.onnx_opset import reduction

        original = reduction.np
        reduction.np = _NumpyWithScalarLimits()  # read by this one call; put back below
        try:
            reduction.SegmentSum.any_version(opset, ctx, node, **kwargs)
        finally:
            reduction.np = original
