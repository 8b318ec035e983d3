"""TFLite FCs in groups of input channels: what the file computes (against an emulation in numpy of the hybrid
kernel's per-row quantization), what it costs, and the dynamic-int8 search that moves weights to groups first."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pe_export.converters.search.keep_float import ChoiceSamples
from pe_export.parity.tolerances import Tolerance
from tests.helpers import float_and_dynamic_range

WIDTH, OUTPUTS, SIDE = 192, 96, 32  # x: 4 groups of 48 input channels; relu(x·W): 2


@pytest.mark.parametrize(
    ("inputs", "groups"), [(384, 8), (1536, 32), (768, 16), (1024, 16), (100, 2), (96, 2), (64, 1), (48, 1)]
)
def test_group_count_takes_the_narrowest_equal_width_of_48_or_more(inputs: int, groups: int) -> None:
    from pe_export.converters.tflite.groups import group_count

    assert group_count(inputs) == groups


@pytest.fixture(scope="module")
def wide_files() -> tuple[bytes, bytes]:
    """(float32 file, the converter's dynamic-range file) of z = x·W2, u = relu(x·W)·V, x 192 channels wide."""
    from pe_export.native import import_tensorflow

    tf = import_tensorflow()
    rng = np.random.default_rng(11)
    shapes = ((WIDTH, OUTPUTS), (OUTPUTS, OUTPUTS), (WIDTH, SIDE))
    w, v, w2 = (tf.constant(rng.normal(size=s).astype(np.float32)) for s in shapes)

    class Model(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None, WIDTH], tf.float32, name="x")])
        def __call__(self, x: tf.Tensor) -> dict[str, tf.Tensor]:
            return {"z": tf.matmul(x, w2), "u": tf.matmul(tf.nn.relu(tf.matmul(x, w)), v)}

    return float_and_dynamic_range(Model())


def group_feeds(seed: int) -> list[dict[str, np.ndarray]]:
    """Rows with one loud group of channels, a different one row by row (as a trained encoder's massive activations
    sit at some tokens only): one range per row is set by the loud group and the quiet ones lose their precision,
    and smoothing, one scale per channel for every row, cannot tell the rows apart."""
    rng = np.random.default_rng(seed)
    feeds = []
    for _ in range(4):
        x = rng.normal(size=(12, WIDTH)).astype(np.float32)
        for row, loud in enumerate(rng.integers(0, 4, size=12)):
            x[row, loud * (WIDTH // 4) : (loud + 1) * (WIDTH // 4)] *= 40.0
        feeds.append({"x": x})
    return feeds


def run(data: bytes, feeds: list[dict[str, np.ndarray]], folder: Path) -> list[dict[str, np.ndarray]]:
    from pe_export.converters.tflite.dynamic_int8 import run_candidates

    return run_candidates(data, feeds, folder)


def relative_error(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.square(got - want).sum() / np.square(want).sum())


def emulated(x: np.ndarray, weight: np.ndarray, groups: int) -> np.ndarray:
    """x·Wᵀ as the grouped file computes it, in numpy: per group, the rows int8 over each row's range (asymmetric,
    255 levels) and the weight's columns int8 symmetric with a step per output channel."""
    from pe_export.converters.search.smoothing import per_channel_int8, range_quantized

    width = x.shape[1] // groups
    total = np.zeros((x.shape[0], weight.shape[0]), np.float64)
    for group in range(groups):
        part = slice(group * width, (group + 1) * width)
        total += range_quantized(x[:, part], 255, axis=1) @ per_channel_int8(weight[:, part].T)
    return total.astype(np.float32)


def test_a_grouped_fc_computes_the_emulated_groups_at_int8_bytes(wide_files: tuple[bytes, bytes], tmp_path: Path):
    from ai_edge_litert.interpreter import Interpreter

    from pe_export.converters.tflite.dynamic_int8 import DynamicRangeFile

    float_file, quantized = wide_files
    edited = DynamicRangeFile(quantized, float_file)
    untouched = edited.build([])
    wide = edited.groupable()
    shapes = sorted(edited.weights[n].values.shape for n in wide)
    assert shapes == [(SIDE, WIDTH), (OUTPUTS, OUTPUTS), (OUTPUTS, WIDTH)], shapes
    (side,) = [n for n in wide if edited.weights[n].values.shape == (SIDE, WIDTH)]
    grouped = edited.build([], wide)
    assert edited.build([]) == untouched  # build leaves the objects as they were
    ops = Counter(op["op_name"] for op in Interpreter(model_content=grouped)._get_ops_details())
    plain = Counter(op["op_name"] for op in Interpreter(model_content=untouched)._get_ops_details())
    assert ops["SPLIT"] == 2  # x once for both its FCs (4 groups each), relu(x·W) once (2 groups)
    assert ops["FULLY_CONNECTED"] == plain["FULLY_CONNECTED"] + 7 and ops["ADD"] == plain["ADD"] + 7
    # a step (float32 scale, int64 zero point) per group and output, and the ops' and tensors' entries; the whole
    # weights are gone (kept beside their groups, they would add their int8 bytes)
    steps, values = 12 * ((OUTPUTS + SIDE) * 3 + OUTPUTS), (WIDTH + OUTPUTS) * OUTPUTS + WIDTH * SIDE
    assert steps <= len(grouped) - len(untouched) < steps + values / 2, (len(grouped), len(untouched))

    feeds = group_feeds(3)
    reference = run(float_file, feeds, tmp_path)
    got, whole = run(grouped, feeds, tmp_path), run(untouched, feeds, tmp_path)
    weight = edited.weights[side].values
    for feed, want, mine, one_range in zip(feeds, reference, got, whole, strict=True):
        exact = emulated(feed["x"], weight, 4)
        # the runtime computes the emulation (up to its rounding of ties and float sums) …
        assert relative_error(mine["z"], exact) < 0.01 * relative_error(mine["z"], want["z"])
        # … which is nearer float32 than one range per row is (the loud group's own rounding is what is left)
        assert relative_error(mine["z"], want["z"]) < 0.5 * relative_error(one_range["z"], want["z"])


def by_cosine(min_cosine: float) -> Tolerance:
    return Tolerance(atol=1e9, rtol=1e9, min_cosine=min_cosine)  # judged by the cosine alone


def worst_cosine(got: list[dict[str, np.ndarray]], want: list[dict[str, np.ndarray]]) -> float:
    """The search's own score (``feed_score``), each row alone as it judges a dynamic batch, worst of all."""
    from pe_export.converters.search.keep_float import feed_score

    return min(
        feed_score({k: v[i : i + 1] for k, v in g.items()}, {k: v[i : i + 1] for k, v in w.items()}, None, by_cosine(0),
                   None)[1]
        for g, w in zip(got, want, strict=True)
        for i in range(next(iter(w.values())).shape[0])
    )  # fmt: skip


def search_start(wide_files: tuple[bytes, bytes], tmp_path: Path) -> tuple[list, list, list, Any]:
    """(feeds, masks, the float file's outputs, the edited file) the search starts from, smoothed as it smooths
    it: built with nothing kept it is every weight int8, with ``groupable()`` grouped the wide FC in groups."""
    from pe_export.converters.tflite.dynamic_int8 import DynamicRangeFile, _captured

    float_file, quantized = wide_files
    feeds = group_feeds(5)
    masks: list[np.ndarray | None] = [None] * len(feeds)
    edited = DynamicRangeFile(quantized, float_file)
    capturing, names = edited.capturing(list(edited.smoothable()))
    edited.smooth(_captured(capturing, names, feeds, masks, tmp_path, rows_alone=True))
    return feeds, masks, run(float_file, feeds, tmp_path), edited


def test_the_search_moves_weights_to_groups_before_float(wide_files: tuple[bytes, bytes], tmp_path: Path) -> None:
    """A target that every weight int8 misses and groups meet: the wide FC goes to groups, nothing float; a target
    groups miss too: weights kept float in the file with every other FC grouped, and the note says so."""
    from pe_export.converters.tflite.dynamic_int8 import int8_to_target
    from pe_export.converters.tflite.groups import ESCALATED_TO

    float_file, quantized = wide_files
    feeds, masks, reference, edited = search_start(wide_files, tmp_path)
    wide = edited.groupable()
    int8 = worst_cosine(run(edited.build([]), feeds, tmp_path), reference)
    grouped = worst_cosine(run(edited.build([], wide), feeds, tmp_path), reference)
    print(f"worst cosine: every weight int8 {int8:.6f}, the wide FC in groups {grouped:.6f}")
    assert 1 - grouped < 0.5 * (1 - int8)

    between = (int8 + grouped) / 2
    outcome = int8_to_target(quantized, float_file, ChoiceSamples(feeds, by_cosine(between), masks), choice_share=1.0)
    kept = outcome.kept_float
    assert outcome.passed and outcome.cosine >= between and outcome.escalated_to == ESCALATED_TO
    assert kept and set(kept) <= set(wide) and outcome.record("int8 weights")["kept_as"] == ESCALATED_TO
    note = outcome.notes("int8 weights")[0]
    steps = sum(  # nothing float: the group steps alone
        12 * edited.weights[n].values.shape[0] * (edited.weights[n].values.shape[1] // 48 - 1) for n in kept
    )
    assert f"{len(kept)} of 3 int8 weights kept in {ESCALATED_TO}, " in note and f"+{steps:,} B over int8" in note
    assert Counter(op["op_name"] for op in _ops(outcome.model))["SPLIT"] >= 1

    # a target groups miss and one weight kept float (the rest in groups) meets
    single = max(
        worst_cosine(run(edited.build([n], [m for m in wide if m != n]), feeds, tmp_path), reference) for n in wide
    )
    assert single > grouped
    beyond = (grouped + single) / 2
    strict = int8_to_target(quantized, float_file, ChoiceSamples(feeds, by_cosine(beyond), masks), choice_share=1.0)
    assert strict.passed and strict.cosine >= beyond
    # float first, chosen with every other FC in groups; then the groups cut back to those the target needs
    floated, grouped_now = (strict.before[0], strict.kept_float) if strict.before else (strict, [])
    assert floated.passed and 1 <= len(floated.kept_float) < len(wide) and not floated.escalated_to
    assert floated.record("int8 weights")["kept_as"] == "float" and not set(grouped_now) & set(floated.kept_float)
    note = floated.notes("int8 weights")[0]
    assert f"every FULLY_CONNECTED as {ESCALATED_TO} missed the target" in note, note
    assert "kept in float (float16 storage, float32 arithmetic)" in note
    if strict.before:
        assert strict.escalated_to == ESCALATED_TO and set(grouped_now) <= set(wide) - set(floated.kept_float)
        assert strict.candidates == len(wide) - len(floated.kept_float)
    splits = Counter(op["op_name"] for op in _ops(strict.model))["SPLIT"]
    assert (splits == 0) == (not grouped_now), (splits, grouped_now)
    kept_float = Counter(op["op_name"] for op in _ops(strict.model))["DEQUANTIZE"]
    assert kept_float == len(floated.kept_float)  # each float weight's DEQUANTIZE from float16


def test_the_search_chooses_against_its_share_of_the_error(wide_files: tuple[bytes, bytes], tmp_path: Path) -> None:
    """A target every FC in groups meets by less than the margin: chosen against the target itself, groups and
    nothing float; chosen against half the error it allows (what the default share is for: a choice lands just over
    its target, and new inputs read worse), weights float, the choice figure over the tighter target, the note
    naming both."""
    from pe_export.converters.tflite.dynamic_int8 import int8_to_target
    from pe_export.converters.tflite.groups import ESCALATED_TO

    float_file, quantized = wide_files
    feeds, masks, reference, edited = search_start(wide_files, tmp_path)
    grouped = worst_cosine(run(edited.build([], edited.groupable()), feeds, tmp_path), reference)
    target = 1 - 1.2 * (1 - grouped)  # groups meet it, with a fifth of their error to spare: not half
    plain = int8_to_target(quantized, float_file, ChoiceSamples(feeds, by_cosine(target), masks), choice_share=1.0)
    assert plain.escalated_to == ESCALATED_TO and not plain.before and plain.cosine >= target
    halved = int8_to_target(quantized, float_file, ChoiceSamples(feeds, by_cosine(target), masks), choice_share=0.5)
    floated = halved.before[0] if halved.before else halved
    assert floated.kept_float and not floated.escalated_to  # groups alone missed the tighter target
    assert halved.passed and halved.cosine >= 1 - 0.5 * (1 - target) > grouped
    note = floated.notes("int8 weights")[0]
    assert f"chosen against cosine >= {1 - 0.5 * (1 - target):g} (0.5 of the error the target {target:g}" in note


def _ops(data: bytes) -> list[dict]:
    from ai_edge_litert.interpreter import Interpreter

    return Interpreter(model_content=data)._get_ops_details()
