"""The float32 reference's activations at its layer boundaries (TensorFlow side).

The frozen graph is the signature's own computation (calls inlined, weights as stand-ins: pe_export/weights.py);
its layer tensors are fetched beside nothing else, with every stand-in fed its variable's value, so no weight is
written into a graph to tap it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from pe_export.native import import_tensorflow
from pe_export.parity.layers.select import LayerSpec, find_layers
from pe_export.savedmodel import FrozenSignature


def conditional_ops(graph: Any) -> set[str]:
    """Names of the ops of ``graph`` that run only when a branch is taken: downstream of a Switch (v1 control
    flow, which freezing lowers tf.cond to), up to the Merge that joins the branches."""
    consumers: dict[str, list[Any]] = {}
    for op in graph.get_operations():
        for tensor in op.inputs:
            consumers.setdefault(tensor.op.name, []).append(op)
    frontier = [op for op in graph.get_operations() if op.type in ("Switch", "RefSwitch")]
    seen: set[str] = set()
    while frontier:
        op = frontier.pop()
        for consumer in consumers.get(op.name, []):
            if consumer.name not in seen and consumer.type not in ("Merge", "RefMerge"):
                seen.add(consumer.name)
                frontier.append(consumer)
    return seen


class LayerTap:
    """``activations(feed)`` → layer name → array, for the layers ``selection`` picks of ``frozen``'s graph."""

    def __init__(self, frozen: FrozenSignature, selection: str) -> None:
        from pe_export.graphdef import without_custom_gradients

        tf = import_tensorflow()
        graph_def, inputs, _ = frozen.graph()
        # A graph-mode session over the imported graph: a pruned tf.function of it took 0.5 s to build on a tiny
        # encoder, this 0.05 s; each stand-in is fed its variable's value when the graph runs.
        with tf.Graph().as_default() as graph:
            tf.compat.v1.import_graph_def(without_custom_gradients(graph_def), name="")
        batches = {spec.shape[0] for spec in frozen.specs if spec.shape}
        layers = find_layers(graph, selection, batches.pop() if len(batches) == 1 else None)
        # A tensor in a branch of the graph's control flow has no value when its branch is not taken: no layer
        branched = conditional_ops(graph)
        self.layers: list[LayerSpec] = [layer for layer in layers if layer.tensor.rsplit(":", 1)[0] not in branched]
        self._graph = graph
        self._inputs = {name: graph.get_tensor_by_name(tensor) for tensor, name in inputs.items()}
        self._weights = {graph.get_tensor_by_name(f"{name}:0"): v for name, v in frozen.weights.variables.items()}
        self._fetches = {layer.name: graph.get_tensor_by_name(layer.tensor) for layer in self.layers}

    def activations(self, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        if not self._fetches:
            return {}
        tf = import_tensorflow()
        feeds = {tensor: feed[name] for name, tensor in self._inputs.items()}
        feeds.update({tensor: variable.numpy() for tensor, variable in self._weights.items()})
        with tf.compat.v1.Session(graph=self._graph) as session:
            try:
                values = session.run(self._fetches, feed_dict=feeds)
            except tf.errors.InvalidArgumentError:  # a tensor without a value on this input: each alone
                values = {}
                for name, fetch in self._fetches.items():
                    try:
                        values[name] = session.run(fetch, feed_dict=feeds)
                    except tf.errors.InvalidArgumentError:
                        continue
        rows = next(iter(feed.values())).shape[0]
        # A dynamic first axis that is not the batch (a dense layer's [batch·seq, d] product) is no layer output.
        return {name: value for name, value in values.items() if value.ndim and value.shape[0] == rows}
