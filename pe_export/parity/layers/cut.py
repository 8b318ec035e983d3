"""A file cut at a layer: the same model with one intermediate tensor as its only output.

Runtimes that keep no intermediate (LiteRT's GPU accelerator, TensorRT) compute a tensor they hand back exactly as
they compute it inside the graph; making the layer's tensor the file's output is the one way to read it there.
TFLite (numpy-free): the cut is made in place on a copy of the bytes: the subgraph's output vector and the
signature's output list shrink to one entry (their length prefixes), and that entry names the layer's tensor;
every op stays in the file. ONNX (the onnx package): the graph's one output is the layer's value and the nodes it
does not depend on are left out (an ONNX graph may not list a value twice, and TensorRT drops dead layers anyway).
"""

from __future__ import annotations

import itertools
import os
import shutil
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pe_export.errors import BadInputError, missing_extra, one_line
from pe_export.inspection.flatbuffer import CorruptFileError, Table, root_table
from pe_export.inspection.tflite_file import (
    MODEL_SIGNATURE_DEFS,
    MODEL_SUBGRAPHS,
    SIGNATURE_OUTPUTS,
    SIGNATURE_SUBGRAPH,
    SUBGRAPH_TENSORS,
    TENSOR_NAME,
    TENSORMAP_INDEX,
)

SUBGRAPH_OUTPUTS = 2  # SubGraph.outputs in schema.fbs


def cut_file(model: Path, folder: Path) -> Callable[[str], Path]:
    """A maker of ``model`` cut at a tensor, each cut a new file in ``folder``."""
    made = itertools.count()
    if model.suffix.lower() == ".onnx":
        return lambda tensor: cut_onnx_at(model, tensor, folder / f"cut-{next(made)}.onnx")
    data = model.read_bytes()

    def tflite_cut(tensor: str) -> Path:
        path = folder / f"cut-{next(made)}.tflite"
        path.write_bytes(cut_at(data, tensor))
        return path

    return tflite_cut


def tensor_indices(data: bytes) -> dict[str, int]:
    """The first signature's subgraph: tensor name → index (a repeated name: its first tensor)."""
    subgraph = _subgraph(root_table(data))
    indices: dict[str, int] = {}
    for index, tensor in enumerate(subgraph.tables(SUBGRAPH_TENSORS)):
        indices.setdefault(tensor.string(TENSOR_NAME), index)
    return indices


def cut_at(data: bytes, tensor: str) -> bytes:
    """``data`` (a .tflite file) whose only output is the tensor named ``tensor``."""
    try:
        model = root_table(data)
        index = tensor_indices(data).get(tensor)
        if index is None:
            raise BadInputError(f"the file has no tensor {tensor!r} to cut at; its layer map does not fit it")
        result = bytearray(data)
        start, length = _subgraph(model).vector_length(SUBGRAPH_OUTPUTS)
        if length < 1:
            raise CorruptFileError("the subgraph has no output")
        struct.pack_into("<II", result, start - 4, 1, index)
        signature = model.tables(MODEL_SIGNATURE_DEFS)[0]
        outputs = signature.tables(SIGNATURE_OUTPUTS)
        first = outputs[0].field_position(TENSORMAP_INDEX)
        if first is None:  # tensor 0 was the output: the index is the schema default and not stored
            raise BadInputError("the file's first signature output is tensor 0, which cannot be re-pointed in place")
        struct.pack_into("<I", result, first, index)
        vector_start, _ = signature.vector_length(SIGNATURE_OUTPUTS)
        struct.pack_into("<I", result, vector_start - 4, 1)
        return bytes(result)
    except (CorruptFileError, IndexError) as err:
        raise BadInputError(f"the file cannot be cut at {tensor!r}: {err}") from None


def _subgraph(model: Table) -> Table:
    signatures = model.tables(MODEL_SIGNATURE_DEFS)
    if not signatures:
        raise CorruptFileError("no signature")
    return model.tables(MODEL_SUBGRAPHS)[int(signatures[0].scalar(SIGNATURE_SUBGRAPH, "I"))]


def cut_onnx_at(model: Path, tensor: str, path: Path) -> Path:
    """``model`` (an .onnx file) with the value ``tensor`` its only output and the nodes it does not depend on
    left out, written at ``path``; external data is reached through hard links beside it (copies across file
    systems: the model's own folder may be read-only on a device). Needs the onnx package (the device extra)."""
    try:
        import onnx
    except ImportError as err:
        raise missing_extra("onnx", "device") from err
    try:
        proto = onnx.load(str(model), load_external_data=False)
    except Exception as err:  # onnx raises DecodeError and others
        raise BadInputError(f"the file cannot be cut at {tensor!r}: {one_line(err)}") from None
    graph = proto.graph
    producers = {name: node for node in graph.node for name in node.output if name}
    if tensor not in producers:
        raise BadInputError(f"the file has no tensor {tensor!r} to cut at; its layer map does not fit it")
    needed, kept, pending = set(), set(), [tensor]
    while pending:  # the nodes the value depends on, through the outer names their subgraphs read
        name = pending.pop()
        if name in needed:
            continue
        needed.add(name)
        node = producers.get(name)
        if node is not None and id(node) not in kept:
            kept.add(id(node))
            pending.extend(_read_names(node))
    nodes = [node for node in graph.node if id(node) in kept]
    typed = {info.name: info for info in list(graph.value_info) + list(graph.output)}
    output = onnx.ValueInfoProto()
    output.CopyFrom(typed.get(tensor, onnx.ValueInfoProto(name=tensor)))  # untyped: onnxruntime infers it
    initializers = [init for init in graph.initializer if init.name in needed]
    del graph.node[:], graph.output[:], graph.initializer[:]
    graph.node.extend(nodes)
    graph.output.append(output)
    graph.initializer.extend(initializers)
    for location in _external_locations(initializers):
        _reach(model.parent / location, path.parent / location)
    path.write_bytes(proto.SerializeToString())
    return path


def _reach(source: Path, target: Path) -> None:
    """The external data file ``source`` at ``target``: a hard link, or a copy across file systems (onnxruntime
    refuses a symbolic link that leads out of the model's folder)."""
    if target.exists() or not source.exists():
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(source, target)
    except OSError:
        shutil.copyfile(source, target)


def _read_names(node: Any) -> list[str]:
    """Every value ``node`` reads: its inputs and, for If/Loop/Scan, what its subgraphs read from outside."""
    names = [name for name in node.input if name]
    for attribute in node.attribute:
        for graph in [attribute.g, *attribute.graphs] if attribute.type in (5, 10) else []:  # GRAPH, GRAPHS
            inner = {name for inner_node in graph.node for name in inner_node.output}
            inner |= {i.name for i in graph.input} | {i.name for i in graph.initializer}
            names += [name for inner_node in graph.node for name in _read_names(inner_node) if name not in inner]
    return names


def _external_locations(initializers: list[Any]) -> set[str]:
    return {
        entry.value
        for init in initializers
        if init.data_location == 1  # TensorProto.EXTERNAL
        for entry in init.external_data
        if entry.key == "location"
    }
