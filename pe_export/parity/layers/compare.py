"""Layer by layer: each mapped tensor of the file against the reference's activation (numpy only).

Each layer is judged as an output is (pe_export/parity/metrics.py, the same tolerance, padding left out where
the layer's axis 1 is the sequence), and its relative error ‖a − e‖ / ‖e‖ is set against the largest of the layers
before it in graph order (the error that could have flowed in: graph order interleaves branches, so the layer just
before may be a side branch such as an exact embedding lookup): the growth says where the error enters rather than
where it merely travels. The first layer over tolerance in
graph order is the divergence.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from pe_export.parity.metrics import OutputAccumulator
from pe_export.parity.result import LayerMetrics
from pe_export.parity.tolerances import Tolerance

FLOAT32_EPSILON = 2.0**-23


class LayerComparison:
    """Accumulates every mapped layer over the batches; ``result`` gives them in graph order."""

    def __init__(self, layers: dict[str, str], tolerance: Tolerance, sequence: dict[str, tuple[int, ...]]) -> None:
        """``layers``: layer → file tensor, in graph order; ``sequence``: each layer's axes that run along the
        sequence (``Bundle.sequence_axes``; none for a layer it leaves out): padding is left out along them."""
        self.layers = layers
        self.tolerance = tolerance
        self._accumulators = {
            name: OutputAccumulator(
                name, tolerance, argmax=False, sequence=bool(sequence.get(name)), sequence_axes=sequence.get(name, ())
            )
            for name in layers
        }

    def update(self, produced: dict[str, np.ndarray], expected: dict[str, np.ndarray], valid: np.ndarray) -> None:
        for name, tensor in self.layers.items():
            reference = expected[name]
            self._accumulators[name].update(produced[tensor].reshape(reference.shape), reference, valid)

    def result(self) -> list[LayerMetrics]:
        results: list[LayerMetrics] = []
        for name, accumulator in self._accumulators.items():
            metrics = accumulator.result()
            squared = accumulator.norm_actual + accumulator.norm_expected - 2 * accumulator.dot
            relative = math.sqrt(max(squared, 0.0)) / max(math.sqrt(accumulator.norm_expected), 1e-30)
            results.append(
                LayerMetrics(
                    name=name,
                    tensor=self.layers[name],
                    max_abs=metrics.max_abs,
                    mean_abs=metrics.mean_abs,
                    cosine=metrics.cosine,
                    relative_error=relative,
                    growth=None,
                    atol=self.tolerance.atol,
                    rtol=self.tolerance.rtol,
                    min_cosine=self.tolerance.min_cosine,
                    ok=metrics.within_tolerance,
                    violations=metrics.violations,
                    compared=metrics.compared,
                    pooled_cosine=metrics.pooled_cosine,
                    position_max_abs=metrics.position_max_abs,
                )
            )
        return with_growth(results)


def with_growth(layers: list[LayerMetrics]) -> list[LayerMetrics]:
    """Each layer's growth: its relative error over the largest of the layers before it in the list."""
    grown: list[LayerMetrics] = []
    previous: float | None = None
    for layer in layers:
        # float32 rounding is the floor: growth over exact layers (embedding lookups) says nothing
        growth = None if previous is None else layer.relative_error / max(previous, FLOAT32_EPSILON)
        grown.append(replace(layer, growth=growth))
        previous = layer.relative_error if previous is None else max(previous, layer.relative_error)
    return grown
