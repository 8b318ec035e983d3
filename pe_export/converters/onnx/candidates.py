"""Candidate ONNX models run in onnxruntime, and the nodes an int8 precision quantizes: what every ONNX search
(dynamic and static int8, float16, GPTQ's activations) runs and counts."""

from __future__ import annotations

from collections.abc import Collection, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from pe_export.converters.onnx.outliers import is_side_node


def quantizable_nodes(model: Any, beside: Collection[str] = ()) -> list[str]:
    """Nodes quantize_dynamic turns into integer kernels: MatMul by a 2-D weight, Gather from a table (not the
    float products beside them, ``onnx.outliers``, nor those ``beside`` names: the smoothing's own float
    products, ``Smoothing.beside``)."""
    initializers = {i.name: len(i.dims) for i in model.graph.initializer}
    names = []
    for node in model.graph.node:
        if is_side_node(node.name) or node.name in beside:
            continue
        if node.op_type == "MatMul" and initializers.get(node.input[1]) == 2:
            names.append(node.name)
        elif node.op_type == "Gather" and initializers.get(node.input[0], 0) == 2:
            names.append(node.name)
    return names


def _run(model: Any, feeds: list[dict[str, np.ndarray]], names: list[str] | None = None) -> list[dict[str, np.ndarray]]:
    """Every feed through ``model`` in onnxruntime: its outputs, or the ``names`` asked for."""
    return list(_each_output(model, feeds, names))


def _each_output(
    model: Any, feeds: list[dict[str, np.ndarray]], names: list[str] | None = None
) -> Iterator[dict[str, np.ndarray]]:
    """``_run``, one feed's outputs at a time, in one session: the runner every ONNX check goes through."""
    from pe_export.runners import create_runner

    with create_runner("onnxruntime", Path("candidate.onnx"), serialized=model.SerializeToString()) as runner:
        inputs = {spec.name for spec in runner.input_specs()}
        for feed in feeds:
            produced = runner.infer({k: v for k, v in feed.items() if k in inputs})
            yield produced if names is None else {name: produced[name] for name in names}
