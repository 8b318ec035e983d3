"""The one comparison loop: a runner's outputs against reference batches, every output accumulated.

`pe-export parity` feeds it a golden bundle's batches from disk (pe_export/parity/inprocess.py); every
export feeds it the SavedModel's outputs on in-memory batches (pe_export/api.py). Both get the same
metrics, the same ParityReport and the same failure message.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from pe_export.errors import ParityError
from pe_export.interrupts import raise_if_interrupted
from pe_export.parity.bundle import Batch
from pe_export.parity.metrics import OutputAccumulator
from pe_export.parity.result import OutputMetrics
from pe_export.parity.tolerances import Tolerance
from pe_export.runners.base import Runner, infer_rows


def compare_batches(
    runner: Runner,
    batches: Iterable[Batch],
    tolerances: dict[str, Tolerance],
    *,
    model_name: str,
    progress: Callable[[], None] | None = None,
    sequence_outputs: set[str] | None = None,
) -> list[OutputMetrics]:
    """Run the (active) ``runner`` on every batch and judge each output in ``tolerances`` against the
    batch's reference outputs; batches of a named case are judged apart from the others. ``progress`` is
    called after every batch. ``sequence_outputs``: those the padding mask applies to (None: not known, by
    shape)."""
    accumulators: dict[tuple[str | None, str], OutputAccumulator] = {}
    for batch in batches:
        raise_if_interrupted()  # a Ctrl-C a finalizer swallowed still stops the check
        produced = infer_rows(runner, batch.inputs)
        missing = sorted(set(tolerances) - set(produced))
        if missing:
            raise ParityError(
                f"{model_name} lacks outputs {', '.join(missing)} (it has: {', '.join(sorted(produced))})"
            )
        for name, tolerance in tolerances.items():
            actual, expected = produced[name], batch.outputs[name]
            if actual.shape != expected.shape:
                raise ParityError(
                    f"{model_name}: output {name!r} has shape {actual.shape}, the float32 reference "
                    f"{expected.shape} ({batch.where})"
                )
            key = (batch.case, name)
            if key not in accumulators:
                sequence = None if sequence_outputs is None else name in sequence_outputs
                accumulators[key] = OutputAccumulator(name, tolerance, case=batch.case, sequence=sequence)
            accumulators[key].update(actual, expected, batch.valid, batch.labels.get(name))
        if progress:
            progress()
    return [accumulator.result() for accumulator in accumulators.values()]
