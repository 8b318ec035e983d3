"""tegrastats parsing (JetPack 4 to 6; Nano, Xavier, Orin) and the Jetson benchmark, off and on a Jetson."""

from __future__ import annotations

import json
import shlex
import stat
from pathlib import Path

import pytest

from pe_export.targets.jetson.benchmark import main as jetson_benchmark
from pe_export.targets.jetson.tegrastats import BOARD_RAILS, INPUT_RAILS, Sample, mean_power_mw, parse_line
from tests.helpers import REPO, shell_lines

# One line per format. Their shapes (field order, unitless JetPack 4 rails, the two `NC` channels
# of AGX Orin's second monitor, -256C for sensors a module lacks, lower-case sensors on JetPack 6)
# follow tegrastats output that Jetson users have published; the numbers are ours. None is a
# capture from this project's boards: those go in data/tegrastats/ (see its README) and are
# checked by test_captured_lines.
AGX_ORIN_JETPACK5 = (
    "03-14-2025 09:12:44 RAM 3381/30623MB (lfb 5820x4MB) SWAP 0/15311MB (cached 0MB) CPU [14%@1420,9%@1420,"
    "22%@1420,3%@1420,0%@729,1%@729,0%@729,2%@729,off,off,off,off] EMC_FREQ 4%@2133 GR3D_FREQ 37%@[918,918] "
    "VIC_FREQ 115 APE 174 CV0@-256C CPU@46.218C Tboard@34C SOC2@42.75C Tdiode@36.5C SOC0@43.593C CV1@-256C "
    "GPU@44.937C tj@46.218C SOC1@42.812C CV2@-256C VDD_GPU_SOC 6371mW/6012mW VDD_CPU_CV 1193mW/1120mW "
    "VIN_SYS_5V0 4427mW/4390mW NC 0mW/0mW VDDQ_VDD2_1V8AO 604mW/598mW NC 0mW/0mW"
)
ORIN_NX_JETPACK6 = (
    "RAM 2716/15656MB (lfb 1893x4MB) SWAP 0/7828MB (cached 0MB) CPU [31%@1984,18%@1984,25%@1984,12%@1984,"
    "off,off,off,off] EMC_FREQ 11%@3199 GR3D_FREQ 58%@[917,917] NVENC off NVDEC off NVJPG off NVJPG1 off "
    "VIC off OFA off NVDLA0 off NVDLA1 off PVA0_FREQ off APE 200 cpu@51.281C soc2@47.062C soc0@48.375C "
    "gpu@49.5C tj@51.281C soc1@47.843C cv0@-256C cv1@-256C cv2@-256C VDD_IN 11820mW/10904mW "
    "VDD_CPU_GPU_CV 5318mW/4766mW VDD_SOC 2391mW/2320mW"
)
AGX_XAVIER_JETPACK5 = (
    "RAM 2874/31920MB (lfb 6981x4MB) SWAP 0/15960MB (cached 0MB) CPU [7%@2265,3%@2265,0%@2265,5%@2265,"
    "2%@2265,0%@2265,1%@2265,4%@2265] EMC_FREQ 2%@2133 GR3D_FREQ 44%@1377 VIC_FREQ 115 APE 150 MTS fg 0% bg 1% "
    "AO@38C GPU@41C PMIC@50C AUX@38.5C CPU@40.5C thermal@39.5C Tboard@36C Tdiode@39.25C GPU 3512mW/3314mW "
    "CPU 621mW/598mW SOC 1706mW/1690mW CV 0mW/0mW VDDRQ 774mW/752mW SYS5V 2135mW/2120mW"
)
NANO_JETPACK4 = (
    "RAM 1624/3964MB (lfb 212x4MB) SWAP 0/1982MB (cached 0MB) IRAM 0/252kB(lfb 252kB) CPU [18%@1479,9%@1479,"
    "14%@1479,11%@1479] EMC_FREQ 6%@1600 GR3D_FREQ 27%@921 NVENC off NVDEC off APE 25 PLL@38C CPU@40.5C "
    "PMIC@100C GPU@37.5C AO@45C thermal@39C POM_5V_IN 3671/3590 POM_5V_GPU 402/380 POM_5V_CPU 813/790"
)
# cur/avg/max rails, as other tegrastats parsers expect from newer releases; unconfirmed by a capture.
AGX_ORIN_THREE_VALUE_RAILS = (
    "RAM 9120/62841MB (lfb 3x4MB) SWAP 0/31420MB (cached 0MB) CPU [41%@2201,37%@2201,52%@2201,30%@2201,"
    "28%@2201,33%@2201,45%@2201,39%@2201,26%@2201,31%@2201,35%@2201,29%@2201] EMC_FREQ 19%@3199 "
    "GR3D_FREQ 81%@[1300,1300] cpu@55.4C/56.1C gpu@58.2C/58.9C tj@58.9C/59.3C VDD_GPU_SOC 21480mW/19870mW/22960mW "
    "VDD_CPU_CV 3920mW/3801mW/4410mW VIN_SYS_5V0 6104mW/6012mW/6320mW VDDQ_VDD2_1V8AO 2512mW/2460mW/2590mW"
)
# AGX Thor (JetPack 7), from what Thor users report: no GPU load figure, VIN is the whole board's input.
AGX_THOR_JETPACK7 = (
    "RAM 9215/125772MB (lfb 12x4MB) SWAP 0/62886MB (cached 0MB) CPU [12%@2601,8%@2601,5%@2601,9%@2601] "
    "EMC_FREQ 3%@4266 GR3D_FREQ @[1575,1575,1575] cpu@53.7C soc012@55.1C soc345@53.7C tj@55.1C "
    "VDD_GPU 1204mW/1180mW VDD_CPU_SOC_MSS 6510mW/6402mW VIN_SYS_5V0 6520mW/6499mW VIN 23140mW/22980mW"
)
FORMATS = [
    AGX_ORIN_JETPACK5,
    ORIN_NX_JETPACK6,
    AGX_XAVIER_JETPACK5,
    NANO_JETPACK4,
    AGX_ORIN_THREE_VALUE_RAILS,
    AGX_THOR_JETPACK7,
]
CAPTURES = Path(__file__).parent / "data" / "tegrastats"


def test_agx_orin_module_power_is_the_sum_of_its_rails() -> None:
    # VIN_SYS_5V0 is AGX Orin's 5 V system rail, not its input: it reads less than VDD_GPU_SOC
    # under load, so taking it as the total would report a third of the module's power.
    sample = parse_line(AGX_ORIN_JETPACK5)
    assert sample.timestamp == "03-14-2025 09:12:44"
    assert (sample.ram_used_mb, sample.ram_total_mb) == (3381, 30623)
    assert sample.cpu_load == [14, 9, 22, 3, 0, 1, 0, 2, None, None, None, None]
    assert sample.gpu_load == 37
    assert sample.rails_mw == {"VDD_GPU_SOC": 6371, "VDD_CPU_CV": 1193, "VIN_SYS_5V0": 4427, "VDDQ_VDD2_1V8AO": 604}
    assert sample.total_mw == 6371 + 1193 + 4427 + 604
    assert sample.power_basis == "VDD_GPU_SOC+VDD_CPU_CV+VIN_SYS_5V0+VDDQ_VDD2_1V8AO"
    assert sample.temps_c["tj"] == 46.218 and sample.temps_c["gpu"] == 44.937
    assert not {"cv0", "cv1", "cv2"} & sample.temps_c.keys()  # -256C: no such sensor on this module


def test_orin_nx_module_power_is_its_input_rail() -> None:
    sample = parse_line(ORIN_NX_JETPACK6)
    assert sample.total_mw == 11820 and sample.power_basis == "VDD_IN"
    assert sample.cpu_load == [31, 18, 25, 12, None, None, None, None] and sample.gpu_load == 58
    assert sample.temps_c == {"cpu": 51.281, "soc2": 47.062, "soc0": 48.375, "gpu": 49.5, "tj": 51.281, "soc1": 47.843}


def test_agx_xavier_module_power_is_the_sum_of_its_six_rails() -> None:
    sample = parse_line(AGX_XAVIER_JETPACK5)
    assert sample.rails_mw == {"GPU": 3512, "CPU": 621, "SOC": 1706, "CV": 0, "VDDRQ": 774, "SYS5V": 2135}
    assert sample.total_mw == 8748 and sample.gpu_load == 44
    assert sample.temps_c["tdiode"] == 39.25


def test_jetpack4_rails_without_units_and_iram_is_not_a_rail() -> None:
    sample = parse_line(NANO_JETPACK4)
    assert sample.rails_mw == {"POM_5V_IN": 3671, "POM_5V_GPU": 402, "POM_5V_CPU": 813}
    assert sample.total_mw == 3671 and (sample.ram_used_mb, sample.gpu_load) == (1624, 27)


def test_three_value_rails_take_the_instantaneous_value() -> None:
    sample = parse_line(AGX_ORIN_THREE_VALUE_RAILS)
    assert sample.rails_mw == {"VDD_GPU_SOC": 21480, "VDD_CPU_CV": 3920, "VIN_SYS_5V0": 6104, "VDDQ_VDD2_1V8AO": 2512}
    assert len(sample.cpu_load) == 12 and sample.temps_c["tj"] == 58.9


def test_thor_module_power_leaves_out_the_board_input() -> None:
    sample = parse_line(AGX_THOR_JETPACK7)
    assert sample.rails_mw["VIN"] == 23140 and sample.gpu_load is None  # Thor prints no GR3D load
    assert sample.power_basis == "VDD_GPU+VDD_CPU_SOC_MSS+VIN_SYS_5V0" and sample.total_mw == 1204 + 6510 + 6520


def test_mean_power_skips_lines_without_rails() -> None:
    samples = [parse_line(ORIN_NX_JETPACK6), parse_line("RAM 2716/15656MB (lfb 1893x4MB)"), parse_line("")]
    assert samples[1].total_mw is None and samples[2] == Sample()
    assert mean_power_mw(samples) == 11820
    assert mean_power_mw(samples[1:]) is None


def check_line(sample: Sample) -> None:
    """What every tegrastats line must satisfy, whichever the board."""
    assert sample.ram_used_mb is not None and sample.cpu_load, "RAM or CPU field not parsed"
    assert sample.rails_mw, "no power rail parsed"
    for rail in (*INPUT_RAILS, *BOARD_RAILS):  # an input feeds the other rails: it can't read less than any
        if rail in sample.rails_mw:
            assert all(sample.rails_mw[rail] >= mw for mw in sample.rails_mw.values()), sample.rails_mw
    assert all(-60 < t < 130 for t in sample.temps_c.values()), sample.temps_c


@pytest.mark.parametrize(
    "line", FORMATS, ids=["agx-orin-jp5", "orin-nx-jp6", "agx-xavier-jp5", "nano-jp4", "3-value", "thor-jp7"]
)
def test_every_format_passes_the_line_checks(line: str) -> None:
    check_line(parse_line(line))


def test_captured_lines() -> None:
    captures = sorted(CAPTURES.glob("*.log"))
    if not captures:
        pytest.skip(f"no tegrastats capture from a Jetson in {CAPTURES} yet (see its README)")
    for capture in captures:
        for number, line in enumerate(capture.read_text().splitlines(), 1):
            if line.strip():
                try:
                    check_line(parse_line(line))
                except AssertionError as err:
                    raise AssertionError(f"{capture.name}:{number}: {err}") from None


def test_the_examples_benchmark_lines_off_a_jetson_run_the_cpu_parts(
    saved_model, tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """examples/jetson-bench/README.md's commands as written (in this process), on the suite's encoder_dynamic
    exported as encoder.tflite and encoder.onnx with its table extended to the profile's 128 positions: off a Jetson
    each says so and runs the CPU parts."""
    from pe_export.api import export_onnx, export_tflite
    from pe_export.converters.options import ExportOptions
    from pe_export.tables.pipeline import TableOptions

    for export, suffix in ((export_tflite, "tflite"), (export_onnx, "onnx")):
        options = ExportOptions(tables=TableOptions(max_len=128), verify=False)
        export(saved_model("encoder_dynamic"), tmp_path / f"encoder.{suffix}", options)
    monkeypatch.setenv("PATH", str(tmp_path / "nothing"))  # no tegrastats, whatever this machine has
    monkeypatch.chdir(tmp_path)
    lines = shell_lines(REPO / "examples" / "jetson-bench" / "README.md")
    module = "python -m pe_export.targets.jetson.benchmark "
    assert len(lines) == 2 and all(line.startswith(module) for line in lines), lines
    expected = {"jetson-bench": ["tflite cpu (xnnpack)", "onnx cpu"], "jetson-bench-128": ["onnx cpu"]}
    for line, (out, runs) in zip(lines, expected.items(), strict=True):
        code = jetson_benchmark(shlex.split(line.removeprefix(module)))
        printed = capsys.readouterr().out
        assert code == 0 and "not a Jetson" in printed and "mJ/inference" in printed
        results = json.loads((tmp_path / out / "results.json").read_text())["runs"]
        assert [r["run"] for r in results] == runs
        assert all(r["latency_ms"]["p50"] > 0 and r["mean_power_mw"] is None for r in results)
        assert (tmp_path / out / "results.csv").read_text().count("\n") == len(runs) + 1
    assert json.loads((tmp_path / "jetson-bench-128" / "results.json").read_text())["runs"][0]["runs"] == 500


FAKE_TEGRASTATS = """#!/bin/sh
# tegrastats --interval MS --logfile FILE, as on a Jetson: a line per interval, appended.
# The idle measurement (its log is named so) reads IDLE_LINE, the runs LINE.
while [ $# -gt 0 ]; do [ "$1" = --logfile ] && log=$2; shift; done
case "$log" in *idle*) line=$IDLE_LINE ;; *) line=$LINE ;; esac
while true; do echo "$line" >> "$log"; sleep 0.05; done
"""
IDLE_MW, LOAD_MW = 4000, 11820
ORIN_NX_IDLE = ORIN_NX_JETPACK6.replace("VDD_IN 11820mW/10904mW", f"VDD_IN {IDLE_MW}mW/{IDLE_MW}mW")


def test_benchmark_on_a_jetson_records_power_and_keeps_the_logs(
    exported_file, tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The Jetson's tools are faked (this machine has none); the runtimes and models are real.
    tools = tmp_path / "bin"
    tools.mkdir()
    fake_nvpmodel = "#!/bin/sh\necho 'NV Power Mode: MAXN'\necho 0\n"
    for name, body in (("tegrastats", FAKE_TEGRASTATS), ("nvpmodel", fake_nvpmodel)):
        (tools / name).write_text(body)
        (tools / name).chmod(stat.S_IRWXU)
    monkeypatch.setenv("PATH", f"{tools}:/usr/bin:/bin")
    monkeypatch.setenv("LINE", ORIN_NX_JETPACK6)
    monkeypatch.setenv("IDLE_LINE", ORIN_NX_IDLE)
    onnx = exported_file("encoder_dynamic", "onnx")
    out = tmp_path / "bench"
    # Enough runs that the timed window spans several 50 ms samples.
    code = jetson_benchmark([str(onnx), "--out", str(out), "--seq-len", "16", "--runs", "3000", "--idle-s", "0.3"])
    printed = capsys.readouterr().out
    # This machine's onnxruntime has no TensorRT or CUDA provider: those runs fail by name, exit 3.
    assert code == 3 and "not a Jetson" not in printed and "power mode: NV Power Mode: MAXN" in printed
    results = json.loads((out / "results.json").read_text())
    assert results["environment"]["jetson"] is True and results["environment"]["idle_power_mw"] == IDLE_MW
    runs = {r["run"]: r for r in results["runs"]}
    assert "tensorrt" in runs["onnx tensorrt"]["error"].lower() and "cuda" in runs["onnx cuda"]["error"].lower()
    assert "tensorrt" in runs["onnx tensorrt fp16"]["error"].lower()  # the build as deployed, asked the same way
    cpu = runs["onnx cpu"]
    assert cpu["mean_power_mw"] == LOAD_MW and cpu["power_basis"] == "VDD_IN"
    # Only the samples taken during the timed runs: the log also holds those of start-up, load and warm-up.
    logged = (out / cpu["tegrastats_log"]).read_text().splitlines()
    assert cpu["power_window"] == "timed runs" and 2 <= cpu["power_samples"] < len(logged)
    assert logged[0] == ORIN_NX_JETPACK6
    p50 = cpu["latency_ms"]["p50"]
    assert cpu["energy_mj_per_inference"] == pytest.approx(LOAD_MW * p50 / 1000)
    assert cpu["energy_above_idle_mj_per_inference"] == pytest.approx((LOAD_MW - IDLE_MW) * p50 / 1000)
    assert cpu["max_temp_c"] == 51.281 and cpu["mean_gpu_load"] == 58
    assert cpu["mean_rails_mw"] == {"VDD_IN": LOAD_MW, "VDD_CPU_GPU_CV": 5318, "VDD_SOC": 2391}
    assert cpu["mean_cpu_load"] == (31 + 18 + 25 + 12) / 4 and cpu["max_ram_used_mb"] == 2716
    assert f"idle {IDLE_MW} mW" in printed and "module power from VDD_IN over the timed runs" in printed
