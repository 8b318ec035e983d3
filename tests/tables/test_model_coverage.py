"""Model coverage: a tiny random-init keras-hub backbone of every encoder family reports exactly the
position tables it reads by position, and exports to TFLite (builtins only) and ONNX, plain and with
--compress 64, each file verified through the CLI at the fp32 tolerance."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest

from pe_export.api import find_position_tables
from pe_export.converters.options import ExportOptions
from tests.fixtures.keras_hub_models import FAMILIES, export_family
from tests.helpers import run_cli

pytest.importorskip("keras_hub", reason="the coverage models come from keras-hub (pip install -e '.[dev]')")

MAX_ABS = re.compile(r"^\s+(?:random|padded)\s+\S+\s+([0-9.e+-]+)\s", re.M)
FP32_ATOL = 1e-4


@pytest.fixture(scope="session")
def family_model(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    built: dict[str, Path] = {}
    root = tmp_path_factory.mktemp("keras_hub")

    def get(name: str) -> Path:
        if name not in built:
            from pe_export.native import import_tensorflow

            import_tensorflow()
            built[name] = export_family(FAMILIES[name], root)
        return built[name]

    return get


@pytest.mark.parametrize("family", list(FAMILIES))
def test_reports_exactly_the_tables_read_by_position(family: str, family_model) -> None:
    case = FAMILIES[family]
    found = find_position_tables(family_model(family), ExportOptions(seq_len=case.seq_len))
    reported = sorted((r.table.kind, r.table.shape) for r in found)
    assert reported == sorted(case.tables), [(r.table.name, r.table.kind, r.table.shape) for r in found]
    for result in found:
        assert any(word in result.table.notes[0] for word in ("gathered", "sliced", "added", "multiplied")), result


@pytest.mark.parametrize("target", ["tflite", "onnx"])
@pytest.mark.parametrize("family", list(FAMILIES))
def test_exports_plain_and_compressed_within_fp32(family: str, target: str, family_model, tmp_path: Path,
                                                  capfd: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    case = FAMILIES[family]
    model = family_model(family)
    length = ["--seq-len", str(case.seq_len)] if case.seq_len else []
    builtins = ["--builtins-only"] if target == "tflite" and not case.refusal else []
    sizes = {}
    for label, extra in (("plain", []), ("compress 64", ["--compress", "64"])):
        output = tmp_path / f"{label.replace(' ', '_')}.{target}"
        result = run_cli(capfd, target, model, "-o", output, *length, *builtins, *extra)
        if case.refusal:  # FFT mixing: a named refusal, one line, a documented exit code
            assert result.exit_code == case.refusal[target], result.stderr
            assert "FFT" in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr
            continue
        assert result.exit_code == 0, (label, result.stderr, result.stdout[-3000:])
        errors = [float(value) for value in MAX_ABS.findall(result.stdout)]
        assert errors and max(errors) <= FP32_ATOL, (label, errors)
        assert "flex ops: none" in result.stdout or target == "onnx", result.stdout
        sizes[label] = output.stat().st_size
        print(f"{family} {target} {label}: {sizes[label]:,} B, max abs {max(errors):.2g}")
    if sizes:
        # --compress never makes a file larger than the plain export. tf2onnx's generated node names make
        # two conversions of the same graph differ by a few hundred bytes (measured: 153,237 / 153,518 /
        # 153,439 B for three plain exports of one model), so ONNX gets that much room; TFLite none.
        noise = 0.005 * sizes["plain"] if target == "onnx" else 0
        assert sizes["compress 64"] <= sizes["plain"] + noise, sizes
