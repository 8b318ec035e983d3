"""Error-compensating rounding of int8 weights (GPTQ, Frantar et al. 2022) for an ONNX file whose weights are stored
as int8 with a step per output channel (static QDQ's ``DequantizeLinear`` weights, the per-row products'
``onnx.row_int8``).

Rounding each value to its nearest step is what quantizers do; GPTQ rounds the input channels of a ``[K, N]``
weight one after another and moves each rounding's error onto the channels not yet rounded, weighted by how the
calibration activations correlate them (``H = XᵀX``), so that ``X·W`` rather than ``W`` is kept. The steps (the
scales the file already holds) and the storage are unchanged: only which int8 value each weight takes.

Measured on all-MiniLM-L6-v2 (48 varied sentences calibrate, 32 others judge, worst mean-pooled cosine): weights
int8 with activations float 0.99873 rounded to nearest, 0.99892 by GPTQ; every MatMul's activations int8 too
0.99319 → 0.99464. Dynamic int8 with a range per row and rotated inputs (``onnx.row_int8``, ``search.hadamard``), every
MatMul and table int8, held out: 0.99872 → 0.99908.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator
from typing import Any

import numpy as np

# Of H's mean diagonal, added to its diagonal. GPTQ's default is 0.01; from a few dozen sentences H is rank-poor and
# 0.01 fits them: MiniLM, GPTQ fitted on 24 of the 48 calibration sentences and judged on the other 24 (worst
# pooled cosine, every activation float): nearest 0.99813, damping 0.01 0.99849, 0.1 0.99889, 0.3 0.99903, 1 0.99881.
DAMPING = 0.3
# input channels rounded before their error is carried to the rest at once: the same values at any size (K 3072 x
# N 768: 2.2 s at 64, 3.2 s at 128, 2.4 s at 32)
BLOCK = 64
LEVEL = 127  # symmetric int8: values in [-127, 127]


def hessians(
    outputs: Iterator[dict[str, np.ndarray]], tensors: list[str], masks: list[np.ndarray | None]
) -> dict[str, np.ndarray]:
    """``XᵀX`` of each tensor over the calls in ``outputs`` (one dict of captured tensors per call), from the valid
    positions of each call (``masks``, one per call: padding is not what the weights will multiply). float32: every
    one is held until the rounding (BERT-large: 24 of 4096², 1.6 GB), and the damping dwarfs its rounding."""
    result: dict[str, np.ndarray] = {}
    for captured, mask in zip(outputs, masks, strict=True):
        for name in tensors:
            rows = np.asarray(captured[name], np.float32)
            rows = rows.reshape(-1, rows.shape[-1])
            if mask is not None and mask.size == rows.shape[0]:
                rows = rows[np.asarray(mask, bool).reshape(-1)]
            result[name] = result.get(name, 0.0) + rows.T @ rows
    return result


def gptq_round(weight: np.ndarray, scale: np.ndarray, hessian: np.ndarray) -> np.ndarray:
    """int8 values ``Q`` of ``weight`` [K, N] at the per-output-channel ``scale`` [N] that keep ``X·(Q·scale)``
    close to ``X·weight`` for the activations whose ``XᵀX`` is ``hessian`` [K, K]. Channels are rounded largest
    ``H`` diagonal first (act-order); a channel no activation reached rounds to nearest."""
    work = weight.astype(np.float64).copy()
    channels = work.shape[0]
    h = hessian.astype(np.float64).copy()
    dead = np.diag(h) == 0
    h[dead, dead] = 1.0
    step = np.where(scale > 0, scale, 1.0).astype(np.float64)
    order = np.argsort(-np.diag(h), kind="stable")
    work, h = work[order], h[order][:, order]
    h += DAMPING * float(np.mean(np.diag(h))) * np.eye(channels)
    upper = np.linalg.cholesky(np.linalg.inv(h)).T  # H⁻¹ = UᵀU: row k carries channel k's error forward
    values = np.zeros(work.shape, np.int8)
    for start in range(0, channels, BLOCK):
        end = min(start + BLOCK, channels)
        block = work[start:end].copy()
        errors = np.zeros_like(block)
        for i in range(end - start):
            rounded = np.clip(np.round(block[i] / step), -LEVEL, LEVEL)
            values[start + i] = rounded.astype(np.int8)
            errors[i] = (block[i] - rounded * step) / upper[start + i, start + i]
            block[i + 1 :] -= np.outer(upper[start + i, start + i + 1 : end], errors[i])
        work[end:] -= upper[start:end, end:].T @ errors
    result = np.zeros_like(values)
    result[order] = values
    return result


def weight_dequantizers(model: Any) -> dict[str, tuple[str, str]]:
    """MatMul node → (its int8 weight initializer, that weight's scale initializer), where the MatMul reads a
    constant weight through a per-output-channel ``DequantizeLinear``."""
    initializers = {init.name: init for init in model.graph.initializer}
    producers = {output: node for node in model.graph.node for output in node.output}
    found = {}
    for node in model.graph.node:
        if node.op_type != "MatMul" or len(node.input) < 2:
            continue
        dequantize = producers.get(node.input[1])
        if dequantize is None or dequantize.op_type != "DequantizeLinear":
            continue
        stored, scale = dequantize.input[0], dequantize.input[1]
        if stored in initializers and scale in initializers and len(initializers[stored].dims) == 2:
            found[node.name] = (stored, scale)
    return found


class GptqWeights:
    """GPTQ's int8 values for the weights of a float model's MatMuls, each computed once, written into every QDQ
    file built from that model (``apply``). ``weight_of(node)`` gives a MatMul's float weight and the name of the
    activation tensor it multiplies; ``hessian_of(tensor)`` that tensor's ``XᵀX``."""

    def __init__(
        self,
        weight_of: Callable[[str], tuple[np.ndarray, str] | None],
        hessian_of: Callable[[str], np.ndarray | None],
    ) -> None:
        self._weight_of, self._hessian_of = weight_of, hessian_of
        self._values: dict[str, np.ndarray | None] = {}

    def apply(self, model: Any) -> int:
        """In place: every MatMul weight of ``model`` stored as int8 with a step per output channel takes GPTQ's
        values at those steps; returns how many did."""
        from onnx import numpy_helper

        initializers = {init.name: init for init in model.graph.initializer}
        done = 0
        for node, (stored, scale_name) in weight_dequantizers(model).items():
            values = self.rounded(node, numpy_helper.to_array(initializers[scale_name]))
            if values is None or tuple(values.shape) != tuple(initializers[stored].dims):
                continue
            initializers[stored].CopyFrom(numpy_helper.from_array(values, stored))
            done += 1
        return done

    def rounded(self, node: str, scale: np.ndarray) -> np.ndarray | None:
        """GPTQ's int8 values [K, N] of MatMul ``node``'s weight at the per-output-channel steps ``scale`` [N],
        computed once; None where the node has no weight or captured activations that fit."""
        if node not in self._values:
            self._values[node] = self._rounded(node, scale)
        return self._values[node]

    def _rounded(self, node: str, scale: np.ndarray) -> np.ndarray | None:
        found = self._weight_of(node)
        if found is None or scale.ndim != 1:
            return None
        weight, tensor = found
        hessian = self._hessian_of(tensor)
        if hessian is None or hessian.shape[0] != weight.shape[0] or scale.shape[0] != weight.shape[1]:
            return None
        return gptq_round(weight, scale.astype(np.float64), hessian)


def matmul_gptq(
    model: Any, feeds: list[dict[str, np.ndarray]], masks: list[np.ndarray | None], beside: Collection[str] = ()
) -> GptqWeights:
    """GPTQ's rounding of an ONNX ``model``'s MatMul weights (not the float products beside them: the outlier
    channels', and those ``beside`` names), from the activations each multiplies on ``feeds`` (one onnxruntime
    call each)."""
    from onnx import numpy_helper

    from pe_export.converters.onnx.candidates import _each_output, quantizable_nodes
    from pe_export.converters.onnx.smooth import _with_outputs

    initializers = {init.name: init for init in model.graph.initializer}
    quantizable = set(quantizable_nodes(model, beside))  # MatMuls by a 2-D weight (and tables), not the side products
    weighted = {
        node.name: (node.input[0], node.input[1])
        for node in model.graph.node
        if node.op_type == "MatMul" and node.name in quantizable
    }
    tensors = sorted({tensor for tensor, _ in weighted.values()})
    found = hessians(_each_output(_with_outputs(model, tensors), feeds, tensors), tensors, masks) if tensors else {}

    def weight_of(node: str) -> tuple[np.ndarray, str] | None:
        if node not in weighted:
            return None
        tensor, weight = weighted[node]
        return numpy_helper.to_array(initializers[weight]), tensor

    return GptqWeights(weight_of, found.get)
