"""The model's layer boundaries in its frozen graph, named by the model's own layer paths (TensorFlow side).

A *layer* is a name scope of the graph (a Keras layer's, e.g. ``transformer_layer_2/feedforward_output_dense``)
that hands exactly one float activation with a batch axis to the rest of the graph: its boundary output, found
from the graph's edges (what is computed inside the scope and consumed outside it), not from the scope's name.
With ``all``, the compute ops directly inside a layer made of layers (a block's residual sums, attention's score
product) are layers too. Names are hints for people; the graph tensor each layer stands for is kept beside it.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

from pe_export.errors import BadInputError
from pe_export.graphdef import node_name

BLOCKS, ALL = "blocks", "all"
LAYER_SELECTIONS = (BLOCKS, ALL)  # or a regular expression over the `all` names
# Scopes a SavedModel's calls wrap every op in: not the model's.
_CALL_SCOPE = re.compile(r"(Stateful)?PartitionedCall(_\d+)?")
# Ops that move or reshape data only: their outputs are the same numbers as their inputs, never a layer of their own.
_MOVEMENT_OPS = {
    "Identity",
    "IdentityN",
    "Reshape",
    "Transpose",
    "ExpandDims",
    "Squeeze",
    "StridedSlice",
    "Slice",
    "ConcatV2",
    "Pack",
    "Unpack",
    "Shape",
    "Cast",
    "BroadcastTo",
    "Const",
    "Placeholder",
    "StopGradient",
    "Fill",
    "Range",
    "Tile",
    "ZerosLike",
    "OnesLike",
}
_FLOAT = ("float32", "float16", "bfloat16", "float64")


@dataclass(frozen=True)
class LayerSpec:
    name: str  # the layer path, relative to the model (``transformer_layer_0/self_attention_layer``)
    tensor: str  # the frozen graph's tensor that carries it (``…/add_2:0``)
    shape: tuple[int | None, ...]  # static shape, batch axis first (None)
    dtype: str


def check_selection(selection: str) -> str:
    """``blocks``, ``all`` or a regular expression (compiled here so a bad one is one line)."""
    if selection not in LAYER_SELECTIONS:
        try:
            re.compile(selection)
        except re.error as err:
            raise BadInputError(
                f"--layers {selection!r} is neither {' nor '.join(LAYER_SELECTIONS)} nor a regular expression "
                f"({err}); expected --layers blocks, --layers all or --layers 'transformer_layer_1/.*'"
            ) from None
    return selection


def find_layers(graph: Any, selection: str = ALL, batch: int | None = None) -> list[LayerSpec]:
    """The layers of an imported frozen ``graph`` (a tf.Graph), in graph order, as ``selection`` picks them;
    ``batch``: the inputs' fixed batch size (None: dynamic), which an activation's first axis carries."""
    selection = check_selection(selection)
    operations = [op for op in graph.get_operations() if not op.name.startswith("Func/")]
    paths = {op.name: _scopes(op.name) for op in operations}
    root = _common_root([paths[op.name] for op in operations if op.type not in _MOVEMENT_OPS])
    inner = {name: path[len(root) :] for name, path in paths.items() if path[: len(root)] == root}
    activation = partial(_is_activation, batch=batch)
    candidates = _scope_outputs(operations, inner, activation)  # tensor → (layer path, an op's own?, tensor)
    if selection != BLOCKS:
        candidates.update(_composite_ops(operations, inner, candidates, activation))
    named = _readable({tensor: (path, op) for tensor, (path, op, _) in candidates.items()})
    layers = [
        LayerSpec(named[key], key, tuple(tensor.shape.as_list()), tensor.dtype.name)
        for key, (path, _, tensor) in candidates.items()
        if selection == ALL or (selection == BLOCKS and len(path) == 1) or re.search(selection, named[key])
    ]
    order = {op.name: index for index, op in enumerate(operations)}
    return sorted(layers, key=lambda layer: order[node_name(layer.tensor)])


_Candidates = dict[str, tuple[tuple[str, ...], bool, Any]]


def _scope_outputs(
    operations: list[Any], inner: dict[str, tuple[str, ...]], is_activation: Callable[[Any], bool]
) -> _Candidates:
    """Each scope that hands exactly one activation out of itself, named by the outermost such scope."""
    scopes: dict[tuple[str, ...], list[Any]] = {}
    for op in operations:
        path = inner.get(op.name, ())
        for depth in range(1, len(path)):  # every enclosing scope below the root; the last part is the op
            scopes.setdefault(path[:depth], []).append(op)
    candidates: _Candidates = {}
    for path, ops in scopes.items():
        members = {op.name for op in ops}
        leaving = [
            tensor
            for op in ops
            for tensor in op.outputs
            if is_activation(tensor) and any(consumer.name not in members for consumer in tensor.consumers())
        ]
        if len(leaving) == 1 and (leaving[0].name not in candidates or len(path) < len(candidates[leaving[0].name][0])):
            candidates[leaving[0].name] = (path, False, leaving[0])
    return candidates


def _composite_ops(
    operations: list[Any],
    inner: dict[str, tuple[str, ...]],
    layers: _Candidates,
    is_activation: Callable[[Any], bool],
) -> _Candidates:
    """The compute ops directly inside a layer made of layers: a block's residual sums, attention's products."""
    layer_scopes = {path for path, _, _ in layers.values()}
    composite = {path[:-1] for path in layer_scopes if len(path) > 1} & layer_scopes
    found: _Candidates = {}
    for op in operations:
        path = inner.get(op.name, ())
        if len(path) >= 2 and op.type not in _MOVEMENT_OPS and path[:-1] in composite:
            for tensor in op.outputs:
                if is_activation(tensor) and tensor.name not in layers:
                    found[tensor.name] = (path, True, tensor)
    return found


def _scopes(op_name: str) -> tuple[str, ...]:
    parts = op_name.split("/")
    while parts and _CALL_SCOPE.fullmatch(parts[0]):
        parts.pop(0)
    return tuple(parts)


def _common_root(paths: list[tuple[str, ...]]) -> tuple[str, ...]:
    """The scope every compute op of the model sits in (the model's own: ``bert_backbone_1``), else none."""
    scoped = [path[:-1] for path in paths if len(path) > 1]
    if not scoped or len(scoped) < len(paths) // 2:
        return ()
    root = scoped[0]
    for path in scoped[1:]:
        length = 0
        while length < min(len(root), len(path)) and root[length] == path[length]:
            length += 1
        root = root[:length]
    return root


def _is_activation(tensor: Any, batch: int | None) -> bool:
    """A float tensor with the inputs' batch axis first and more: what a layer hands on."""
    shape = tensor.shape
    return (
        tensor.dtype.name in _FLOAT
        and shape.rank is not None
        and shape.rank >= 2
        and shape.as_list()[0] == batch
        and tensor.op.type not in ("Const", "Placeholder")
    )


def _readable(paths: dict[str, tuple[tuple[str, ...], bool]]) -> dict[str, str]:
    """Layer paths without the ``_<n>`` suffix a second trace gives every Keras name scope
    (``transformer_layer_0_1`` → ``transformer_layer_0``; an op's own name kept), where dropping it names no two
    layers alike; those it would confuse keep the graph's names."""
    raw = {key: "/".join(path) for key, (path, _) in paths.items()}
    stripped = {
        key: "/".join([*(re.sub(r"_\d+$", "", part) for part in path[: len(path) - op]), *path[len(path) - op :]])
        for key, (path, op) in paths.items()
    }
    counts: dict[str, int] = {}
    for name in stripped.values():
        counts[name] = counts.get(name, 0) + 1
    return {key: name if counts[name] == 1 else raw[key] for key, name in stripped.items()}
