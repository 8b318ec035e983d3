"""ONNX past protobuf's 2 GiB: the model is written with its weights as external data beside the file, verified
from there by onnxruntime, and published file and data together. A real 2 GiB model lives in
benchmarks/scale.py (xlmr-large); here the limit is lowered so that a small encoder takes the same path."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from pe_export.api import export_onnx
from pe_export.converters.options import ExportOptions
from pe_export.errors import ExitCode


def _contents(path: Path) -> list[tuple[str, tuple[int, ...], bytes]]:
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(path))  # external data read from beside the file
    arrays = [numpy_helper.to_array(init) for init in model.graph.initializer]
    return sorted((a.dtype.str, a.shape, a.tobytes()) for a in arrays)


def test_model_past_the_limit_is_written_with_external_data(
    saved_model, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = saved_model("encoder_dynamic")
    (tmp_path / "inline").mkdir()
    assert export_onnx(model, tmp_path / "inline" / "m.onnx", ExportOptions()).exit_code == ExitCode.OK
    monkeypatch.setattr("pe_export.converters.onnx.convert.INLINE_LIMIT", 20_000)
    folder = tmp_path / "external"
    folder.mkdir()
    report = export_onnx(model, folder / "m.onnx", ExportOptions())
    assert report.exit_code == ExitCode.OK and report.parity is not None and report.parity.passed
    assert report.parity.max_abs < 1e-4
    assert sorted(p.name for p in folder.iterdir()) == ["m.onnx", "m.onnx.data"]  # no staging left behind
    assert (folder / "m.onnx").stat().st_size < (folder / "m.onnx.data").stat().st_size
    # the same weights, bit for bit (tf2onnx numbers its constants per process: names differ between exports)
    assert _contents(tmp_path / "inline" / "m.onnx") == _contents(folder / "m.onnx")


def test_external_data_follows_a_renamed_model(saved_model, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """--keep-failed publishes under another name: the data file is renamed with it and the model re-pointed."""
    import onnx
    import onnxruntime as ort

    from pe_export.api import _publish
    from pe_export.converters.onnx.convert import write_onnx
    from pe_export.fileio import staged_in_folder

    source = tmp_path / "plain.onnx"
    export_onnx(saved_model("encoder_dynamic"), source, ExportOptions(verify=False))
    output = tmp_path / "out" / "model.onnx"
    output.parent.mkdir()
    with staged_in_folder(output) as staged:
        write_onnx(onnx.load(str(source)), staged, "model.onnx.data")
        _publish(staged, output.with_name("model.FAILED.onnx"), False, overwrite=False)
    assert sorted(p.name for p in output.parent.iterdir()) == ["model.FAILED.onnx", "model.FAILED.onnx.data"]
    session = ort.InferenceSession(str(output.with_name("model.FAILED.onnx")), providers=["CPUExecutionProvider"])
    plain = ort.InferenceSession(str(source), providers=["CPUExecutionProvider"])
    feed = {i.name: np.ones([1, 8], np.int32) for i in plain.get_inputs()}
    for got, want in zip(session.run(None, feed), plain.run(None, feed), strict=True):
        np.testing.assert_array_equal(got, want)


@pytest.fixture
def external_model(saved_model, tmp_path: Path) -> Path:
    """The small encoder written as a model file and its external data beside it."""
    import onnx

    from pe_export.converters.onnx.convert import write_onnx

    source = tmp_path / "plain.onnx"
    export_onnx(saved_model("encoder_dynamic"), source, ExportOptions(verify=False))
    path = tmp_path / "split" / "model.onnx"
    path.parent.mkdir()
    write_onnx(onnx.load(str(source)), path, "model.onnx.data")
    return path


@pytest.mark.parametrize("damage", ["missing", "truncated"])
def test_a_missing_or_truncated_data_file_is_one_line(
    capfd, saved_model, external_model: Path, tmp_path: Path, damage: str
) -> None:
    """parity and bench on a model whose external data is gone or cut short: exit 2, the data file named."""
    from tests.helpers import assert_one_line_error, run_cli

    bundle = tmp_path / "golden"
    assert run_cli(capfd, "golden", saved_model("encoder_dynamic"), "-o", bundle, "--samples", "2").exit_code == 0
    assert run_cli(capfd, "parity", external_model, bundle, "--runtime", "onnxruntime").exit_code == 0  # whole
    data = external_model.with_name("model.onnx.data")
    if damage == "missing":
        data.unlink()
    else:
        data.write_bytes(data.read_bytes()[: data.stat().st_size // 2])
    said = "does not exist" if damage == "missing" else "can not be read in full"
    parity = run_cli(capfd, "parity", external_model, bundle, "--runtime", "onnxruntime")
    assert_one_line_error(parity, ExitCode.BAD_INPUT, "could not load model.onnx", said)
    bench = run_cli(capfd, "bench", external_model, "--runs", "2")  # its progress line, then the one error line
    assert bench.exit_code == ExitCode.BAD_INPUT and "Traceback" not in bench.stderr, bench.stderr
    errors = [line for line in bench.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "could not load model.onnx" in errors[0] and said in errors[0], bench.stderr
