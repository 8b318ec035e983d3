"""ONNX that computes in float16: weights and activations in float16, float32 at the file's inputs and outputs,
and float32 islands where float16 would not hold the values.

Which node runs in float16 is decided from what the graph does and from the values it computes on the export's
own inputs: a node of an arithmetic or data-movement op (``FLOAT16_OPS``) whose float inputs and outputs all stay
within ``FLOAT16_SAFE_MAX`` on every captured input, and whose float constants float16 can hold. Everything else
stays float32: comparisons and index arithmetic (tf2onnx's strided-slice lowering compares against ±1e9
sentinels, which float16 turns into infinities), Cast to float, attention-mask biases of -1e9, nodes with
subgraphs. A Cast is inserted wherever a float tensor crosses from one precision to the other. The nodes the
measured search (``pe_export/converters/search/keep_float.py``, on the per-sentence error) keeps float32 are added on
top.

onnxconverter-common's ``convert_float_to_float16`` decides by op list alone; on pe-export's MiniLM file it
writes a model onnxruntime refuses (a float16 output of a Less node where float32 is expected).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pe_export.converters.search.keep_float import FLOAT16_SEARCH, ChoiceSamples

# Ops whose float inputs and outputs may all be float16 (every float input of one node then takes the same type),
# with onnxruntime kernels or its automatic casts on every provider.
FLOAT16_OPS = frozenset(
    {
        "Abs", "Add", "Concat", "Div", "Einsum", "Erf", "Exp", "Expand", "Flatten", "Gather", "Gemm",
        "GlobalAveragePool", "Identity", "LayerNormalization", "MatMul", "Max", "Min", "Mul", "Neg", "Pow",
        "Reciprocal", "ReduceMax", "ReduceMean", "ReduceSum", "Relu", "Reshape", "Sigmoid", "Slice", "Softmax",
        "Split", "Sqrt", "Squeeze", "Sub", "Tanh", "Tile", "Transpose", "Unsqueeze", "Where",
    }
)  # fmt: skip
# Float16's largest finite value is 65504; a tensor that reached half of it on the captured inputs could overflow
# on the next input (a longer sentence, an outlier token), so it stays float32.
FLOAT16_SAFE_MAX = 32752.0
FLOAT, FLOAT16 = 1, 10  # onnx.TensorProto's element types


@dataclass
class Float16Plan:
    """Which nodes run in float16, and why the others stay float32 (node name → reason)."""

    float16: set[str] = field(default_factory=set)
    float32: dict[str, str] = field(default_factory=dict)

    def matmuls(self, model: Any) -> tuple[int, int]:
        """(MatMul/Gemm nodes in float16, all of them)."""
        names = [node.name for node in model.graph.node if node.op_type in ("MatMul", "Gemm")]
        return sum(name in self.float16 for name in names), len(names)


def float_tensors(model: Any) -> dict[str, int]:
    """Element type of every value in the main graph whose type shape inference or the graph states."""
    import onnx

    inferred = onnx.shape_inference.infer_shapes(model)
    graph = inferred.graph
    types = {v.name: v.type.tensor_type.elem_type for v in [*graph.value_info, *graph.input, *graph.output]}
    types.update({init.name: init.data_type for init in model.graph.initializer})
    for node in model.graph.node:
        if node.op_type == "Constant":
            for attribute in node.attribute:
                if attribute.name == "value":
                    types[node.output[0]] = attribute.t.data_type
    return types


def plan_float16(
    model: Any, peaks: dict[str, float], keep_float32: Iterable[str] = (), types: dict[str, int] | None = None
) -> Float16Plan:
    """The precision of every node: ``peaks`` gives each float tensor's largest magnitude on the captured inputs
    (a tensor never captured counts as out of range: nothing is known of it); ``keep_float32`` names nodes the
    search keeps float32."""
    types = types if types is not None else float_tensors(model)
    constants = {init.name: init for init in model.graph.initializer}
    kept = set(keep_float32)
    plan = Float16Plan()
    for node in model.graph.node:
        floats = [name for name in [*node.input, *node.output] if name and types.get(name) == FLOAT]
        reason = None
        if node.name in kept:
            reason = "kept float32 by the measured search"
        elif node.op_type not in FLOAT16_OPS or any(a.type in (5, 10) for a in node.attribute):  # GRAPH(S)
            reason = f"{node.op_type} is not an arithmetic op float16 runs"
        elif not floats:
            reason = "no float tensor"
        else:
            for name in floats:
                peak = peaks.get(name)
                if peak is None:  # a constant captured_peaks did not measure (a caller's own peaks)
                    peak = constant_peak(constants[name]) if name in constants else np.inf
                if not peak <= FLOAT16_SAFE_MAX:
                    reason = f"{name} reaches {peak:.3g}, beyond float16's safe range"
                    break
        if reason is None:
            plan.float16.add(node.name)
        else:
            plan.float32[node.name] = reason
    return plan


def to_float16(model: Any, plan: Float16Plan, types: dict[str, int] | None = None) -> Any:
    """A copy of ``model`` with the nodes ``plan`` puts in float16 computing in float16: their float inputs cast
    (constants stored) in float16, float32 wherever the other nodes and the file's inputs and outputs read."""
    import onnx
    from onnx import helper

    types = types if types is not None else float_tensors(model)
    result = onnx.ModelProto()
    result.CopyFrom(model)
    graph = result.graph
    outputs = {output.name for output in graph.output}
    retype = _Retyping(graph, plan, types)
    for node in list(graph.node):
        wanted = FLOAT16 if node.name in plan.float16 else FLOAT
        for index, name in enumerate(node.input):
            if name and types.get(name) == FLOAT:
                node.input[index] = retype.as_type(name, wanted)
        retype.nodes.append(node)
        for index, name in enumerate(node.output):
            if name in outputs and retype.precision.get(name) == FLOAT16:  # the file's outputs stay float32
                node.output[index] = f"{name}__fp16"
                cast = helper.make_node("Cast", [node.output[index]], [name], name=f"{name}__out", to=FLOAT)
                retype.nodes.append(cast)
                retype.precision[name] = FLOAT  # what later readers of the output get
    del graph.node[:]
    graph.node.extend(retype.nodes)
    del graph.value_info[:]  # stale types; the checker infers them again
    read = {name for node in graph.node for name in node.input}
    for init in [init for init in graph.initializer if init.name not in read and init.name not in outputs]:
        graph.initializer.remove(init)
    return result


class _Retyping:
    """The rewrite's state: each float tensor's type as written (its producer's), the float16 copies of constants
    and the casts made so far (one per tensor and type), and the nodes in their new order."""

    def __init__(self, graph: Any, plan: Float16Plan, types: dict[str, int]) -> None:
        self.graph = graph
        self.nodes: list[Any] = []
        self.constants = {init.name: init for init in graph.initializer}
        self.precision = {
            name: FLOAT16 if node.name in plan.float16 else FLOAT
            for node in graph.node
            for name in node.output
            if types.get(name) == FLOAT
        }
        self.stored: dict[str, str] = {}
        self.casts: dict[tuple[str, int], str] = {}

    def as_type(self, name: str, wanted: int) -> str:
        """``name`` as a tensor of type ``wanted``: itself, its float16 copy (a constant) or a cast of it."""
        from onnx import helper, numpy_helper

        if name in self.constants:
            if wanted == FLOAT:
                return name
            if name not in self.stored:
                half = numpy_helper.from_array(numpy_helper.to_array(self.constants[name]).astype(np.float16))
                half.name = self.stored[name] = f"{name}__fp16"
                self.graph.initializer.append(half)
            return self.stored[name]
        if self.precision.get(name, FLOAT) == wanted:  # graph inputs are float32
            return name
        if (name, wanted) not in self.casts:
            cast = f"{name}__as_{'fp16' if wanted == FLOAT16 else 'fp32'}"
            self.nodes.append(helper.make_node("Cast", [name], [cast], name=f"{cast}__cast", to=wanted))
            self.casts[(name, wanted)] = cast
        return self.casts[(name, wanted)]


def constant_peak(constant: Any) -> float:
    """A float constant's largest magnitude (0 for an empty one)."""
    from onnx import numpy_helper

    values = numpy_helper.to_array(constant)
    return float(np.abs(values).max()) if values.size else 0.0


def captured_peaks(
    model: Any,
    feeds: list[dict[str, np.ndarray]],
    run: Callable[..., Iterable[dict[str, np.ndarray]]],
    types: dict[str, int] | None = None,
) -> tuple[dict[str, float], list[dict[str, np.ndarray]]]:
    """Each float tensor's largest magnitude over ``feeds`` (``run(model, feeds, names)``, one feed at a time) and
    each float constant's, measured once for every plan the search makes; and the model's outputs on ``feeds``."""
    from pe_export.converters.onnx.smooth import _with_outputs

    types = types if types is not None else float_tensors(model)
    constants = {init.name for init in model.graph.initializer}
    names = sorted(
        {
            name
            for node in model.graph.node
            for name in node.output
            if types.get(name) == FLOAT and name not in constants
        }
    )
    outputs = [output.name for output in model.graph.output]
    peaks: dict[str, float] = defaultdict(float)
    for init in model.graph.initializer:
        if init.data_type == FLOAT:
            peaks[init.name] = constant_peak(init)
    for feed in feeds:  # float inputs of the file
        for name, values in feed.items():
            if types.get(name) == FLOAT and np.size(values):
                peaks[name] = max(peaks[name], float(np.abs(values).max()))
    expected = []
    for captured in run(_with_outputs(model, names), feeds, outputs + [n for n in names if n not in outputs]):
        expected.append({name: captured[name] for name in outputs})
        for name in names:
            values = np.asarray(captured[name])
            if values.size:
                peak = float(np.abs(values).max())
                peaks[name] = max(peaks[name], peak) if np.isfinite(peak) else np.inf
    return dict(peaks), expected


def float16_to_target(
    model: Any,
    samples: ChoiceSamples,
    keep: tuple[str, ...] = (),
    searches: list[dict[str, Any]] | None = None,
) -> tuple[Any, list[str]]:
    """``model`` computing in float16 where it holds its values, with the fewest further nodes in float32 that
    make ``tolerance`` hold against the float32 model on ``feeds`` (the search ``search.keep_float`` runs for int8;
    ``keep`` names nodes --keep-float keeps float32). Returns the model and the notes that say what stayed float32
    and why; ``searches`` receives the search's record (``KeepFloatOutcome.record``)."""
    import onnx

    from pe_export.converters.onnx.quantize import _each_output, _run, named_apart
    from pe_export.converters.search.keep_float import keep_float_to_target, resolve_asked, short_name

    feeds, tolerance = samples.feeds, samples.tolerance
    if not feeds:  # the export always gives them (pe_export/api.py), --no-verify or not
        raise ValueError("float16 arithmetic needs inputs to measure the graph's values on")
    prepared = onnx.ModelProto()
    prepared.CopyFrom(model)
    named_apart(prepared.graph)  # the plan and the search name nodes
    types = float_tensors(prepared)
    peaks, expected = captured_peaks(prepared, feeds, _each_output, types)
    first = plan_float16(prepared, peaks, types=types)
    asked = resolve_asked(keep, sorted(first.float16), "float16 node")

    def build(kept: list[str]) -> Any:
        return to_float16(prepared, plan_float16(prepared, peaks, kept, types), types)

    sizes = _weight_bytes(prepared)
    kinds = {node.name: (node.op_type, sizes.get(node.name, 0)) for node in prepared.graph.node}
    candidates = [node.name for node in prepared.graph.node if node.name in first.float16]
    outcome = keep_float_to_target(
        candidates,
        sizes,
        build,
        _run,
        samples.judging(expected),
        tolerance,
        kinds,
        asked,
        kind=FLOAT16_SEARCH,
    )
    plan = plan_float16(prepared, peaks, outcome.kept_float, types)
    in_float16, matmuls = plan.matmuls(prepared)
    out_of_range = [name for name, why in plan.float32.items() if "safe range" in why]
    notes = outcome.notes("float nodes")
    if searches is not None:
        searches.append(outcome.record("float nodes"))
    notes.append(
        f"float16: {len(plan.float16)} of {len(plan.float16) + len(plan.float32)} nodes compute in float16 "
        f"({in_float16} of {matmuls} MatMul/Gemm); float32 where a value passed float16's safe range "
        f"({FLOAT16_SAFE_MAX:g}) on the inputs measured ({len(out_of_range)} node(s): "
        f"{', '.join(short_name(n) for n in out_of_range[:3])}{', …' if len(out_of_range) > 3 else ''}), "
        "where the op is not arithmetic (shapes, comparisons, casts), and where the search kept it; float32 at the "
        "file's inputs and outputs"
    )
    return outcome.model, notes


def _weight_bytes(model: Any) -> dict[str, int]:
    """Float32 bytes of the constant inputs each node reads (what keeping it float32 costs over float16)."""
    sizes = {init.name: int(np.prod(init.dims)) * 4 for init in model.graph.initializer if init.data_type == FLOAT}
    return {node.name: sum(sizes.get(name, 0) for name in node.input) for node in model.graph.node}
