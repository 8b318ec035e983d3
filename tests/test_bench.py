"""`pe-export bench` and `pe-export targets`: real figures on both file kinds."""

from __future__ import annotations

import json
import os
import platform
from pathlib import Path

from pe_export.api import export_onnx, export_tflite
from pe_export.converters.options import ExportOptions
from pe_export.encoders.tiny import FIXED_LEN, MAX_LEN
from pe_export.errors import ExitCode
from pe_export.host import INT8_FEATURES
from tests.helpers import run_cli


def test_bench_writes_real_figures(capfd, saved_model, tmp_path: Path) -> None:
    for export, name in ((export_tflite, "m.tflite"), (export_onnx, "m.onnx")):
        export(saved_model("encoder_dynamic"), tmp_path / name, ExportOptions(verify=False))
        result = run_cli(
            capfd,
            "bench",
            tmp_path / name,
            "--runs",
            "30",
            "--warmup",
            "3",
            "--seq-len",
            "32",
            "--threads",
            "1",
            "--json",
            tmp_path / f"{name}.json",
        )
        assert result.exit_code == 0, result.stderr
        figures = json.loads((tmp_path / f"{name}.json").read_text())
        latency = figures["latency_ms"]
        assert latency["min"] <= latency["p50"] <= latency["p90"] <= latency["p99"] <= latency["max"]
        assert figures["file_bytes"] == (tmp_path / name).stat().st_size and figures["runs"] == 30
        assert figures["tokens_per_s"] == figures["sequences_per_s"] * 32 and figures["peak_rss_mb"] > 10
        assert "latency ms: p50" in result.stdout
        # the machine beside its figures: the CPU's int8 instructions, read here from the kernel's own list
        host = figures["host"]
        assert host["machine"] == platform.machine() and host["cpus"] == os.cpu_count()
        assert set(host["int8_features"]) == set(INT8_FEATURES) & cpu_flags()
        assert f"host: {host['model']} ({host['machine']}, {host['cpus']} cores); int8 instructions:" in result.stdout


def cpu_flags() -> set[str]:
    """The first processor's flags (x86) or features (ARM) in /proc/cpuinfo; empty where there is none."""
    cpuinfo = Path("/proc/cpuinfo")
    lines = cpuinfo.read_text().splitlines() if cpuinfo.exists() else []
    found = [line.split(":", 1)[1].split() for line in lines if line.split(":")[0].strip() in ("flags", "Features")]
    return set(found[0]) if found else set()


def test_targets_and_target_option(capfd, saved_model, tmp_path: Path) -> None:
    listed = run_cli(capfd, "targets")
    for name in ("jetson-agx-orin", "arm64", "desktop-cuda", "x86-cpu"):
        assert name in listed.stdout
    export_onnx(saved_model("encoder_dynamic"), tmp_path / "m.onnx", ExportOptions(verify=False))
    import onnxruntime as ort

    if "CUDAExecutionProvider" not in ort.get_available_providers():
        gpu = run_cli(capfd, "bench", tmp_path / "m.onnx", "--target", "desktop-cuda")
        assert gpu.exit_code == ExitCode.RUNTIME_UNAVAILABLE and "TensorrtExecutionProvider" in gpu.stderr
    unknown = run_cli(capfd, "bench", tmp_path / "m.onnx", "--target", "tpu")
    assert unknown.exit_code == ExitCode.BAD_INPUT and "x86-cpu" in unknown.stderr
    zero = run_cli(capfd, "bench", tmp_path / "m.onnx", "--runs", "0")
    assert zero.exit_code == ExitCode.BAD_INPUT and "--runs 0" in zero.stderr


def test_fixed_length_model_reports_the_length_it_ran(capfd, exported_file, tmp_path: Path) -> None:
    # --seq-len only sizes dynamic axes: a 16-token model runs 16 tokens, and its tokens/s says so.
    model = exported_file("encoder_fixed", "onnx")
    result = run_cli(capfd, "bench", model, "--runs", "10", "--seq-len", "48", "--json", tmp_path / "b.json")
    assert result.exit_code == 0, result.stderr
    figures = json.loads((tmp_path / "b.json").read_text())
    assert (figures["batch"], figures["seq_len"]) == (1, FIXED_LEN)
    assert figures["tokens_per_s"] == figures["sequences_per_s"] * FIXED_LEN


def test_length_beyond_the_position_table_says_what_to_change(capfd, exported_file) -> None:
    model = exported_file("encoder_dynamic", "onnx")  # 64-row position table
    result = run_cli(capfd, "bench", model, "--runs", "5", "--seq-len", str(MAX_LEN + 1))
    assert result.exit_code == ExitCode.BAD_INPUT
    assert f"sequence length {MAX_LEN + 1}" in result.stderr and "--seq-len within it" in result.stderr
    assert run_cli(capfd, "bench", model, "--runs", "5", "--seq-len", str(MAX_LEN)).exit_code == 0
