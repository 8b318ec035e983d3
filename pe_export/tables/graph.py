"""GraphDef plumbing for table rewriting: folding, splicing a rebuild in for a Const, and back
to a concrete function for the TFLite converter (TensorFlow side)."""

from __future__ import annotations

from collections.abc import Set as AbstractSet
from typing import Any

import numpy as np

from pe_export.graphdef import GraphIndex, const_value, node_name
from pe_export.native import import_tensorflow
from pe_export.tables.detect import position_axis
from pe_export.tables.methods import Compressed
from pe_export.tables.sinusoid import fit_sinusoid

TABLES_SCOPE = "pe_export_tables"
RUN_TIME_ZERO = f"{TABLES_SCOPE}/run_time_zero"  # the node computing the tables' run-time zero
RELATIVE_SCOPE = "pe_export_relative"  # a second scope: both may sit in one graph


def fold_constants(graph_def: Any, inputs: list[str], outputs: list[str]) -> Any:
    """Grappler's constant folding: tables computed in-graph at a fixed length become Consts."""
    tf = import_tensorflow()
    from tensorflow.core.protobuf import config_pb2, meta_graph_pb2
    from tensorflow.python.grappler import tf_optimizer

    config = config_pb2.ConfigProto()
    config.graph_options.infer_shapes = True  # lets tf.shape(x)[1] fold at a fixed sequence length
    config.graph_options.rewrite_options.optimizers[:] = ["constfold", "function", "dependency"]
    config.graph_options.rewrite_options.experimental_disable_folding_quantization_emulation = True
    with tf.Graph().as_default():  # meta graphs exist only in graph mode
        meta_graph = tf.compat.v1.train.export_meta_graph(graph_def=graph_def)
    fetch = meta_graph_pb2.CollectionDef()
    fetch.node_list.value.extend(inputs + outputs)
    meta_graph.collection_def["train_op"].CopyFrom(fetch)
    return tf_optimizer.OptimizeGraph(config, meta_graph)


def materialize_static_dims(graph_def: Any) -> Any:
    """Replace tf.shape(x)[i] by a constant wherever dimension i of x is static.

    Grappler folds Shape only when the whole shape is known; with a dynamic batch, a
    table computed from range(tf.shape(x)[1]) would otherwise never become a constant.
    """
    tf = import_tensorflow()
    from tensorflow.python.framework import tensor_util

    with tf.Graph().as_default() as graph:
        tf.compat.v1.import_graph_def(graph_def, name="")
    nodes = {node.name: node for node in graph_def.node}
    replaced: dict[str, Any] = {}
    for node in graph_def.node:
        if node.op != "StridedSlice":
            continue
        shape_node = nodes.get(node_name(node.input[0]))
        if shape_node is None or shape_node.op != "Shape":
            continue
        attrs = node.attr
        if attrs["shrink_axis_mask"].i != 1 or attrs["ellipsis_mask"].i or attrs["new_axis_mask"].i:
            continue
        begin = nodes.get(node_name(node.input[1]))
        if begin is None or begin.op != "Const":
            continue
        index = int(tensor_util.MakeNdarray(begin.attr["value"].tensor).reshape(-1)[0])
        dims = graph.get_tensor_by_name(
            shape_node.input[0] if ":" in shape_node.input[0] else shape_node.input[0] + ":0"
        )
        static = dims.shape.as_list() if dims.shape.rank is not None else None
        if static is None or not -len(static) <= index < len(static) or static[index] is None:
            continue
        dtype = shape_node.attr["out_type"].type
        replacement = type(node)()
        replacement.name, replacement.op = node.name, "Const"
        replacement.attr["dtype"].type = dtype
        replacement.attr["value"].tensor.CopyFrom(
            tensor_util.make_tensor_proto(static[index], dtype=tf.as_dtype(dtype), shape=[])
        )
        replaced[node.name] = replacement
    if not replaced:
        return graph_def
    result = type(graph_def)()
    result.CopyFrom(graph_def)
    del result.node[:]
    result.node.extend(replaced.get(node.name, node) for node in graph_def.node)
    return result


def prefix_slices_only(graph_def: Any, const_name: str) -> bool:
    """True when every reader of the Const slices rows from 0 to an end known only at run time."""

    nodes = {node.name: node for node in graph_def.node}
    readers = [
        node for node in graph_def.node if any(not i.startswith("^") and node_name(i) == const_name for i in node.input)
    ]
    if not readers:
        return False
    for reader in readers:
        if reader.op != "StridedSlice" or node_name(reader.input[0]) != const_name:
            return False
        begin, end = nodes.get(node_name(reader.input[1])), nodes.get(node_name(reader.input[2]))
        if begin is None or begin.op != "Const" or np.any(const_value(begin) != 0):
            return False
        if end is None or end.op == "Const":
            return False
    return True


def _through_identity(nodes: dict[str, Any], name: str) -> Any:
    """The node behind an input name, skipping Identity nodes."""
    node = nodes.get(node_name(name))
    while node is not None and node.op == "Identity":
        node = nodes.get(node_name(node.input[0]))
    return node


def relative_gathers(graph_def: Any) -> list[str]:
    """Gathers of a constant [R, c] table by a distance index (Shaw's [2K+1, d] table, T5's bucket biases).

    At a fixed length constant folding turns such a gather into a [T, T, c] constant (or, transposed, a
    heads×T×T bias), far larger than the table and its T×T index together.
    """
    from pe_export.tables.uses import GATHER_OPS, index_origin

    graph = GraphIndex(graph_def)
    found = []
    for node in graph_def.node:
        if node.op not in GATHER_OPS or len(node.input) < 2:
            continue
        params = _through_identity(graph.nodes, node.input[0])
        if params is None or params.op != "Const":
            continue
        dims = [d.size for d in params.attr["value"].tensor.tensor_shape.dim]
        if len(dims) == 2 and dims[0] >= 3 and index_origin(graph, node.input[1])[0] == "distance":
            found.append(node.name)
    return found


def hybrid_sums(graph_def: Any) -> dict[str, np.ndarray]:
    """Add nodes that sum a sinusoid Const and a (scaled) learned Const of the same shape → their sum."""

    nodes = {node.name: node for node in graph_def.node}

    def const_of(name: str) -> Any:
        return _through_identity(nodes, name)

    found: dict[str, np.ndarray] = {}
    for node in graph_def.node:
        if node.op not in ("Add", "AddV2") or len(node.input) != 2:
            continue
        parts = [const_of(name) for name in node.input]
        if any(p is None for p in parts):
            continue
        values = []
        for part in parts:
            if part.op == "Const":
                values.append(const_value(part))
            elif part.op == "Mul" and all(const_of(i) is not None and const_of(i).op == "Const" for i in part.input):
                values.append(np.multiply(*[const_value(const_of(i)) for i in part.input]))
            else:
                values = []
                break
        if len(values) == 2 and values[0].shape == values[1].shape and values[0].ndim >= 2:
            if any(fit_sinusoid(v.reshape(-1, v.shape[-1])) is not None for v in values):
                found[node.name] = (values[0] + values[1]).astype(np.float32)
    return found


def splice_rebuild(
    graph_def: Any,
    replacements: dict[str, tuple[Compressed, tuple[int, ...], int, str]],
    anchor: tuple[str, str, tuple[int | None, ...]],
    file_format: str,
    prefix_only: AbstractSet[str] = frozenset(),
) -> Any:
    """Replace each named Const with ops that rebuild it from stored arrays at run time.

    ``replacements``: node → (compressed form, original shape, rows to rebuild, storage dtype).
    ``anchor``: (input name, dtype) of a graph input. The rebuild starts from positions
    range(L) + zero, where zero = int(max|anchor| < 0) is always 0 but only known at run time:
    that is what stops the converters from folding the rebuild back into the full table.
    ``file_format`` ("tflite" or "onnx") picks how half-precision arrays are read: TFLite's GATHER
    takes no float16, so there they travel as int16 bit patterns and are bitcast.
    Tables in ``prefix_only`` are read only through slices from row 0 up to a run-time end (the
    sequence length): for those only min(L, T) rows are rebuilt, T being the seed's axis 1.
    """
    tf = import_tensorflow()
    anchor_name = anchor[0]
    with tf.Graph().as_default() as scratch:
        placeholder, zero = _run_time_zero(tf, anchor, TABLES_SCOPE)
        with tf.name_scope(TABLES_SCOPE):
            sequence_length = tf.shape(placeholder)[1]
        for index, (node_name, (compressed, shape, rows, storage)) in enumerate(replacements.items()):
            with tf.name_scope(f"{TABLES_SCOPE}/table_{index}"):
                store = Store(tf, compressed.arrays, storage, file_format, zero)
                if node_name in prefix_only:
                    positions = tf.range(tf.minimum(rows, sequence_length), dtype=tf.int32) + zero
                    axis = position_axis(shape)
                    shape = (*shape[:axis], -1, *shape[axis + 1 :])
                else:
                    positions = tf.range(rows, dtype=tf.int32) + zero
                rebuilt = compressed.emit(tf, positions, store)
            tf.reshape(rebuilt, shape, name=node_name)
    added = [node for node in scratch.as_graph_def().node if node.name != anchor_name]
    result = type(graph_def)()
    result.CopyFrom(graph_def)
    del result.node[:]
    result.node.extend(node for node in graph_def.node if node.name not in replacements)
    result.node.extend(added)
    return result


def _run_time_zero(tf: Any, anchor: tuple[str, str, tuple[int | None, ...]], scope: str) -> tuple[Any, Any]:
    """(placeholder standing for graph input ``anchor``, int32 zero = int(max|anchor| < 0)), in the current graph.

    Always 0, but known only at run time: no converter can fold what depends on it.
    """
    name, dtype, shape = anchor
    placeholder = tf.compat.v1.placeholder(tf.as_dtype(dtype), shape=shape, name=name)
    with tf.name_scope(scope):
        magnitude = tf.abs(tf.reshape(tf.cast(placeholder, tf.float32), [-1]))
        zero = tf.cast(tf.reduce_max(magnitude, axis=0) < 0.0, tf.int32, name=RUN_TIME_ZERO.rsplit("/", 1)[1])
    return placeholder, zero


def gathers_at_run_time(graph_def: Any, gathers: list[str], anchor: tuple[str, str, tuple[int | None, ...]]) -> Any:
    """Each named gather reads its indices through ``+ zero`` (a run-time zero), so that constant folding,
    grappler's and the converters', cannot turn a relative table gathered by a T×T distance index into a
    T×T×d (or heads×T×T) constant: the small table and the index are what the file stores."""
    if not gathers:
        return graph_def
    tf = import_tensorflow()
    from tensorflow.python.framework import dtypes

    nodes = {node.name: node for node in graph_def.node}
    with tf.Graph().as_default() as scratch:
        _, zero = _run_time_zero(tf, anchor, RELATIVE_SCOPE)
        shifted = {}
        for index, name in enumerate(gathers):
            indices = nodes[name].input[1]
            dtype = dtypes.as_dtype(nodes[name].attr["Tindices"].type)
            with tf.name_scope(f"{RELATIVE_SCOPE}/gather_{index}"):
                source = tf.compat.v1.placeholder(dtype, name="indices")
                shifted[name] = (tf.add(source, tf.cast(zero, dtype), name="at_run_time"), indices, source)
    # The scratch placeholders stand for each gather's own indices: wire the Adds to those instead.
    rename = {source.op.name: original for _, original, source in shifted.values()}
    added = [node for node in scratch.as_graph_def().node if node.name != anchor[0] and node.name not in rename]
    for node in added:
        node.input[:] = [rename.get(i.split(":")[0], i) for i in node.input]  # "^name" control inputs stay
    result = type(graph_def)()
    result.CopyFrom(graph_def)
    for node in result.node:
        if node.name in shifted:
            node.input[1] = shifted[node.name][0].op.name
    result.node.extend(added)
    return result


class Store:
    """The stored arrays as graph constants, read the way each storage dtype and file_format allows.

    Float arrays are read only through a gather with run-time indices, then cast to float32:
    a cast of a constant would be folded back to a float32 constant by the converters. For
    float16 in TFLite, whose GATHER takes no float16, the bits travel as int16 and are bitcast.
    """

    def __init__(self, tf: Any, arrays: dict[str, np.ndarray], storage: str, file_format: str, zero: Any) -> None:
        self.tf, self.storage, self.file_format, self.zero = tf, storage, file_format, zero
        self.constants = {}
        for key, array in arrays.items():
            if not np.issubdtype(array.dtype, np.floating):
                self.constants[key] = tf.constant(array, name=key)
            elif storage == "float32":
                self.constants[key] = tf.constant(array.astype(np.float32), name=key)
            else:
                half = array.astype(np.float16)
                self.constants[key] = tf.constant(half.view(np.int16) if file_format == "tflite" else half, name=key)
        self.lengths = {key: array.shape[0] for key, array in arrays.items() if array.ndim}

    def index(self, key: str) -> Any:
        return self.constants[key]

    def take(self, key: str, indices: Any) -> Any:
        rows = self.tf.gather(self.constants[key], indices)
        if self.storage == "float32":
            return rows
        if self.file_format == "tflite":
            rows = self.tf.bitcast(rows, self.tf.float16)
        return self.tf.cast(rows, self.tf.float32)

    def whole(self, key: str) -> Any:
        return self.take(key, self.tf.range(self.lengths[key]) + self.zero)
