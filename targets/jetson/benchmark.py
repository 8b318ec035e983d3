"""On-device benchmark for Jetson: power mode, clocks, tegrastats power during each run.

    python -m pe_export.targets.jetson.benchmark encoder.tflite encoder.onnx --out jetson-bench/

Records `nvpmodel -q` and `jetson_clocks --show`, samples tegrastats every 100 ms while
`pe-export bench` runs the .tflite on the CPU (XNNPACK) and the .onnx with the TensorRT,
CUDA and CPU providers, and writes results.json, results.csv, each run's raw tegrastats log
and a one-screen summary with energy per inference (mean module power × median latency).
Module power is the input rail where the module has one (Orin NX/Nano: VDD_IN), else the
sum of its rails (AGX Orin, AGX Xavier); the carrier board is never included. Off a Jetson
it says so and still runs the CPU parts.
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
RUNS = (  # (label, file suffix, runtime, providers)
    ("tflite cpu (xnnpack)", ".tflite", "litert", ()),
    ("onnx tensorrt", ".onnx", "onnxruntime", ("tensorrt", "cuda", "cpu")),
    ("onnx cuda", ".onnx", "onnxruntime", ("cuda", "cpu")),
    ("onnx cpu", ".onnx", "onnxruntime", ("cpu",)),
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
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return [parse_line(line) for line in text.splitlines() if line.strip()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="+", type=Path, help=".tflite and/or .onnx files")
    parser.add_argument("--out", type=Path, default=Path("jetson-bench"))
    parser.add_argument("--target", default="jetson-agx-orin")
    parser.add_argument("--seq-len", type=int, default=None, help="override the profile's sequence length")
    parser.add_argument("--runs", type=int, default=None, help="override the profile's number of runs")
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
    results = []
    for model in args.models:
        for label, suffix, runtime, providers in RUNS:
            if model.suffix != suffix or (providers and providers[0] != "cpu" and not on_jetson):
                continue
            settings = {**profile.bench, **{k: v for k, v in (("seq_len", args.seq_len), ("runs", args.runs)) if v}}
            options = BenchOptions(runtime=runtime, providers=providers or ("cpu",), **settings)
            log = args.out / f"tegrastats-{model.stem}-{re.sub(r'[^a-z0-9]+', '-', label).strip('-')}.log"
            with Tegrastats(log) as power:
                try:
                    bench = run_bench(model, options)
                except PeExportError as err:
                    results.append({"model": str(model), "run": label, "error": str(err)})
                    continue
            samples = power.samples()
            watts = mean_power_mw(samples)
            row = {"model": str(model), "run": label, **bench.to_dict(), "power_samples": len(samples),
                   "mean_power_mw": watts, "power_basis": samples[0].power_basis if samples else None,
                   "tegrastats_log": log.name if log.exists() else None,
                   "energy_mj_per_inference": watts * bench.latency_ms["p50"] / 1000 if watts else None,
                   "max_temp_c": max((max(s.temps_c.values()) for s in samples if s.temps_c), default=None),
                   "mean_gpu_load": _mean([s.gpu_load for s in samples])}  # fmt: skip
            results.append(row)
    (args.out / "results.json").write_text(json.dumps({"environment": environment, "runs": results}, indent=2))
    columns = ["model", "run", "runtime", "p50", "p90", "p99", "sequences_per_s", "mean_power_mw",
               "energy_mj_per_inference", "max_temp_c", "error"]  # fmt: skip
    with (args.out / "results.csv").open("w", newline="") as handle:
        writer = csv.DictWriter(handle, columns, extrasaction="ignore")
        writer.writeheader()
        for row in results:
            writer.writerow({**row, **row.get("latency_ms", {})})
    print(summary(environment, results))
    return 0 if all("error" not in row for row in results) else 3


def _mean(values: list[int | None]) -> float | None:
    present = [v for v in values if v is not None]
    return sum(present) / len(present) if present else None


def summary(environment: dict[str, Any], results: list[dict[str, Any]]) -> str:
    mode = (environment["nvpmodel"] or "n/a").splitlines()[0] if environment["nvpmodel"] else "n/a"
    lines = [f"power mode: {mode}", f"{'run':<22} {'p50 ms':>8} {'seq/s':>9} {'mean mW':>9} {'mJ/inference':>13}"]
    for row in results:
        if "error" in row:
            lines.append(f"{row['run']:<22} error: {row['error']}")
            continue
        power = "-" if row["mean_power_mw"] is None else f"{row['mean_power_mw']:.0f}"
        energy = "-" if row["energy_mj_per_inference"] is None else f"{row['energy_mj_per_inference']:.3f}"
        lines.append(f"{row['run']:<22} {row['latency_ms']['p50']:>8.3f} {row['sequences_per_s']:>9.1f} "
                     f"{power:>9} {energy:>13}")  # fmt: skip
    bases = sorted({row["power_basis"] for row in results if row.get("power_basis")})
    if bases:
        lines.append(f"mean mW = module power from {', '.join(bases)} (carrier board not included)")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
