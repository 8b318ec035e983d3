"""litert-gpu on a real encoder: all-MiniLM-L6-v2 (real weights) at fixed shapes, every op on the GPU under a
software Vulkan (lavapipe), at fp32 and fp16 arithmetic. Apart from tests/runners/test_litert_gpu.py so that the
two heavy modules run side by side (pytest's --dist loadfile)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pe_export.errors import ExitCode
from tests.helpers import software_vulkan_env
from tests.runners.test_litert_gpu import SEQ_LEN, gpu_parity

pytestmark = pytest.mark.slow  # a 90 MB export and four GPU runs: excluded from the quick run


@pytest.fixture(scope="module")
def vulkan_env() -> dict[str, str]:
    return software_vulkan_env()


@pytest.fixture(scope="module")
def fixed_minilm(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """all-MiniLM-L6-v2 (real weights, 30,522-row token table) at batch 1 × 32, with a golden bundle of the
    suite's sentences at that shape."""
    from pe_export.api import export_tflite
    from pe_export.converters.options import ExportOptions
    from pe_export.golden import GoldenOptions, make_golden
    from pe_export.text_inputs import TextInputs
    from tests.fixtures.pretrained import minilm_for_tests

    saved, tokenizer, sentences = minilm_for_tests()
    root = tmp_path_factory.mktemp("gpu-minilm")
    report = export_tflite(saved, root / "minilm.tflite", ExportOptions(batch=1, seq_len=SEQ_LEN))
    assert report.parity is not None and report.parity.passed
    assert any(note.startswith("2 table lookup(s) read by flattened ids") for note in report.notes), report.notes
    text = TextInputs(sentences, tokenizer)
    make_golden(saved, root / "golden", GoldenOptions(batch=1, seq_len=SEQ_LEN, text=text))
    return {"model": root / "minilm.tflite", "golden": root / "golden"}


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_a_fixed_shape_minilm_runs_whole_on_the_gpu(vulkan_env, fixed_minilm, tmp_path, precision) -> None:
    """Every op on the GPU (no --cpu-fallback), judged by the tolerance of the arithmetic that ran. Measured under
    lavapipe: fp32 max abs 3.5e-6; fp16 max abs 0.024, worst sentence's pooled cosine 0.99998. Before the lookups
    were rewritten the GATHERs needed the CPU, and with 2-D rows the position ADD came out wrong (cosine 0.01)."""
    code, report = gpu_parity(
        vulkan_env, fixed_minilm["model"], fixed_minilm["golden"], tmp_path, "--gpu-precision", precision
    )
    assert report["runtime"] == f"litert-gpu[{precision} math; llvmpipe; fully accelerated]"
    assert report["arithmetic"] == precision and report["samples"] == 8
    sequence = next(output for output in report["outputs"] if output["name"] == "sequence_output")
    assert code == ExitCode.OK and report["passed"], sequence
    if precision == "fp32":
        assert sequence["max_abs"] < 1e-4 and sequence["pooled_cosine"] > 0.99999
    else:  # really half precision, and still the same sentence embeddings
        assert 1e-3 < sequence["max_abs"] < 0.05 and sequence["pooled_cosine"] > 0.9999
