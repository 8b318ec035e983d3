"""Accuracy-driven int8, the search both formats share: quantize everything; if that misses the target,
measure which weights cost the most accuracy per weight byte and keep the fewest of them in float that make
the target hold, found by bisection. Every step is a real quantized file run in a real runtime.

A weight's cost is measured by quantizing it alone (the rest float) and running the model. One run per
weight is 38 runs on MiniLM and 75 on BERT-base (a minute or more there), so weights that hold the same
place in the model's repeated block (a Transformer's query kernels, its feed-forward output kernels, …:
the same op and shape at the same offset in a period of the graph's order) are measured together, one
run per place, and share its cost. Measured on all-MiniLM-L6-v2, the cost of a place spans 300x (query
kernels least, feed-forward outputs most) and the layer within a place less; a one-pass estimate (each op's
own simulated int8 error) spanned 6x and ranked the six feed-forward outputs almost in reverse, so it was
not used.

The format supplies ``build(kept_float)`` (the quantized model with those weights left in float), ``run(model,
feeds)`` and each weight's kind (op and shape), the candidates in graph order. Weights are named by the
format's own handle (an ONNX node, a TFLite tensor).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pe_export.interrupts import raise_if_interrupted
from pe_export.parity.metrics import compare_output
from pe_export.parity.tolerances import Tolerance

Feeds = list[dict[str, np.ndarray]]
Masks = list[np.ndarray | None]
Build = Callable[[list[str]], Any]
Run = Callable[[Any, Feeds], list[dict[str, np.ndarray]]]
JudgeFeeds = Callable[[], tuple[Feeds, Masks]]
Probe = tuple[Feeds, Masks, list[dict[str, np.ndarray]]]  # feeds, their masks, the float model's outputs
PROBE_ROWS = 2  # single rows the places are measured on


@dataclass
class KeepFloatOutcome:
    model: Any  # the chosen quantized model, in the format's own form
    kept_float: list[str] = field(default_factory=list)  # weights left in float, most sensitive first
    candidates: int = 0  # weights that could be quantized
    cosine: float = 1.0  # worst output cosine of the result against the float model
    passed: bool = True  # the result meets the target on the judging inputs
    # weight → 1 - cosine with its place quantized alone (the rest float), shared among the place's weights
    sensitivity: dict[str, float] = field(default_factory=dict)
    runs: int = 0  # quantized files built and run by the search
    float_bytes: int = 0  # bytes the kept weights cost over int8 (4 B a value instead of 1)
    steps: list[str] = field(default_factory=list)  # what ran before the search (smoothing), for the note

    def notes(self, what: str) -> list[str]:
        before = "".join(f"{step}; " for step in self.steps)
        if not self.kept_float:
            return [
                f"int8: {before}all {self.candidates} {what} quantized, worst cosine {self.cosine:.6f} against "
                "the float model"
            ]
        names = ", ".join(_short(n) for n in self.kept_float[:4]) + (", …" if len(self.kept_float) > 4 else "")
        verdict = "meets" if self.passed else "still misses"
        return [
            f"int8: {before}{len(self.kept_float)} of {self.candidates} {what} kept in float, the most sensitive "
            f"per weight byte first ({names}; +{self.float_bytes:,} B over int8; {self.runs} quantized files "
            f"tried); worst cosine {self.cosine:.6f} against the float model, which {verdict} the target"
        ]


def keep_float_to_target(
    candidates: list[str],
    sizes: dict[str, int],
    build: Build,
    run: Run,
    feeds: Feeds,
    masks: Masks,
    tolerance: Tolerance,
    expected: list[dict[str, np.ndarray]],
    kinds: dict[str, Hashable],
    probe: Probe | None = None,
) -> KeepFloatOutcome:
    """The quantized model with the fewest weights in float that meets ``tolerance`` against
    ``expected`` (the float model's outputs on ``feeds``); every weight in float when nothing else does.
    ``candidates`` are in graph order; ``kinds`` gives each one's op and shape (``repeated_places``).
    ``probe`` (feeds, masks, the float model's outputs on them), a few single rows, is what the places are
    measured on: a ranking needs less than a verdict (BERT-base: 8 rows of 512 positions, 6 s a file), and
    every verdict is still taken on all of ``feeds``."""
    runs = 0

    def judge(kept: list[str], on: Probe | None = None) -> tuple[Any, float, bool]:
        nonlocal runs
        raise_if_interrupted()
        runs += 1
        model = build(kept)
        worst, ok = 1.0, True
        given, valid, wanted = on or (feeds, masks, expected)
        for got, want, mask in zip(run(model, given), wanted, valid, strict=True):
            for name in want:
                metrics = compare_output(name, got[name], want[name], tolerance, mask)
                pooled = 1.0 if metrics.pooled_cosine is None else metrics.pooled_cosine
                worst, ok = min(worst, metrics.cosine, pooled), ok and metrics.within_tolerance
        return model, worst, ok

    model, cosine, passed = judge([])
    outcome = KeepFloatOutcome(model, [], len(candidates), cosine, passed, runs=runs)
    if passed or not candidates:
        return outcome
    for place in repeated_places(candidates, kinds):  # each place's share of the error: quantized alone
        _, alone, _ = judge([other for other in candidates if other not in place], probe)
        for name in place:
            outcome.sensitivity[name] = (1.0 - alone) / len(place)
    # Keep float first where it buys the most accuracy per byte: a 47 MB embedding table kept float
    # costs what a dozen feed-forward kernels do.
    ranked = sorted(candidates, key=lambda n: -outcome.sensitivity[n] / max(sizes.get(n, 1), 1))
    trials: dict[int, tuple[Any, float, bool]] = {}

    def on_all(count: int) -> bool:
        trials[count] = judge(ranked[:count])
        return trials[count][2]

    # The probe's feeds are among ``feeds`` (TFLite: rows that compute alone as in their batch; ONNX: single-row
    # feeds themselves), so a count that fails on them fails on all: bisect on the probe first, then take the
    # verdicts on all from its count up (often one file).
    low = 0 if probe is None else _fewest(0, len(ranked), lambda count: judge(ranked[:count], probe)[2])
    count = _fewest(low, len(ranked), on_all, first=low if probe is not None else None)
    # only every weight in float passes: nothing is left quantized, and the note says so
    model, cosine, passed = trials[count] if count in trials else judge(ranked)
    outcome.model, outcome.kept_float, outcome.cosine, outcome.passed = model, ranked[:count], cosine, passed
    outcome.float_bytes = sum(sizes.get(n, 0) for n in outcome.kept_float) * 3 // 4
    outcome.runs = runs
    return outcome


def _fewest(low: int, high: int, passes: Callable[[int], bool], first: int | None = None) -> int:
    """The smallest count in [low, high] that ``passes`` (``high`` is taken to pass untried), by bisection;
    ``first`` is tried first."""
    if first is not None and low <= first < high:
        if passes(first):
            return first
        low = first + 1
    while low < high:
        middle = (low + high) // 2
        if passes(middle):
            high = middle
        else:
            low = middle + 1
    return low


def repeated_places(candidates: list[str], kinds: dict[str, Hashable]) -> list[list[str]]:
    """The candidates (graph order) grouped by their place in the model's repeated block: the longest span
    in which every weight's kind equals the kind one period later, for the period that covers the most
    weights in two or more repeats; the weight at offset i of each repeat is one place. Weights outside
    the span (embeddings, a pooler) are places of their own; with no repeat, every weight is."""
    order = [kinds.get(name, name) for name in candidates]
    best = (0, 0, 0)  # (covered, period, start)
    for period in range(1, len(order) // 2 + 1):
        start = 0
        while start + period < len(order):
            end = start
            while end + period < len(order) and order[end] == order[end + period]:
                end += 1
            covered = end - start + period if end > start else 0  # the span and its last repeat
            if covered >= 2 * period and covered > best[0]:
                best = (covered, period, start)
            start = end + 1
    covered, period, start = best
    if not covered:
        return [[name] for name in candidates]
    places: dict[int, list[str]] = {}
    singles = []
    for index, name in enumerate(candidates):
        if start <= index < start + covered:
            places.setdefault((index - start) % period, []).append(name)
        else:
            singles.append([name])
    return list(places.values()) + singles


def batch_rows(feed: dict[str, np.ndarray]) -> int:
    """Rows in a feed's batch (its first input's leading axis; 1 for a scalar or an empty feed)."""
    first = next(iter(feed.values()), None)
    return int(first.shape[0]) if first is not None and np.ndim(first) else 1


def probe_rows(batch_rows: list[int], limit: int = PROBE_ROWS) -> list[tuple[int, int]]:
    """(batch, row) of at most ``limit`` single rows to measure places on, taken from the batches in turn
    (batches of one are left out: a probe is rows to spare)."""
    order = [(b, r) for r in range(max(batch_rows, default=0)) for b, n in enumerate(batch_rows) if n > 1 and r < n]
    return order[:limit]


def with_single_rows(feeds: Feeds, masks: Masks) -> tuple[Feeds, Masks]:
    """The batches as given, and each of their rows alone (batch 1, as devices run): dynamic
    quantization takes one range per tensor over the whole batch (onnxruntime), so a row's result
    depends on the rows beside it. Other compositions still differ: an int8 MiniLM that met atol 0.5
    on 8 sentences both in one batch and one by one erred 0.53 (one element of 51,072) in batches of 4."""
    all_feeds, all_masks = list(feeds), list(masks)
    for feed, mask in zip(feeds, masks, strict=True):
        rows = batch_rows(feed)
        if rows < 2:
            continue
        for row in range(rows):
            all_feeds.append({name: array[row : row + 1] for name, array in feed.items()})
            all_masks.append(None if mask is None else mask[row : row + 1])
    return all_feeds, all_masks


def _short(name: str) -> str:
    parts = [p for p in name.split("/") if p not in ("StatefulPartitionedCall", "Tensordot", "einsum")]
    return "/".join(parts[-2:])
