"""tegrastats parsing (JetPack 5 and 6, Orin and Xavier) and the Jetson benchmark off a Jetson."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pe_export.targets.jetson.benchmark import main as jetson_benchmark
from pe_export.targets.jetson.tegrastats import mean_power_mw, parse_line

# Lines in the formats tegrastats prints: JetPack 5 (two-value rails, upper-case sensors) on Orin
# and Xavier, and the three-value rails with lower-case sensors of newer releases (JetPack 6.1+/7).
# They are composed from the documented formats, not captured on this project's own devices.
ORIN_JETPACK5 = (
    "RAM 5120/30536MB (lfb 4848x4MB) SWAP 0/15268MB (cached 0MB) CPU [12%@2201,5%@2201,8%@2201,3%@2201,"
    "off,off,off,off] EMC_FREQ 7%@3199 GR3D_FREQ 61%@[1300,1300] VIC_FREQ 729 APE 174 CV0@45.218C CPU@47.5C "
    "SOC2@44.437C SOC0@45.312C CV1@44.875C GPU@46.125C tj@47.5C SOC1@44.562C CV2@44.281C "
    "VDD_GPU_SOC 7947mW/7947mW VDD_CPU_CV 1590mW/1590mW VIN_SYS_5V0 4152mW/4152mW VDDQ_VDD2_1V8AO 906mW/906mW"
)
ORIN_THREE_VALUE_RAILS = (
    "11-29-2026 10:00:01 RAM 20642/62817MB (lfb 1x2MB) SWAP 0/31408MB (cached 0MB) CPU [23%@2201,10%@2201,"
    "4%@2201,14%@2201,30%@2201,18%@2201,10%@2201,10%@2201,33%@2201,7%@2201,5%@2201,27%@2201] EMC_FREQ 3%@3199 "
    "GR3D_FREQ 12%@[1300,1300] NVENC0 off NVDEC0 off VIC off APE 174 cpu@52.968C/52.968C soc2@48.406C/48.406C "
    "gpu@47.625C/47.625C tj@53.1C/53.1C VDD_GPU_SOC 5139mW/5139mW/5139mW VDD_CPU_CV 3268mW/3268mW/3268mW "
    "VIN_SYS_5V0 5500mW/5500mW/5500mW"
)
XAVIER_JETPACK5 = (
    "RAM 1936/31919MB (lfb 7263x4MB) SWAP 0/15959MB (cached 0MB) CPU [2%@1190,1%@1190,0%@1190,0%@1190,"
    "off,off,off,off] EMC_FREQ 0%@2133 GR3D_FREQ 0%@318 APE 150 MTS fg 0% bg 0% AO@43.5C GPU@43C PMIC@50C "
    "AUX@42C CPU@44.5C thermal@43.6C Tboard@41C Tdiode@43.25C GPU 0mW/0mW CPU 155mW/155mW SOC 1242mW/1242mW "
    "CV 0mW/0mW VDDRQ 155mW/155mW SYS5V 1526mW/1526mW"
)


def test_orin_jetpack5() -> None:
    sample = parse_line(ORIN_JETPACK5)
    assert (sample.ram_used_mb, sample.ram_total_mb) == (5120, 30536)
    assert sample.cpu_load == [12, 5, 8, 3, None, None, None, None]
    assert sample.gpu_load == 61
    assert sample.rails_mw == {"VDD_GPU_SOC": 7947, "VDD_CPU_CV": 1590, "VIN_SYS_5V0": 4152, "VDDQ_VDD2_1V8AO": 906}
    assert sample.total_mw == 4152  # the board input rail, not the sum
    assert sample.temps_c["tj"] == 47.5 and sample.temps_c["gpu"] == 46.125


def test_orin_three_value_rails_and_lowercase_temps() -> None:
    sample = parse_line(ORIN_THREE_VALUE_RAILS)
    assert sample.rails_mw == {"VDD_GPU_SOC": 5139, "VDD_CPU_CV": 3268, "VIN_SYS_5V0": 5500}
    assert len(sample.cpu_load) == 12 and sample.gpu_load == 12
    assert sample.temps_c["cpu"] == 52.968 and sample.temps_c["tj"] == 53.1


def test_xavier_jetpack5() -> None:
    sample = parse_line(XAVIER_JETPACK5)
    assert sample.rails_mw == {"GPU": 0, "CPU": 155, "SOC": 1242, "CV": 0, "VDDRQ": 155, "SYS5V": 1526}
    assert sample.total_mw == 1526 and sample.gpu_load == 0
    assert sample.temps_c["tdiode"] == 43.25
    assert mean_power_mw([sample, parse_line(ORIN_JETPACK5)]) == (1526 + 4152) / 2


def test_benchmark_off_a_jetson_runs_the_cpu_parts(
    exported_file, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    tflite, onnx = exported_file("encoder_dynamic", "tflite"), exported_file("encoder_dynamic", "onnx")
    code = jetson_benchmark([str(tflite), str(onnx), "--out", str(tmp_path / "bench"), "--target", "x86-cpu",
                             "--seq-len", "16", "--runs", "20"])  # fmt: skip
    printed = capsys.readouterr().out
    assert code == 0 and "not a Jetson" in printed and "mJ/inference" in printed
    runs = json.loads((tmp_path / "bench" / "results.json").read_text())["runs"]
    assert [r["run"] for r in runs] == ["tflite cpu (xnnpack)", "onnx cpu"]
    assert all(r["latency_ms"]["p50"] > 0 and r["mean_power_mw"] is None for r in runs)
    assert (tmp_path / "bench" / "results.csv").read_text().count("\n") == 3
