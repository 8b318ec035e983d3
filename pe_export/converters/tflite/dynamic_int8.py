"""Accuracy-driven dynamic-range int8 for TFLite: the converter's file, its activations smoothed into its
weights, then the weights that cost the most accuracy put back in float32 until the target holds (the
search in ``search.keep_float``).

The converter's dynamic-range mode (int8 weights per output channel, activations quantized per row
at run time) has no per-op denylist and no smoothing, and a Mul placed right before a MatMul in the
TensorFlow graph is folded back into its weights (measured: relu(x)·c then MatMul converts to RELU,
FULLY_CONNECTED). So both happen on the flatbuffer, with the float32 file of the same graph (the same
converter, the same tensor names) as the source of the float weights and activations:

- smoothing (SmoothQuant, as in ``onnx.smooth``): for a FULLY_CONNECTED ``x·Wᵀ``, a MUL by 1/s on x and
  W's input columns times s, requantized per output channel; α per input tensor from a grid, by a
  simulation of the hybrid kernel's per-row quantization on the captured activations;
- tables: an int8 table read by GATHER then DEQUANTIZE gets a step per row (``tflite.table_int8``; the
  converter gives the whole table one);
- keep-float: a hybrid kernel also takes a float32 weight and then runs as a float kernel; a table kept
  float is gathered in float32 straight into what its rows' last op wrote;
- groups (``tflite.groups``): an FC as one hybrid FC per group of input channels, a step per group.

Measured on all-MiniLM-L6-v2, worst of 8 real sentences' pooled cosine: 0.99838 as the converter
writes it; 0.99892 smoothed, every weight int8; 0.99914 asked for 0.999 (3 of 38 weights float).
"""

from __future__ import annotations

import itertools
import os
import tempfile
from collections import Counter, defaultdict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from pe_export.converters.search.hadamard import ROTATION_BLOCK, choose_rotations, hadamard, rotated_weight
from pe_export.converters.search.keep_float import (
    ChoiceSamples,
    KeepFloatOutcome,
    cut_back_after_float,
    keep_float_to_target,
    resolve_asked,
    with_choice_margin,
)
from pe_export.converters.search.smoothing import (
    SMOOTHING_ROWS,
    Smoothing,
    best_scale,
    range_quantized,
    scales_of,
    thinned,
)
from pe_export.converters.tflite.groups import ESCALATED_TO, GroupedFC, group_count, split_into_groups, step_bytes
from pe_export.converters.tflite.objects import add_buffer, add_constant, add_like, new_op, per_output_channel_int8
from pe_export.converters.tflite.table_int8 import rowwise_steps
from pe_export.errors import ParityError
from pe_export.parity.tolerances import DYNAMIC_INT8_CHOICE_SHARE
from pe_export.provenance import pack_tflite

# Builtin ops whose hybrid (int8 weight, float activation) kernels also run with a float32 weight.
HYBRID_OPS = ("FULLY_CONNECTED", "BATCH_MATMUL", "CONV_2D", "DEPTHWISE_CONV_2D")
WEIGHT_INPUT = 1
ROW_LEVELS = 255  # the hybrid kernels' activations: int8, asymmetric, one range per row
# The smoothing capture stops once as many valid positions are in as the α search takes.
CAPTURE_POSITIONS = SMOOTHING_ROWS
RUN_THREADS = os.cpu_count() or 1  # the capture's and every candidate's runs (row results do not depend on it)


@dataclass
class _Weight:
    tensor: Any  # the int8 tensor in the quantized file
    values: np.ndarray  # its float32 weight (smoothed, once smoothing ran)
    op: Any  # the one operator that reads it
    op_name: str
    rows_ops: tuple[Any, ...] = ()  # GATHER only: the ops that make its int8 rows float (``tflite.table_int8``)


class DynamicRangeFile:
    """The converter's dynamic-range file as flatbuffer objects, and the float32 file's weights for it."""

    def __init__(self, quantized: bytes, float_file: bytes) -> None:
        from tensorflow.lite.python import schema_py_generated as schema
        from tensorflow.lite.tools import flatbuffer_utils

        self._schema, self._utils = schema, flatbuffer_utils
        self.model = flatbuffer_utils.read_model_from_bytearray(bytearray(quantized))
        self.float_model = flatbuffer_utils.read_model_from_bytearray(bytearray(float_file))
        self._bytes = len(float_file)  # what a file of this model takes at most, with every weight float
        self._codes = {value: name for name, value in vars(schema.BuiltinOperator).items() if not name.startswith("_")}
        float_tensors = _constant_floats(self.float_model)
        graph = self.model.subgraphs[0]
        readers: dict[int, int] = defaultdict(int)
        for op in graph.operators:
            for index in op.inputs if op.inputs is not None else ():
                readers[int(index)] += 1
        dequantizes = {int(op.inputs[0]): op for op in graph.operators if self._op_name(op) == "DEQUANTIZE"}
        # Tensor names need not be unique: a name names one tensor only where it occurs once in both files
        # (then it joins the two files, for capture); a weight's key is its name, with its index where repeated.
        counts = Counter(t.name for t in graph.tensors)
        in_float = Counter(t.name for t in self.float_model.subgraphs[0].tensors)
        self._unique = {
            t.name.decode(): i for i, t in enumerate(graph.tensors) if counts[t.name] == in_float[t.name] == 1
        }
        self.weights: dict[str, _Weight] = {}
        for op in graph.operators:
            name = self._op_name(op)
            gather = name == "GATHER" and int(op.outputs[0]) in dequantizes  # an int8 table, rows dequantized
            if not (name in HYBRID_OPS or gather) or op.inputs is None or len(op.inputs) <= WEIGHT_INPUT:
                continue
            index = int(op.inputs[0 if gather else WEIGHT_INPUT])
            tensor = graph.tensors[index] if index >= 0 else None
            if tensor is None or tensor.type != schema.TensorType.INT8 or readers[index] != 1:
                continue
            values = self._float_source(tensor, float_tensors)
            if values is not None:
                key = tensor.name.decode() if counts[tensor.name] == 1 else f"{tensor.name.decode()}#{index}"
                # ``values`` is never written in place: smoothing makes new arrays
                self.weights[key] = _Weight(tensor, values, op, str(name))
        shared: dict[int, int] = defaultdict(int)
        for tensor in (t for g in self.model.subgraphs for t in g.tensors):
            shared[tensor.buffer] += 1
        for weight in self.weights.values():  # each weight's bytes are rewritten in place: give it its own
            if shared[weight.tensor.buffer] > 1:
                weight.tensor.buffer = add_buffer(self.model, self.model.buffers[weight.tensor.buffer].data)
            if weight.op_name == "GATHER":  # a step per row of the table (the converter gives it one in all)
                dequantize = dequantizes[int(weight.op.outputs[0])]
                weight.rows_ops = tuple(rowwise_steps(self.model, weight.op, dequantize, weight.values))

    def _float_source(self, tensor: Any, float_tensors: dict[bytes, np.ndarray]) -> np.ndarray | None:
        """The float32 file's weight that ``tensor`` quantizes: the one of the same name, else (the converter
        renames some, e.g. ``…/Einsum`` → ``…/Einsum2``) the one of its shape that its int8 values and
        scales reproduce; the values decide, a name alone never does."""
        data = self.model.buffers[tensor.buffer].data
        if data is None or tensor.quantization is None or tensor.quantization.scale is None:
            return None
        quantized = np.asarray(data, np.uint8).view(np.int8).reshape(tuple(tensor.shape)).astype(np.float32)
        scale = np.asarray(tensor.quantization.scale, np.float32)
        axis = int(tensor.quantization.quantizedDimension or 0) if scale.size > 1 else 0
        shape = [1] * quantized.ndim
        shape[axis] = scale.size
        dequantized = quantized * scale.reshape(shape)
        named = float_tensors.get(tensor.name)
        others = [v for k, v in float_tensors.items() if k != tensor.name and v.shape == quantized.shape]
        half_step = 0.5001 * scale.reshape(shape)
        for values in ([named] if named is not None else []) + others:
            if values.shape == quantized.shape and np.all(np.abs(values - dequantized) <= half_step):
                return values
        return None

    def _op_name(self, op: Any) -> str | None:
        code = self.model.operatorCodes[op.opcodeIndex]
        return self._codes.get(max(code.builtinCode, code.deprecatedBuiltinCode))

    # -- smoothing ---------------------------------------------------------------------------------

    def smoothable(self) -> dict[str, list[str]]:
        """FULLY_CONNECTED input tensor name → the weights (keys) of the FCs that read it; inputs whose name is
        not one tensor's in both files are left out (their activations could not be told apart)."""
        graph = self.model.subgraphs[0]
        groups: dict[str, list[str]] = defaultdict(list)
        for key, weight in self.weights.items():
            name = graph.tensors[int(weight.op.inputs[0])].name.decode()
            if weight.op_name == "FULLY_CONNECTED" and weight.values.ndim == 2 and name in self._unique:
                groups[name].append(key)
        return dict(groups)

    def smooth(self, activations: dict[str, np.ndarray]) -> Smoothing:
        """In place: for each input tensor with activations (rows [n, inputs]), the α (0 = none) with the
        least simulated error; a MUL by 1/s inserted before its FCs, their weights' columns times s,
        requantized."""
        readers = self.smoothable()
        groups = {}
        for tensor, names in readers.items():
            rows = activations.get(tensor)
            joined = np.concatenate([self.weights[n].values for n in names], axis=0).T  # [inputs, outputs]
            if rows is not None and rows.size and rows.shape[-1] == joined.shape[0]:
                groups[tensor] = (thinned([rows]), joined)  # each row its own range: one call stands for all
        choices = {tensor: best_scale(*group, _row_quantized) for tensor, group in groups.items()}
        graph = self.model.subgraphs[0]
        rows_only = {t: g for t, g in groups.items() if len(graph.tensors[self._unique[t]].shape) == 2}
        rotations = choose_rotations(rows_only, choices, _row_quantized)  # a rotated input is reshaped to rows
        choices.update(rotations)  # smoothed (where their α > 0), then rotated
        chosen, smoothing = scales_of(choices, "FULLY_CONNECTED")
        for tensor, scale in chosen.items():
            self._insert_mul(tensor, scale, readers[tensor])
        for tensor in rotations:
            self._insert_rotation(tensor, readers[tensor])
        return replace(smoothing, tensors=len(readers), rotated=len(rotations), rotation_block=ROTATION_BLOCK)

    def _insert_rotation(self, tensor_name: str, weight_names: list[str]) -> None:
        """Before the FCs of ``weight_names``: x·H block by block (a float FC by H, which the runtime applies to
        x's rows cut into blocks, then a RESHAPE back to x's rows), their weights Hᵀ·W, requantized."""
        schema = self._schema
        graph = self.model.subgraphs[0]
        source = int(self.weights[weight_names[0]].op.inputs[0])  # the tensor, or its smoothing MUL's output
        channels = self.weights[weight_names[0]].values.shape[1]
        matrix = add_constant(
            self.model, f"{tensor_name}/hadamard", hadamard(ROTATION_BLOCK), schema.TensorType.FLOAT32
        )
        blocks = add_like(self.model, source, "/hadamard_blocks", schema.TensorType.FLOAT32)
        rows = int(np.prod(graph.tensors[source].shape)) // ROTATION_BLOCK
        dynamic = graph.tensors[source].shapeSignature is not None and -1 in list(graph.tensors[source].shapeSignature)
        graph.tensors[blocks].shape = [rows, ROTATION_BLOCK]
        graph.tensors[blocks].shapeSignature = [-1 if dynamic else rows, ROTATION_BLOCK]
        rotated = add_like(self.model, source, "/rotated", schema.TensorType.FLOAT32)
        shape = np.array([-1, channels], np.int32)
        new_shape = add_constant(self.model, f"{tensor_name}/rotated_shape", shape, schema.TensorType.INT32)
        reshape_options = schema.ReshapeOptionsT()
        reshape_options.newShape = shape.tolist()
        ops = [  # H is symmetric: the FC's weight [outputs, inputs] is H itself
            new_op(
                self.model,
                schema.BuiltinOperator.FULLY_CONNECTED,
                [source, matrix, -1],
                [blocks],
                schema.FullyConnectedOptionsT(),
            ),
            new_op(self.model, schema.BuiltinOperator.RESHAPE, [blocks, new_shape], [rotated], reshape_options),
        ]
        self._before_readers(ops, rotated, weight_names, lambda values: rotated_weight(values.T).T)

    def _insert_mul(self, tensor_name: str, scale: np.ndarray, weight_names: list[str]) -> None:
        schema = self._schema
        source = self._unique[tensor_name]
        inverse = add_constant(
            self.model, f"{tensor_name}/smooth_inverse", (1.0 / scale).astype(np.float32), schema.TensorType.FLOAT32
        )
        output = add_like(self.model, source, "/smoothed", schema.TensorType.FLOAT32)
        mul = new_op(self.model, schema.BuiltinOperator.MUL, [source, inverse], [output], schema.MulOptionsT())
        self._before_readers([mul], output, weight_names, lambda values: values * scale[None, :])

    def _before_readers(
        self, ops: list[Any], output: int, weight_names: list[str], remade: Callable[[np.ndarray], np.ndarray]
    ) -> None:
        """``ops`` (writing ``output``, computed from the FCs' input) placed before the first FC of
        ``weight_names``; each of those FCs then reads ``output``, its weight ``remade`` from its values
        [outputs, inputs] and requantized."""
        graph = self.model.subgraphs[0]
        first = min(graph.operators.index(self.weights[n].op) for n in weight_names)
        graph.operators[first:first] = ops
        for name in weight_names:
            weight = self.weights[name]
            weight.op.inputs[0] = output
            weight.values = np.ascontiguousarray(remade(weight.values), np.float32)
            self._requantize(weight)

    def _requantize(self, weight: _Weight) -> None:
        """int8 per output channel (axis 0), symmetric, as the converter writes hybrid FC weights."""
        quantized, weight.tensor.quantization = per_output_channel_int8(weight.values)
        self.model.buffers[weight.tensor.buffer].data = np.frombuffer(quantized.tobytes(), np.uint8)

    # -- keep float --------------------------------------------------------------------------------

    def groupable(self) -> list[str]:
        """The weights whose FULLY_CONNECTED can be computed in groups of input channels (``tflite.groups``)."""
        return [
            name
            for name, weight in self.weights.items()
            if weight.op_name == "FULLY_CONNECTED"
            and weight.values.ndim == 2
            and group_count(weight.values.shape[1]) > 1
        ]

    def build(self, kept: list[str], grouped: list[str] | tuple[str, ...] = ()) -> bytes:
        """The file with the ``kept`` weights float: stored in float16, a DEQUANTIZE to float32 before the op
        that reads them (as the converter's float16 mode writes weights: the runtime dequantizes a constant
        once), the op then a float one (a table's GATHER writes the float rows straight into what its rows'
        DEQUANTIZE wrote); the ``grouped`` ones' FCs in groups of input channels (``tflite.groups``). The objects
        are left as they were."""
        graph = self.model.subgraphs[0]
        saved = []
        kept_lists = (
            list(graph.operators),
            list(graph.tensors),
            list(self.model.buffers),
            list(self.model.operatorCodes),
        )
        for name in kept:
            weight = self.weights[name]
            tensor, op = weight.tensor, weight.op
            buffer = self.model.buffers[tensor.buffer]
            saved.append((tensor, tensor.type, tensor.quantization, buffer, buffer.data, op, op.outputs, op.inputs))
            buffer.data = np.frombuffer(weight.values.astype(np.float16).tobytes(), np.uint8)
            tensor.type, tensor.quantization = self._schema.TensorType.FLOAT16, None
            at = 0 if weight.rows_ops else WEIGHT_INPUT
            op.inputs = [*op.inputs[:at], self._dequantized(int(op.inputs[at]), op), *op.inputs[at + 1 :]]
            if weight.rows_ops:  # the float rows go straight to where the last of its row ops wrote
                op.outputs = list(weight.rows_ops[-1].outputs)
                for row_op in weight.rows_ops:
                    graph.operators.remove(row_op)
        groups = [self.weights[name] for name in grouped if name not in set(kept)]
        split_into_groups(self.model, [GroupedFC(w.op, int(w.op.inputs[WEIGHT_INPUT]), w.values) for w in groups])
        try:
            return pack_tflite(self.model, self._bytes)
        finally:
            for tensor, kind, quantization, buffer, data, op, outputs, inputs in saved:
                tensor.type, tensor.quantization, buffer.data = kind, quantization, data
                op.outputs, op.inputs = outputs, inputs
            graph.operators, graph.tensors, self.model.buffers, self.model.operatorCodes = kept_lists

    def _dequantized(self, source: int, reader: Any) -> int:
        """A float32 tensor that a DEQUANTIZE of ``source``, inserted right before ``reader``, writes."""
        schema = self._schema
        graph = self.model.subgraphs[0]
        dequantized = add_like(self.model, source, "/dequantized", schema.TensorType.FLOAT32)
        dequantize = new_op(self.model, schema.BuiltinOperator.DEQUANTIZE, [source], [dequantized])
        graph.operators.insert(graph.operators.index(reader), dequantize)
        return dequantized

    def capturing(self, names: list[str]) -> tuple[bytes, dict[str, str]]:
        """The float32 file with the named tensors as outputs of its signature too, and the output name each
        one has there: run with its delegate (XNNPACK), which keeps only outputs readable, at full speed
        (BERT-base without a delegate, every tensor kept: 20 s a row of 512 positions)."""
        graph, signature = self.float_model.subgraphs[0], self.float_model.signatureDefs[0]
        index = {t.name.decode(): i for i, t in enumerate(graph.tensors) if t.name.decode() in self._unique}
        outputs, maps = list(graph.outputs), list(signature.outputs)
        added = {}
        for number, name in enumerate(n for n in names if n in index):
            entry = self._schema.TensorMapT()
            entry.name, entry.tensorIndex = f"pe_export_capture_{number}".encode(), index[name]
            graph.outputs = [*graph.outputs, index[name]]
            signature.outputs.append(entry)
            added[name] = entry.name.decode()
        try:
            return pack_tflite(self.float_model, self._bytes), added
        finally:
            graph.outputs, signature.outputs = outputs, maps


def int8_to_target(
    quantized: bytes,
    float_file: bytes,
    samples: ChoiceSamples,
    keep: tuple[str, ...] = (),
    choice_share: float = DYNAMIC_INT8_CHOICE_SHARE,
) -> KeepFloatOutcome:
    """The dynamic-range file, smoothed, that meets ``tolerance`` against the float32 file on ``feeds`` with the
    fewest weights escalated, chosen against ``choice_share`` of the cosine error it allows, those ``keep`` names
    (--keep-float) float in every candidate; each candidate run in the installed TFLite runtime. The search first
    moves FCs to groups of input channels (``tflite.groups``: int8 bytes, a fraction of float's time), the other
    weights int8; where even every FC in groups misses, it keeps the fewest weights float in the file with every
    other FC in groups."""
    feeds, masks = samples.feeds, samples.masks
    edited = DynamicRangeFile(quantized, float_file)
    asked = resolve_asked(keep, list(edited.weights))
    tolerance, chosen_note = with_choice_margin(
        samples.tolerance, choice_share, "which weights escalate and the smoothing"
    )
    # No single-row copies of the batches (onnxruntime needs them): the hybrid kernels quantize each row
    # over its own range, so a row's result does not depend on the rows beside it.
    with tempfile.TemporaryDirectory(prefix="pe-export-") as work:
        folder = Path(work)
        expected = run_candidates(float_file, feeds, folder)
        rows_alone = batch_is_dynamic(edited.float_model)
        capturing, names = edited.capturing(list(edited.smoothable()))
        smoothing = edited.smooth(_captured(capturing, names, feeds, masks, folder, rows_alone))
        del capturing
        sizes = {name: weight.values.size * 4 for name, weight in edited.weights.items()}
        search = partial(
            keep_float_to_target,
            sizes=sizes,
            run=lambda data, f: run_candidates(data, f, folder),
            judging=samples.judging(expected, rows_alone=rows_alone),
            tolerance=tolerance,
            kinds={name: (weight.op_name, weight.values.shape) for name, weight in edited.weights.items()},
            asked=asked,
        )
        steps = [*([smoothing.note()] if smoothing.smoothed else []), chosen_note]
        groupable = [name for name in edited.groupable() if name not in set(asked)]
        # what a group costs is time, the ops it adds (measured: ~2-3 us each with XNNPACK), not bytes
        group_ops = ("op a group adds", {n: group_count(edited.weights[n].values.shape[1]) - 1 for n in groupable})
        if groupable:
            try:  # the FCs the search keeps go to groups of input channels; the other weights stay int8
                outcome = search(
                    groupable,
                    build=lambda kept: edited.build(
                        [n for n in kept if n not in set(groupable)], [n for n in kept if n in set(groupable)]
                    ),
                    kept_bytes=1,
                    escalated_to=ESCALATED_TO,
                    rank_costs=group_ops,
                )
            except ParityError:  # even every FC in groups misses: float on top of the file with every FC grouped
                steps.append(
                    f"every FULLY_CONNECTED as {ESCALATED_TO} missed the target: the weights kept float were chosen "
                    "with every other FC in groups, and the groups then cut back to those the target needs"
                )
            else:
                outcome.steps = steps
                outcome.float_bytes = _escalated_bytes(edited, outcome)
                if not set(outcome.kept_float) - set(asked):  # all int8 met it: all of them, not only the groupable
                    outcome.candidates = len(edited.weights)
                return outcome
        floated = search(
            list(edited.weights),
            build=lambda kept: edited.build(kept, [n for n in groupable if n not in set(kept)]),
            kept_bytes=2,  # DynamicRangeFile.build: kept weights in float16 storage
        )
        floated.steps = steps
        # The groups that float made unneeded go back to plain int8: fewer ops (measured on MiniLM at 0.999: 8 of
        # the 27 FCs left in groups met it where all 27 did, held out 0.99931 against 0.99934)
        return cut_back_after_float(
            floated,
            groupable,
            lambda fixed, rest: search(
                rest,
                build=lambda kept: edited.build(fixed, kept),
                asked=[],
                kept_bytes=1,
                escalated_to=ESCALATED_TO,
                rank_costs=group_ops,
            ),
            lambda names: sum(_group_step_bytes(edited, name) for name in names),
        )


def _group_step_bytes(edited: DynamicRangeFile, name: str) -> int:
    """What a weight's group steps add over its per-channel ones (``tflite_groups.split_into_groups``)."""
    return step_bytes(*edited.weights[name].values.shape)


def _escalated_bytes(edited: DynamicRangeFile, outcome: KeepFloatOutcome) -> int:
    """What the weights the grouped search kept cost over int8: an FC's group steps, an asked weight's float16
    values (2 B against int8's 1)."""
    grouped = set(edited.groupable()) - set(outcome.asked)
    total = 0
    for name in outcome.kept_float:
        values = edited.weights[name].values
        if name in grouped:
            total += _group_step_bytes(edited, name)
        else:
            total += values.size
    return total


def batch_is_dynamic(model: Any) -> bool:
    """Whether every input's batch axis is dynamic: then a row runs alone as it does in its batch."""
    graph = model.subgraphs[0]
    signatures = [graph.tensors[int(i)].shapeSignature for i in graph.inputs]
    return all(s is not None and len(s) and int(s[0]) == -1 for s in signatures)


def _row_quantized(x: np.ndarray) -> np.ndarray:
    """``x`` as the hybrid FULLY_CONNECTED sees it: each row int8 over its own range, dequantized."""
    return range_quantized(x, ROW_LEVELS, axis=1)


def _captured(
    data: bytes,
    names: dict[str, str],
    feeds: list[dict[str, np.ndarray]],
    masks: list[np.ndarray | None],
    folder: Path,
    rows_alone: bool,
) -> dict[str, np.ndarray]:
    """The tensors ``names`` maps to output names of ``data`` (``DynamicRangeFile.capturing``), as rows
    [n, channels] of valid positions only (padding never sets a range: each row is its own range here), on
    the feeds' rows taken in turn (variety first) until ``CAPTURE_POSITIONS`` valid positions are in; where
    ``rows_alone`` (the batch axis is dynamic: ``batch_is_dynamic``) a batch runs a row at a time."""
    from pe_export.runners import create_runner

    path = folder / "capturing.tflite"
    path.write_bytes(data)
    gathered: dict[str, list[np.ndarray]] = {name: [] for name in names}
    with create_runner(_runtime(path), path, threads=RUN_THREADS) as runner:
        inputs = {spec.name for spec in runner.input_specs()}
        calls = []  # (feed, mask, row or None for the whole feed), the feeds' rows interleaved
        for feed, mask in zip(feeds, masks, strict=True):
            given = {k: v for k, v in feed.items() if k in inputs}
            rows = next(iter(given.values())).shape[0] if given and rows_alone else 0
            calls.append([(given, mask, row) for row in range(rows)] if rows else [(given, mask, None)])
        positions = 0
        for given, mask, row in (call for group in itertools.zip_longest(*calls) for call in group if call):
            if positions >= CAPTURE_POSITIONS:
                break
            fed = given if row is None else {k: v[row : row + 1] for k, v in given.items()}
            outputs = runner.infer(fed)
            valid = mask if row is None or mask is None else mask[row : row + 1]
            positions += int(np.sum(valid)) if valid is not None else next(iter(fed.values()), np.zeros(1)).size
            for name, output in names.items():
                gathered[name].append(_valid_rows(outputs[output], valid))
    return {name: np.concatenate(parts) for name, parts in gathered.items() if parts}


def _valid_rows(tensor: np.ndarray, valid: np.ndarray | None) -> np.ndarray:
    """``tensor`` [..., channels] as rows, those of padding positions left out where the shape says which."""
    rows = np.array(tensor, np.float32).reshape(-1, tensor.shape[-1])
    if valid is not None and valid.size == rows.shape[0]:
        rows = rows[np.asarray(valid, bool).reshape(-1)]
    return rows


def run_candidates(
    data: bytes, feeds: list[dict[str, np.ndarray]], folder: Path, *, per_core: bool = False
) -> list[dict[str, np.ndarray]]:
    """Every feed through the TFLite file ``data`` (written to ``folder``) in the runtime that verifies exports:
    its outputs as real values (the runner dequantizes an integer output), one dict per feed. Shared by the
    dynamic-int8 and the full-integer searches. ``per_core``: the feeds split among one interpreter per core,
    each on its share, for files whose kernels run on one thread whatever num_threads asks (LiteRT's int16
    ones, most of a full-integer search's candidates: BERT-base's 2-row probe 13.2 s -> 6.6 s on 2 cores; the
    interpreters map the same file and invoke releases the GIL). Float and hybrid kernels use the threads
    themselves, and XNNPACK would pack a float file's weights once per interpreter."""
    from pe_export.runners import create_runner

    path = folder / "candidate.tflite"
    path.write_bytes(data)
    runtime = _runtime(path)
    workers = max(1, min(len(feeds), RUN_THREADS)) if per_core else 1

    def run_share(share: list[dict[str, np.ndarray]]) -> list[dict[str, np.ndarray]]:
        with create_runner(runtime, path, threads=max(1, RUN_THREADS // workers)) as runner:
            inputs = {spec.name for spec in runner.input_specs()}
            return [runner.infer({k: v for k, v in feed.items() if k in inputs}) for feed in share]

    if workers == 1:
        return run_share(feeds)
    shares = [feeds[start::workers] for start in range(workers)]
    with ThreadPoolExecutor(workers) as pool:
        results = list(pool.map(run_share, shares))
    ordered: list[dict[str, np.ndarray]] = [{} for _ in feeds]
    for start, outputs in enumerate(results):
        ordered[start::workers] = outputs
    return ordered


def _constant_floats(model: Any) -> dict[bytes, np.ndarray]:
    """Every float32 constant of the main graph, by name."""
    from tensorflow.lite.python import schema_py_generated as schema

    result = {}
    for tensor in model.subgraphs[0].tensors:
        data = model.buffers[tensor.buffer].data
        if tensor.type == schema.TensorType.FLOAT32 and data is not None and len(data) and tensor.shape is not None:
            shape = tuple(int(d) for d in tensor.shape)
            # a view of the buffer the model holds anyway, not a copy (BERT-base: 438 MB of them)
            values = np.ascontiguousarray(data, np.uint8).view(np.float32)
            if values.size == int(np.prod(shape)):
                result[tensor.name] = values.reshape(shape)
    return result


def _runtime(path: Path) -> str:
    """The TFLite runtime that judges candidates: the first installed, as verification picks it."""
    from pe_export.runners import first_installed_runner

    return first_installed_runner(path) or "tflite-tf"
