"""The float32 reference's activations at its layer boundaries (TensorFlow side).

The frozen graph is the signature's own computation (calls inlined, weights as stand-ins: pe_export/weights.py);
its layer tensors are fetched beside nothing else, with every stand-in fed its variable's value, so no weight is
copied into a graph to tap it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from pe_export.layers.select import LayerSpec, find_layers
from pe_export.native import import_tensorflow
from pe_export.savedmodel import FrozenSignature


class LayerTap:
    """``activations(feed)`` → layer name → array, for the layers ``selection`` picks of ``frozen``'s graph."""

    def __init__(self, frozen: FrozenSignature, selection: str) -> None:
        from pe_export.graphdef import without_custom_gradients

        tf = import_tensorflow()
        graph_def, inputs, _ = frozen.graph()
        graph_def = without_custom_gradients(graph_def)

        def load() -> None:
            tf.compat.v1.import_graph_def(graph_def, name="")

        wrapped = tf.compat.v1.wrap_function(load, [])
        graph = wrapped.graph
        self.layers: list[LayerSpec] = find_layers(graph, selection)
        self._input_names = list(inputs.values())
        self._weights = frozen.weights.variables
        feeds = [graph.get_tensor_by_name(tensor) for tensor in inputs]
        feeds += [graph.get_tensor_by_name(f"{name}:0") for name in self._weights]
        fetches = {layer.name: graph.get_tensor_by_name(layer.tensor) for layer in self.layers}
        self._function: Any = wrapped.prune(feeds, fetches) if fetches else None

    def activations(self, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        if self._function is None:
            return {}
        tf = import_tensorflow()
        args = [tf.constant(feed[name]) for name in self._input_names]
        args += [variable.value() for variable in self._weights.values()]
        rows = next(iter(feed.values())).shape[0]
        values = {name: np.asarray(value) for name, value in self._function(*args).items()}
        # A dynamic first axis that is not the batch (a dense layer's [batch·seq, d] product) is no layer output.
        return {name: value for name, value in values.items() if value.ndim and value.shape[0] == rows}
