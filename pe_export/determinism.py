"""A reference that is random at inference cannot be matched by any file.

The source write-ups' position-noise injection draws ``tf.random.normal`` in ``call()`` with no training
guard: the SavedModel's own outputs differ from call to call, and every export "fails parity", which blames the
converter. The graph says whether a stateful random op is there; a second run of the reference on one input
says whether it reaches the outputs (a random op in a branch never taken changes nothing).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from pe_export.errors import BadInputError

# Stateful random ops: a new draw on every call. The stateless ones take their seed as an input and are
# deterministic given it.
RANDOM_OPS = frozenset(
    {
        "RandomStandardNormal",
        "RandomUniform",
        "RandomUniformInt",
        "TruncatedNormal",
        "Multinomial",
        "RandomGamma",
        "RandomPoisson",
        "RandomPoissonV2",
        "RandomShuffle",
        "ParameterizedTruncatedNormal",
        "StatefulStandardNormalV2",
        "StatefulUniform",
        "StatefulUniformInt",
        "StatefulUniformFullInt",
        "StatefulTruncatedNormal",
        "RngReadAndSkip",
    }
)


def random_ops(concrete: Any) -> list[str]:
    """The stateful random ops in ``concrete``'s graph and the functions it calls: "Op (node)"."""
    graph_def = concrete.graph.as_graph_def()
    nodes = list(graph_def.node) + [node for function in graph_def.library.function for node in function.node_def]
    return [f"{node.op} ({node.name})" for node in nodes if node.op in RANDOM_OPS]


def refuse_random_reference(
    concrete: Any, infer: Any, feed: dict[str, np.ndarray], outputs: dict[str, np.ndarray], where: str
) -> None:
    """BadInputError where ``concrete`` holds a stateful random op and ``infer`` (the reference) gives other
    ``outputs`` for ``feed`` when run again."""
    found = random_ops(concrete)
    if not found:
        return
    again = infer(feed)
    changed = [name for name in outputs if not np.array_equal(np.asarray(again[name]), np.asarray(outputs[name]))]
    if changed:
        raise BadInputError(
            f"{where} is random at inference: {found[0]}{f' and {len(found) - 1} more' if len(found) > 1 else ''} "
            f"draws new values on every call, and {changed[0]!r} differs between two runs on the same input, so no "
            "exported file can match it. Draw noise only in training (`if training:`), or remove it, then export"
        )
