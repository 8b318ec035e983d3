"""On-device benchmark for Jetson: power mode, clocks, tegrastats power during each run.

    python -m pe_export.targets.jetson.benchmark encoder.tflite encoder.onnx --out jetson-bench/

Records `nvpmodel -q` and `jetson_clocks --show`, samples tegrastats every 100 ms while
`pe-export bench` runs the .tflite on the CPU (XNNPACK) and the .onnx with the TensorRT,
CUDA and CPU providers, and writes results.json, results.csv, each run's raw tegrastats log
and a one-screen summary with energy per inference: mean module power over the timed runs
(not the model load or warm-up) × median latency, in all and above the idle power measured
before the runs. Module power is the input rail where the module has one (Orin NX/Nano:
VDD_IN), else the sum of its rails (AGX Orin, AGX Xavier); the carrier board is never
included. Off a Jetson it says so and still runs the CPU parts.
"""

from __future__ import annotations

import argparse
import csv
import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from pe_export.bench import BenchOptions, run_bench
from pe_export.errors import PeExportError
from pe_export.targets import get_profile
from pe_export.targets.jetson.tegrastats import Sample, mean_power_mw, parse_line

SAMPLE_INTERVAL_MS = 100
IDLE_S = 3.0  # idle power is the mean over this long, before any model is loaded
RUNS = (  # (label, file suffix, runtime, providers, TensorRT's float16 layers allowed)
    ("tflite cpu (xnnpack)", ".tflite", "litert", (), False),
    ("onnx tensorrt", ".onnx", "onnxruntime", ("tensorrt", "cuda", "cpu"), False),
    ("onnx tensorrt fp16", ".onnx", "onnxruntime", ("tensorrt", "cuda", "cpu"), True),  # as Jetsons deploy it
    ("onnx cuda", ".onnx", "onnxruntime", ("cuda", "cpu"), False),
    ("onnx cpu", ".onnx", "onnxruntime", ("cpu",), False),
)


def command_output(*command: str) -> str | None:
    if shutil.which(command[0]) is None:
        return None
    done = subprocess.run(command, capture_output=True, text=True, check=False, timeout=30)
    return (done.stdout + done.stderr).strip()


class Tegrastats:
    """tegrastats writing to `log` for the duration of a `with` block; the log is kept as the run's record."""

    def __init__(self, log: Path) -> None:
        self.available = shutil.which("tegrastats") is not None
        self.log = log
        self.process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> Tegrastats:
        if self.available:
            self.log.unlink(missing_ok=True)  # --logfile appends
            self.process = subprocess.Popen(
                ["tegrastats", "--interval", str(SAMPLE_INTERVAL_MS), "--logfile", str(self.log)]
            )
            time.sleep(2 * SAMPLE_INTERVAL_MS / 1000)
        return self

    def __exit__(self, *exc: object) -> None:
        # Only our own process: `tegrastats --stop` would also end one the user started with --start.
        if self.process:
            self.process.terminate()
            self.process.wait(timeout=10)

    def samples(self) -> list[Sample]:
        return [parse_line(line) for line in self._lines()]

    def _lines(self) -> list[str]:
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return [line for line in text.splitlines() if line.strip()]

    def mark(self) -> int:
        """How many samples the log holds now: bounds of a window of the run."""
        return len(self._lines()) if self.available else 0


def measure_idle(log: Path, seconds: float) -> float | None:
    """Mean module power with nothing of ours running (None off a Jetson or with --idle-s 0)."""
    if seconds <= 0:
        return None
    with Tegrastats(log) as power:
        if not power.available:
            return None
        time.sleep(seconds)
    return mean_power_mw(power.samples())


class TimedWindow:
    """A bench progress callback that marks where the timed runs start and end in the tegrastats log."""

    def __init__(self, power: Tegrastats) -> None:
        self.power, self.start, self.end = power, 0, 0

    def __call__(self, done: int, total: int) -> None:
        # Called between timed calls, outside the measured time: reading the log costs no latency.
        if done == 1:
            self.start = self.power.mark()
        if done == total:
            self.end = self.power.mark()

    def samples(self) -> tuple[list[Sample], str]:
        """The samples taken during the timed runs, else (a window shorter than one sample) all of them."""
        everything = self.power.samples()
        inside = everything[self.start : self.end]
        return (inside, "timed runs") if inside else (everything, "whole run (timed runs shorter than one sample)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="+", type=Path, help=".tflite and/or .onnx files")
    parser.add_argument("--out", type=Path, default=Path("jetson-bench"))
    parser.add_argument("--target", default="jetson-agx-orin")
    parser.add_argument("--seq-len", type=int, default=None, help="override the profile's sequence length")
    parser.add_argument("--runs", type=int, default=None, help="override the profile's number of runs")
    parser.add_argument("--idle-s", type=float, default=IDLE_S, help="seconds of idle power to measure first (0: skip)")
    args = parser.parse_args(argv)
    profile = get_profile(args.target)
    args.out.mkdir(parents=True, exist_ok=True)
    on_jetson = shutil.which("tegrastats") is not None
    environment = {
        "jetson": on_jetson,
        "nvpmodel": command_output("nvpmodel", "-q"),
        "jetson_clocks": command_output("jetson_clocks", "--show"),
        "l4t_release": Path("/etc/nv_tegra_release").read_text().strip()
        if Path("/etc/nv_tegra_release").exists()
        else None,
    }
    if not on_jetson:
        print("not a Jetson (no tegrastats on PATH): running the CPU parts only, without power figures")
    environment["idle_power_mw"] = measure_idle(args.out / "tegrastats-idle.log", args.idle_s) if on_jetson else None
    results = []
    for model in args.models:
        for label, suffix, runtime, providers, fp16 in RUNS:
            if model.suffix != suffix or (providers and providers[0] != "cpu" and not on_jetson):
                continue
            settings = {**profile.bench, **{k: v for k, v in (("seq_len", args.seq_len), ("runs", args.runs)) if v}}
            tensorrt = {"trt_fp16": fp16, "trt_cache": str(args.out / "trt-cache")} if "tensorrt" in providers else {}
            options = BenchOptions(runtime=runtime, providers=providers or ("cpu",), **settings, **tensorrt)
            log = args.out / f"tegrastats-{model.stem}-{re.sub(r'[^a-z0-9]+', '-', label).strip('-')}.log"
            with Tegrastats(log) as power:
                window = TimedWindow(power)
                try:
                    bench = run_bench(model, options, progress=window)
                except PeExportError as err:
                    results.append({"model": str(model), "run": label, "error": str(err)})
                    continue
            figures = power_figures(*window.samples(), bench.latency_ms["p50"], environment["idle_power_mw"])
            kept_log = log.name if log.exists() else None
            row = {"model": str(model), "run": label, **bench.to_dict(), "tegrastats_log": kept_log, **figures}
            results.append(row)
    (args.out / "results.json").write_text(json.dumps({"environment": environment, "runs": results}, indent=2))
    columns = [
        "model",
        "run",
        "runtime",
        "p50",
        "p90",
        "p99",
        "sequences_per_s",
        "mean_power_mw",
        "energy_mj_per_inference",
        "energy_above_idle_mj_per_inference",
        "max_temp_c",
        "mean_gpu_load",
        "mean_cpu_load",
        "max_ram_used_mb",
        "error",
    ]
    with (args.out / "results.csv").open("w", newline="") as handle:
        writer = csv.DictWriter(handle, columns, extrasaction="ignore")
        writer.writeheader()
        for row in results:
            writer.writerow({**row, **row.get("latency_ms", {})})
    print(summary(environment, results))
    return 0 if all("error" not in row for row in results) else 3


def power_figures(samples: list[Sample], window: str, p50_ms: float, idle_mw: float | None) -> dict[str, Any]:
    """Mean power over the samples and the energy of one median inference (mW × ms = µJ, /1000 = mJ)."""
    mean = mean_power_mw(samples)
    above_idle = mean - idle_mw if mean is not None and idle_mw is not None else None
    return {
        "power_samples": len(samples),
        "power_window": window if samples else None,
        "power_basis": samples[0].power_basis if samples else None,
        "mean_power_mw": mean,
        "energy_mj_per_inference": mean * p50_ms / 1000 if mean is not None else None,
        "energy_above_idle_mj_per_inference": above_idle * p50_ms / 1000 if above_idle is not None else None,
        "mean_rails_mw": {rail: _mean([s.rails_mw.get(rail) for s in samples]) for rail in _rails(samples)},
        "max_temp_c": max((max(s.temps_c.values()) for s in samples if s.temps_c), default=None),
        "mean_gpu_load": _mean([s.gpu_load for s in samples]),
        # Mean over the cores that were on; a core tegrastats shows as "off" is left out.
        "mean_cpu_load": _mean([load for s in samples for load in s.cpu_load]),
        "max_ram_used_mb": max((s.ram_used_mb for s in samples if s.ram_used_mb is not None), default=None),
    }


def _rails(samples: list[Sample]) -> list[str]:
    return list(dict.fromkeys(rail for s in samples for rail in s.rails_mw))


def _mean(values: list[int | None]) -> float | None:
    present = [v for v in values if v is not None]
    return sum(present) / len(present) if present else None


def summary(environment: dict[str, Any], results: list[dict[str, Any]]) -> str:
    mode = (environment["nvpmodel"] or "n/a").splitlines()[0] if environment["nvpmodel"] else "n/a"
    idle = environment.get("idle_power_mw")
    lines = [
        f"power mode: {mode}; idle {'-' if idle is None else f'{idle:.0f}'} mW",
        f"{'run':<22} {'p50 ms':>8} {'seq/s':>9} {'mean mW':>9} {'mJ/inference':>13} {'above idle':>11}",
    ]
    for row in results:
        if "error" in row:
            lines.append(f"{row['run']:<22} error: {row['error']}")
            continue
        power, energy, dynamic = (
            "-" if row[key] is None else f"{row[key]:.{digits}f}"
            for key, digits in (
                ("mean_power_mw", 0),
                ("energy_mj_per_inference", 3),
                ("energy_above_idle_mj_per_inference", 3),
            )
        )
        lines.append(
            f"{row['run']:<22} {row['latency_ms']['p50']:>8.3f} {row['sequences_per_s']:>9.1f} "
            f"{power:>9} {energy:>13} {dynamic:>11}"
        )
    bases = sorted({row["power_basis"] for row in results if row.get("power_basis")})
    if bases:
        lines.append(f"mean mW: module power from {', '.join(bases)} over the timed runs (carrier board not included)")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
