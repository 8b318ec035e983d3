"""Dynamic-range int8 for TFLite, edited on the flatbuffer: weights put back in float32 run as float
kernels, activations smoothed into the weights cut the int8 error, and an export meets the target it
is asked for, each checked in the installed TFLite runtime."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from pe_export.api import export_tflite
from pe_export.converters.options import ExportOptions
from pe_export.errors import ExitCode
from tests.helpers import (
    assert_chosen_with_margin,
    assert_judged_on_the_held_out_part,
    float_and_dynamic_range,
    outlier_feeds,
    stricter_target,
)


@pytest.fixture(scope="module")
def outlier_files() -> tuple[bytes, bytes]:
    """(float32 file, the converter's dynamic-range file) of z = x·W2, u = relu(x·W1)·W3 (each weight over the
    converter's 1,024-value minimum for quantizing it)."""
    from pe_export.native import import_tensorflow

    tf = import_tensorflow()
    rng = np.random.default_rng(5)
    w1, w2, w3 = (tf.constant(rng.normal(size=s).astype(np.float32)) for s in ((64, 48), (64, 32), (48, 32)))

    class Model(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None, 64], tf.float32, name="x")])
        def __call__(self, x: tf.Tensor) -> dict[str, tf.Tensor]:
            return {"z": tf.matmul(x, w2), "u": tf.matmul(tf.nn.relu(tf.matmul(x, w1)), w3)}

    return float_and_dynamic_range(Model())


def feeds(seed: int) -> list[dict[str, np.ndarray]]:
    return outlier_feeds(seed, width=64)


def run(
    data: bytes, inputs: list[dict[str, np.ndarray]], tmp_path: Path, per_core: bool = False
) -> list[dict[str, np.ndarray]]:
    from pe_export.converters.tflite.dynamic_int8 import run_candidates

    return run_candidates(data, inputs, tmp_path, per_core=per_core)


def relative_error(got: list[dict[str, np.ndarray]], want: list[dict[str, np.ndarray]]) -> float:
    error = sum(float(np.square(g[k] - w[k]).sum()) for g, w in zip(got, want, strict=True) for k in w)
    return error / sum(float(np.square(w[k]).sum()) for w in want for k in w)


def test_weights_put_back_in_float_run_as_float(outlier_files: tuple[bytes, bytes], tmp_path: Path) -> None:
    from pe_export.converters.tflite.dynamic_int8 import DynamicRangeFile

    float_file, quantized = outlier_files
    edited = DynamicRangeFile(quantized, float_file)
    assert len(edited.weights) == 3  # the three FULLY_CONNECTED weights, matched to the float file by name
    inputs = feeds(7)
    untouched = edited.build([])
    assert len(untouched) == pytest.approx(len(quantized), rel=0.02)
    for got, want in zip(run(untouched, inputs, tmp_path), run(quantized, inputs, tmp_path), strict=True):
        assert all(np.array_equal(got[k], want[k]) for k in want)  # the objects round-trip exactly
    all_float = edited.build(list(edited.weights))
    reference = run(float_file, inputs, tmp_path)
    # kept weights are stored in float16 (a rounding of at most 2^-11 of each value) and computed in float32
    assert (
        relative_error(run(all_float, inputs, tmp_path), reference)
        < 2**-22
        < relative_error(run(quantized, inputs, tmp_path), reference)
    )
    kinds = _kept_weight_kinds(all_float)
    assert kinds == ["FLOAT16"] * 3, kinds  # each FULLY_CONNECTED reads a DEQUANTIZE of its float16 weight
    grown, values = len(all_float) - len(untouched), sum(w.values.size for w in edited.weights.values())
    # 2 B a value instead of 1, less the per-channel scales and zero points (12 B a channel of 48 here)
    assert 0.8 * values <= grown <= 1.1 * values, (grown, values)
    assert edited.build([]) == untouched  # build leaves the objects as they were


def _kept_weight_kinds(data: bytes) -> list[str]:
    """The type of the tensor each FULLY_CONNECTED's weight is dequantized from (or its own, read directly)."""
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_content=data)
    ops = interpreter._get_ops_details()
    written_by = {output: op for op in ops for output in op["outputs"]}
    details = {d["index"]: d for d in interpreter.get_tensor_details()}
    kinds = []
    for op in ops:
        if op["op_name"] == "FULLY_CONNECTED":
            weight = op["inputs"][1]
            source = written_by.get(weight)
            if source is not None and source["op_name"] == "DEQUANTIZE":
                weight = source["inputs"][0]
            kinds.append(details[weight]["dtype"].__name__.upper())
    return kinds


def test_smoothing_cuts_the_int8_error(outlier_files: tuple[bytes, bytes], tmp_path: Path) -> None:
    from pe_export.converters.tflite.dynamic_int8 import DynamicRangeFile, _captured

    float_file, quantized = outlier_files
    edited = DynamicRangeFile(quantized, float_file)
    assert sorted(len(names) for names in edited.smoothable().values()) == [1, 2]  # x read twice, relu(y) once
    given = feeds(6)
    capturing, names = edited.capturing(list(edited.smoothable()))
    smoothing = edited.smooth(_captured(capturing, names, given, [None] * len(given), tmp_path, rows_alone=True))
    held_out = feeds(7)
    reference = run(float_file, held_out, tmp_path)
    plain = relative_error(run(quantized, held_out, tmp_path), reference)
    smooth = relative_error(run(edited.build([]), held_out, tmp_path), reference)
    print(f"int8 relative error on held-out inputs: converter {plain:.3e}, smoothed {smooth:.3e}; {smoothing.note()}")
    assert smoothing.smoothed >= 1 and smoothing.error_after < smoothing.error_before
    assert smooth < 0.5 * plain
    # Smoothed and every weight back in float (float16 storage): the float file's arithmetic (x/s · s·W).
    assert relative_error(run(edited.build(list(edited.weights)), held_out, tmp_path), reference) < 2**-22


def test_smoothing_sees_valid_rows_only(outlier_files: tuple[bytes, bytes], tmp_path: Path) -> None:
    """Padding rows (here 100x larger) never reach the ranges the α is chosen by."""
    from pe_export.converters.tflite.dynamic_int8 import DynamicRangeFile, _captured

    float_file, quantized = outlier_files
    rng = np.random.default_rng(11)
    x = rng.normal(size=(300, 64)).astype(np.float32)
    valid = np.ones(x.shape[0], bool)
    valid[::3] = False
    x[~valid] *= 100.0
    edited = DynamicRangeFile(quantized, float_file)
    capturing, names = edited.capturing(list(edited.smoothable()))
    assert len(names) == 2  # x and relu(y), outputs of the capturing file now
    captured = _captured(capturing, names, [{"x": x}], [valid], tmp_path, rows_alone=True)
    np.testing.assert_array_equal(captured[next(n for n in names if captured[n].shape[-1] == 64)], x[valid])
    # the capturing file still computes the float file's outputs, and the float objects are as they were
    (got,), (want,) = run(capturing, [{"x": x}], tmp_path), run(float_file, [{"x": x}], tmp_path)
    assert set(want) < set(got) and all(np.array_equal(got[k], want[k]) for k in want)
    assert len(edited.float_model.subgraphs[0].outputs) == len(edited.float_model.signatureDefs[0].outputs) == len(want)


def test_thinned_rows_keep_every_range() -> None:
    """Rows past SMOOTHING_ROWS are thinned; the channel maxima and each call's extremes are all rows'."""
    from pe_export.converters.search.smoothing import SMOOTHING_ROWS, thinned

    rng = np.random.default_rng(12)
    calls = [rng.normal(size=(3 * SMOOTHING_ROWS, 64)).astype(np.float32) for _ in range(2)]
    calls[1][1234, 7] = 50.0  # an outlier the even spread would skip
    kept = thinned(calls)
    assert sum(r.shape[0] for r in kept.rows) <= SMOOTHING_ROWS + 4
    np.testing.assert_array_equal(kept.channel_max, np.abs(np.concatenate(calls)).max(axis=0))
    for rows, whole in zip(kept.rows, calls, strict=True):
        assert rows.max() == whole.max() and rows.min() == whole.min()


def test_export_meets_the_target_asked_for(saved_model, tmp_path: Path) -> None:
    model = saved_model("encoder_dynamic")
    default = export_tflite(model, tmp_path / "default.tflite", ExportOptions(quantize="dynamic-int8"))
    assert default.parity is not None and default.parity.min_cosine < 1 - 1e-7  # int8 changed the outputs
    # Keras 3.12 on Python 3.10 and 3.15 on 3.11 build different weights: the target follows the default's figure.
    target = stricter_target(default.notes)
    strict = export_tflite(model, tmp_path / "strict.tflite", ExportOptions(quantize="dynamic-int8", min_cosine=target))
    default_note = next(n for n in default.notes if n.startswith("int8:"))
    strict_note = next(n for n in strict.notes if n.startswith("int8:"))
    print(default_note, default.parity.min_cosine, "|", strict_note, strict.parity.min_cosine)
    total = int(re.search(r"(\d+) int8 weights", default_note)[1])
    assert default.exit_code == ExitCode.OK and f"all {total} int8 weights quantized" in default_note
    kept = re.search(rf"(\d+) of {total} int8 weights kept in float", strict_note)
    assert kept and 1 <= int(kept[1]) < total
    assert_chosen_with_margin(strict.notes, target)
    assert_judged_on_the_held_out_part(strict, target, tmp_path / "strict.tflite")
    assert default.summary.file_bytes < strict.summary.file_bytes


def test_candidates_run_in_parallel_keep_each_feeds_outputs(
    outlier_files: tuple[bytes, bytes], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """run_candidates(per_core=True) splits the feeds among interpreters (one per core): each feed's outputs come
    back in its place, equal to that feed run alone."""
    import pe_export.converters.tflite.dynamic_int8 as tflite_int8

    _, quantized = outlier_files
    inputs = feeds(11) + feeds(12)[:3]
    alone = [run(quantized, [feed], tmp_path)[0] for feed in inputs]
    monkeypatch.setattr(tflite_int8, "RUN_THREADS", 3)  # three interpreters, whatever this machine has
    together = run(quantized, inputs, tmp_path, per_core=True)
    assert len(together) == len(inputs) == 7
    for got, want in zip(together, alone, strict=True):
        assert want and all(np.array_equal(got[k], want[k]) for k in want)
    assert not all(np.array_equal(together[0][k], together[1][k]) for k in together[0])  # distinct feeds


def test_a_rotated_input_errs_less_than_smoothed_alone(
    outlier_files: tuple[bytes, bytes], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """x (64 channels, one 60x the rest) is rotated by a block Hadamard after its smoothing; relu(x·W1) (48
    channels: no whole blocks of 32) is only smoothed. Held out, in the runtime, the rotated file errs less than the
    same file smoothed alone, and with every weight back in float it computes the float file's products."""
    import pe_export.converters.tflite.dynamic_int8 as tflite_int8

    float_file, quantized = outlier_files
    given, held_out = feeds(6), feeds(7)
    reference = run(float_file, held_out, tmp_path)
    errors, files = {}, {}
    for rotating in (True, False):
        if not rotating:
            monkeypatch.setattr(tflite_int8, "choose_rotations", lambda *args, **kwargs: {})
        edited = tflite_int8.DynamicRangeFile(quantized, float_file)
        capturing, names = edited.capturing(list(edited.smoothable()))
        smoothing = edited.smooth(
            tflite_int8._captured(capturing, names, given, [None] * len(given), tmp_path, rows_alone=True)
        )
        assert smoothing.rotated == (1 if rotating else 0), smoothing.note()
        files[rotating] = edited
        got = run(edited.build([]), held_out, tmp_path)
        errors[rotating] = relative_error([{"z": g["z"]} for g in got], [{"z": r["z"]} for r in reference])
    print(f"held-out int8 relative error of z = x·W2: rotated {errors[True]:.3e}, smoothed alone {errors[False]:.3e}")
    assert errors[True] < 0.67 * errors[False]  # the simulation chose it for at least ROTATION_GAIN (1.5x)
    all_float = files[True].build(list(files[True].weights))
    assert relative_error(run(all_float, held_out, tmp_path), reference) < 2**-22
