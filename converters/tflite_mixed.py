"""Full-integer TFLite's activations chosen by measured error: int8 where they hold, int16 where int8 loses the
answers (issue 25 item 2), with ``--keep-int16`` and ``--keep-float`` for what the user decides.

NPUs run int8 activations at twice the rate of int16 ones (or only int8); a Transformer's residual stream
carries outliers that one int8 range per tensor cannot hold. The search is dynamic-int8's
(converters/keep_float.py), with activations in place of weights: every activation int8 first; where that
misses the target, each place of the repeated block is measured int8 alone (the rest int16), and the fewest
activations kept int16, most accuracy per activation value first, that meet the target are found by bisection.
Every step is a quantized file run in LiteRT; the ranges are calibrated once and shared by every candidate
(ai-edge-quantizer quantizes a 90 MB MiniLM in about 0.3 s from them).

What it chooses on and what it is judged on are apart (pe_export/holdout.py). It chooses against a share of
the target's error (``STATIC_INT8_CHOICE_SHARE``, as static int8 ONNX does: ranges fit to the inputs they were
calibrated on flatter them). Where the all-int16 file itself misses that on a sample (all-MiniLM-L6-v2's
"Thanks!": two of its four tokens carry the massive activations, 0.965 with every activation int16), int8 may
grow that sample's error by at most ``INT8_ERROR_GROWTH``, and never take it below the target where int16 met it.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from pe_export.converters.keep_float import (
    Judging,
    KeepFloatOutcome,
    Masks,
    Outputs,
    Unit,
    feed_score,
    keep_float_to_target,
    resolve_asked,
    short_name,
)
from pe_export.converters.tflite_int8 import _batch_is_dynamic, _run
from pe_export.converters.tflite_integer import (
    IntegerFile,
    activation_ops,
    calibrate,
    finish,
    quantize,
)
from pe_export.parity.tolerances import STATIC_INT8_CHOICE_SHARE, Tolerance

# Where every activation int16 already misses the choice target on a sample, int8 activations may grow its error
# (1 - cosine) by at most this share: int16 has spent the margin there. Measured on all-MiniLM-L6-v2 (every one of
# the 48 sentences chosen on misses 0.995 with every activation int16; held out worst 0.9916): letting int8 cost
# 0.001 of cosine on each put 17 of 379 activations in int8 and the held-out worst at 0.9895, refused by the gate.
INT8_ERROR_GROWTH = 0.02
INT8_BITS = 8


@dataclass
class MixedOutcome:
    """The chosen file and how it was chosen."""

    file: IntegerFile
    search: KeepFloatOutcome  # kept_float: the activations kept int16 (--keep-int16's among them)
    floats: list[str]  # ops left float because --keep-float named them
    floored: int  # samples the all-int16 file missed the choice target on (judged against it instead)

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
                f"{self.floored} sample(s) chosen on miss the choice target with every activation int16: there int8 "
                f"could grow the error (1 - cosine) by at most {INT8_ERROR_GROWTH:.0%}"
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
    judging_inputs: tuple[list[dict[str, np.ndarray]], Masks, set[str]],
    tolerance: Tolerance,
    keep_int16: tuple[str, ...] = (),
    keep_float: tuple[str, ...] = (),
) -> MixedOutcome:
    """The full-integer file of ``float_file`` (calibrated on ``calibration``) with the fewest int16
    activations that meets ``tolerance`` against ``float_file`` on ``judging_inputs`` (feeds, their valid masks,
    the sequence outputs); ``keep_int16`` / ``keep_float`` name ops (their output tensor, or a Keras layer path in
    its name) kept int16 / float in every candidate."""
    calibrated = calibrate(float_file, calibration, order)
    ops = activation_ops(calibrated.data)
    names = [op.name for op in ops]
    floats = resolve_asked(keep_float, names, "activation", option="--keep-float")
    candidates = [name for name in names if name not in set(floats)]
    asked = resolve_asked(keep_int16, candidates, "activation", option="--keep-int16")
    target = tolerance.with_cosine_error(STATIC_INT8_CHOICE_SHARE)
    feeds, masks, sequence = judging_inputs

    def build(int16: list[str]) -> bytes:
        return quantize(calibrated, int16, floats, default_bits=INT8_BITS)

    with tempfile.TemporaryDirectory(prefix="pe-export-") as work:
        folder = Path(work)

        def run(model: bytes, given: list[dict[str, np.ndarray]]) -> Outputs:
            return _run(model, given, folder)

        from tensorflow.lite.tools import flatbuffer_utils

        rows_alone = _batch_is_dynamic(flatbuffer_utils.read_model_from_bytearray(bytearray(float_file)))
        judging = Judging(feeds, masks, run(float_file, feeds), rows_alone, sequence)
        judging.floors = int16_floors(judging, run(build(candidates), feeds), target, tolerance)
        by_name = {op.name: op for op in ops}
        search = keep_float_to_target(
            candidates,
            {name: by_name[name].elements * 4 for name in candidates},  # "bytes" by which cost per value ranks
            build,
            run,
            judging,
            target,
            {name: (by_name[name].code, by_name[name].shape) for name in candidates},
            asked,
            mode="int8 activations",
            kept_bytes=2,
            escalated_to="int16",
        )
    return MixedOutcome(finish(calibrated, search.model), search, floats, len(judging.floors))


def int16_floors(
    judging: Judging, int16_outputs: Outputs, target: Tolerance, tolerance: Tolerance
) -> dict[Unit, float]:
    """Each unit the all-int16 file misses ``target`` on, with the cosine a candidate must keep there: int16's error
    grown by ``INT8_ERROR_GROWTH``, and at least ``tolerance``'s cosine where int16 met that."""
    floors = {}
    for unit in judging.units():
        got, want, mask = judging.part(int16_outputs, unit)
        ok, cosine = feed_score(got, want, mask, target, judging.sequence_outputs)
        if ok:
            continue
        floor = 1.0 - (1.0 - cosine) * (1.0 + INT8_ERROR_GROWTH)
        if cosine >= tolerance.min_cosine:
            floor = max(floor, tolerance.min_cosine)
        floors[unit] = floor
    return floors


def searched_record(outcome: MixedOutcome) -> dict[str, Any]:
    """The search for --json: its verdict and each activation ranked by measured cost."""
    record = outcome.search.record("activations")
    record["kept_as"] = "int16"
    for entry in record["ranking"]:  # the search ranks activations by their float32 bytes, not weights
        entry["activation_bytes"] = entry.pop("weight_bytes")
    record["floats"] = list(outcome.floats)
    return record
