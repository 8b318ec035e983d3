"""A reference random at inference is bad input (exit 2, the op named), not a broken export; a random op that
reaches no output changes nothing (pe_export/determinism.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pe_export.api import export_tflite
from pe_export.converters.options import ExportOptions
from pe_export.errors import BadInputError, ExitCode
from pe_export.golden import GoldenOptions, make_golden
from tests.fixtures.models import MODEL_CASES
from tests.helpers import assert_one_line_error, run_cli


def test_noise_drawn_in_call_is_refused_naming_the_op(capfd, saved_model, tmp_path: Path) -> None:
    assert MODEL_CASES["encoder_position_noise"].random_at_inference
    model = saved_model("encoder_position_noise")
    output = tmp_path / "noisy.tflite"
    result = run_cli(capfd, "tflite", model, "-o", output)
    assert_one_line_error(result, ExitCode.BAD_INPUT, "is random at inference: RandomStandardNormal", "if training:")
    assert not output.exists() and not list(tmp_path.iterdir())  # nothing staged is left behind
    with pytest.raises(BadInputError, match="random at inference"):
        make_golden(model, tmp_path / "golden", GoldenOptions(samples=2, batch=2))
    assert not (tmp_path / "golden").exists()


def test_a_random_op_whose_draws_reach_no_output_exports(saved_model, tmp_path: Path) -> None:
    from pe_export.determinism import random_ops
    from pe_export.native import import_tensorflow

    assert MODEL_CASES["encoder_dead_noise"].random_at_inference is False
    model = saved_model("encoder_dead_noise")
    tf = import_tensorflow()
    signature = tf.saved_model.load(str(model)).signatures["serving_default"]
    assert any(op.startswith("RandomStandardNormal") for op in random_ops(signature))  # the op is there
    report = export_tflite(model, tmp_path / "dead.tflite", ExportOptions())
    assert report.exit_code == ExitCode.OK and report.parity is not None and report.parity.max_abs <= 1e-4
