"""tf2onnx 1.17's optimizer faults, mended for the length of a conversion.

Back-to-back Reshapes: tf2onnx's BackToBackOptimizer merges ``Reshape(Reshape(x, a), b)`` into ``Reshape(x, b)``
whatever ``b`` holds. Its own ReshapeOptimizer writes shapes with 0s ("this dimension of the input"), and a 0 read
against ``x`` instead of ``Reshape(x, a)`` is another dimension: a Dense applied to a 3-D tensor is a Reshape to
[B·T, d], a MatMul and a Reshape back to [B, T, d]; where nothing stands between that and the attention's reshape
to [0, 0, heads, d/heads] (a bias-free projection, or a zero bias removed), the merge reshapes the 2-D [B·T, d]
to [B·T, d, heads, d/heads] and onnxruntime refuses it (DeBERTa, DeBERTa-v2, ESM and ConvBERT of transformers 4.x).
The merge is kept where ``b`` is a constant without 0s, where it is exact.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any


@contextlib.contextmanager
def sound_optimizers() -> Iterator[None]:
    """For the block, tf2onnx merges back-to-back Reshapes only where the second shape is a constant without 0s."""
    from tf2onnx.optimizer import back_to_back_optimizer

    registry = back_to_back_optimizer._func_map  # tf2onnx's registry of back-to-back handlers
    key = ("Reshape",)
    merge = registry.get(key)
    if merge is None:  # another tf2onnx: nothing to mend
        yield
        return

    def exact_merge(graph: Any, node: Any, consumers: list[Any]) -> Any:
        if len(consumers) == 1 and consumers[0].type == "Reshape" and not _fixed_without_zeros(consumers[0].inputs[1]):
            return []
        return merge(graph, node, consumers)

    registry[key] = exact_merge
    try:
        yield
    finally:
        registry[key] = merge


def _fixed_without_zeros(shape_node: Any) -> bool:
    if shape_node is None or not shape_node.is_const():
        return False
    return bool((shape_node.get_tensor_value(as_list=False) != 0).all())
