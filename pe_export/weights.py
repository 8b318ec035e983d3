"""Weights held once: a frozen graph whose large weights are stand-ins, bound to their values only for a converter.

Freezing a deployment-sized encoder the usual way (``convert_variables_to_constants_v2``) wrote every weight into
a GraphDef, built a function from it and serialized it again: 15 s and +3 GB at BERT-base shape, before any
conversion, and every graph copy the table pipeline made copied the weights with it. Here a weight the graph only
multiplies by (a kernel) or looks up by token id (a vocabulary table) is frozen as a *stand-in*: a Placeholder of
the weight's dtype and shape, marked with ``STAND_IN_ATTR``. Graph analysis and rewrites run on that weightless
graph; :meth:`WeightStore.bind` gives a converter a copy with each stand-in turned into the Const that plain
freezing would have written (the same values, read from the loaded variable when bound, never before).

A weight the graph reads in any other way — by position, or in a way the evidence does not name — is frozen as a
Const, exactly as before: position tables are found and rewritten by their values (tables/detect.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pe_export.graphdef import STAND_IN_ATTR, GraphIndex, node_name
from pe_export.native import import_tensorflow

MIN_STAND_IN_BYTES = 64 * 1024  # smaller weights are frozen as Consts: their copies cost nothing worth the bind
_FLOAT_DTYPES = ("float32", "float16", "bfloat16", "float64")


def is_stand_in(node: Any) -> bool:
    return node is not None and node.op == "Placeholder" and STAND_IN_ATTR in node.attr


def stored_shape(node: Any) -> list[int] | None:
    """The static shape of a Const or a weight stand-in (what a frozen weight holds), else None."""
    if node is None:
        return None
    if node.op == "Const":
        return [int(d.size) for d in node.attr["value"].tensor.tensor_shape.dim]
    if is_stand_in(node):
        return [int(d.size) for d in node.attr["shape"].shape.dim]
    return None


@dataclass
class WeightStore:
    """Stand-in node name → the variable whose value it stands for (held by the loaded SavedModel, not copied)."""

    variables: dict[str, Any] = field(default_factory=dict)

    @property
    def nbytes(self) -> int:
        from pe_export.memory import weight_bytes

        return weight_bytes(list(self.variables.values()))

    def value(self, name: str) -> np.ndarray:
        return np.asarray(self.variables[name].numpy())

    def bind(self, graph_def: Any) -> Any:
        """A copy of ``graph_def`` with every stand-in a Const of its weight (what plain freezing writes)."""
        if not any(is_stand_in(node) for node in graph_def.node):
            return graph_def
        result = type(graph_def)()
        result.library.CopyFrom(graph_def.library)
        result.versions.CopyFrom(graph_def.versions)
        for node in graph_def.node:
            if not is_stand_in(node):
                result.node.append(node)
                continue
            const = result.node.add()
            const.name, const.op = node.name, "Const"
            const.device = node.device
            const.attr["dtype"].type = node.attr["dtype"].type
            _set_const(const, self.value(node.name))  # one weight at a time: the bound graph is the only full copy
        return result


def weightless_freeze(concrete: Any, min_bytes: int = MIN_STAND_IN_BYTES) -> tuple[Any, WeightStore, list[str]]:
    """(frozen GraphDef with weight stand-ins, their store, input tensor names) of a concrete function.

    The graph is what ``convert_variables_to_constants_v2`` builds (calls inlined, control flow lowered), but the
    weights that pass the stand-in test are Placeholders; its output tensors are ``concrete.outputs``' names.
    """
    from tensorflow.python.framework import convert_to_constants as c2c

    variables = captured_variables(concrete)
    large = {name for name, var in variables.items() if _big_float(var, min_bytes)}
    held_back = {id(variables[name]) for name in large}

    class _Data(c2c._FunctionConverterDataInEager):  # TensorFlow's own freezing, the large values held back
        def _eval(self, tensor: Any) -> Any:
            if id(tensor) in held_back:
                return np.zeros([1] * len(tensor.shape), tensor.dtype.as_numpy_dtype)  # replaced below
            return tensor.numpy()

    data = _Data(func=concrete, lower_control_flow=True, aggressive_inlining=False)
    graph_def, converted = c2c._replace_variables_by_constants(converter_data=data)
    captured = [concrete.graph.internal_captures[index].name for index in converted]
    inputs = [t.name for t in concrete.inputs if t.name not in set(captured)]
    renamed = stable_capture_names(graph_def, variables)
    variables = {renamed.get(name, name): var for name, var in variables.items()}
    large = {renamed.get(name, name) for name in large}
    markers = {node_name(name) for name in large}
    store = WeightStore()
    nodes = [node for node in graph_def.node if node.name in markers]
    weights_only = _weights_only(graph_def, {node.name: variables[node.name].shape[0] for node in nodes})
    for node in nodes:
        var = variables[node.name]
        if node.name not in weights_only:
            _set_const(node, var.numpy())  # read some other way (by position, …): a Const, as plain freezing
            continue
        name, dtype = node.name, node.attr["dtype"].type
        node.Clear()
        node.name, node.op = name, "Placeholder"
        node.attr["dtype"].type = dtype
        node.attr["shape"].shape.CopyFrom(_shape_proto(var.shape))
        node.attr[STAND_IN_ATTR].b = True
        store.variables[node.name] = var
    return graph_def, store, inputs


def stable_capture_names(graph_def: Any, variables: dict[str, Any]) -> dict[str, str]:
    """In place: each frozen capture node (named by TensorFlow's process-wide counter: ``1596`` on the first load
    of a SavedModel, ``4186`` on the next one in the same process) takes its variable's name
    (``transformer_layer_0/self_attention_layer/query/kernel``), unique in the graph; returns old → new.

    The counter made one SavedModel freeze to differently named graphs, and tf2onnx orders its output by name:
    the ONNX file, and every choice an export makes by graph order, changed with it."""
    taken = {node.name for node in graph_def.node}
    renamed: dict[str, str] = {}
    for node in graph_def.node:
        var = variables.get(node.name)
        if var is None:
            continue
        base = _NODE_NAME_UNSAFE.sub("_", str(var.name).split(":")[0]).lstrip("_./-") or "weight"
        new, suffix = base, 1
        while new in taken:
            new, suffix = f"{base}_{suffix}", suffix + 1
        taken.add(new)
        renamed[node.name] = new
    if not renamed:
        return renamed
    for node in graph_def.node:
        node.name = renamed.get(node.name, node.name)
        for index, name in enumerate(node.input):
            control, rest = ("^", name[1:]) if name.startswith("^") else ("", name)
            base, colon, port = rest.partition(":")
            if base in renamed:
                node.input[index] = f"{control}{renamed[base]}{colon}{port}"
    return renamed


_NODE_NAME_UNSAFE = re.compile(r"[^A-Za-z0-9_./\-]")  # outside what a TensorFlow node name may hold


def captured_variables(concrete: Any) -> dict[str, Any]:
    """Capture placeholder node name → the variable it captures (as TensorFlow's freezing maps them)."""
    by_handle = {id(var.handle): var for var in concrete.graph.variables}
    result = {}
    for external, internal in concrete.graph.captures:
        var = by_handle.get(id(external))
        if var is not None:
            result[node_name(internal.name)] = var
    return result


def _big_float(var: Any, min_bytes: int) -> bool:
    shape = var.shape
    if not shape.is_fully_defined() or len(shape) < 2 or var.dtype.name not in _FLOAT_DTYPES:
        return False
    return int(np.prod(shape.as_list())) * var.dtype.size >= min_bytes


def _weights_only(graph_def: Any, rows: dict[str, int]) -> set[str]:
    """The Consts (name → rows) whose every reading the graph evidence calls a kernel or a vocabulary lookup."""
    from pe_export.tables.uses import KERNEL, LOOKUP, uses_of

    if not rows:
        return set()
    graph = GraphIndex(graph_def)
    result = set()
    for name, count in rows.items():
        roles = {use.role for use in uses_of(graph, name, int(count))}
        if roles and roles <= {KERNEL, LOOKUP}:
            result.add(name)
    return result


def _set_const(node: Any, value: np.ndarray) -> None:
    from tensorflow.python.framework import tensor_util

    node.attr["value"].tensor.CopyFrom(tensor_util.make_tensor_proto(value, node.attr["dtype"].type))


def _shape_proto(shape: Any) -> Any:
    tf = import_tensorflow()
    return tf.TensorShape(shape).as_proto()
