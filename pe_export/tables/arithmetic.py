"""Position arithmetic made builtins: what a graph computes from the sequence length alone, frozen (TensorFlow side).

Hugging Face's TF encoders compute relative-position buckets at run time: MPNet and DeBERTa take the log of
distances in float64 (TFLite has no float64 kernel: FlexLog, FlexRealDiv, FlexMul), and DeBERTa picks the distance
matrix through ``tf.cond`` on shapes (v1 control flow after freezing, which tf2onnx mis-converts). None of it
depends on the inputs' values: it is *position arithmetic*, computed from shapes and constants only. Two rewrites
make it what the position tables already are, frozen constants:

- a condition computed from shapes alone that holds the same at every length (DeBERTa's ``q_len != k_len`` in an
  encoder) is folded: the branch taken is wired through, the other dropped;
- an integer index computed in floating point from positions (a ``Cast`` from float to int: the bucket of a
  distance) whose value at query i and key j is f(j - i) becomes a table of f indexed by distance, read with
  int32 builtins (range, subtract, clip, gather). Exact by construction: f is TensorFlow's own value, and a bucket
  computed in float at run time can land differently at a boundary in another runtime.

The table spans the distances the model takes (its position table's limit, pe_export/lengths.py); a model without
one (relative positions only) is frozen where its buckets saturate (constant over the farther half of the
distances measured), and read with the distance clipped there.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from pe_export.graphdef import node_name
from pe_export.native import import_tensorflow

ARITHMETIC_SCOPE = "pe_export_position_arithmetic"
# Length the arithmetic is evaluated at where no position table bounds the model (its values must saturate there).
UNBOUNDED_LENGTH = 2048
# A second, short length: the value there must be the top-left block of the long one (a function of i and j only).
SHORT_LENGTH = 7
_SHAPE_OPS = {"Shape", "Size", "Rank", "ShapeN"}
_FLOAT_TYPES = {1, 2, 19, 14}  # DT_FLOAT, DT_DOUBLE, DT_HALF, DT_BFLOAT16
_INT_TYPES = {3, 9}  # DT_INT32, DT_INT64


@dataclass(frozen=True)
class DistanceTable:
    """f(d) for d in [-before, after]: what ``tensor`` held at query i, key j for d = j - i."""

    tensor: str
    values: np.ndarray
    before: int
    after: int
    rank: int
    axes: tuple[int, int]  # the query and key axes of the replaced tensor (the others have size 1)
    saturated: bool  # clipped where the values stop changing (no position table bounds the model)
    shape_type: int | None = None  # not a table: the Shape of such a tensor, of this dtype enum (values unused)

    def describe(self) -> str:
        clip = "clipped where it saturates" if self.saturated else "the distances the model takes"
        return f"{self.values.size} distances, {clip}"


@dataclass
class ArithmeticRewrite:
    graph_def: Any
    folded_conditions: int
    tables: list[DistanceTable]

    @property
    def changed(self) -> bool:
        return bool(self.folded_conditions or self.tables)


def data_free(graph_def: Any, inputs: set[str]) -> set[str]:
    """Nodes whose values depend on the inputs' shapes only (constants, weights, shapes and what they compute)."""
    nodes = {node.name: node for node in graph_def.node}
    free: dict[str, bool] = {}
    order = _topological(graph_def)
    for node in order:
        if node.op == "Placeholder":
            free[node.name] = node.name not in inputs  # a weight stand-in holds a constant
        elif node.op in _SHAPE_OPS or node.op == "Const":
            free[node.name] = True
        else:
            data = [node_name(i) for i in node.input if not i.startswith("^")]
            free[node.name] = bool(data) and all(free.get(i, False) for i in data if i in nodes)
    return {name for name, value in free.items() if value}


def has_position_arithmetic(graph_def: Any, inputs: dict[str, str]) -> bool:
    """Whether the graph decides a condition or computes an integer index in floating point from shapes alone."""
    free = data_free(graph_def, {node_name(tensor) for tensor in inputs})
    return (
        any(node.name in free and node.op == "Switch" for node in graph_def.node)
        or bool(_float_to_int_casts(graph_def, free))
        or bool(assert_guards(graph_def))
    )


# What the branches of a lowered assertion hold: the failing side the Assert and what it prints, the passing side
# nothing but the data passed through.
_GUARD_PASSING_OPS = {"Identity", "NoOp", "Const"}
_GUARD_FAILING_OPS = _GUARD_PASSING_OPS | {"Assert"}


def assert_guards(graph_def: Any) -> dict[str, bool]:
    """The Switches of lowered assertions (``tf.debugging.assert_*``), each decided for its passing branch.

    Both converters drop Assert ops, but a lowered assertion's Switch and Merge stay behind and the TFLite
    converter refuses nested ones (Longformer: "Merge of two inputs that differ on more than one predicate").
    Found by what the branches hold, not by name: an Assert, and nothing else but Identity, NoOp and Const on the
    false side; only those on the true side.
    """
    switches: dict[str, list[str]] = {}
    for node in graph_def.node:
        if node.op == "Switch":
            switches.setdefault(_port_name(node.input[1]), []).append(node.name)
    readers: dict[str, list[Any]] = {}
    for node in graph_def.node:
        for tensor in node.input:
            readers.setdefault(tensor[1:] if tensor.startswith("^") else _port_name(tensor), []).append(node)
    decided: dict[str, bool] = {}
    for names in switches.values():
        sides = [_branch_ops(names, port, readers) for port in (0, 1)]
        if "Assert" in sides[0] and sides[0] <= _GUARD_FAILING_OPS and sides[1] <= _GUARD_PASSING_OPS:
            decided.update({name: True for name in names})
    return decided


def _branch_ops(switches: list[str], port: int, readers: dict[str, list[Any]]) -> set[str]:
    """The ops of the nodes one output port of ``switches`` reaches before a Merge."""
    frontier = [f"{name}:{port}" for name in switches]
    seen: set[str] = set()
    ops: set[str] = set()
    while frontier:
        tensor = frontier.pop()
        for node in readers.get(tensor, []):
            if node.op == "Merge" or node.name in seen:
                continue
            seen.add(node.name)
            ops.add(node.op)
            # a node's every output and its control edge
            frontier.extend([f"{node.name}:{i}" for i in range(_outputs(node))] + [node.name])
    return ops


def _outputs(node: Any) -> int:
    return 2 if node.op == "Switch" else 1


# Length at which tables computed at run time (rotary caches from an inv_freq weight) are measured for listing.
LISTING_LENGTH = 64


def computed_tables(
    graph_def: Any, inputs: dict[str, str], weights: Any, limit: int | None
) -> list[tuple[str, np.ndarray]]:
    """(tensor, value at the listing length) of each float tensor the graph computes from positions alone and hands
    to the rest: a table computed at run time (ESM's rotary cos/sin from its inv_freq). Listed, not rewritten:
    they are builtins, and no length bounds them."""
    input_nodes = {node_name(tensor) for tensor in inputs}
    free = data_free(graph_def, input_nodes)
    readers = _readers(graph_def)
    candidates = [
        f"{node.name}:0"
        for node in graph_def.node
        if node.name in free
        and node.op not in ("Const", "Placeholder", "Identity", "Shape")
        and "T" in node.attr  # (reading a missing key of a protobuf map would add it)
        and node.attr["T"].type in _FLOAT_TYPES
        and any(reader.name not in free for reader in readers.get(f"{node.name}:0", []))
    ]
    nodes = {node.name: node for node in graph_def.node}
    candidates = [tensor for tensor in candidates if not _reads_a_table(node_name(tensor), nodes, free)]
    if not candidates:
        return []
    evaluator = _Evaluator(graph_def, input_nodes, weights)
    long = min(limit or LISTING_LENGTH, LISTING_LENGTH)
    short = max(3, long // 2)
    at_long, at_short = evaluator.run(candidates, long), evaluator.run(candidates, short)
    if at_long is None or at_short is None:
        return []
    found = []
    for tensor, value, small in zip(candidates, at_long, at_short, strict=True):
        grows = [axis for axis, size in enumerate(value.shape) if size == long and small.shape[axis] == short]
        if value.ndim >= 2 and len(grows) == 1 and grows[0] != value.ndim - 1:
            found.append((tensor, value))
    return found


def _reads_a_table(name: str, nodes: dict[str, Any], free: set[str]) -> bool:
    """Whether position arithmetic ``name`` reads a stored table (a float constant or weight of 2 or more
    dimensions): then it is that table, sliced, and the table is what is listed."""
    frontier, seen = [name], set()
    while frontier:
        current = frontier.pop()
        if current in seen or current not in free or current not in nodes:
            continue
        seen.add(current)
        node = nodes[current]
        if node.op in ("Const", "Placeholder"):
            key = "value" if node.op == "Const" else "shape"
            if key not in node.attr or "dtype" not in node.attr:
                continue
            shape = node.attr[key].tensor.tensor_shape if node.op == "Const" else node.attr[key].shape
            if node.attr["dtype"].type in _FLOAT_TYPES and sum(dim.size != 1 for dim in shape.dim) >= 2:
                return True
            continue
        frontier.extend(node_name(tensor) for tensor in node.input if not tensor.startswith("^"))
    return False


def rewrite_position_arithmetic(
    graph_def: Any, inputs: dict[str, str], outputs: list[str], weights: Any, limit: int | None
) -> ArithmeticRewrite:
    """``inputs``: graph tensor → user name; ``outputs``: output node names; ``weights``: the stand-ins' store;
    ``limit``: the longest sequence the model takes (None: unbounded)."""
    input_nodes = {node_name(tensor) for tensor in inputs}
    evaluator = _Evaluator(graph_def, input_nodes, weights)
    guards = assert_guards(graph_def)
    folded = len(guards)
    if guards:
        graph_def = _fold_switches(graph_def, guards, outputs)
        evaluator = _Evaluator(graph_def, input_nodes, weights)
    while True:
        free = data_free(graph_def, input_nodes)
        decided = _static_conditions(graph_def, free, evaluator, limit)
        if not decided:
            break
        graph_def = _fold_switches(graph_def, decided, outputs)
        evaluator = _Evaluator(graph_def, input_nodes, weights)
        folded += len(decided)
    free = data_free(graph_def, input_nodes)
    readers = _readers(graph_def)
    tables: dict[str, DistanceTable] = {}
    for cast in _float_to_int_casts(graph_def, free):
        for table in _distance_tables(evaluator, cast, limit, free, readers) or []:
            tables[table.tensor] = table
    if tables:
        anchor = next(iter(sorted(input_nodes)))
        graph_def = _splice_tables(graph_def, list(tables.values()), anchor, evaluator.dtypes[anchor], outputs)
    return ArithmeticRewrite(graph_def, folded, list(tables.values()))


def _readers(graph_def: Any) -> dict[str, list[Any]]:
    """Tensor ("node:port") → the nodes that read it."""
    readers: dict[str, list[Any]] = {}
    for node in graph_def.node:
        for tensor in node.input:
            if not tensor.startswith("^"):
                readers.setdefault(_port_name(tensor), []).append(node)
    return readers


def _distance_tables(
    evaluator: _Evaluator, tensor: str, limit: int | None, free: set[str], readers: dict[str, list[Any]], depth: int = 0
) -> list[DistanceTable] | None:
    """Tables that replace ``tensor``, or where it does not saturate (no limit), what its readers compute from it
    (DeBERTa's distances clipped to its attention span), as long as they are position arithmetic too."""
    table = _distance_table(evaluator, tensor, limit)
    if table is not None:
        return [table]
    reading = readers.get(tensor, [])
    if limit is not None or depth >= 12 or not reading or any(node.name not in free for node in reading):
        return None
    found: list[DistanceTable] = []
    for node in reading:
        if node.op == "Shape":  # its shape, [1 … T … T], is made from the length beside the tables
            shaped = _shape_of(evaluator, tensor, limit or UNBOUNDED_LENGTH)
            if shaped is None:
                return None
            found.append(replace(shaped, tensor=f"{node.name}:0", shape_type=node.attr["out_type"].type))
            continue
        tables = _distance_tables(evaluator, f"{node.name}:0", limit, free, readers, depth + 1)
        if tables is None:
            return None
        found.extend(tables)
    return found


class _Evaluator:
    """Runs tensors of the graph at generated inputs of a given length (their values never matter here)."""

    def __init__(self, graph_def: Any, inputs: set[str], weights: Any) -> None:
        from pe_export.graphdef import without_custom_gradients

        tf = import_tensorflow()
        with tf.Graph().as_default() as graph:
            tf.compat.v1.import_graph_def(without_custom_gradients(graph_def), name="")
        self.graph = graph
        self.inputs = {name: graph.get_tensor_by_name(f"{name}:0") for name in inputs}
        self.dtypes = {name: tensor.dtype.as_numpy_dtype for name, tensor in self.inputs.items()}
        present = {op.name for op in graph.get_operations()}
        self.weights = {
            graph.get_tensor_by_name(f"{name}:0"): variable
            for name, variable in weights.variables.items()
            if name in present
        }

    def run(self, tensors: list[str], length: int, batch: int = 1) -> list[np.ndarray] | None:
        tf = import_tensorflow()
        feeds: dict[Any, Any] = {}
        for name, tensor in self.inputs.items():
            shape = [batch, length, *[d or 1 for d in tensor.shape.as_list()[2:]]] if tensor.shape.rank else []
            feeds[tensor] = np.ones(shape, self.dtypes[name])
        feeds.update({tensor: variable.numpy() for tensor, variable in self.weights.items()})
        try:
            with tf.compat.v1.Session(graph=self.graph) as session:
                return list(session.run([self.graph.get_tensor_by_name(t) for t in tensors], feed_dict=feeds))
        except (tf.errors.InvalidArgumentError, ValueError):  # a branch not taken, a length the model refuses
            return None


def _shapes(limit: int | None) -> tuple[tuple[int, int], ...]:
    """(length, batch) pairs a condition must hold the same at: short and long, one row and two."""
    long = limit or UNBOUNDED_LENGTH
    short = min(SHORT_LENGTH, long)
    return tuple(sorted({(short, 1), (short, 2), (long, 1)}))


def _static_conditions(graph_def: Any, free: set[str], evaluator: _Evaluator, limit: int | None) -> dict[str, bool]:
    """Switches whose predicate is position arithmetic of the same value at every length tried (and batch)."""
    predicates = {
        node.name: node.input[1] for node in graph_def.node if node.op == "Switch" and node_name(node.input[1]) in free
    }
    if not predicates:
        return {}
    tensors = sorted(set(predicates.values()))
    names = [t if ":" in t else f"{t}:0" for t in tensors]
    seen: dict[str, set[bool | None]] = {t: set() for t in tensors}
    for length, batch in _shapes(limit):
        together = evaluator.run(names, length, batch)
        # some inside a branch not taken: each alone, those left undecided
        alone = together if together is not None else [_one(evaluator, name, length, batch) for name in names]
        for tensor, value in zip(tensors, alone, strict=True):
            seen[tensor].add(None if value is None else bool(np.asarray(value).item()))
    return {
        switch: bool(next(iter(seen[p])))
        for switch, p in predicates.items()
        if len(seen[p]) == 1 and None not in seen[p]
    }


def _one(evaluator: _Evaluator, tensor: str, length: int, batch: int) -> np.ndarray | None:
    values = evaluator.run([tensor], length, batch)
    return None if values is None else values[0]


def _fold_switches(graph_def: Any, decided: dict[str, bool], outputs: list[str]) -> Any:
    """Each decided Switch's taken output wired to its data input; the untaken branch removed, with the Merges
    left holding one live input replaced by it."""
    replace, removed = _untaken(graph_def, decided)
    result = type(graph_def)()
    result.CopyFrom(graph_def)
    del result.node[:]
    for node in graph_def.node:
        if node.name in removed:
            continue
        copy = result.node.add()
        copy.CopyFrom(node)
        control_gone = [t for t in node.input if t.startswith("^") and t[1:] in removed]
        copy.input[:] = [_rewired(tensor, replace) for tensor in node.input if tensor not in control_gone]
    return _pruned(result, outputs)


def _untaken(graph_def: Any, decided: dict[str, bool]) -> tuple[dict[str, str], set[str]]:
    """(tensor → the tensor that replaces it, the nodes removed: the switches, the untaken branch, and the Merges
    that hand on their one live input)."""
    nodes = {node.name: node for node in graph_def.node}
    replace: dict[str, str] = {}
    for name, value in decided.items():
        replace[f"{name}:{int(value)}"] = nodes[name].input[0]
        if not value:
            replace[name] = nodes[name].input[0]
    dead_ports = {(name, int(not value)) for name, value in decided.items()}
    dead: set[str] = set()
    removed = set(decided)
    for node in _topological(graph_def):
        if node.name in decided:
            continue
        data = [i for i in node.input if not i.startswith("^")]
        dead_inputs = [i for i in data if _port(i) in dead_ports or node_name(i) in dead]
        live = [i for i in data if i not in dead_inputs]
        # as in TensorFlow's executor, a dead control input makes a node dead too (a branch's constants hang
        # on its pivot by one)
        if node.op != "Merge" and any(i.startswith("^") and i[1:] in dead for i in node.input):
            dead.add(node.name)
        elif node.op == "Merge" and dead_inputs and len(live) == 1:
            replace[node.name] = replace[f"{node.name}:0"] = live[0]
            removed.add(node.name)  # replaced, not dead: its readers read the live input
        elif dead_inputs and (node.op != "Merge" or not live):
            dead.add(node.name)
    return replace, removed | dead


def _rewired(tensor: str, replace: dict[str, str]) -> str:
    if tensor.startswith("^"):
        return tensor
    while tensor in replace or _port_name(tensor) in replace:
        tensor = replace.get(tensor, replace.get(_port_name(tensor), tensor))
    return tensor


def _float_to_int_casts(graph_def: Any, free: set[str]) -> list[str]:
    return [
        f"{node.name}:0"
        for node in graph_def.node
        if node.name in free
        and node.op == "Cast"
        and node.attr["SrcT"].type in _FLOAT_TYPES
        and node.attr["DstT"].type in _INT_TYPES
    ]


def _distance_table(evaluator: _Evaluator, tensor: str, limit: int | None) -> DistanceTable | None:
    """The tensor as a function of distance, or None where it is not one (or cannot be evaluated)."""
    long = limit or UNBOUNDED_LENGTH
    values = evaluator.run([tensor], long)
    short = evaluator.run([tensor], SHORT_LENGTH, batch=2) if long > SHORT_LENGTH else values
    if values is None or short is None:
        return None
    value, small = values[0], short[0]
    axes = tuple(axis for axis, size in enumerate(value.shape) if size == long)
    if len(axes) != 2 or any(size != 1 for axis, size in enumerate(value.shape) if axis not in axes):
        return None
    matrix = value.reshape(long, long)
    cut = min(SHORT_LENGTH, long)
    if small.shape != tuple(cut if axis in axes else 1 for axis in range(value.ndim)):
        return None
    if not np.array_equal(small.reshape(cut, cut), matrix[:cut, :cut]):
        return None
    distances = np.arange(-(long - 1), long)
    f = np.array([matrix[max(0, -int(d)), max(0, int(d))] for d in distances], dtype=matrix.dtype)
    rows, cols = np.indices((long, long))
    if not np.array_equal(matrix, f[cols - rows + long - 1]):
        return None
    before = after = long - 1
    saturated = limit is None
    if saturated:
        near, far = _saturation(f[: long - 1][::-1], f[long - 1]), _saturation(f[long:], f[long - 1])
        if near is None or far is None:
            return None
        before, after = near, far
        f = f[long - 1 - before : long + after]
    return DistanceTable(tensor, f, before, after, value.ndim, (axes[0], axes[1]), saturated)


def _shape_of(evaluator: _Evaluator, tensor: str, long: int) -> DistanceTable | None:
    values = evaluator.run([tensor], long)
    if values is None:
        return None
    shape = values[0].shape
    axes = tuple(axis for axis, size in enumerate(shape) if size == long)
    if len(axes) != 2 or any(size != 1 for axis, size in enumerate(shape) if axis not in axes):
        return None
    return DistanceTable(tensor, np.zeros(0), 0, 0, len(shape), (axes[0], axes[1]), False)


def _saturation(side: np.ndarray, centre: Any) -> int | None:
    """Distances until ``side`` (f at 1, 2, … from the centre) stops changing, where it is constant over at least
    the farther half; None where it still changes."""
    changes = np.flatnonzero(np.diff(np.concatenate([[centre], side])))
    last = int(changes[-1]) + 1 if changes.size else 0
    return last if last <= side.size // 2 else None


def _splice_tables(graph_def: Any, tables: list[DistanceTable], anchor: str, dtype: Any, outputs: list[str]) -> Any:
    tf = import_tensorflow()
    with tf.Graph().as_default() as scratch:
        placeholder = tf.compat.v1.placeholder(dtype, name=anchor)
        built = {}
        with tf.name_scope(ARITHMETIC_SCOPE):
            positions = tf.range(tf.shape(placeholder, out_type=tf.int32)[1])
            distance = positions[None, :] - positions[:, None]  # [query, key]: key - query
        for index, table in enumerate(tables):
            if table.shape_type is not None:
                with tf.name_scope(f"{ARITHMETIC_SCOPE}/shape_{index}"):
                    length = tf.shape(placeholder, out_type=tf.as_dtype(table.shape_type))[1]
                    one = tf.ones_like(length)
                    dims = [length if axis in table.axes else one for axis in range(table.rank)]
                    built[table.tensor] = tf.identity(tf.stack(dims), name="value").name
                continue
            with tf.name_scope(f"{ARITHMETIC_SCOPE}/table_{index}"):
                clipped = tf.clip_by_value(distance, -table.before, table.after) + table.before
                value = tf.gather(tf.constant(table.values), clipped)
                for axis in range(table.rank):
                    if axis not in table.axes:
                        value = tf.expand_dims(value, axis)
                built[table.tensor] = tf.identity(value, name="value").name
    added = [node for node in scratch.as_graph_def().node if node.name != anchor]
    result = type(graph_def)()
    result.CopyFrom(graph_def)
    for node in result.node:
        node.input[:] = [built.get(_port_name(i), i) if not i.startswith("^") else i for i in node.input]
    result.node.extend(added)
    return _pruned(result, outputs)


def _port(tensor: str) -> tuple[str, int]:
    name, _, index = tensor.partition(":")
    return name, int(index or 0)


def _port_name(tensor: str) -> str:
    name, index = _port(tensor)
    return f"{name}:{index}"


def _pruned(graph_def: Any, outputs: list[str]) -> Any:
    """What the outputs still read; every placeholder kept (the signature's inputs and the weights' stand-ins)."""
    nodes = {node.name: node for node in graph_def.node}
    keep: set[str] = set()
    frontier = [*outputs, *(node.name for node in graph_def.node if node.op == "Placeholder")]
    while frontier:
        name = frontier.pop()
        if name in keep or name not in nodes:
            continue
        keep.add(name)
        frontier.extend(node_name(tensor.lstrip("^")) for tensor in nodes[name].input)
    result = type(graph_def)()
    result.CopyFrom(graph_def)
    del result.node[:]
    result.node.extend(node for node in graph_def.node if node.name in keep)
    for node in result.node:
        if "_class" in node.attr:  # colocation with nodes that may be gone
            del node.attr["_class"]
    return result


def _topological(graph_def: Any) -> list[Any]:
    nodes = {node.name: node for node in graph_def.node}
    order: list[Any] = []
    state: dict[str, int] = {}
    for root in nodes:
        stack = [(root, False)]
        while stack:
            name, done = stack.pop()
            if done:
                state[name] = 2
                order.append(nodes[name])
                continue
            if state.get(name):
                continue
            state[name] = 1
            stack.append((name, True))
            for tensor in nodes[name].input:
                parent = node_name(tensor.lstrip("^"))
                if parent in nodes and not state.get(parent):
                    stack.append((parent, False))
    return order
