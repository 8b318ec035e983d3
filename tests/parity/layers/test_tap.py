"""The reference's layer tensors where the graph has control flow (pe_export/parity/layers/tap.py): a tensor of a branch
not taken has no value, so none is a layer, and the export's layer map, an optional stamp, never fails it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from pe_export.api import export_tflite
from pe_export.converters.options import ExportOptions
from pe_export.parity.layers.select import ALL
from pe_export.parity.layers.tap import LayerTap, conditional_ops
from pe_export.savedmodel import FrozenSignature, load_savedmodel, signature_input_specs


def _branching_model(path: Path) -> Path:
    """One dense layer in each branch of a tf.cond on the data (which runs depends on the input), one after."""
    import tensorflow as tf

    class Model(tf.Module):
        def __init__(self) -> None:
            rng = np.random.default_rng(0)
            self.up = tf.Variable(rng.standard_normal((4, 8)).astype("float32"), name="up")
            self.down = tf.Variable(rng.standard_normal((4, 8)).astype("float32"), name="down")
            self.out = tf.Variable(rng.standard_normal((8, 4)).astype("float32"), name="out")

        @tf.function(input_signature=[tf.TensorSpec([None, None, 4], tf.float32, name="x")])
        def serve(self, x: Any) -> dict[str, Any]:
            with tf.name_scope("block"):
                hidden = tf.cond(
                    tf.reduce_sum(x) > 0.0,
                    lambda: tf.nn.relu(tf.einsum("btd,de->bte", x, self.up)),
                    lambda: tf.nn.tanh(tf.einsum("btd,de->bte", x, self.down)),
                )
            with tf.name_scope("head"):
                return {"y": tf.einsum("bte,ed->btd", hidden, self.out) + 1.0}

    model = Model()
    tf.saved_model.save(model, str(path), signatures={"serving_default": model.serve})
    return path


def test_branch_tensors_are_no_layers_and_the_others_are_computed(tmp_path: Path) -> None:
    loaded = load_savedmodel(_branching_model(tmp_path / "branching"))
    signature = loaded.signature(None)
    frozen = FrozenSignature(signature, signature_input_specs(signature))
    graph_def, _, _ = frozen.graph()
    assert any(node.op == "Switch" for node in graph_def.node)  # the cond was lowered to v1 control flow
    tap = LayerTap(frozen, ALL)
    branched = conditional_ops(tap._graph)
    assert branched and not {layer.tensor.split(":")[0] for layer in tap.layers} & branched
    for sign in (1.0, -1.0):  # either branch taken: every layer has its value
        x = sign * np.abs(np.random.default_rng(1).standard_normal((1, 5, 4))).astype("float32")
        values = tap.activations({"x": x})
        assert set(values) == {layer.name for layer in tap.layers}


def test_the_export_is_written_with_or_without_a_layer_map(tmp_path: Path) -> None:
    model = _branching_model(tmp_path / "branching")
    report = export_tflite(model, tmp_path / "m.tflite", ExportOptions())
    assert report.exit_code == 0 and (tmp_path / "m.tflite").exists()
    assert report.layer_map is not None  # what it covers, or why there is none: said, never raised
