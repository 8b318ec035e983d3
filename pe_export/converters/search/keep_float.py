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
not used. Nor is a layer-wise pass (`parity --layers` on the all-int8 file, benchmarks/int8_sensitivity.py): on
MiniLM its layers' relative errors rank the 7 places against their measured costs (Spearman -0.43; growth -0.29),
and it is no cheaper (3.7 s with the reference's activations, against 3.0 s for the 7 per-place files).

The format supplies ``build(kept_float)`` (the quantized model with those weights left in float), ``run(model,
feeds)`` and each weight's kind (op and shape), the candidates in graph order. Weights are named by the
format's own handle (an ONNX node, a TFLite tensor).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from pe_export.errors import BadInputError, ParityError
from pe_export.interrupts import raise_if_interrupted
from pe_export.parity.metrics import compare_output
from pe_export.parity.tolerances import Tolerance

Feeds = list[dict[str, np.ndarray]]
Masks = list[np.ndarray | None]
Outputs = list[dict[str, np.ndarray]]
Build = Callable[[list[str]], Any]
Run = Callable[[Any, Feeds], Outputs]
Unit = tuple[int, int | None]  # (feed, row of it alone) or (feed, None): the whole feed
CHOSEN_ON = "on the inputs it chose on"  # the held-out figure is the export's parity (pe_export/holdout.py)
Score = tuple[bool, float]  # (within the tolerance, worst cosine): sorted, failing and lowest first
PROBE_ROWS = 2  # single rows the places are measured on, at first


@dataclass(frozen=True)
class SearchKind:
    """What a search keeps candidates out of, in the words of its notes and its refusal."""

    name: str  # the notes' label: int8, float16, int8 activations
    kept_as: str = "float"  # what a kept candidate computes in
    value_bytes: int = 1  # bytes a value takes in it (a kept value's cost is counted over these)
    done: str = "quantized"  # every candidate, when none is kept
    files: str = "quantized"  # the candidate files the search ran
    refused: str = "int8: no file with an int8 weight"  # the refusal's subject
    everything: str = "every weight int8"  # the file with no candidate kept
    instead: str = "export in float (no --quantize, or --quantize float16)"


INT8_SEARCH = SearchKind("int8")
INT8_ACTIVATIONS_SEARCH = SearchKind("int8 activations")
FLOAT16_SEARCH = SearchKind(
    "float16",
    kept_as="float32",
    value_bytes=2,
    done="in float16",
    files="float16",
    refused="float16: no file with a float16 node",
    everything="every node in float16",
    instead="export in float32 (no --quantize, or --quantize weight-float16 for float16 storage with float32 "
    "arithmetic)",
)


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
    asked: list[str] = field(default_factory=list)  # kept float because --keep-float named them (among kept_float)
    verdicts: int = 0  # of which run on every judging input (the others on the probe's few rows)
    float_bytes: int = 0  # bytes the kept weights cost over the mode (int8: 1 B a value; kept: ``kept_bytes``)
    steps: list[str] = field(default_factory=list)  # what ran before the search (smoothing), for the note
    kind: SearchKind = INT8_SEARCH  # what the kept weights are kept out of: int8, or float16's arithmetic
    kept_bytes: int = 4  # bytes a kept weight's value is stored in: 4 (float32), 2 (float16 storage, cast on load)
    weight_bytes: dict[str, int] = field(default_factory=dict)  # each candidate's weight, float32 bytes
    ranked: list[str] = field(default_factory=list)  # the search's order (most cost per byte first); [] unmeasured
    # where the format moves the weights it keeps to a finer integer product instead of float (ONNX's block-wise
    # int8): what the notes call it; "" for float. --keep-float's weights stay float.
    escalated_to: str = ""
    # searches whose choice this one started from (static int8: the weights kept float16 before the activations
    # were chosen); their notes and records come first
    before: list[KeepFloatOutcome] = field(default_factory=list)
    # what the ranking divides each place's cost by: the weight's bytes, or a format's own unit (``rank_costs``)
    ranked_per: str = "weight byte"

    def record(self, what: str) -> dict[str, Any]:
        """What the search did, for the export's --json: its verdict, and each candidate weight ranked as the
        search ranked it (measured cost per weight byte, highest first; ``cost`` is 1 - cosine with the weight's
        place alone quantized, shared among the place's weights), each marked kept or not. No ranking where
        the all-quantized file met the target: nothing was measured."""
        kept, ranked = set(self.kept_float), self.ranked
        return {
            "mode": self.kind.name,
            "candidates": self.candidates,
            "what": what,
            "kept_float": list(self.kept_float),
            "kept_as": self.escalated_to or self.kind.kept_as,
            "asked": list(self.asked),
            "worst_cosine_chosen_on": self.cosine,
            "passed_where_chosen": self.passed,
            "files_tried": self.runs,
            "float_bytes": self.float_bytes,
            "ranking": [
                {
                    "name": name,
                    "cost": self.sensitivity[name],
                    "weight_bytes": self.weight_bytes.get(name, 0),
                    "kept": name in kept,
                }
                for name in ranked
            ],
            "ranking_note": (
                f"most accuracy per {self.ranked_per} first, measured one place of the repeated block at a time"
                if ranked
                else "not measured: every candidate quantized met the target"
            ),
        }

    def notes(self, what: str) -> list[str]:
        kind = self.kind
        done, files, kept_as = kind.done, kind.files, kind.kept_as
        stored = " (float16 storage, float32 arithmetic)" if kind.value_bytes < self.kept_bytes == 2 else ""
        searched_as = self.escalated_to or kept_as
        before = "".join(f"{step}; " for step in self.steps)
        if self.asked:
            before += f"{len(self.asked)} kept in {kept_as} as --keep-float asked; "
        if not self.kept_float:
            return [
                f"{self.kind.name}: {before}all {self.candidates} {what} {done}, worst cosine {self.cosine:.6f} "
                f"against the float model {CHOSEN_ON}"
            ]
        names = ", ".join(short_name(n) for n in self.kept_float[:4]) + (", …" if len(self.kept_float) > 4 else "")
        verdict = "meets" if self.passed else "still misses"
        return [
            f"{self.kind.name}: {before}{len(self.kept_float)} of {self.candidates} {what} kept in "
            f"{searched_as}{'' if self.escalated_to else stored}, "
            f"the most sensitive per {self.ranked_per} first ({names}; +{self.float_bytes:,} B over {self.kind.name}; "
            f"{self.runs} {files} files tried, {self.verdicts} on every input); worst cosine {self.cosine:.6f} "
            f"against the float model {CHOSEN_ON}, which {verdict} the target"
        ]


@dataclass(frozen=True)
class ChoiceSamples:
    """What an accuracy-driven choice (which weights stay float, ranges, smoothing, float16 islands) is made on:
    the samples, each one's valid mask (None: every position), the outputs the masks apply to (None: by shape),
    and the tolerance the choice must meet. Never the samples it is judged on afterwards (pe_export/holdout.py:
    the export's verification judges the held-out part)."""

    feeds: Feeds
    tolerance: Tolerance
    valid: Masks | None = None
    sequence_outputs: set[str] | None = None

    @property
    def masks(self) -> Masks:
        return list(self.valid) if self.valid is not None else [None] * len(self.feeds)

    def judging(self, expected: Outputs, *, rows_alone: bool = False) -> Judging:
        """What every candidate is scored on, given the float model's outputs on these samples."""
        return Judging(self.feeds, self.masks, expected, rows_alone, self.sequence_outputs)


@dataclass
class Judging:
    """What every candidate is judged on: ``feeds`` and their valid ``masks``, ``expected`` (the float model's
    outputs on them), and whether each row of a batch computes alone as it does in its batch (``rows_alone``:
    TFLite's hybrid kernels over a dynamic batch axis), so that a row can be run by itself in the probe. Where
    it does not (onnxruntime's one range per call), the format adds the batches' rows as feeds of their own."""

    feeds: Feeds
    masks: Masks
    expected: Outputs
    rows_alone: bool = False
    sequence_outputs: set[str] | None = None  # those the masks apply to (None: by shape)
    # units whose worst cosine must be at least this instead of the tolerance's (pe_export/converters/tflite/mixed.py:
    # what the
    # file with every candidate escalated reaches there, less what the search may spend)
    floors: dict[Unit, float] = field(default_factory=dict)
    # floored units where the escalated file already puts elements over the tolerance: no element may err more
    # than this instead
    max_abs: dict[Unit, float] = field(default_factory=dict)

    def units(self) -> list[Unit]:
        """What a verdict is scored on, one score each: the feeds, or their rows where rows compute alone."""
        units: list[Unit] = []
        for index, (feed, want) in enumerate(zip(self.feeds, self.expected, strict=True)):
            rows = batch_rows(feed)
            split = self.rows_alone and all(np.ndim(v) and v.shape[0] == rows for v in want.values())
            units.extend([(index, row) for row in range(rows)] if split else [(index, None)])
        return units

    def score(self, unit: Unit, got: dict, want: dict, mask: np.ndarray | None, tolerance: Tolerance) -> Score:
        """(verdict, worst cosine) of ``unit``'s outputs: by ``tolerance``, its cosine the unit's floor where it has
        one, its elements within ``max_abs`` instead of the tolerance's where that is given."""
        floor = self.floors.get(unit)
        if floor is not None:
            tolerance = replace(tolerance, min_cosine=floor)
        ok, cosine, worst_abs, _ = feed_metrics(got, want, mask, tolerance, self.sequence_outputs)
        allowed = self.max_abs.get(unit)
        if floor is not None and allowed is not None:
            return cosine >= floor and worst_abs <= allowed, cosine
        return ok, cosine

    def single(self, unit: Unit) -> bool:
        return unit[1] is not None or batch_rows(self.feeds[unit[0]]) == 1

    def of(self, units: list[Unit]) -> tuple[Feeds, Masks, Outputs]:
        """Feeds, valid masks and expected outputs of ``units``, each unit a feed of its own."""
        parts = [self.part(self.feeds, unit) for unit in units]
        return [p[0] for p in parts], [p[2] for p in parts], [p[1] for p in parts]

    def part(self, outputs: Feeds | Outputs, unit: Unit) -> tuple[dict, dict, np.ndarray | None]:
        """``unit``'s slice of ``outputs`` (one entry per feed, or the feeds themselves), its expected
        outputs and its valid mask."""
        index, row = unit
        got, want, mask = outputs[index], self.expected[index], self.masks[index]
        if row is None:
            return got, want, mask
        return (
            {k: v[row : row + 1] for k, v in got.items()},
            {k: v[row : row + 1] for k, v in want.items()},
            None if mask is None else mask[row : row + 1],
        )


def keep_float_to_target(
    candidates: list[str],
    sizes: dict[str, int],
    build: Build,
    run: Run,
    judging: Judging,
    tolerance: Tolerance,
    kinds: Mapping[str, Hashable],
    asked: list[str] | None = None,
    kind: SearchKind = INT8_SEARCH,
    kept_bytes: int = 4,
    escalated_to: str = "",
    costs_over_escalated: bool = False,
    rank_costs: tuple[str, dict[str, int]] | None = None,
) -> KeepFloatOutcome:
    """The quantized model with the fewest weights in float that meets ``tolerance`` against the float
    model on ``judging``; every weight in float when nothing else does. ``candidates`` are in graph order;
    ``kinds`` gives each one's op and shape (``repeated_places``). The ranking is by measured cost per weight byte, or
    per the unit ``rank_costs`` names (its name, each candidate's count of it) where escalating costs something else.

    A verdict is on every unit (``Judging.units``: each row alone where rows compute alone, as a device runs
    batch 1; else each feed, the batches' rows among them as feeds of their own) and costly (BERT-base: 8 rows
    of 512 positions, 6 s a file); a ranking needs less: places are measured, and counts bisected, on a probe:
    the ``PROBE_ROWS`` units that the all-int8 model got worst. A count that fails on the probe fails its
    verdict (the probe's units are among those, scored alike), so the count the probe finds goes to a verdict;
    where that fails, the unit it failed worst on joins the probe and the bisection goes on above that count.
    The worst rows stay the worst as weights go back to float: at BERT-base 17 files of which 2 verdicts, in
    both formats, where a probe of the first two rows took 21 files (verdicts from its count up, by bisection)."""
    runs = verdicts = 0
    units = judging.units()
    asked = list(asked or [])  # --keep-float: float in every candidate, out of the search
    candidates = [name for name in candidates if name not in set(asked)]
    if not candidates:
        raise BadInputError("--keep-float names every int8 weight of this file: nothing would be int8 (name fewer)")

    def score(unit: Unit, got: dict, want: dict, mask: np.ndarray | None) -> Score:
        return judging.score(unit, got, want, mask, tolerance)

    def judge(kept: list[str], probe: list[Unit] | None = None) -> tuple[Any, float, bool, dict[Unit, Score]]:
        """The model with ``kept`` in float, its worst cosine and verdict on every input (or on the probe's
        units), and each unit's score."""
        nonlocal runs, verdicts
        raise_if_interrupted()
        runs += 1
        model = build(asked + kept)
        if probe is not None:
            feeds, masks, expected = judging.of(probe)
            got = run(model, feeds)
            scores = {u: score(u, g, w, m) for u, g, m, w in zip(probe, got, masks, expected, strict=True)}
            return model, min(c for _, c in scores.values()), all(ok for ok, _ in scores.values()), scores
        verdicts += 1
        outputs = run(model, judging.feeds)
        scores = {unit: score(unit, *judging.part(outputs, unit)) for unit in units}
        return model, min(c for _, c in scores.values()), all(ok for ok, _ in scores.values()), scores

    model, cosine, passed, scores = judge([])
    outcome = KeepFloatOutcome(
        model,
        list(asked),
        len(candidates) + len(asked),
        cosine,
        passed,
        runs=runs,
        verdicts=verdicts,
        asked=asked,
        kind=kind,
        kept_bytes=kept_bytes,
        escalated_to=escalated_to,
        weight_bytes={name: sizes.get(name, 0) for name in [*asked, *candidates]},
    )
    # sizes are float32 bytes: a kept value costs kept_bytes where the kind's costs 1 (int8) or 2 (float16)
    over = kept_bytes - kind.value_bytes
    outcome.float_bytes = sum(sizes.get(n, 0) for n in asked) * over // 4
    if passed or not candidates:
        return outcome
    singles = [unit for unit in units if judging.single(unit)] or units
    probe = sorted(singles, key=lambda unit: scores[unit])[:PROBE_ROWS]  # failing first, then the lowest cosine
    # A place's cost is what it loses against the file with every candidate kept: float (1.0), or where that file
    # is itself lossy (``costs_over_escalated``: full-integer's every-int16 file), that file's cosine on the probe
    baseline = judge(candidates, probe)[1] if costs_over_escalated else 1.0
    outcome.sensitivity = _place_costs(candidates, kinds, lambda kept: judge(kept, probe)[1], baseline)
    # Keep float first where it buys the most accuracy per byte: a 47 MB embedding table kept float
    # costs what a dozen feed-forward kernels do.
    outcome.ranked_per, costs = rank_costs or ("weight byte", sizes)  # what escalating one costs, in that unit
    outcome.ranked = ranked = sorted(candidates, key=lambda n: -outcome.sensitivity[n] / max(costs.get(n, 1), 1))
    low, chosen = 0, None
    while chosen is None:
        count = _fewest(low, len(ranked), lambda count: judge(ranked[:count], probe)[2])
        if count == len(ranked) and not escalated_to:  # nothing left int8: that is a float file, not an int8 one
            raise ParityError(_nothing_meets(kind, tolerance, outcome.cosine, len(ranked)))
        model, cosine, passed, scores = judge(ranked[:count])
        if count == len(ranked) and not passed:  # every weight escalated still misses: the format decides
            raise ParityError(_nothing_meets(kind, tolerance, outcome.cosine, len(ranked)))
        if passed:
            chosen = count
            continue
        rest = [unit for unit in units if unit not in probe]
        if rest:
            probe.append(min(rest, key=lambda unit: scores[unit]))
        low = count + 1
    outcome.model, outcome.kept_float, outcome.cosine, outcome.passed = model, asked + ranked[:chosen], cosine, passed
    outcome.float_bytes = sum(sizes.get(n, 0) for n in outcome.kept_float) * over // 4
    outcome.runs, outcome.verdicts = runs, verdicts
    return outcome


def _place_costs(
    candidates: list[str],
    kinds: Mapping[str, Hashable],
    cosine_with_float: Callable[[list[str]], float],
    baseline: float = 1.0,
) -> dict[str, float]:
    """Each candidate's share of its place's cost: ``baseline`` (the cosine with every candidate kept) less the
    worst cosine with that place alone quantized (every other candidate kept), split evenly among the place's
    weights; never below 0."""
    costs = {}
    for place in repeated_places(candidates, kinds):
        alone = cosine_with_float([other for other in candidates if other not in place])
        costs.update({name: max(baseline - alone, 0.0) / len(place) for name in place})
    return costs


def _nothing_meets(kind: SearchKind, tolerance: Tolerance, cosine: float, count: int) -> str:
    target = f"cosine >= {tolerance.min_cosine:g}, atol {tolerance.atol:g}, rtol {tolerance.rtol:g}"
    return (
        f"{kind.refused} meets the target ({target}) on the inputs it chooses on: {kind.everything} reached "
        f"{cosine:.6f}, and no count short of all {count} kept in {kind.kept_as} passes; nothing was written. Ask "
        f"for less (--min-cosine), or {kind.instead}"
    )


def feed_score(
    got: dict, want: dict, mask: np.ndarray | None, tolerance: Tolerance, sequence: set[str] | None
) -> Score:
    """(verdict, worst cosine) of one feed's outputs: the cosine of each output and of its mean-pooled rows."""
    ok, worst, _, _ = feed_metrics(got, want, mask, tolerance, sequence)
    return ok, worst


def feed_metrics(
    got: dict, want: dict, mask: np.ndarray | None, tolerance: Tolerance, sequence: set[str] | None
) -> tuple[bool, float, float, int]:
    """``feed_score``'s verdict and worst cosine, the largest element error of any output, and how many elements
    are over the tolerance's atol/rtol."""
    worst, ok, worst_abs, over = 1.0, True, 0.0, 0
    for name in want:
        metrics = compare_output(
            name, got[name], want[name], tolerance, mask, None if sequence is None else name in sequence
        )
        pooled = 1.0 if metrics.pooled_cosine is None else metrics.pooled_cosine
        worst, ok = min(worst, metrics.cosine, pooled), ok and metrics.within_tolerance
        worst_abs, over = max(worst_abs, metrics.max_abs), over + metrics.violations
    return ok, worst, worst_abs, over


def _fewest(low: int, high: int, passes: Callable[[int], bool]) -> int:
    """The smallest count in [low, high] that ``passes`` (``high`` is taken to pass untried), by bisection."""
    while low < high:
        middle = (low + high) // 2
        if passes(middle):
            high = middle
        else:
            low = middle + 1
    return low


def repeated_places(candidates: list[str], kinds: Mapping[str, Hashable]) -> list[list[str]]:
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


def resolve_asked(
    requested: tuple[str, ...], candidates: list[str], what: str = "int8 weight", option: str = "--keep-float"
) -> list[str]:
    """The candidates ``--keep-float`` names: a weight's own name (a TFLite tensor, an ONNX node), or a path of
    whole name segments in it (a Keras layer path, ``transformer_layer_2/feedforward_output_dense``; the ``_1``
    Keras appends to a scope in the traced graph, and its numbering of a name used before, are allowed). A name
    that matches none is refused with names that would."""
    chosen: list[str] = []
    for wanted in requested:
        found = [c for c in candidates if c == wanted or _layer_path_in(wanted, c.split("#")[0])]
        if not found:
            examples = ", ".join(sorted({short_name(c) for c in candidates})[:6])
            raise BadInputError(
                f"{option} {wanted!r} names no {what} of this file; expected its name or a layer path in one "
                f"({len(candidates)} of them, e.g. {examples})"
            )
        chosen.extend(c for c in found if c not in chosen)
    return chosen


def _layer_path_in(path: str, name: str) -> bool:
    """Whether ``path``'s segments appear in a row among ``name``'s, each as it is or with ``_<n>`` suffixes (Keras
    numbers a second layer of a name in the process, ``softmax_2``, and the SavedModel's trace adds ``_1``)."""
    wanted, parts = [part for part in path.split("/") if part], name.split("/")

    def same(want: str, part: str) -> bool:
        return part == want or re.fullmatch(re.escape(want) + r"(?:_\d+)+", part) is not None

    return bool(wanted) and any(
        all(same(w, p) for w, p in zip(wanted, parts[start : start + len(wanted)], strict=True))
        for start in range(len(parts) - len(wanted) + 1)
    )


def short_name(name: str) -> str:
    """A graph name's last two scopes, without the wrappers every traced name carries."""
    parts = [p for p in name.split("/") if p not in ("StatefulPartitionedCall", "Tensordot", "einsum")]
    return "/".join(parts[-2:])


def with_choice_margin(target: Tolerance, share: float, fitted: str) -> tuple[Tolerance, str]:
    """The tolerance a search chooses against (``share`` of the cosine error ``target`` allows) and the note that
    says so; ``fitted``: what the search fits to the inputs it chooses on, which reads better there than on new
    ones."""
    chosen = target.with_cosine_error(share)
    return chosen, (
        f"chosen against cosine >= {chosen.min_cosine:g} ({share:g} of the error the target {target.min_cosine:g} "
        f"allows: {fitted} fitted to these inputs read better there than on new ones)"
    )


def cut_back_after_float(
    floated: KeepFloatOutcome,
    escalatable: list[str],
    cut_back: Callable[[list[str], list[str]], KeepFloatOutcome],
    escalated_bytes: Callable[[list[str]], int],
) -> KeepFloatOutcome:
    """After ``floated``, a float search run with every other of ``escalatable`` escalated (TFLite's FCs in groups,
    ONNX's MatMuls block-wise): the fewest of those left escalated, by ``cut_back(fixed float, rest)``, the float
    search in ``before``. ``floated`` itself where none is left, or where the cut-back finds no file (not expected:
    every one of them escalated is the file that met the target); ``escalated_bytes``: what escalating names adds."""
    fixed = list(floated.kept_float)
    rest = [name for name in escalatable if name not in set(fixed)]
    if not rest:
        return floated
    try:
        outcome = cut_back(fixed, rest)
    except ParityError:
        floated.float_bytes += escalated_bytes(rest)
        return floated
    outcome.before = [floated]
    outcome.float_bytes = escalated_bytes(outcome.kept_float)
    return outcome
