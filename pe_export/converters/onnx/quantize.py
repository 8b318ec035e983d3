"""Accuracy-driven dynamic int8 for ONNX: every MatMul and table quantized with per-channel weights,
activations smoothed into the weights first, then the most sensitive nodes moved to block-wise int8
(``onnx.block_int8``; --int8-kernel mixed) or kept in float (matmulinteger) until the target tolerance holds
(the search in ``search.keep_float``).

onnxruntime's ``quantize_dynamic`` defaults (per-tensor weight scales) damage a trained encoder: on
all-MiniLM-L6-v2 the worst real sentence's mean-pooled cosine fell to 0.955. Per-channel weight
scales bring it to 0.994 with the attention projections left float (tf2onnx writes them as Gemm,
which the quantizer skips); with them as MatMul every weight is int8 (0.26× the bytes, 0.43× the
latency) at 0.992, and smoothing (``onnx.smooth``) brings that to 0.998. What is left is spread over every
MatMul (one range per call, one step per output channel): at 0.999 on varied text the float search kept 18-24 of
39 weights float (p50 0.8-1.1x fp32); moved to block-wise int8 instead, 0.28x the bytes at 0.67-0.74x.
"""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Collection
from pathlib import Path
from typing import Any

import numpy as np

from pe_export.constants import ONNX_INT8_KERNEL, OUTLIER_CHANNELS
from pe_export.converters.onnx.block_int8 import BLOCK, block_int8_matmuls, block_int8_node, with_microsoft_domain
from pe_export.converters.onnx.candidates import _each_output, _run, quantizable_nodes
from pe_export.converters.onnx.gptq import matmul_gptq
from pe_export.converters.onnx.rewrites import (
    drop_unread_initializers,
    float16_stored,
    folded_by_onnxruntime,
    gemms_to_matmuls,
    names_read_by,
)
from pe_export.converters.onnx.row_int8 import Rounding, row_int8_matmuls, row_quantized
from pe_export.converters.onnx.smooth import smooth_activations
from pe_export.converters.onnx.table_int8 import rowwise_int8_tables, table_lookups
from pe_export.converters.search.keep_float import (
    ChoiceSamples,
    Judging,
    KeepFloatOutcome,
    cut_back_after_float,
    keep_float_to_target,
    resolve_asked,
    with_choice_margin,
    with_single_rows,
)
from pe_export.errors import ParityError
from pe_export.parity.tolerances import DYNAMIC_INT8_CHOICE_SHARE, Tolerance

BLOCKS_NOTE = (
    f"MatMuls as MatMulNBits (int8 weights and activations in blocks of {BLOCK} input channels of each row, integer "
    "products; onnxruntime's com.microsoft op, 1.22 or later)"
)
# Said where the mixed search moved a MatMul to blocks: benchmarks/int8_kernels.py, onnxruntime 1.32, one thread,
# all-MiniLM-L6-v2's weights at 14 tokens: MatMulNBits 1.13x float32's time on a Xeon with AMX (MatMulInteger
# 0.27x), 0.83x on an EPYC with AVX-512 VNNI (0.37x); the same file at 0.999 ran 0.67-0.74x fp32's p50 on an AVX2
# host, 1.02-1.05x on the Xeon, 0.65-0.69x on the EPYC
BLOCKS_SPEED_NOTE = (
    "8-bit MatMulNBits' speed depends on the CPU (on a Xeon with AMX it ran no faster than float32, on an EPYC with "
    "AVX-512 VNNI at 0.83x of it; MatMulInteger at a quarter to a third): measure the device with "
    "benchmarks/int8_kernels.py; --int8-kernel matmulinteger keeps every product MatMulInteger and the weights it "
    "must float"
)
GPTQ_NOTE = (
    "weights rounded by GPTQ (each input channel's rounding error carried onto the channels not yet rounded, "
    "weighted by the given inputs' activations)"
)
ESCALATED_TO = f"block-wise int8 (MatMulNBits: blocks of {BLOCK} channels; onnxruntime 1.22 or later)"
MIXED_BASE = "matmulinteger"  # the per-call product the mixed search starts from
QUANTIZED_OPS = ("MatMul", "Gather")  # what quantize_dynamic turns into integer kernels in tf2onnx graphs


def weight_bytes(model: Any) -> dict[str, int]:
    """Bytes of the float weight each quantizable node reads."""
    sizes = {i.name: int(np.prod(i.dims)) * 4 for i in model.graph.initializer}
    result = {}
    for node in model.graph.node:
        weight = node.input[1] if node.op_type == "MatMul" else (node.input[0] if node.op_type == "Gather" else None)
        if weight in sizes:
            result[node.name] = sizes[weight]
    return result


def weight_kinds(model: Any) -> dict[str, tuple[str, tuple[int, ...]]]:
    """Each quantizable node's op and weight shape: what places it in the model's repeated block."""
    dims = {i.name: tuple(i.dims) for i in model.graph.initializer}
    return {
        node.name: (node.op_type, dims.get(node.input[1] if node.op_type == "MatMul" else node.input[0], ()))
        for node in model.graph.node
        if node.op_type in QUANTIZED_OPS
    }


def quantize_to_target(
    model: Any,
    samples: ChoiceSamples,
    keep: tuple[str, ...] = (),
    outliers_per_input: int = OUTLIER_CHANNELS,
    kernel: str = ONNX_INT8_KERNEL,
    choice_share: float = DYNAMIC_INT8_CHOICE_SHARE,
) -> KeepFloatOutcome:
    """Dynamic int8 of ``model`` (float) that meets the samples' tolerance against it on them, if any does, chosen
    against ``choice_share`` of the cosine error it allows; the nodes
    ``keep`` names (--keep-float) float in every candidate; up to ``outliers_per_input`` outlier channels of each
    MatMul input computed in float beside its int8 product (``onnx.outliers``; 0: none). ``kernel``
    (``constants.ONNX_INT8_KERNELS``): "rows" (a range per row, inputs rotated where the simulation says so, GPTQ's
    weights, ``onnx.row_int8``; kept nodes float), "matmulinteger" (``quantize_dynamic``'s standard ops, one range
    per call, kept nodes float), "blocks" (every MatMul as MatMulNBits, ``onnx.block_int8``), or "mixed":
    matmulinteger with the kept MatMuls block-wise, and matmulinteger's float search where even every one of them
    moved misses."""
    feeds, tolerance, sequence_outputs = samples.feeds, samples.tolerance, samples.sequence_outputs
    prepared, steps = int8_ready(model)
    nodes = quantizable_nodes(prepared)
    asked = resolve_asked(keep, nodes)
    if not feeds:  # nothing to judge by, or to smooth on: everything quantized
        plain = MIXED_BASE if kernel == "mixed" else kernel
        quantized = QuantizedVariants(prepared, _quantize(prepared, [], plain)).build(asked)
        return KeepFloatOutcome(quantized, asked, len(nodes), float("nan"), True, asked=asked, kept_bytes=2)
    feeds, masks = with_single_rows(feeds, samples.masks)
    # the float model's outputs come from the smoothing's capture runs: the prepared model is the float model
    # with onnxruntime's basic optimizations applied, which every session applies anyway
    rows = kernel == "rows"  # the other kernels' smoothing: as for one range per call (blocks too)
    smoothed, smoothing, expected = smooth_activations(
        prepared, feeds, _each_output, outliers_per_input, row_quantized if rows else None, rotate=rows
    )
    if smoothing.smoothed or smoothing.outlier_channels or smoothing.rotated:
        steps.append(smoothing.note())
    rounding = None
    if rows:  # held out on MiniLM, every weight int8: 0.99872 rounded to nearest, 0.99908 by GPTQ
        rounding = matmul_gptq(smoothed, feeds, masks, smoothing.beside).rounded
        steps.append(GPTQ_NOTE)
    tolerance, chosen_note = with_choice_margin(tolerance, choice_share, "which weights escalate and the smoothing")
    steps.append(chosen_note)
    judging = Judging(feeds, masks, expected, sequence_outputs=sequence_outputs)
    candidates, sizes, kinds = (
        quantizable_nodes(smoothed, smoothing.beside),
        weight_bytes(smoothed),
        weight_kinds(smoothed),
    )
    if kernel == "mixed":
        quantized = _quantize(smoothed, list(smoothing.beside), MIXED_BASE)
        escalating = QuantizedVariants(smoothed, quantized, kept_as="blocks", always_float=set(asked))
        try:
            outcome = keep_float_to_target(
                candidates, sizes, escalating.build, _run, judging, tolerance, kinds, asked,
                kept_bytes=1, escalated_to=ESCALATED_TO,
            )  # fmt: skip
        except ParityError:  # even every weight escalated misses: float on top of the blocks, as TFLite's groups
            steps.append(
                "every MatMul as block-wise int8 missed the target: the weights kept float were chosen with every "
                "other MatMul block-wise, and the blocks then cut back to those the target needs"
            )
            searched = _float_over_blocks(candidates, sizes, escalating, judging, tolerance, kinds, asked, steps)
            if searched is not None:
                return searched
            # no file with an int8 weight met it so (an encoder without outliers: one range per call of 255 levels
            # can beat 127 per block): the standard ops' search, weights kept float
            kernel = MIXED_BASE
            steps[-1] = "block-wise int8 for every weight the search could move missed the target: kept float instead"
        else:
            if any(kinds[name][0] == "MatMul" for name in set(outcome.kept_float) - set(asked)):
                steps.append(BLOCKS_SPEED_NOTE)
            outcome.steps, outcome.float_bytes = steps, _escalated_bytes(outcome, kinds)
            return outcome
    variants = QuantizedVariants(smoothed, _quantize(smoothed, list(smoothing.beside), kernel, rounding))
    if kernel == "blocks":
        steps.append(BLOCKS_NOTE)
    outcome = keep_float_to_target(
        candidates,
        sizes,
        variants.build,
        _run,
        judging,
        tolerance,
        kinds,
        asked,
        kept_bytes=2,  # QuantizedVariants: kept weights in float16 storage
    )
    outcome.steps = steps
    return outcome


def _float_over_blocks(
    candidates: list[str],
    sizes: dict[str, int],
    escalating: QuantizedVariants,
    judging: Judging,
    tolerance: Tolerance,
    kinds: dict[str, tuple[str, tuple[int, ...]]],
    asked: list[str],
    steps: list[str],
) -> KeepFloatOutcome | None:
    """Where every MatMul block-wise misses: the fewest weights float (float16 storage) with every other MatMul
    block-wise, then the fewest of those MatMuls left block-wise (the rest back to the per-call int8 product) with
    them float; the float search in ``before``. None where only the float file meets the target."""
    matmuls = [name for name in candidates if kinds[name][0] == "MatMul"]
    try:
        floated = keep_float_to_target(
            candidates, sizes, lambda kept: escalating.build([*matmuls, *kept], floated=kept), _run, judging,
            tolerance, kinds, asked, kept_bytes=2,
        )  # fmt: skip
    except ParityError:
        return None
    floated.steps = list(steps)
    outcome = cut_back_after_float(
        floated,
        matmuls,
        lambda fixed, rest: keep_float_to_target(
            rest,
            sizes,
            lambda kept: escalating.build([*fixed, *kept], floated=fixed),
            _run,
            judging,
            tolerance,
            kinds,
            kept_bytes=1,
            escalated_to=ESCALATED_TO,
        ),
        lambda names: sum(sizes[name] // BLOCK for name in names),  # a block's float32 scale (_escalated_bytes)
    )
    if outcome is not floated and outcome.kept_float:
        outcome.steps = [BLOCKS_SPEED_NOTE]
    return outcome


def _escalated_bytes(outcome: KeepFloatOutcome, kinds: dict[str, tuple[str, tuple[int, ...]]]) -> int:
    """What the weights the mixed search kept cost over int8: a MatMul's block scales (float32, one per ``BLOCK``
    values), a table's float16 values (2 B against int8's 1); ``kinds``: ``weight_kinds``' op of each node."""
    values = {name: size // 4 for name, size in outcome.weight_bytes.items()}
    return sum(
        values.get(name, 0) * 4 // BLOCK
        if kinds[name][0] == "MatMul" and name not in outcome.asked
        else values.get(name, 0)
        for name in outcome.kept_float
    )


def int8_ready(model: Any) -> tuple[Any, list[str]]:
    """The float model as the quantizer needs it: constants folded by onnxruntime's basic optimizer
    (tf2onnx leaves the attention output kernel behind a Reshape of a constant), then Gemm by a constant
    as MatMul (the dynamic quantizer has integer kernels for MatMul only). Same arithmetic."""
    prepared = folded_by_onnxruntime(model.SerializeToString())
    count = gemms_to_matmuls(prepared)
    named_apart(prepared.graph)
    return prepared, [f"{count} Gemm node(s) as MatMul, which has integer kernels"] if count else []


def named_apart(graph: Any) -> int:
    """Give every node a name of its own (ONNX allows empty and repeated ones): the quantizer's exclusions and
    the search name nodes, and two that share a name would be kept float, or not, together. Returns how many
    were renamed."""
    seen: set[str] = set()
    renamed = 0
    for index, node in enumerate(graph.node):
        if not node.name or node.name in seen:
            node.name = f"{node.name or node.op_type}__pe_export_{index}"
            renamed += 1
        seen.add(node.name)
    return renamed


class QuantizedVariants:
    """The quantizer's all-int8 model, and from it the model with any nodes kept float: each kept node's
    integer chain (the nodes the quantizer put between the float node's inputs and its output) replaced by
    the float node, dead nodes and initializers dropped. A kept weight is stored in float16 and cast back
    (``float16_stored``; onnxruntime folds the Cast when it loads the file): float32 arithmetic at half the
    bytes, a rounding of 2^-11 against int8's 2^-7. Otherwise the same graph as ``quantize_dynamic`` with
    ``nodes_to_exclude`` writes (up to node order), without quantizing every weight again for each
    variant: at BERT-base one quantizer call is 20 s, and the search asks for a dozen variants."""

    def __init__(
        self, float_model: Any, quantized: Any, kept_as: str = "float", always_float: set[str] | None = None
    ) -> None:
        self.float_model, self.quantized, self.kept_as = float_model, quantized, kept_as
        self.always_float = always_float or set()  # --keep-float's: float whatever ``kept_as`` says
        self._float_nodes = {node.name: node for node in float_model.graph.node}
        self._float_initializers = {init.name: init for init in float_model.graph.initializer}
        self._blocked: dict[str, tuple[Any, list[Any]]] = {}  # a MatMul's block-wise form, made once for the search

    def _block_int8(self, node: Any) -> tuple[Any, list[Any]]:
        from onnx import numpy_helper

        if node.name not in self._blocked:
            weight = numpy_helper.to_array(self._float_initializers[node.input[1]])
            self._blocked[node.name] = block_int8_node(node, weight)
        return self._blocked[node.name]

    def build(self, kept: list[str], floated: Collection[str] = ()) -> Any:
        """The model with ``kept`` out of the per-call int8 products: float (float16 storage), or with
        ``kept_as`` "blocks" a MatMul kept as block-wise int8 (``onnx.block_int8``; a table lookup goes float),
        but those of them ``floated`` names float."""
        import onnx

        if not kept:
            return self.quantized
        model = onnx.ModelProto()
        model.CopyFrom(self.quantized)
        graph = model.graph
        producer = {output: index for index, node in enumerate(graph.node) for output in node.output}
        present = {init.name for init in graph.initializer}
        replaced: dict[int, Any] = {}
        casts = []
        for name in kept:
            node = self._float_nodes[name]
            if (
                self.kept_as == "blocks"
                and node.op_type == "MatMul"
                and name not in self.always_float
                and name not in floated
            ):
                blocked, blocked_weights = self._block_int8(node)
                replaced[producer[node.output[0]]] = blocked
                graph.initializer.extend(blocked_weights)  # copied: the cached protos stay as they are
                with_microsoft_domain(model)
                continue
            replaced[producer[node.output[0]]] = node  # the float node where its chain ended
            for weight in node.input:
                if weight in self._float_initializers and weight not in present:
                    initializer = self._float_initializers[weight]
                    stored = float16_stored(initializer) if len(initializer.dims) >= 2 else None
                    graph.initializer.append(initializer if stored is None else stored[0])
                    casts.extend([] if stored is None else [stored[1]])
                    present.add(weight)
        nodes = casts + [replaced.get(index, node) for index, node in enumerate(graph.node)]
        del graph.node[:]
        graph.node.extend(_live(nodes, {output.name for output in graph.output}))
        drop_unread_initializers(graph)
        return model


def _live(nodes: list[Any], outputs: set[str]) -> list[Any]:
    """``nodes`` (topological order) without those whose outputs nothing reads."""
    needed, kept = set(outputs), []
    for node in reversed(nodes):
        if any(output in needed for output in node.output):
            kept.append(node)
            needed |= names_read_by([node])  # subgraphs' reads too
    return kept[::-1]


def _quantize(model: Any, excluded: list[str], kernel: str = "matmulinteger", rounding: Rounding | None = None) -> Any:
    """``model`` with every MatMul (``excluded`` aside) and table int8 by ``kernel``; ``rounding``: the rows
    kernel's weight values (GPTQ's)."""
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    if kernel in ("blocks", "rows"):
        quantized = onnx.ModelProto()
        quantized.CopyFrom(model)
        if kernel == "blocks":
            block_int8_matmuls(quantized, set(excluded))
        else:
            row_int8_matmuls(quantized, set(excluded), rounding)
        rowwise_int8_tables(quantized, [name for name in table_lookups(quantized) if name not in set(excluded)])
        return quantized

    with tempfile.TemporaryDirectory(prefix="pe-export-") as work:
        target = Path(work) / "int8.onnx"
        root = logging.getLogger()
        level = root.level
        root.setLevel(logging.ERROR)  # the quantizer logs a pre-processing hint on every call
        try:
            quantize_dynamic(
                model,
                str(target),
                weight_type=QuantType.QInt8,
                per_channel=True,
                op_types_to_quantize=["MatMul"],  # tables: one step per row (``onnx.table_int8``), not per table
                nodes_to_exclude=excluded,
            )
        finally:
            root.setLevel(level)
        quantized = onnx.load(str(target))
    rowwise_int8_tables(quantized, [name for name in table_lookups(quantized) if name not in set(excluded)])
    return quantized
