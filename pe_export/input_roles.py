"""Which inputs are padding masks, read from how the graph uses them (TensorFlow side; the name only a hint).

Generated inputs, ``--text`` and golden bundles give a padding mask ones on real tokens and zeros on padding, and
token ids ids. A name says neither for certain: a Keras 2 functional encoder's inputs are ``input_1`` (the ids)
and ``input_2`` (the mask), and ``--text`` once gave ``input_2`` zeros, so the float32 reference itself ran with
every token masked and parity passed on both sides' wrong input. The graph says it instead:

- an input that indexes a table (``integer_input_bounds``) is ids: never a mask, whatever its name;
- an input whose values reach a softmax's logits (a select, a product or a sum with the attention scores) without
  indexing anything on the way is a mask;
- where neither holds, the name decides (``mask`` in it), and an integer input it does not name stays unplaced:
  ``--text`` refuses it rather than feed it zeros (text_inputs.py).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from pe_export.graphdef import consumers_of
from pe_export.inputs import named_as_mask

_GATHERS = {"GatherV2", "ResourceGather", "Gather", "GatherNd"}
_SOFTMAX = {"Softmax", "LogSoftmax"}
_SHAPE_ONLY = {"Shape", "Size", "Rank", "ShapeN"}
_MAX_DEPTH = 64


def reaches_softmax(consumers: Mapping[str, list[tuple[Any, int]]], name: str) -> bool:
    """Whether input ``name``'s values flow into a softmax without being used as an index on the way
    (``consumers``: graphdef.consumers_of the graph)."""
    frontier, seen = [(name, 0)], {name}
    while frontier:
        current, depth = frontier.pop()
        for node, position in consumers.get(current, []):
            if node.op in _SOFTMAX:
                return True
            if node.name in seen or depth >= _MAX_DEPTH or node.op in _SHAPE_ONLY:
                continue
            if node.op in _GATHERS and position != 0:
                continue  # an index: what it picks carries the table's values, not the input's
            seen.add(node.name)
            frontier.append((node.name, depth + 1))
    return False


def mask_inputs(graph_def: Any, names: Collection[str], bounds: Mapping[str, int]) -> frozenset[str]:
    """The inputs among ``names`` taken as padding masks: never a table index (``bounds``), the graph's word first
    (its values reach a softmax), the name's where the graph says nothing."""
    consumers = consumers_of(graph_def)
    masks = set()
    for name in names:
        if name in bounds:
            continue
        if reaches_softmax(consumers, name) or named_as_mask(name):
            masks.add(name)
    return frozenset(masks)
