"""Full-integer TFLite's activations chosen by measured error: int8 where they hold, int16 where int8 loses the
answers (issue 25 item 2), with ``--keep-int16`` and ``--keep-float`` for what the user decides.

NPUs run int8 activations at twice the rate of int16 ones (or only int8); a Transformer's residual stream
carries outliers that one int8 range per tensor cannot hold. The search is dynamic-int8's
(pe_export/converters/search/keep_float.py), with activations in place of weights: every activation int8 first; where
that
misses the target, each place of the repeated block is measured int8 alone (the rest int16), and the fewest
activations kept int16, most accuracy per activation value first, that meet the target are found by bisection.
Every step is a quantized file run in LiteRT; the ranges are calibrated once and shared by every candidate
(ai-edge-quantizer quantizes a 90 MB MiniLM in about 0.3 s from them).

What it chooses on and what it is judged on are apart (pe_export/holdout.py), and ranges fit to the samples they
were calibrated on flatter them, so the choice keeps a margin, measured from the every-int16 file (the search's
fallback) one sample at a time: where int16 meets the target, int8 must keep ``INT16_MARGIN_KEPT`` of int16's
margin over it; where int16
misses it (all-MiniLM-L6-v2's "Thanks!": two of its four tokens carry the massive activations, 0.965 with every
activation int16), int8 may grow that sample's error (1 - cosine) by at most ``INT8_ERROR_GROWTH``.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from pe_export.converters.search.keep_float import (
    INT8_ACTIVATIONS_SEARCH,
    ChoiceSamples,
    Judging,
    KeepFloatOutcome,
    Outputs,
    feed_metrics,
    keep_float_to_target,
    resolve_asked,
    short_name,
)
from pe_export.converters.tflite.dynamic_int8 import batch_is_dynamic, run_candidates
from pe_export.converters.tflite.integer import (
    IntegerFile,
    activation_ops,
    calibrate,
    finish,
    quantize,
)
from pe_export.parity.tolerances import INT16_MARGIN_KEPT, Tolerance

# Where every activation int16 already misses the target on a sample, int8 activations may grow its error
# (1 - cosine) by at most this share: int16 has spent the margin there.
INT8_ERROR_GROWTH = 0.02
INT8_BITS = 8


@dataclass
class MixedOutcome:
    """The chosen file and how it was chosen."""

    file: IntegerFile
    search: KeepFloatOutcome  # kept_float: the activations kept int16 (--keep-int16's among them)
    floats: list[str]  # ops left float because --keep-float named them
    floored: int  # samples the every-int16 file misses the target on

    def notes(self) -> list[str]:
        search, candidates = self.search, self.search.candidates
        int16 = len(search.kept_float)
        names = ", ".join(short_name(n) for n in search.kept_float[:4]) + (", …" if int16 > 4 else "")
        asked = f"{len(search.asked)} as --keep-int16 asked; " if search.asked else ""
        if not int16:
            chosen = f"all {candidates} activations int8"
        elif int16 == candidates:
            chosen = f"all {candidates} activations int16 ({asked}every int8 choice missed the target)"
        else:
            chosen = (
                f"{candidates - int16} of {candidates} activations int8, {int16} int16 ({asked}the most error per "
                f"value first: {names}; {search.runs} files tried)"
            )
        notes = [
            f"activations by measured error: {chosen}; worst cosine {search.cosine:.6f} against the float file on the "
            "inputs it chose on"
        ]
        if self.floored:
            notes.append(
                f"{self.floored} sample(s) chosen on miss the tolerance with every activation int16: judged against "
                f"that file there (int8 may grow the error, 1 - cosine, by at most {INT8_ERROR_GROWTH:.0%})"
            )
        if self.floats:
            notes.append(
                f"{len(self.floats)} op(s) float as --keep-float asked (a CPU's float kernels between a DEQUANTIZE "
                "and a QUANTIZE; not for an integer-only NPU): " + ", ".join(short_name(n) for n in self.floats[:6])
            )
        return [*self.file.notes(), *notes]


def mixed_integer(
    float_file: bytes,
    calibration: Iterable[dict[str, np.ndarray]],
    order: list[str] | None,
    samples: ChoiceSamples,
    keep_int16: tuple[str, ...] = (),
    keep_float: tuple[str, ...] = (),
) -> MixedOutcome:
    """The full-integer file of ``float_file`` (calibrated on ``calibration``) with the fewest int16
    activations that meets the samples' tolerance against ``float_file`` on them; ``keep_int16`` / ``search.keep_float``
    name ops (their output tensor, or a Keras layer path in its name) kept int16 / float in every candidate."""
    calibrated = calibrate(float_file, calibration, order)
    ops = activation_ops(calibrated.data)
    names = [op.name for op in ops]
    floats = resolve_asked(keep_float, names, "activation", option="--keep-float")
    candidates = [name for name in names if name not in set(floats)]
    asked = resolve_asked(keep_int16, candidates, "activation", option="--keep-int16")
    feeds, masks, sequence, tolerance = samples.feeds, samples.masks, samples.sequence_outputs, samples.tolerance

    def build(int16: list[str]) -> bytes:
        return quantize(calibrated, int16, floats, default_bits=INT8_BITS)

    with tempfile.TemporaryDirectory(prefix="pe-export-") as work:
        folder = Path(work)

        def run(model: bytes, given: list[dict[str, np.ndarray]]) -> Outputs:
            # integer outputs come back as real values; int16 kernels use one core each
            return run_candidates(model, given, folder, per_core=True)

        from tensorflow.lite.tools import flatbuffer_utils

        rows_alone = batch_is_dynamic(flatbuffer_utils.read_model_from_bytearray(bytearray(float_file)))
        # the float file on one interpreter: its kernels use the threads, and XNNPACK packs its weights per interpreter
        expected = run_candidates(float_file, feeds, folder)
        judging = Judging(feeds, masks, expected, rows_alone, sequence)
        missed = int16_floors(judging, run(build(candidates), feeds), tolerance)
        by_name = {op.name: op for op in ops}
        search = keep_float_to_target(
            candidates,
            {name: by_name[name].elements * 4 for name in candidates},  # "bytes" by which cost per value ranks
            build,
            run,
            judging,
            tolerance,  # its element checks; the cosine is each unit's floor
            {name: (by_name[name].code, by_name[name].shape) for name in candidates},
            asked,
            kind=INT8_ACTIVATIONS_SEARCH,
            kept_bytes=2,
            escalated_to="int16",
            costs_over_escalated=True,
        )
    return MixedOutcome(finish(calibrated, search.model, floats_asked=bool(floats)), search, floats, missed)


def int16_floors(judging: Judging, int16_outputs: Outputs, tolerance: Tolerance) -> int:
    """Set each unit's floor in ``judging`` (the cosine a candidate must keep there): where the every-int16 file
    meets ``tolerance``'s cosine, the target plus ``INT16_MARGIN_KEPT`` of int16's margin over it; where it misses
    it, its error grown by ``INT8_ERROR_GROWTH``; and where int16 puts elements over the tolerance's atol/rtol, no
    element may err more than int16's worst, grown alike. Returns how many units int16 misses the tolerance on."""
    target, missed = tolerance.min_cosine, 0
    for unit in judging.units():
        got, want, mask = judging.part(int16_outputs, unit)
        ok, cosine, worst_abs, over = feed_metrics(got, want, mask, tolerance, judging.sequence_outputs)
        if cosine >= target:
            judging.floors[unit] = target + (cosine - target) * INT16_MARGIN_KEPT
        else:
            judging.floors[unit] = 1.0 - (1.0 - cosine) * (1.0 + INT8_ERROR_GROWTH)
        if over:
            judging.max_abs[unit] = worst_abs * (1.0 + INT8_ERROR_GROWTH)
        missed += not ok
    return missed


def searched_record(outcome: MixedOutcome) -> dict[str, Any]:
    """The search for --json: its verdict and each activation ranked by measured cost."""
    record = outcome.search.record("activations")
    record["kept_as"] = "int16"
    for entry in record["ranking"]:  # the search ranks activations by their float32 bytes, not weights
        entry["activation_bytes"] = entry.pop("weight_bytes")
    record["floats"] = list(outcome.floats)
    return record
