"""The longest sequence the float32 reference takes, from the model itself (TensorFlow side).

A dynamic-length encoder with a table read by position serves as many tokens as that table has rows, less any
offset its position ids start at: RoBERTa, XLM-R, CamemBERT and MPNet count positions from ``pad_token_id + 1``
(a 514-row table serves 512 tokens). The offset is not in any name or config a SavedModel keeps, so it is
measured: the reference is run on one full-length row of generated ids at the table's length, and where it refuses,
at shorter lengths until it runs. Verification, int8 calibration and golden bundles stay inside the limit, and a
``--seq-len`` past it is refused in one line that names it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pe_export.constants import MAX_CHECKED_POSITIONS
from pe_export.inputs import generate_inputs
from pe_export.native import import_tensorflow
from pe_export.specs import any_dynamic_length

if TYPE_CHECKING:
    from pe_export.tables.pipeline import PreparedGraph

# Offsets tried one by one before a bisection: the field's are 0 (BERT) and 2 (RoBERTa's pad id 1, plus one).
_NEAR_OFFSETS = 4


@dataclass(frozen=True)
class SequenceLimit:
    """``tokens``: the longest sequence the reference runs; ``rows``: its position table's rows."""

    tokens: int
    rows: int

    @property
    def offset(self) -> int:
        return self.rows - self.tokens

    def describe(self) -> str:
        table = f"its position table has {self.rows} rows"
        return (
            f"{self.tokens} tokens ({table}, position ids counted from {self.offset})"
            if self.offset
            else (f"{self.tokens} tokens ({table})")
        )


def sequence_limit(frozen: Any, rows: int | None, bounds: dict[str, int]) -> SequenceLimit | None:
    """The limit of ``frozen``'s signature (a FrozenSignature of dynamic length) whose tables have ``rows``
    positions; None without such a table, or where it refuses even one token (for another reason than its
    length: verification says which). ``bounds``: the integer inputs' bounds (generated ids stay inside)."""
    if rows is None:
        return None
    if _runs(frozen, rows, bounds):
        return SequenceLimit(rows, rows)
    for length in range(rows - 1, max(0, rows - 1 - _NEAR_OFFSETS), -1):
        if _runs(frozen, length, bounds):
            return SequenceLimit(length, rows)
    if not _runs(frozen, 1, bounds):
        return None  # refused for another reason than its length (verification then says which)
    low, high = 1, rows - 1 - _NEAR_OFFSETS  # low runs, high does not
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if _runs(frozen, middle, bounds) else (low, middle)
    return SequenceLimit(low, rows)


def _runs(frozen: Any, length: int, bounds: dict[str, int]) -> bool:
    """Whether the reference computes full rows of ``length`` tokens (no padding: the highest position ids a row of
    that length reaches). Ids equal to the model's pad id take no position in RoBERTa-likes, so besides a random
    row each table-indexing input is given a row of its highest id and one of its middle id: a pad id, unknown
    here, cannot be all of them."""
    tf = import_tensorflow()
    feed = generate_inputs(frozen.specs, bounds, batch=3, seq_len=length, seed=0, padded=False)
    for name, bound in bounds.items():
        if name in feed and feed[name].ndim == 2 and feed[name].shape[0] == 3:
            feed[name][1] = bound - 1
            feed[name][2] = max(bound // 2, 0)
    try:
        frozen.signature(**{name: tf.constant(value) for name, value in feed.items()})
    except tf.errors.InvalidArgumentError:  # a position id past the table
        return False
    return True


def model_limit(loaded: Any, frozen: Any) -> SequenceLimit | None:
    """The longest sequence the reference takes where a table read by position bounds it (``sequence_limit``)."""
    from pe_export.savedmodel import input_bounds
    from pe_export.tables.pipeline import position_rows

    if not any_dynamic_length(frozen.specs):
        return None
    return sequence_limit(frozen, position_rows(loaded, frozen), input_bounds(frozen))


def checked_length(loaded: Any, frozen: Any, prepared: PreparedGraph | None = None) -> int | None:
    """Positions to check a dynamic-length model over: every position its tables serve (their rows less the
    offset its position ids start at, pe_export/lengths.py), up to MAX_CHECKED_POSITIONS. None for a fixed length
    or without such tables.

    Export verification, int8 calibration and golden bundles use it: a table rebuild that went wrong
    at row 300, or int8 ranges calibrated on positions 0-15 only, must not pass on 16 positions.
    """
    if not any_dynamic_length(frozen.specs):
        return None
    return checked_positions(model_limit(loaded, frozen), prepared)


def checked_positions(limit: SequenceLimit | None, prepared: PreparedGraph | None = None) -> int | None:
    """checked_length for a model of this ``limit`` (a dynamic length), its tables as ``prepared`` rebuilt them."""
    length = prepared.position_length() if prepared is not None else (limit.rows if limit else None)
    if not length:
        return None
    return min(length - (limit.offset if limit else 0), MAX_CHECKED_POSITIONS)
