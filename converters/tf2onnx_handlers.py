"""tf2onnx handlers for TensorFlow ops that tf2onnx 1.17 leaves unconverted.

Keras 3's exact GELU lowers to ``Erfc``; tf2onnx has no handler for it, logs an error,
exits 0 and writes an ``Erfc`` node that ONNX does not define. Importing this module
registers the missing conversions with tf2onnx's handler registry.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from tf2onnx import utils
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
