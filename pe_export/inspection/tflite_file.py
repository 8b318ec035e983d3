"""Read a .tflite flatbuffer: signatures, op inventory, Flex ops and constants (no TensorFlow)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from pe_export.errors import BadInputError
from pe_export.inspection.flatbuffer import CorruptFileError, Table, root_table
from pe_export.inspection.runtimes import MIN_RUNTIME_KEY, tflite_verdicts
from pe_export.inspection.summary import ConstantInfo, ModelSummary, SignatureInfo
from pe_export.inspection.tflite_metadata import (
    MODEL_BUFFERS,
    buffer_size,
    check_identifier,
    metadata_entries,
)
from pe_export.inspection.tflite_schema import BUILTIN_OPERATORS, TENSOR_TYPES
from pe_export.specs import TensorSpec

CUSTOM_OPCODE = 32
FLEX_PREFIX = "Flex"
_ITEMSIZE = {
    "float32": 4,
    "float16": 2,
    "int32": 4,
    "uint8": 1,
    "int64": 8,
    "bool": 1,
    "int16": 2,
    "int8": 1,
    "float64": 8,
    "uint64": 8,
    "uint32": 4,
    "uint16": 2,
    "bfloat16": 2,
}

# Field indices from the TFLite schema (schema.fbs).
MODEL_OPERATOR_CODES, MODEL_SUBGRAPHS, MODEL_SIGNATURE_DEFS = 1, 2, 7
OPCODE_DEPRECATED_BUILTIN, OPCODE_CUSTOM, OPCODE_BUILTIN = 0, 1, 3
SUBGRAPH_TENSORS, SUBGRAPH_OPERATORS = 0, 3
TENSOR_SHAPE, TENSOR_TYPE, TENSOR_BUFFER, TENSOR_NAME, TENSOR_SHAPE_SIGNATURE = 0, 1, 2, 3, 7
OPERATOR_OPCODE_INDEX, OPERATOR_INPUTS = 0, 1
SIGNATURE_INPUTS, SIGNATURE_OUTPUTS, SIGNATURE_KEY, SIGNATURE_SUBGRAPH = 0, 1, 2, 4
TENSORMAP_NAME, TENSORMAP_INDEX = 0, 1


def op_names(model: Table) -> list[str]:
    """Name of each operator code: builtin name, or the custom code (Flex ops start with 'Flex')."""
    names = []
    for code in model.tables(MODEL_OPERATOR_CODES):
        builtin = max(int(code.scalar(OPCODE_DEPRECATED_BUILTIN, "b")), int(code.scalar(OPCODE_BUILTIN, "i")))
        if builtin == CUSTOM_OPCODE:
            names.append(code.string(OPCODE_CUSTOM) or "CUSTOM")
        else:
            names.append(BUILTIN_OPERATORS.get(builtin, f"BUILTIN_{builtin}"))
    return names


def _tensor_spec(tensor: Table, name: str) -> TensorSpec:
    shape = tensor.scalars(TENSOR_SHAPE_SIGNATURE, "i") or tensor.scalars(TENSOR_SHAPE, "i")
    dtype = TENSOR_TYPES.get(int(tensor.scalar(TENSOR_TYPE, "b")), "unknown")
    return TensorSpec(name, dtype, tuple(None if d < 0 else int(d) for d in shape))


def _int16_ops(operators: list[tuple[str, list[int]]], tensors: list[Table]) -> list[str]:
    """The ops that read an int16 tensor (a full-integer file's activations), by name."""
    found = set()
    for name, inputs in operators:
        for index in inputs:
            if 0 <= index < len(tensors) and TENSOR_TYPES.get(int(tensors[index].scalar(TENSOR_TYPE, "b"))) == "int16":
                found.add(name)
    return sorted(found)


def _signature(signature: Table, all_tensors: list[list[Table]]) -> SignatureInfo:
    subgraph_index = int(signature.scalar(SIGNATURE_SUBGRAPH, "I"))
    if subgraph_index >= len(all_tensors):
        raise CorruptFileError(f"signature names subgraph {subgraph_index} of {len(all_tensors)}")
    tensors = all_tensors[subgraph_index]
    io = []
    for field in (SIGNATURE_INPUTS, SIGNATURE_OUTPUTS):
        specs = []
        for entry in signature.tables(field):
            index = int(entry.scalar(TENSORMAP_INDEX, "I"))
            if index >= len(tensors):
                raise CorruptFileError(f"signature names tensor {index} of {len(tensors)}")
            specs.append(_tensor_spec(tensors[index], entry.string(TENSORMAP_NAME)))
        io.append(specs)
    return SignatureInfo(signature.string(SIGNATURE_KEY), io[0], io[1])


# Elementwise ops LiteRT's GPU accelerator misreads with a constant [N, C] operand beside a 2-D runtime tensor.
_BROADCAST_OPS = frozenset({"ADD", "SUB", "MUL", "DIV"})


def gpu_risks(operators: list[tuple[str, list[int]]], tensors: list[Table], constant: set[int]) -> list[str]:
    """What LiteRT's GPU accelerator would do wrong or refuse in one subgraph, found from the ops and shapes (it
    lays a 2-D [N, C] tensor out as N batches and its constant operand as one row; it gathers by 1-D ids only).
    Measured under lavapipe (docs/devices.md): an ADD of a [32, 384] tensor and a constant [32, 384] added the
    constant's row 0 to every row; a GATHER by [1, 32] ids was refused ("Only support 1D indices")."""

    def shape(index: int) -> tuple[int | None, ...]:
        return _tensor_spec(tensors[index], "").shape

    risks: list[str] = []
    for name, inputs in operators:
        inputs = [i for i in inputs if 0 <= i < len(tensors)]
        if name == "GATHER" and len(inputs) >= 2 and len(shape(inputs[1])) >= 2:
            risks.append(f"GATHER by {_dims(shape(inputs[1]))} ids (the GPU takes 1-D ids: --cpu-fallback)")
        elif name in _BROADCAST_OPS and len(inputs) == 2:
            runtime = [i for i in inputs if i not in constant]
            fixed = [i for i in inputs if i in constant]
            if len(runtime) == 1 and len(fixed) == 1:
                rows, table = shape(runtime[0]), shape(fixed[0])
                if len(rows) == 2 and len(table) == 2 and (rows[0] or 0) > 1 and (table[0] or 0) > 1:
                    risks.append(
                        f"{name} of a {_dims(rows)} tensor and a constant {_dims(table)} (the GPU reads the constant's "
                        "row 0 for every row: wrong results)"
                    )
    return sorted(set(risks))


def _dims(shape: tuple[int | None, ...]) -> str:
    return "[" + ", ".join("?" if d is None else str(d) for d in shape) + "]"


def summarize_tflite_bytes(data: bytes, path: Path) -> ModelSummary:
    check_identifier(data, path)
    try:
        model = root_table(data)
        names = op_names(model)
        subgraphs = model.tables(MODEL_SUBGRAPHS)
        buffers = model.tables(MODEL_BUFFERS)
        buffer_sizes = [buffer_size(buffer) for buffer in buffers]
        metadata, metadata_buffers = metadata_entries(model, buffers)
        op_counts: Counter[str] = Counter()
        constants: list[ConstantInfo] = []
        all_tensors: list[list[Table]] = []
        risks: list[str] = []
        int16_ops: list[str] = []
        for number, subgraph in enumerate(subgraphs):
            tensors = subgraph.tables(SUBGRAPH_TENSORS)
            all_tensors.append(tensors)
            operators = []
            for operator in subgraph.tables(SUBGRAPH_OPERATORS):
                index = int(operator.scalar(OPERATOR_OPCODE_INDEX, "I"))
                name = names[index] if index < len(names) else f"OPCODE_{index}"
                op_counts[name] += 1
                operators.append((name, list(operator.scalars(OPERATOR_INPUTS, "i"))))
            constant = set()
            for position, tensor in enumerate(tensors):
                buffer = int(tensor.scalar(TENSOR_BUFFER, "I"))
                if 0 < buffer < len(buffer_sizes) and buffer_sizes[buffer] > 0 and buffer not in metadata_buffers:
                    constant.add(position)
                    spec = _tensor_spec(tensor, tensor.string(TENSOR_NAME))
                    constants.append(
                        ConstantInfo(spec.name, spec.dtype, tuple(d or 0 for d in spec.shape), buffer_sizes[buffer])
                    )
            if number == 0:  # the subgraph a signature runs
                risks = gpu_risks(operators, tensors, constant)
                int16_ops = _int16_ops(operators, tensors)
        signatures = [_signature(signature, all_tensors) for signature in model.tables(MODEL_SIGNATURE_DEFS)]
    except CorruptFileError as err:
        raise BadInputError(f"{path} is a truncated or corrupt TFLite file ({err}); re-export or re-copy it") from err
    flex = sorted(name for name in op_counts if name.startswith(FLEX_PREFIX))
    custom = sorted(
        name for name in op_counts if name not in flex and (name == "CUSTOM" or name not in BUILTIN_OPERATORS.values())
    )
    dynamic_inputs = [s.describe() for s in signatures[0].inputs if None in s.shape] if signatures else []
    return ModelSummary(
        path=path,
        format="tflite",
        file_bytes=len(data),
        signatures=signatures,
        op_counts=op_counts,
        constants=constants,
        flex_ops=flex,
        custom_ops=custom,
        runs_on=tflite_verdicts(flex, custom, metadata.get(MIN_RUNTIME_KEY), dynamic_inputs, risks, int16_ops),
        details={"subgraphs": str(len(subgraphs))},
        metadata=metadata,
    )


def summarize_tflite(path: Path) -> ModelSummary:
    return summarize_tflite_bytes(Path(path).read_bytes(), Path(path))
