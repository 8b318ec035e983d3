"""Default tolerances per precision: the one place they are set.

An output passes when every element satisfies |actual - expected| <= atol + rtol * |expected|
(numpy.allclose), the cosine similarity of the flattened output is at least min_cosine, and for a sequence
output with a padding mask, so is the worst row's cosine of its mean over the valid positions.
Values come from measurements recorded in README ("Parity tolerances").
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from pe_export.errors import BadInputError


@dataclass(frozen=True)
class Tolerance:
    atol: float
    rtol: float
    min_cosine: float

    def override(self, atol: float | None = None, rtol: float | None = None) -> Tolerance:
        return replace(self, atol=self.atol if atol is None else atol, rtol=self.rtol if rtol is None else rtol)

    def with_cosine_error(self, share: float) -> Tolerance:
        """This tolerance with ``share`` of the cosine error it allows (``1 - min_cosine``)."""
        return replace(self, min_cosine=1.0 - (1.0 - self.min_cosine) * share)


FP32_TOLERANCE = Tolerance(atol=1e-4, rtol=1e-4, min_cosine=0.99999)
FP16_TOLERANCE = Tolerance(atol=5e-2, rtol=5e-2, min_cosine=0.999)
# int8 is judged mainly by direction: element errors are on the order of the quantization scale.
INT8_TOLERANCE = Tolerance(atol=0.5, rtol=0.1, min_cosine=0.99)

# Static int8 fits its activation ranges and its weights' rounding to the inputs it chooses on, then chooses what
# stays int8 by the worst of them: the figure it reaches there is optimistic for inputs it never saw. It chooses
# against this share of the cosine error the target allows. Measured on all-MiniLM-L6-v2 (48 varied sentences
# given, 32 held out, target 0.999): choosing against the target itself, three runs met 0.99900-0.99909 where they
# chose and 0.99847 on the held-out part (refused); choosing against 0.9995, held-out 0.99935. Set after seeing that
# held-out figure, so 24 sentences written afterwards judge it too (benchmarks/data/varied_fresh.txt): 0.99931.
STATIC_INT8_CHOICE_SHARE = 0.5
# Dynamic int8 computes its activation ranges at run time, but which weights escalate (and the smoothing) is still
# fitted to the inputs it chooses on, where the chosen file then lands just over the target. It chooses against this
# share of the cosine error the target allows. Measured against the target itself: all-MiniLM-L6-v2 at 0.999 (48
# varied sentences chosen on, 32 held out) met 0.99902 where it chose and 0.99919 / 0.99909 held out (TFLite /
# ONNX), but 0.99891 / 0.99883 on 24 sentences written later (benchmarks/data/varied_fresh.txt): the gap to new text
# took 11% and 19% of the error allowed; random-init BERT-base at 0.9999 met 0.999900 where it chose and was refused
# held out (0.999896). A quarter of the error kept back; it costs speed (docs/quantization.md, "Choice margin").
DYNAMIC_INT8_CHOICE_SHARE = 0.75
# Full-integer TFLite chooses int8 activations against the every-int16 file, one sample at a time: int8 must keep this
# share of int16's margin over the target (pe_export/converters/tflite/mixed.py). Measured on all-MiniLM-L6-v2 (48
# varied
# sentences chosen on, 32 held out; every activation int16: held-out worst 0.99157, only 0.0016 over 0.99): keeping
# half, 58 of 379 activations int8, held-out 0.99087; keeping 80%, 2 of 379, 0.99157. Its 24 later sentences
# (benchmarks/data/varied_fresh.txt) lose alike: 0.97775 and 0.97854 on their worst, "Thanks a lot!". The margin is
# int16's to keep where it is this thin: a file the held-out gate refuses is no file.
INT16_MARGIN_KEPT = 0.8

DEFAULT_TOLERANCES: dict[str, Tolerance] = {
    "fp32": FP32_TOLERANCE,
    "fp16": FP16_TOLERANCE,
    "int8": INT8_TOLERANCE,
}


def tolerance_for(precision: str) -> Tolerance:
    if precision not in DEFAULT_TOLERANCES:
        raise BadInputError(f"unknown precision {precision!r}; expected one of: {', '.join(DEFAULT_TOLERANCES)}")
    return DEFAULT_TOLERANCES[precision]


def parse_overrides(values: tuple[str, ...] | list[str], flag: str) -> tuple[float | None, dict[str, float]]:
    """``--atol 1e-3`` sets every output, ``--atol logits:1e-3`` one output; returns (global, per output)."""
    overall: float | None = None
    per_output: dict[str, float] = {}
    for value in values:
        name, _, number = value.rpartition(":")
        try:
            parsed = float(number)
        except ValueError:
            raise BadInputError(
                f"{flag} {value!r} is not a number; expected {flag} 1e-3 or {flag} OUTPUT:1e-3"
            ) from None
        if not parsed >= 0:
            raise BadInputError(f"{flag} {value!r} is negative or NaN; expected a tolerance ≥ 0")
        if name:
            per_output[name] = parsed
        else:
            overall = parsed
    return overall, per_output
