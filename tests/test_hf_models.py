"""Hugging Face transformers TF encoders and Keras 2 models, saved as the field saves them, export and verify.

The models are built in a Keras 2 child (tests/fixtures/hf_models.py); every file is checked here again,
independently of the export's own verification: run in a pip runtime against the SavedModel on inputs the export
never saw (another seed, padded rows, the longest sequence the model takes).
"""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import pytest

from pe_export.api import export_onnx, export_tflite, find_position_tables
from pe_export.converters.options import ExportOptions
from pe_export.errors import ExitCode
from pe_export.inputs import generate_inputs
from pe_export.lengths import model_limit
from pe_export.runners import create_runner
from pe_export.runners.savedmodel import SavedModelRunner
from pe_export.savedmodel import FrozenSignature, input_bounds, load_savedmodel, signature_input_specs
from pe_export.tables.pipeline import TableOptions
from tests.fixtures.hf_models import ROWS, build_cached
from tests.helpers import VENV_CACHE, assert_one_line_error, cache_lock, run_cli

pytestmark = pytest.mark.slow

# (family, how it was saved) → (the formats exported here: where its fix matters, for CI's budget; what it
# exercises). benchmarks/hf_coverage.py exports every family both ways saved, in both formats.
BOTH, TFLITE, ONNX = ("tflite", "onnx"), ("tflite",), ("onnx",)
MODELS: dict[tuple[str, str], tuple[tuple[str, ...], str]] = {
    ("roberta", "pretrained"): ((), "position ids from pad_token_id + 1: 66 rows serve 64 tokens (the limit test)"),
    ("mpnet", "signature"): (TFLITE, "the same offset, T5-style buckets in float64 (FlexLog without the rewrite)"),
    ("deberta_v2", "pretrained"): (
        BOTH,
        "tf.cond on shapes, log buckets in float64, no absolute table (unbounded length); tf2onnx's back-to-back "
        "reshape merge",
    ),
    ("deberta", "signature"): (
        ONNX,
        "conditions on shapes (42 Switch nodes: v1 control flow tf2onnx mis-converts), a masked softmax whose fully "
        "masked rows are NaN before tf.where zeroes them",
    ),
    ("esm", "pretrained"): (ONNX, "rotary cos/sin from an inv_freq weight at run time; tf2onnx's reshape merge"),
    ("clip_text", "signature"): (ONNX, "tf2onnx writes com.microsoft ops without their opset import"),
    ("keras2_sinusoid", "pretrained"): (TFLITE, "Keras 2 model.save, the seed's sinusoid, inputs input_1/input_2"),
    ("longformer", "pretrained"): (
        TFLITE,
        "ids padded to its window (their vocabulary read through the Pad), lowered assertions (nested Switch/Merge "
        "the TFLite converter refused), einsum, roll and int64 abs (Flex without the rewrites)",
    ),
    ("tapas", "pretrained"): (ONNX, "[batch, tokens, 7] type ids; tf2onnx failed its integer segment min"),
    ("layoutlm", "pretrained"): (ONNX, "[batch, tokens, 4] boxes whose differences index tables: generated in order"),
}
EXPORTS = {"tflite": export_tflite, "onnx": export_onnx}
STAMPED = ("deberta_v2", "deberta", "longformer")  # tf.cond in their graphs
ATOL = 1e-4


@pytest.fixture(scope="module")
def hf_models() -> dict[tuple[str, str], Path]:
    with cache_lock("hf-models"):
        return build_cached(list(MODELS), VENV_CACHE)


@functools.cache
def _independent_feed(saved_model: Path) -> dict[str, np.ndarray]:
    """Generated inputs of a seed the export never used, padded rows, at the longest sequence the model takes."""
    loaded = load_savedmodel(saved_model)
    signature = loaded.signature(None)
    specs = signature_input_specs(signature)
    frozen = FrozenSignature(signature, specs)
    limit = model_limit(loaded, frozen)
    length = limit.tokens if limit is not None else 48
    return generate_inputs(specs, input_bounds(frozen), batch=3, seq_len=length, seed=4242, padded=True)


def _independent_error(saved_model: Path, exported: Path, runtime: str) -> float:
    """Max abs of the file against the SavedModel on _independent_feed."""
    loaded = load_savedmodel(saved_model)
    feed = _independent_feed(saved_model)
    with SavedModelRunner(saved_model, loaded=loaded) as reference:
        expected = reference.infer(feed)
    with create_runner(runtime, exported) as runner:
        got = runner.infer(feed)
    return max(float(np.max(np.abs(got[name] - expected[name]))) for name in expected)


EXPORTED = [(model, file_format) for model, (formats, _) in MODELS.items() for file_format in formats]


@pytest.mark.parametrize(("model", "file_format"), EXPORTED, ids=lambda v: "-".join(v) if isinstance(v, tuple) else v)
def test_exports_within_tolerance_in_a_pip_runtime(
    hf_models: dict[tuple[str, str], Path],
    tmp_path: Path,
    model: tuple[str, str],
    file_format: str,
) -> None:
    saved_model = hf_models[model]
    output = tmp_path / f"model.{file_format}"
    # the layer map (an optional stamp) made where control flow once crashed it, left out elsewhere (CI time)
    stamped = model[0] in STAMPED
    options = ExportOptions(tables=TableOptions(compress=64), layer_map=stamped)
    report = EXPORTS[file_format](saved_model, output, options)
    assert report.exit_code == ExitCode.OK, report.parity.failure_message() if report.parity else report
    assert report.parity is not None and report.parity.passed  # verified here: no Flex op left unrunnable
    assert not report.summary.flex_ops
    runtime = "litert" if file_format == "tflite" else "onnxruntime"
    assert _independent_error(saved_model, output, runtime) <= ATOL


def test_offset_table_limit_is_measured_and_a_longer_seq_len_refused(
    hf_models: dict[tuple[str, str], Path], capfd: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    for family in ("longformer", "roberta"):  # Longformer's ids reach its tables through a Pad to its window
        saved_model = hf_models[(family, "pretrained")]
        loaded = load_savedmodel(saved_model)
        signature = loaded.signature(None)
        limit = model_limit(loaded, FrozenSignature(signature, signature_input_specs(signature)))
        assert limit is not None and (limit.rows, limit.tokens) == (ROWS + 2, ROWS), family
    refused = run_cli(capfd, "tflite", str(saved_model), "-o", str(tmp_path / "m.tflite"), "--seq-len", str(ROWS + 1))
    assert_one_line_error(refused, ExitCode.BAD_INPUT, f"{ROWS} tokens", f"--seq-len {ROWS} or less")
    assert not (tmp_path / "m.tflite").exists()
    golden = run_cli(capfd, "golden", str(saved_model), "-o", str(tmp_path / "g"))
    assert golden.exit_code == 0, golden.stderr
    manifest = (tmp_path / "g" / "manifest.json").read_text()
    assert f'"max_tokens": {ROWS}' in manifest


LISTED = {  # family → kinds --list-tables must report (beside any other)
    "mpnet": {"learned", "relative", "relative-bucket"},
    "deberta_v2": {"relative", "relative-bucket"},  # rel_embeddings, though folded into its projections
    "esm": {"rotary-cos", "rotary-sin"},
    "roberta": {"learned"},
    "keras2_sinusoid": {"sinusoid-interleaved"},
}


@pytest.mark.parametrize("model", [m for m in MODELS if m[0] in LISTED], ids=lambda m: m[0])
def test_position_tables_are_listed(hf_models: dict[tuple[str, str], Path], model: tuple[str, str]) -> None:
    tables = find_position_tables(hf_models[model], ExportOptions())
    assert LISTED[model[0]] <= {result.table.kind for result in tables}
