"""Static int8 ONNX in QDQ form (``--quantize int8``): the graph TensorRT's int8 and onnxruntime's QLinear
kernels take, calibrated on the export's own inputs and driven by accuracy like dynamic int8.

- Every MatMul (weight products, and the attention's two activation products) reads its inputs through a
  QuantizeLinear/DequantizeLinear pair: activations symmetric int8 with one static range per tensor (TensorRT
  takes zero points of 0 only), weights symmetric int8 per output channel. Embedding tables int8 with a step
  per row (``onnx.table_int8``). LayerNorm, softmax and GELU stay float (TensorRT runs them in its own
  precision; neither onnxruntime nor TensorRT has an int8 LayerNorm).
- Activations smoothed into the weights and their outlier channels computed in float beside the int8
  product first (``onnx.smooth``; ``--outlier-channels``). Measured on all-MiniLM-L6-v2 (48 varied sentences
  to calibrate, 32 others to judge, worst mean-pooled cosine, every MatMul int8): onnxruntime's
  ``quantize_static`` min-max 0.613, entropy 0.609; smoothed with outlier channels split off min-max 0.931,
  entropy 0.986. One place dominates: the feed-forward output MatMul reads the GELU's output, whose massive
  [CLS] activations no single static range serves (one of them alone int8: 0.83-0.96).
- The calibration method (min-max, percentile, entropy) is chosen by accuracy on data it did not calibrate
  on: each method's ranges from every other input the export chooses on, the all-int8 file judged on the
  rest; the chosen method then calibrates on all of them.
- The nodes that cost most accuracy per weight byte are kept float (weights stored in float16, no QDQ) by the
  search of ``search.keep_float`` until the target holds; the export's held-out part then decides.
"""

from __future__ import annotations

import contextlib
import io
import logging
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

import numpy as np

from pe_export.constants import OUTLIER_CHANNELS
from pe_export.converters.onnx.gptq import GptqWeights, matmul_gptq
from pe_export.converters.onnx.outliers import is_side_node
from pe_export.converters.onnx.quantize import (
    _each_output,
    _live,
    _run,
    int8_ready,
    quantizable_nodes,
    weight_bytes,
    weight_kinds,
)
from pe_export.converters.onnx.rewrites import drop_unread_initializers, float16_stored
from pe_export.converters.onnx.smooth import _with_outputs, smooth_activations
from pe_export.converters.onnx.table_int8 import rowwise_int8_tables, table_lookups
from pe_export.converters.search.keep_float import (
    ChoiceSamples,
    Feeds,
    Judging,
    KeepFloatOutcome,
    batch_rows,
    feed_score,
    keep_float_to_target,
    resolve_asked,
    with_choice_margin,
    with_single_rows,
)
from pe_export.errors import ParityError
from pe_export.parity.tolerances import STATIC_INT8_CHOICE_SHARE, Tolerance

WEIGHT_ONLY = "weight-only int8 (int8 weights, float activations: no QDQ on the activation)"
GPTQ_NOTE = "int8 weights rounded by GPTQ (each rounding's error carried to the input channels not yet rounded)"
PERCENTILE = 99.999  # percentile calibration: the range holds this share of a tensor's |values|
HISTOGRAM_BINS = 2048  # its histogram's bins (onnxruntime's default for percentile)


@dataclass
class Calibrated:
    """Symmetric ranges per activation tensor, by method."""

    ranges: dict[str, dict[str, float]]  # method → tensor → |range|

    def methods(self) -> list[str]:
        return list(self.ranges)


def matmul_activations(model: Any) -> dict[str, list[str]]:
    """Float tensors each quantized MatMul reads that are not constants: what static calibration ranges.
    The side products of split outlier channels stay float (``onnx.outliers``)."""
    constants = {init.name for init in model.graph.initializer}
    produced_by_constant = {n.output[0] for n in model.graph.node if n.op_type == "Constant"}
    reads: dict[str, list[str]] = {}
    for node in model.graph.node:
        if node.op_type != "MatMul" or is_side_node(node.name):
            continue
        reads[node.name] = [i for i in node.input[:2] if i not in constants and i not in produced_by_constant]
    return reads


def static_candidates(model: Any) -> list[str]:
    """What the search may keep float, in graph order: the quantizable weights (``quantizable_nodes``) and the
    MatMuls of two activations (the attention's), which hold no weight: keeping one float costs no bytes."""
    weights = set(quantizable_nodes(model))
    activations = {name for name, reads in matmul_activations(model).items() if len(reads) == 2}
    return [node.name for node in model.graph.node if node.name in weights | activations]


def calibrate(model: Any, feeds: Feeds, tensors: list[str]) -> Calibrated:
    """Each tensor's symmetric range by min-max, percentile and entropy over ``feeds`` (one onnxruntime call
    each; onnxruntime's own histogram collector for percentile and entropy, fed call by call so that nothing
    is held but histograms)."""
    from onnxruntime.quantization.calibrate import HistogramCollector

    peaks: dict[str, float] = {}
    collectors = {
        "percentile": HistogramCollector("percentile", True, HISTOGRAM_BINS, 128, PERCENTILE, "same"),
        # onnxruntime's own bin count for entropy: its threshold search is quadratic in bins (2,048: 80 s on MiniLM)
        "entropy": HistogramCollector("entropy", True, 128, 128, PERCENTILE, "same"),
    }
    capturing = _with_outputs(model, tensors)
    quiet = io.StringIO()
    with contextlib.redirect_stdout(quiet):  # the collectors print their progress
        for captured in _each_output(capturing, feeds, tensors):
            for name in tensors:
                values = np.asarray(captured[name], np.float32)
                peaks[name] = max(peaks.get(name, 0.0), float(np.abs(values).max()) if values.size else 0.0)
            for collector in collectors.values():
                collector.collect({name: [np.asarray(captured[name], np.float32)] for name in tensors})
        ranges = {"min-max": peaks}
        for method, collector in collectors.items():
            found = collector.compute_collection_result()
            ranges[method] = {name: float(max(abs(found[name][0]), abs(found[name][1]))) for name in tensors}
    return Calibrated(ranges)


def qdq_model(
    model: Any,
    ranges: dict[str, float],
    kept: list[str],
    tables: bool = True,
    weight_only: Collection[str] = (),
    rounding: GptqWeights | None = None,
) -> Any:
    """``model`` (float) with QDQ around every MatMul not in ``kept`` (symmetric int8 activations from
    ``ranges``, weights per output channel), tables int8 per row unless kept; kept weights stored in float16.
    The MatMuls in ``weight_only`` read their activations in float (int8 weights only); ``rounding`` gives the
    int8 weights GPTQ's values instead of the nearest ones."""
    import onnx
    from onnxruntime.quantization import QuantType
    from onnxruntime.quantization.calibrate import CalibrationMethod, TensorData, TensorsData
    from onnxruntime.quantization.qdq_quantizer import QDQQuantizer

    kept_set = set(kept)
    quantized_nodes = [
        node.name
        for node in model.graph.node
        if node.op_type == "MatMul" and not is_side_node(node.name) and node.name not in kept_set
    ]
    data = {name: TensorData(lowest=np.float32(-peak), highest=np.float32(peak)) for name, peak in ranges.items()}
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    if not quantized_nodes:  # the quantizer reads an empty list as every node
        _store_kept_in_float16(copy, kept_set)
        return copy
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)
    try:
        quantizer = QDQQuantizer(
            copy,
            True,  # per-channel weights
            False,
            QuantType.QInt8,
            QuantType.QInt8,
            TensorsData(CalibrationMethod.MinMax, data),
            quantized_nodes,
            [],
            ["MatMul"],
            {
                "ActivationSymmetric": True,
                "WeightSymmetric": True,
                "QDQOpTypePerChannelSupportToAxis": {"MatMul": 1},  # output channels of a [K, N] weight
                "OpTypesToExcludeOutputQuantization": ["MatMul"],  # QDQ on inputs only: the pattern TensorRT fuses
            },
        )
        quantizer.quantize_model()
        quantizer.model.topological_sort()  # the quantizer appends its Q/DQ nodes after their readers
        quantized = quantizer.model.model
    finally:
        root.setLevel(level)
    if tables:
        rowwise_int8_tables(quantized, [name for name in table_lookups(quantized) if name not in kept_set])
    _store_kept_in_float16(quantized, kept_set)
    # Only the int8 products read an activation through its QDQ pair. The quantizer has every reader of a tensor
    # read its DequantizeLinear: a kept MatMul beside quantized ones (a layer's query beside its key and value),
    # and any other op reading the same tensor (the residual Add beside a feed-forward MatMul reading a
    # LayerNorm's output), whose float path would take the int8 rounding too.
    products = set(quantized_nodes) - set(weight_only)
    float_activations(quantized, lambda node: node.name not in products)
    if rounding is not None:
        rounding.apply(quantized)
    return quantized


def float_activations(model: Any, reads_float: Callable[[Any], bool]) -> int:
    """In place: the nodes ``reads_float`` names read their activations as they are, not through a QuantizeLinear
    → DequantizeLinear pair (a constant's DequantizeLinear, an int8 weight or table, stays); nodes no one reads
    any more are dropped. Returns the inputs changed. A MatMul so changed is what TensorRT runs as weight-only
    int8 and onnxruntime as a float product of the dequantized weight."""
    graph = model.graph
    constants = {init.name for init in graph.initializer}
    producers = {output: node for node in graph.node for output in node.output}
    changed = 0
    for node in graph.node:
        if node.op_type in ("QuantizeLinear", "DequantizeLinear") or not reads_float(node):
            continue
        for index, name in enumerate(node.input):
            dequantize = producers.get(name)
            if dequantize is None or dequantize.op_type != "DequantizeLinear" or dequantize.input[0] in constants:
                continue
            quantize = producers.get(dequantize.input[0])
            if quantize is not None and quantize.op_type == "QuantizeLinear":
                node.input[index] = quantize.input[0]
                changed += 1
    if changed:  # the pairs no node reads any more go
        live = _live(list(graph.node), {output.name for output in graph.output})
        del graph.node[:]
        graph.node.extend(live)
        drop_unread_initializers(graph)
    return changed


def _store_kept_in_float16(model: Any, kept: set[str]) -> None:
    graph = model.graph
    initializers = {init.name: init for init in graph.initializer}
    casts, replaced = [], set()
    for node in graph.node:
        if node.name not in kept:
            continue
        for name in node.input:
            init = initializers.get(name)
            if init is None or name in replaced or len(init.dims) < 2 or init.data_type != 1:
                continue
            stored = float16_stored(init)
            if stored is not None:
                graph.initializer.remove(init)
                graph.initializer.append(stored[0])
                casts.append(stored[1])
                replaced.add(name)
    if casts:
        nodes = casts + list(graph.node)
        del graph.node[:]
        graph.node.extend(nodes)
        drop_unread_initializers(graph)


def sample_rows(feeds: Feeds, masks: list[np.ndarray | None]) -> tuple[Feeds, list[np.ndarray | None]]:
    """Every sample of ``feeds`` as a feed of its own (a batch's rows one by one), with its mask: what a split
    into calibrating and judging samples divides, so that no sample is on both sides inside a batch."""
    rows: Feeds = []
    row_masks: list[np.ndarray | None] = []
    for feed, mask in zip(feeds, masks, strict=True):
        count = batch_rows(feed)
        for row in range(count):
            rows.append(feed if count == 1 else {name: array[row : row + 1] for name, array in feed.items()})
            row_masks.append(mask if count == 1 or mask is None else mask[row : row + 1])
    return rows, row_masks


def choose_method(
    model: Any,
    feeds: Feeds,
    masks: list[np.ndarray | None],
    tensors: list[str],
    tolerance: Tolerance,
    sequence_outputs: set[str] | None,
) -> tuple[str, dict[str, float]]:
    """The calibration method whose all-int8 file does best on samples it was not calibrated on (every other
    sample calibrates, the rest judge), and each method's worst cosine on the judging half (none with fewer
    than two samples: min-max, which clips nothing it saw)."""
    samples, sample_masks = sample_rows(feeds, masks)
    if len(samples) < 2:
        return "min-max", {}
    fit, judge = samples[0::2], samples[1::2]
    judge_masks = sample_masks[1::2]
    expected = _run(model, judge)
    trial = calibrate(model, fit, tensors)
    figures = {}
    for method in trial.methods():
        candidate = qdq_model(model, trial.ranges[method], [], tables=False)
        got = _run(candidate, judge)
        units = zip(got, expected, judge_masks, strict=True)
        scores = [feed_score(*unit, tolerance, sequence_outputs) for unit in units]
        figures[method] = min(cosine for _, cosine in scores)
    return max(figures, key=lambda name: figures[name]), figures


@dataclass
class StaticPlan:
    """What every static int8 candidate of one export is built from and judged on: the smoothed float model, the
    chosen activation ranges, GPTQ's weights, the judging inputs, the nodes --keep-float names, and the notes of
    what was done."""

    model: Any
    ranges: dict[str, float]
    rounding: GptqWeights
    judging: Judging
    asked: list[str]
    steps: list[str]

    def build(self, float16: Collection[str], weight_only: Collection[str]) -> Any:
        """The QDQ file with ``float16`` (and --keep-float's) nodes float, ``weight_only`` MatMuls reading float
        activations, everything else int8."""
        kept = [*self.asked, *(name for name in float16 if name not in self.asked)]
        return qdq_model(self.model, self.ranges, kept, weight_only=weight_only, rounding=self.rounding)

    @property
    def products(self) -> list[str]:
        """The MatMuls whose activations may be int8 (weights' and attention's), graph order, less --keep-float's."""
        reads = matmul_activations(self.model)
        return [name for name in static_candidates(self.model) if name not in self.asked and name in reads]

    @property
    def weights(self) -> list[str]:
        """The int8 weights (MatMuls' and tables'), graph order, less --keep-float's."""
        return [name for name in quantizable_nodes(self.model) if name not in self.asked]

    def worst_cosine(self, model: Any, tolerance: Tolerance) -> float:
        """``model``'s worst cosine on the judging inputs, as the search scores a candidate."""
        judging, outputs = self.judging, _run(model, self.judging.feeds)
        return min(
            feed_score(*judging.part(outputs, unit), tolerance, judging.sequence_outputs)[1] for unit in judging.units()
        )


def plan_static_int8(
    model: Any,
    samples: ChoiceSamples,
    keep: tuple[str, ...] = (),
    outliers_per_input: int = OUTLIER_CHANNELS,
) -> StaticPlan:
    """Smoothing, the calibration method and its ranges, GPTQ's weights: everything before the search."""
    if not samples.feeds:
        raise ValueError("static int8 needs inputs to calibrate on")
    tolerance, sequence_outputs = samples.tolerance, samples.sequence_outputs
    prepared, steps = int8_ready(model)
    asked = resolve_asked(keep, static_candidates(prepared), "int8 node")
    given, given_masks = samples.feeds, samples.masks
    feeds, masks = with_single_rows(given, given_masks)
    smoothed, smoothing, expected = smooth_activations(prepared, feeds, _each_output, outliers_per_input)
    if smoothing.smoothed or smoothing.outlier_channels:
        steps.append(smoothing.note())
    tensors = sorted({name for reads in matmul_activations(smoothed).values() for name in reads})
    method, figures = choose_method(smoothed, given, given_masks, tensors, tolerance, sequence_outputs)
    # the chosen method's ranges over every feed the search runs (the batches and their rows)
    ranges = calibrate(smoothed, feeds, tensors).ranges[method]
    said = ", ".join(f"{name} {figure:.4f}" for name, figure in figures.items())
    steps.append(
        f"activation ranges by {method}"
        + (f" (worst cosine of each method's all-int8 file on inputs it did not calibrate on: {said})" if said else "")
    )
    rounding = matmul_gptq(smoothed, feeds, masks)
    steps.append(GPTQ_NOTE)
    judging = Judging(feeds, masks, expected, sequence_outputs=sequence_outputs)
    return StaticPlan(smoothed, ranges, rounding, judging, asked, steps)


def static_int8_to_target(
    model: Any,
    samples: ChoiceSamples,
    keep: tuple[str, ...] = (),
    outliers_per_input: int = OUTLIER_CHANNELS,
) -> KeepFloatOutcome:
    """Static QDQ int8 of ``model`` (float) that meets ``tolerance`` against it on ``feeds``, if any does, chosen
    against ``STATIC_INT8_CHOICE_SHARE`` of the cosine error the target allows: the nodes ``keep`` names float in
    every candidate. What misses first reads its activations float (weight-only int8); where even every MatMul so
    misses, the weights that cost most go float16 first (a search of its own, in ``before``)."""
    plan = plan_static_int8(model, samples, keep, outliers_per_input)
    target = samples.tolerance
    tolerance, chosen_note = with_choice_margin(target, STATIC_INT8_CHOICE_SHARE, "ranges and rounding")
    steps = [*plan.steps, chosen_note]
    sizes, kinds = weight_bytes(plan.model), weight_kinds(plan.model)  # no size for an activation product
    products = plan.products
    try:  # what misses moves to int8 weights with float activations: no byte more than int8
        outcome = keep_float_to_target(
            products, sizes, lambda kept: plan.build([], kept), _run, plan.judging, tolerance, kinds,
            kept_bytes=1, escalated_to=WEIGHT_ONLY,
        )  # fmt: skip
    except ParityError:
        pass
    else:
        return _with_asked(outcome, plan.asked, steps, sizes)
    # Even every activation float misses: the weights' own rounding is the rest. Which weights go to float16 with
    # every activation float, then which activations go back to int8 with those weights float16.
    try:
        float16 = keep_float_to_target(
            plan.weights, sizes, lambda kept: plan.build(kept, products), _run, plan.judging, tolerance, kinds,
            kept_bytes=2,
        )  # fmt: skip
    except ParityError as err:
        raise ParityError(
            f"{err} (static int8 chooses against {STATIC_INT8_CHOICE_SHARE:g} of the cosine error "
            f"the target {target.min_cosine:g} allows)"
        ) from err
    float16.steps = ["every MatMul's activations float (every file with int8 activations missed the target)"]
    chosen = set(float16.kept_float)
    outcome = keep_float_to_target(
        [name for name in products if name not in chosen], sizes, lambda kept: plan.build(float16.kept_float, kept),
        _run, plan.judging, tolerance, kinds, kept_bytes=1, escalated_to=WEIGHT_ONLY,
    )  # fmt: skip
    outcome.before = [float16]
    return _with_asked(outcome, plan.asked, steps, sizes)


def _with_asked(
    outcome: KeepFloatOutcome, asked: list[str], steps: list[str], sizes: dict[str, int]
) -> KeepFloatOutcome:
    """The outcome as the export reports it: what ran before the searches in the first one's note, the nodes
    --keep-float named (float16 in every file) among the kept."""
    first = outcome.before[0] if outcome.before else outcome
    first.steps = [*steps, *first.steps]
    if asked:  # kept_float holds them first, as keep_float_to_target's does
        outcome.asked, outcome.kept_float = list(asked), [*asked, *outcome.kept_float]
        outcome.candidates += len(asked)
        outcome.float_bytes += sum(sizes.get(name, 0) for name in asked) // 4
    return outcome


def qdq_counts(model: Any) -> dict[str, int]:
    """QuantizeLinear/DequantizeLinear nodes and MatMuls that read a DequantizeLinear: what the file holds."""
    producers = {output: node.op_type for node in model.graph.node for output in node.output}
    matmuls = [node for node in model.graph.node if node.op_type == "MatMul"]
    return {
        "QuantizeLinear": sum(node.op_type == "QuantizeLinear" for node in model.graph.node),
        "DequantizeLinear": sum(node.op_type == "DequantizeLinear" for node in model.graph.node),
        "MatMul int8": sum(all(producers.get(i) == "DequantizeLinear" for i in node.input[:2]) for node in matmuls),
        "MatMul": len(matmuls),
    }
