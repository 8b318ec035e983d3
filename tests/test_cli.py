"""The CLI: reports, Flex handling, bad input as one line with its exit code, atomic outputs."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from pe_export.cli import Terminated, _interruption
from pe_export.errors import ExitCode, PeExportError
from tests.helpers import assert_one_line_error, run_cli


def no_stray_files(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith(".") or p.suffix == ".tmp")


def test_tflite_report_shows_ops_constants_runtimes_and_parity(capfd, saved_model, tmp_path: Path) -> None:
    out, report = tmp_path / "m.tflite", tmp_path / "m.json"
    result = run_cli(capfd, "tflite", saved_model("encoder_dynamic"), "-o", out, "--json", report)
    assert result.exit_code == 0, result.stderr
    written = json.loads(report.read_text())  # --json: the same report, by field
    assert written["file_bytes"] == out.stat().st_size and written["written"] and written["exit_code"] == 0
    assert written["parity"]["passed"] and written["parity"]["outputs"] and written["searches"] == []
    assert written["inputs"] == ["token_ids: int32[?,?]"] and written["precision"] == "fp32"
    for fragment in (
        "signature serving_default",
        "in   token_ids: int32[?,?]",
        "flex ops: none",
        "FULLY_CONNECTED",
        "largest:",
        "ai-edge-litert   yes",
        "vs TensorFlow float32 (4 samples, 64 positions) on litert",
        "OK: wrote",
    ):
        assert fragment in result.stdout
    assert out.stat().st_size > 0 and no_stray_files(tmp_path) == []


def test_flex_model_names_its_flex_ops_and_is_not_verified_here(capfd, saved_model, tmp_path: Path) -> None:
    out = tmp_path / "flex.tflite"
    result = run_cli(capfd, "tflite", saved_model("encoder_flex"), "-o", out)
    assert "flex ops: FlexCumprod" in result.stdout
    assert "ai-edge-litert   NO   needs Flex ops FlexCumprod" in result.stdout
    assert_one_line_error(result, ExitCode.RUNTIME_UNAVAILABLE, "not verified", "FlexCumprod")
    assert out.exists()  # the file is valid; only the proof is missing

    accepted = run_cli(capfd, "tflite", saved_model("encoder_flex"), "-o", out, "--overwrite", "--no-verify")
    assert accepted.exit_code == 0 and "not verified (--no-verify)" in accepted.stdout


def test_builtins_only_refuses_flex_model_and_writes_nothing(capfd, saved_model, tmp_path: Path) -> None:
    out = tmp_path / "flex.tflite"
    result = run_cli(capfd, "tflite", saved_model("encoder_flex"), "-o", out, "--builtins-only")
    assert_one_line_error(result, ExitCode.NEEDS_FLEX, "--builtins-only", "FlexCumprod")
    assert not out.exists() and no_stray_files(tmp_path) == []


def test_builtins_only_accepts_builtin_model(capfd, saved_model, tmp_path: Path) -> None:
    result = run_cli(capfd, "tflite", saved_model("encoder_dynamic"), "-o", tmp_path / "m.tflite", "--builtins-only")
    assert result.exit_code == 0, result.stderr


def test_seq_len_and_batch_fix_the_exported_shape(capfd, saved_model, tmp_path: Path) -> None:
    result = run_cli(
        capfd, "tflite", saved_model("encoder_dynamic"), "-o", tmp_path / "m.tflite", "--seq-len", "12", "--batch", "3"
    )
    assert result.exit_code == 0, result.stderr
    assert "in   token_ids: int32[3,12]" in result.stdout


@pytest.mark.parametrize("flags", [["--dynamic-seq"], ["--seq-len", "24"]])
def test_fixed_model_length_cannot_be_changed(capfd, saved_model, tmp_path: Path, flags: list[str]) -> None:
    result = run_cli(capfd, "onnx", saved_model("encoder_fixed"), "-o", tmp_path / "m.onnx", *flags)
    assert_one_line_error(result, ExitCode.BAD_INPUT, flags[0], "fixed sequence length of 16")
    assert sorted(p.name for p in tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("make_args", "fragments"),
    [
        (lambda d, sm: ["tflite", d / "missing", "-o", d / "m.tflite"], ["does not exist"]),
        (lambda d, sm: ["tflite", d / "file.txt", "-o", d / "m.tflite"], ["is a file"]),
        (lambda d, sm: ["onnx", d, "-o", d / "m.onnx"], ["is not a SavedModel"]),
        (
            lambda d, sm: ["tflite", sm, "-o", d / "m.tflite", "--signature", "nope"],
            ["signature 'nope'", "serving_default"],
        ),
        (lambda d, sm: ["tflite", sm, "-o", d / "m.tflite", "--quantize", "int4"], ["int4"]),
        (lambda d, sm: ["tflite", sm, "-o", d / "m.tflite", "--quantize", "weight-int8"], ["'weight-int8'"]),
        (lambda d, sm: ["tflite", sm, "-o", d / "m.tflite", "--seq-len", "0"], ["--seq-len 0 is out of range"]),
        (lambda d, sm: ["tflite", sm, "-o", d / "m.tflite", "--seq-len", "-5"], ["--seq-len -5 is out of range"]),
        (lambda d, sm: ["tflite", sm, "-o", d / "m.tflite", "--seq-len", "9999999999"], ["out of range"]),
        (lambda d, sm: ["tflite", sm, "-o", d / "m.tflite", "--seq-len", "8", "--dynamic-seq"], ["contradict"]),
        (lambda d, sm: ["onnx", sm, "-o", d / "m.onnx", "--opset", "7"], ["--opset 7"]),
        (
            lambda d, sm: ["onnx", sm, "-o", d / "m.onnx", "--quantize", "float16", "--int8-kernel", "blocks"],
            ["--int8-kernel applies to ONNX --quantize dynamic-int8", "drop --int8-kernel"],
        ),
        (
            lambda d, sm: ["onnx", sm, "-o", d / "m.onnx", "--quantize", "int8", "--keep-int16", "x"],
            ["--keep-int16 applies to TFLite's --quantize int8", "drop --keep-int16"],
        ),
        (
            lambda d, sm: [
                "tflite",
                sm,
                "-o",
                d / "m.tflite",
                "--quantize",
                "int8",
                "--keep-int16",
                "x",
                "--no-verify",
            ],
            ["--keep-int16 steers the int8 search", "drop --no-verify"],
        ),
        (
            lambda d, sm: ["tflite", sm, "-o", d / "m.tflite", "--quantize", "float16", "--keep-float", "x"],
            ["--keep-float applies to", "TFLite's --quantize int8 (ops left float)"],
        ),
        (lambda d, sm: ["onnx", sm, "-o", d / "m.onnx", "--json", d / "r.txt"], ["--json", "ending in .json"]),
        (lambda d, sm: ["tflite", sm, "-o", d / "m.onnx"], ["expected a file name ending in .tflite"]),
        (lambda d, sm: ["tflite", sm, "-o", d / "nofolder" / "m.tflite"], ["does not exist; create it"]),
        (lambda d, sm: ["inspect", d / "file.txt"], ["neither .tflite nor .onnx"]),
    ],
)
def test_bad_input_is_one_line_and_exit_2(capfd, saved_model, tmp_path: Path, make_args, fragments) -> None:
    (tmp_path / "file.txt").write_text("not a model")
    result = run_cli(capfd, *make_args(tmp_path, saved_model("encoder_dynamic")))
    assert_one_line_error(result, ExitCode.BAD_INPUT, *fragments)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file.txt"]


def test_existing_output_is_kept_without_overwrite(capfd, saved_model, tmp_path: Path) -> None:
    out = tmp_path / "m.onnx"
    out.write_bytes(b"previous")
    result = run_cli(capfd, "onnx", saved_model("encoder_dynamic"), "-o", out)
    assert_one_line_error(result, ExitCode.BAD_INPUT, "already exists", "--overwrite")
    assert out.read_bytes() == b"previous"
    replaced = run_cli(capfd, "onnx", saved_model("encoder_dynamic"), "-o", out, "--overwrite")
    assert replaced.exit_code == 0 and out.read_bytes() != b"previous"
    assert no_stray_files(tmp_path) == []
    report = tmp_path / "m.json"
    report.write_text("previous")  # --json is checked before the work, like the output
    refused = run_cli(capfd, "onnx", saved_model("encoder_dynamic"), "-o", tmp_path / "n.onnx", "--json", report)
    assert_one_line_error(refused, ExitCode.BAD_INPUT, "m.json already exists", "--overwrite")
    assert report.read_text() == "previous" and not (tmp_path / "n.onnx").exists()


@pytest.mark.parametrize("where", ["before", "after"])
def test_verbose_shows_traceback(capfd, tmp_path: Path, where: str) -> None:
    args = ["tflite", tmp_path / "missing", "-o", tmp_path / "m.tflite"]
    args = ["--verbose", *args] if where == "before" else [*args, "-v"]
    result = run_cli(capfd, *args)
    assert result.exit_code == ExitCode.BAD_INPUT and "Traceback" in result.stderr


def test_help_lists_exit_codes(capfd) -> None:
    result = run_cli(capfd, "--help")
    assert result.exit_code == 0
    for code in ExitCode:
        assert f"  {int(code)}  " in result.stdout


def _system_error_from(signal_exception: BaseException) -> SystemError:
    """What a signal landing inside a C extension call looks like from Python."""
    try:
        try:
            raise signal_exception
        except BaseException:
            raise SystemError("<built-in method __array__> returned a result with an exception set") from None
    except SystemError as err:
        err.__context__ = signal_exception
        return err


@pytest.mark.parametrize(
    ("raised", "code", "said"), [(KeyboardInterrupt(), 130, "SIGINT"), (Terminated(), 143, "SIGTERM")]
)
def test_signal_inside_a_c_call_is_an_interruption_not_a_bug(
    capfd, saved_model, monkeypatch: pytest.MonkeyPatch, raised: BaseException, code: int, said: str
) -> None:
    import pe_export.api

    def interrupted(*args: object, **kwargs: object) -> None:
        raise _system_error_from(raised)

    monkeypatch.setattr(pe_export.api, "export_tflite", interrupted)
    result = run_cli(capfd, "tflite", saved_model("encoder_dynamic"), "-o", "never.tflite")
    assert_one_line_error(result, code, f"interrupted ({said})" if code == 130 else f"terminated ({said})")
    assert _interruption(ValueError("a real bug")) is None


@pytest.mark.parametrize(("sent", "code", "said"), [(signal.SIGINT, 130, "SIGINT"), (signal.SIGTERM, 143, "SIGTERM")])
@pytest.mark.parametrize("raised", [SystemError, PeExportError])
def test_an_error_after_a_signal_is_the_interruption_even_unchained(
    capfd, saved_model, monkeypatch: pytest.MonkeyPatch, sent: int, code: int, said: str, raised: type[Exception]
) -> None:
    """CI once saw a SIGINT surface as numpy's SystemError with no KeyboardInterrupt chained to it (exit 6)."""
    import pe_export.api

    def interrupted(*args: object, **kwargs: object) -> None:
        try:
            os.kill(os.getpid(), sent)  # the CLI's handler raises here and records the signal
            time.sleep(5)
        except BaseException:
            pass  # swallowed, as C code between the handler and Python can
        raise raised("<built-in method __array__> returned a result with an exception set")  # nothing chained

    monkeypatch.setattr(pe_export.api, "export_tflite", interrupted)
    result = run_cli(capfd, "tflite", saved_model("encoder_dynamic"), "-o", "never.tflite")
    assert_one_line_error(result, code, f"interrupted ({said})" if code == 130 else f"terminated ({said})")


def test_keep_int16_that_names_no_activation_is_refused_with_names_that_would(
    capfd, saved_model, tmp_path: Path
) -> None:
    out = tmp_path / "m.tflite"
    args = ["tflite", saved_model("encoder_dynamic"), "-o", out, "--quantize", "int8", "--batch", "1", "--seq-len", "8"]
    result = run_cli(capfd, *args, "--keep-int16", "no_such_layer")
    assert_one_line_error(result, ExitCode.BAD_INPUT, "--keep-int16 'no_such_layer' names no activation", "e.g.")
    assert no_stray_files(tmp_path) == []
