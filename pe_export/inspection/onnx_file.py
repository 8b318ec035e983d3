"""Read a .onnx file: inputs, outputs, op inventory, initializers, validity (no TensorFlow)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

from pe_export.errors import BadInputError, missing_extra, one_line
from pe_export.inspection.runtimes import onnx_verdicts
from pe_export.inspection.summary import ConstantInfo, ModelSummary, SignatureInfo
from pe_export.specs import TensorSpec

STANDARD_DOMAINS = ("", "ai.onnx")


def import_onnx() -> Any:
    try:
        import onnx
    except ImportError as err:
        raise missing_extra("onnx", "device") from err
    return onnx


def load_onnx(path: Path) -> Any:
    onnx = import_onnx()
    if Path(path).is_file() and Path(path).stat().st_size == 0:
        raise BadInputError(f"{path} is empty (0 bytes); expected an ONNX model file")
    try:
        model = onnx.load(str(path))
    except Exception as err:  # protobuf's DecodeError and friends
        raise BadInputError(
            f"{path} is not a readable ONNX model ({type(err).__name__}); expected an ONNX protobuf file"
        ) from err
    # Any bytes that parse as protobuf give a ModelProto; a model has a graph with outputs and an opset.
    if not model.HasField("graph") or not model.graph.output or not model.opset_import:
        raise BadInputError(
            f"{path} is not an ONNX model (no graph outputs or opset); the file is damaged or of another kind"
        )
    return model


def text(value: Any) -> str:
    """Protobuf hands back bytes for string fields that are not valid UTF-8 (damaged files)."""
    return value.decode("utf-8", errors="replace") if isinstance(value, bytes) else str(value)


def _value_spec(value: Any, onnx: Any) -> TensorSpec:
    tensor_type = value.type.tensor_type
    dtype = onnx.helper.tensor_dtype_to_np_dtype(tensor_type.elem_type).name if tensor_type.elem_type else "unknown"
    shape = tuple(d.dim_value if d.HasField("dim_value") else None for d in tensor_type.shape.dim)
    return TensorSpec(text(value.name), dtype, shape)


def onnx_input_specs(path: Path) -> list[TensorSpec]:
    """The graph inputs of the file at ``path`` that are not initializers (its weights are not read)."""
    onnx = import_onnx()
    model = onnx.load(str(path), load_external_data=False)
    constants = {init.name for init in model.graph.initializer}
    return [_value_spec(value, onnx) for value in model.graph.input if value.name not in constants]


def unknown_ops(model: Any) -> list[str]:
    """Nodes whose op has no schema in the ONNX standard at the model's opset."""
    onnx = import_onnx()
    opsets = {entry.domain: entry.version for entry in model.opset_import}
    bad = set()
    for node in _all_nodes(model.graph):
        if node.domain not in STANDARD_DOMAINS:
            continue
        try:
            onnx.defs.get_schema(node.op_type, opsets.get(node.domain, opsets.get("", 1)), node.domain)
        except Exception:  # onnx raises SchemaError, which it does not export uniformly
            bad.add(text(node.op_type))
    return sorted(bad)


MATMULNBITS_8BIT_RELEASE = (1, 22)  # onnxruntime's first with 8-bit MatMulNBits kernels on x86 CPUs


def newer_ops(nodes: list[Any]) -> list[str]:
    """Ops of the file that only recent onnxruntime releases run, each with the release it needs."""
    eight_bit = any(
        node.op_type == "MatMulNBits" and any(a.name == "bits" and a.i == 8 for a in node.attribute) for node in nodes
    )
    release = ".".join(str(part) for part in MATMULNBITS_8BIT_RELEASE)
    return [f"MatMulNBits with 8-bit weights (onnxruntime {release} or later)"] if eight_bit else []


TENSORRT_LAYER_NORM_RELEASE = "8.6"  # TensorRT's first ONNX parser with LayerNormalization (JetPack 6; JetPack 5: 8.5)


def tensorrt_ops(nodes: list[Any]) -> list[str]:
    """Ops of the file that only recent TensorRT releases parse, each with the release and how to avoid it."""
    if not any(node.op_type == "LayerNormalization" and node.domain in ("", "ai.onnx") for node in nodes):
        return []
    return [f"{TENSORRT_LAYER_NORM_RELEASE} or later for LayerNormalization (re-export with --no-fuse for older)"]


def release_of(version: str) -> tuple[int, ...]:
    """ "1.23.0.dev20250101" → (1, 23, 0): the leading numbers of a version string."""
    numbers = []
    for part in version.split("."):
        digits = "".join(ch for ch in part if ch.isdigit()) if part[:1].isdigit() else ""
        if not digits:
            break
        numbers.append(int(digits))
    return tuple(numbers)


def too_new_for(model: str | bytes, installed: str) -> str | None:
    """Where the onnxruntime ``installed`` is older than an op of ``model`` (a path or the file's bytes) needs:
    one line that says so and what to do; else None. Read only for such a runtime: the newer ones run it."""
    if release_of(installed) >= MATMULNBITS_8BIT_RELEASE:
        return None
    onnx = import_onnx()
    proto = (
        onnx.load_model_from_string(model) if isinstance(model, bytes) else onnx.load(model, load_external_data=False)
    )
    needed = newer_ops(_all_nodes(proto.graph))
    if not needed:
        return None
    return (
        f"this file needs {needed[0]} and this is onnxruntime {installed}: upgrade onnxruntime, or re-export "
        "with --int8-kernel matmulinteger (standard ops)"
    )


def _all_nodes(graph: Any) -> list[Any]:
    nodes = []
    for node in graph.node:
        nodes.append(node)
        for attribute in node.attribute:
            if attribute.g.node:
                nodes.extend(_all_nodes(attribute.g))
    return nodes


def summarize_onnx_model(model: Any, path: Path, file_bytes: int) -> ModelSummary:
    onnx = import_onnx()
    from onnx import numpy_helper

    graph = model.graph
    initializer_names = {init.name for init in graph.initializer}
    inputs = [_value_spec(v, onnx) for v in graph.input if v.name not in initializer_names]
    outputs = [_value_spec(v, onnx) for v in graph.output]
    nodes = _all_nodes(graph)
    op_counts = Counter(
        text(node.op_type) if node.domain in STANDARD_DOMAINS else f"{text(node.domain)}.{text(node.op_type)}"
        for node in nodes
    )
    constants = []
    for init in graph.initializer:
        dtype = onnx.helper.tensor_dtype_to_np_dtype(init.data_type).name
        constants.append(ConstantInfo(text(init.name), dtype, tuple(init.dims), numpy_helper.to_array(init).nbytes))
    for node in nodes:
        if node.op_type == "Constant" and node.domain in STANDARD_DOMAINS:
            for attribute in node.attribute:
                if attribute.name == "value":
                    array = numpy_helper.to_array(attribute.t)
                    constants.append(ConstantInfo(text(node.output[0]), array.dtype.name, array.shape, array.nbytes))
    bad = unknown_ops(model)
    domains = sorted({text(n.domain) for n in nodes if n.domain not in STANDARD_DOMAINS})
    opsets = ", ".join(f"{e.domain or 'ai.onnx'}:{e.version}" for e in model.opset_import)
    return ModelSummary(
        path=path,
        format="onnx",
        file_bytes=file_bytes,
        signatures=[SignatureInfo(graph.name or "main", inputs, outputs)],
        op_counts=op_counts,
        constants=constants,
        custom_ops=bad,
        runs_on=onnx_verdicts(bad, domains, newer_ops(nodes), tensorrt_ops(nodes)),
        details={"opset": opsets, "producer": f"{model.producer_name} {model.producer_version}".strip()},
        metadata={text(prop.key): text(prop.value) for prop in model.metadata_props},
    )


def summarize_onnx(path: Path) -> ModelSummary:
    path = Path(path)
    model = load_onnx(path)
    try:
        return summarize_onnx_model(model, path, path.stat().st_size)
    except (ValueError, TypeError, KeyError, IndexError, AttributeError) as err:  # parsed, but inconsistent
        raise BadInputError(
            f"{path} parses as ONNX but is inconsistent ({type(err).__name__}: {one_line(err)[:80]}); re-export it"
        ) from err
