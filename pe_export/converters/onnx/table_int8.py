"""Embedding tables in int8 with one scale per row, dequantized after the lookup, for dynamic int8.

onnxruntime's ``quantize_dynamic`` stores a Gather's table with one scale for the whole table (its
``quantize_activation`` path): all-MiniLM-L6-v2's 30,522 x 384 token table shares the step of its largest value.
Here each row takes its own symmetric step (as the MatMul weights' output channels do), and only the rows looked up
are dequantized: ``Gather(int8 table, ids)`` cast to float, times ``Gather(steps [rows, 1], ids)``. Same bytes
(plus 4 per row), cheaper than dequantizing the table on every call.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from pe_export.converters.search.smoothing import symmetric_int8

SUFFIX = "__rows_int8"


def table_lookups(model: Any) -> list[str]:
    """Gather nodes reading rows (axis 0) of a 2-D float table stored in the file."""
    from onnx import TensorProto, helper

    tables = {i.name for i in model.graph.initializer if len(i.dims) == 2 and i.data_type == TensorProto.FLOAT}
    names = []
    for node in model.graph.node:
        axis = next((helper.get_attribute_value(a) for a in node.attribute if a.name == "axis"), 0)
        if node.op_type == "Gather" and node.input[0] in tables and axis == 0:
            names.append(node.name)
    return names


def rowwise_int8_tables(model: Any, names: list[str]) -> int:
    """In place: each named Gather (``table_lookups``) reads an int8 copy of its table and scales the rows it
    gathered; the node's output keeps its name (the last node of the chain). Returns the tables rewritten."""
    from onnx import TensorProto, helper, numpy_helper

    from pe_export.converters.onnx.rewrites import drop_unread_initializers

    graph = model.graph
    initializers = {init.name: init for init in graph.initializer}
    wanted, chains, done = set(names), {}, {}
    for node in graph.node:
        if node.name not in wanted:
            continue
        table, ids = node.input[0], node.input[1]
        if table not in done:
            values, steps = symmetric_int8(numpy_helper.to_array(initializers[table]), axis=1)
            graph.initializer.extend(
                [
                    numpy_helper.from_array(values, f"{table}{SUFFIX}"),
                    numpy_helper.from_array(steps.astype(np.float32), f"{table}{SUFFIX}_steps"),
                ]
            )
            done[table] = True
        base = f"{node.name}{SUFFIX}"
        chains[node.name] = [
            helper.make_node("Gather", [f"{table}{SUFFIX}", ids], [f"{base}_q"], name=f"{base}_gather", axis=0),
            helper.make_node("Cast", [f"{base}_q"], [f"{base}_float"], name=f"{base}_cast", to=TensorProto.FLOAT),
            helper.make_node(
                "Gather", [f"{table}{SUFFIX}_steps", ids], [f"{base}_steps"], name=f"{base}_steps", axis=0
            ),
            helper.make_node("Mul", [f"{base}_float", f"{base}_steps"], list(node.output), name=node.name),
        ]
    nodes = []
    for node in graph.node:
        nodes.extend(chains.get(node.name, [node]))
    del graph.node[:]
    graph.node.extend(nodes)
    drop_unread_initializers(graph)
    return len(done)
