"""SmoothQuant's scales (pe_export/converters/search/smoothing.py) on activations with a channel that calibration never
saw active: the scale must leave that channel's weights as they are, or int8 loses them where it wakes."""

from __future__ import annotations

import numpy as np

from pe_export.converters.search.smoothing import migration_scale, per_channel_int8


def test_a_channel_dead_in_calibration_keeps_its_weight_row() -> None:
    rng = np.random.default_rng(21)
    weight = rng.normal(size=(16, 32)).astype(np.float32)
    calibration = rng.normal(size=(256, 16)).astype(np.float32)
    calibration[:, 5] = 0.0  # never active on the calibration rows
    calibration[:, 2] *= 40.0  # an outlier channel: what smoothing is for
    scale = migration_scale(np.abs(calibration).max(axis=0), weight, 0.5)
    assert scale[5] == 1.0 and scale[2] > 1.0
    held_out = rng.normal(size=(256, 16)).astype(np.float32)
    held_out[:, 2] *= 40.0
    held_out[:, 5] *= 3.0  # the channel wakes
    exact = held_out @ weight
    smoothed = (held_out / scale) @ per_channel_int8(weight * scale[:, None])
    plain = held_out @ per_channel_int8(weight)
    # Weights only quantized here, so smoothing should cost nothing visible; a floor scale (≈ 3e-3 / 0.5) would
    # have put channel 5's row below half an int8 step and dropped its share (≈ 1/16 of the output energy).
    error = float(np.square(smoothed - exact).sum() / np.square(exact).sum())
    assert error < 2 * float(np.square(plain - exact).sum() / np.square(exact).sum()) + 1e-6
    assert error < 1e-3
