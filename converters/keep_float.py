"""Accuracy-driven int8, the search both formats share: quantize everything; if that misses the target,
measure each quantized weight's share of the error and keep the fewest, most sensitive per weight byte,
in float until the target holds. Every step is a real quantized file run in a real runtime.

The format supplies two callables: ``build(kept_float)`` makes the quantized model with those weights
left in float, ``run(model, feeds)`` runs it. Weights are named by the format's own handle (an ONNX
node, a TFLite tensor).
"""

from __future__ import annotations

from collections.abc import Callable
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


@dataclass
class KeepFloatOutcome:
    model: Any  # the chosen quantized model, in the format's own form
    kept_float: list[str] = field(default_factory=list)  # weights left in float, most sensitive first
    candidates: int = 0  # weights that could be quantized
    cosine: float = 1.0  # worst output cosine of the result against the float model
    passed: bool = True  # the result meets the target on the judging inputs
    sensitivity: dict[str, float] = field(default_factory=dict)  # weight → 1 - cosine when quantized alone
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
            f"per weight byte first ({names}; +{self.float_bytes:,} B over int8); worst cosine "
            f"{self.cosine:.6f} against the float model, which {verdict} the target"
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
) -> KeepFloatOutcome:
    """The quantized model with the fewest weights in float that meets ``tolerance`` against
    ``expected`` (the float model's outputs on ``feeds``); every weight in float when nothing else does."""

    def judge(kept: list[str]) -> tuple[Any, float, bool]:
        raise_if_interrupted()
        model = build(kept)
        worst, ok = 1.0, True
        for got, want, mask in zip(run(model, feeds), expected, masks, strict=True):
            for name in want:
                metrics = compare_output(name, got[name], want[name], tolerance, mask)
                pooled = 1.0 if metrics.pooled_cosine is None else metrics.pooled_cosine
                worst, ok = min(worst, metrics.cosine, pooled), ok and metrics.within_tolerance
        return model, worst, ok

    model, cosine, passed = judge([])
    outcome = KeepFloatOutcome(model, [], len(candidates), cosine, passed)
    if passed or not candidates:
        return outcome
    for name in candidates:  # each weight's share of the error: quantized alone
        _, alone, _ = judge([other for other in candidates if other != name])
        outcome.sensitivity[name] = 1.0 - alone
    # Keep float first where it buys the most accuracy per byte: a 47 MB embedding table kept float
    # costs what a dozen feed-forward kernels do.
    ranked = sorted(candidates, key=lambda n: -outcome.sensitivity[n] / max(sizes.get(n, 1), 1))
    low, high = 0, len(ranked)  # keeping `high` weights in float passes (all float does); find the fewest
    best: tuple[int, tuple[Any, float, bool]] | None = None
    while low < high:
        middle = (low + high) // 2
        trial = judge(ranked[:middle])
        if trial[2]:
            high, best = middle, (middle, trial)
        else:
            low = middle + 1
    if best is None:  # only every weight in float passes: nothing is left quantized, and the note says so
        count, (model, cosine, passed) = len(ranked), judge(ranked)
    else:
        count, (model, cosine, passed) = best
    outcome.model, outcome.kept_float, outcome.cosine, outcome.passed = model, ranked[:count], cosine, passed
    outcome.float_bytes = sum(sizes.get(n, 0) for n in outcome.kept_float) * 3 // 4
    return outcome


def with_single_rows(feeds: Feeds, masks: Masks) -> tuple[Feeds, Masks]:
    """The batches as given, and each of their rows alone (batch 1, as devices run): dynamic
    quantization takes one range per tensor over the whole batch (onnxruntime), so a row's result
    depends on the rows beside it. Other compositions still differ: an int8 MiniLM that met atol 0.5
    on 8 sentences both in one batch and one by one erred 0.53 (one element of 51,072) in batches of 4."""
    all_feeds, all_masks = list(feeds), list(masks)
    for feed, mask in zip(feeds, masks, strict=True):
        rows = next(iter(feed.values())).shape[0] if feed and np.ndim(next(iter(feed.values()))) else 1
        if rows < 2:
            continue
        for row in range(rows):
            all_feeds.append({name: array[row : row + 1] for name, array in feed.items()})
            all_masks.append(None if mask is None else mask[row : row + 1])
    return all_feeds, all_masks


def _short(name: str) -> str:
    parts = [p for p in name.split("/") if p not in ("StatefulPartitionedCall", "Tensordot", "einsum")]
    return "/".join(parts[-2:])
