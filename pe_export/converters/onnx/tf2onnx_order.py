"""The same SavedModel converts to the same ONNX file: tf2onnx 1.17's three sources of run-to-run change, fixed
for the length of one conversion.

tf2onnx (upstream onnx/tensorflow-onnx#2006, #1789: open) turns one frozen GraphDef into a differently ordered,
differently named graph in each process (measured on all-MiniLM-L6-v2: 90 of 721 nodes named or placed apart,
the per-layer attention-mask chains merged into a different layer's copy). What an export then decides by graph
order (the int8 searches' places and ties) changed with it. The causes, found by hashing the graph after each of
its optimizers in two processes with the same input:

- ``Graph.extract_sub_graph_nodes`` returns ``list(set(nodes))``: a set of Node objects, ordered by their memory
  addresses; ``delete_unused_nodes`` resets the graph to that order, and the optimizers after it (duplicate
  merging keeps the first copy it meets; ``topological_sort`` sorts by name) follow it. Here it returns them in
  the graph's order.
- The Einsum decomposition names its nodes ``einsum<id(self)>…``: memory addresses again, which then order the
  name sort. Here ``id`` in that module gives each object a serial number in the order it is first asked about,
  unique for the conversion (the objects are held until it ends) and as far above small integers as real ids.
- The decomposition caches its work by equation in a class-wide dict that outlives the conversion: a second
  conversion in one process reuses the first one's objects, whose serial numbers then name its nodes. Here the
  conversion starts from an empty cache, and the process's cache is put back after it.
- ``utils.make_name`` numbers generated names from a process-wide counter: a second conversion in one process
  names (and so orders) its nodes apart from the first. Here the counter starts from its initial value; after
  the conversion it is left past both, so names stay unique for any later tf2onnx use in the process.

Each is restored when the conversion ends; pe-export converts one model at a time.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

_FIRST_NAME = 1  # tf2onnx.utils.INTERNAL_NAME's value at import
# The decomposition keys one dict by its inputs' small integer positions and by its sub-ops' ids: serial numbers
# start far above any position, as real ids are.
_FIRST_SERIAL = 1 << 40


class _SerialIds:
    """A stand-in for ``id`` that numbers objects in the order they are first seen, from ``_FIRST_SERIAL``."""

    def __init__(self) -> None:
        self._serial: dict[int, int] = {}
        self._held: list[Any] = []  # keeps each object alive so that its id() is never reused meanwhile

    def __call__(self, obj: Any) -> int:
        key = id(obj)
        if key not in self._serial:
            self._serial[key] = _FIRST_SERIAL + len(self._serial)
            self._held.append(obj)
        return self._serial[key]


@contextlib.contextmanager
def repeatable_conversion() -> Iterator[None]:
    """For the block, tf2onnx orders and names the graph it builds from its input alone."""
    from tf2onnx import utils
    from tf2onnx.graph import Graph
    from tf2onnx.optimizer import einsum_optimizer

    unordered = Graph.extract_sub_graph_nodes

    def in_graph_order(self: Any, outputs_name: Any, input_checker: Any = None, remove_unused_inputs: bool = True):
        found = unordered(self, outputs_name, input_checker, remove_unused_inputs)
        position = {id(node): index for index, node in enumerate(self.get_nodes())}
        return sorted(found, key=lambda node: (position.get(id(node), len(position)), node.name))

    had_id = "id" in vars(einsum_optimizer)
    own_id = vars(einsum_optimizer).get("id")
    counter = utils.INTERNAL_NAME
    cached = einsum_optimizer.CachedEinsum.einsum_cache
    Graph.extract_sub_graph_nodes = in_graph_order
    einsum_optimizer.CachedEinsum.einsum_cache = {}
    einsum_optimizer.id = _SerialIds()
    utils.INTERNAL_NAME = _FIRST_NAME
    try:
        yield
    finally:
        Graph.extract_sub_graph_nodes = unordered
        if had_id:
            einsum_optimizer.id = own_id
        else:
            del einsum_optimizer.id
        utils.INTERNAL_NAME = max(counter, utils.INTERNAL_NAME)
        einsum_optimizer.CachedEinsum.einsum_cache = cached
