"""The device-side check, side by side: `pe-export parity` against a bare runtime script and Polygraphy.

    python benchmarks/device_check.py [--device-python PATH] [--runs 7]

The tiny encoder (pe_export/encoders/tiny.py) is exported to .onnx and .tflite with a 16-sample golden bundle.
Each command runs in a fresh process of a TF-free interpreter (the device venv that tests/test_device_extra.py
caches, or --device-python): wall time, and the peak of the summed resident memory of its whole process tree
(polled every 2 ms), medians over --runs interleaved runs. The bare scripts are the ten lines a user would
write instead: load the runtime, feed each batch, compare with the stored outputs. Polygraphy (`polygraphy run
--onnxrt --load-inputs --load-outputs`, the same comparison) is timed where it installs; it has no TFLite
runner."""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from pe_export.api import export_onnx, export_tflite  # noqa: E402
from pe_export.converters.options import ExportOptions  # noqa: E402
from pe_export.encoders.tiny import build_encoder  # noqa: E402
from pe_export.golden import GoldenOptions, make_golden  # noqa: E402
from pe_export.native import import_tensorflow  # noqa: E402
from tests.helpers import cached_venv  # noqa: E402

BARE = {
    "onnx": """import glob, json, sys, numpy as np, onnxruntime as ort
session = ort.InferenceSession(sys.argv[1], providers=["CPUExecutionProvider"])
manifest, worst = json.load(open(sys.argv[2] + "/manifest.json")), 0.0
for entry in manifest["batches"]:
    arrays = np.load(sys.argv[2] + "/batches/" + entry["file"].split("/")[-1])
    feed = {k.split("/", 1)[1]: arrays[k] for k in arrays.files if k.startswith("input/")}
    for name, value in zip([o.name for o in session.get_outputs()], session.run(None, feed)):
        worst = max(worst, float(np.abs(value - arrays["output/" + name]).max()))
print("max abs", worst, "PASS" if worst <= 1e-4 else "FAIL")
""",
    "tflite": """import glob, json, sys, numpy as np
from ai_edge_litert.interpreter import Interpreter
run = Interpreter(model_path=sys.argv[1]).get_signature_runner()
manifest, worst = json.load(open(sys.argv[2] + "/manifest.json")), 0.0
for entry in manifest["batches"]:
    arrays = np.load(sys.argv[2] + "/batches/" + entry["file"].split("/")[-1])
    feed = {k.split("/", 1)[1]: arrays[k] for k in arrays.files if k.startswith("input/")}
    for name, value in run(**feed).items():
        worst = max(worst, float(np.abs(value - arrays["output/" + name]).max()))
print("max abs", worst, "PASS" if worst <= 1e-4 else "FAIL")
""",
}
# Polygraphy's own input and output files, written in its venv from the bundle.
POLYGRAPHY_FILES = """import json, sys, numpy as np
from polygraphy.comparator import IterationResult, RunResults
from polygraphy.json import save_json
bundle, out = sys.argv[1], sys.argv[2]
manifest = json.load(open(bundle + "/manifest.json"))
feeds, outputs = [], []
for entry in manifest["batches"]:
    arrays = np.load(bundle + "/batches/" + entry["file"].split("/")[-1])
    feeds.append({k.split("/", 1)[1]: arrays[k] for k in arrays.files if k.startswith("input/")})
    golden = {k.split("/", 1)[1]: arrays[k] for k in arrays.files if k.startswith("output/")}
    outputs.append(IterationResult(outputs=golden, runner_name="golden"))
save_json(feeds, out + "/inputs.json")
results = RunResults()
results.append(("golden", outputs))
results.save(out + "/outputs.json")
"""


def tree_peak(command: list[str], field: str = "VmRSS") -> tuple[float, float, int]:
    """(wall seconds, peak summed memory of the process tree in MiB, exit code).

    ``field``: VmRSS (from /proc/PID/status; a page shared by two processes counts twice, as a forked
    child's pages inherited from its parent do) or Pss (from /proc/PID/smaps_rollup; each shared page is
    split among its sharers, so the sum is what the tree really holds; slower to read, so timed apart).
    """
    source = "status" if field == "VmRSS" else "smaps_rollup"

    def memory(pid: int) -> int:
        total, stack = 0, [pid]
        while stack:
            current = stack.pop()
            try:
                text = Path(f"/proc/{current}/{source}").read_text()
                total += next(int(line.split()[1]) for line in text.splitlines() if line.startswith(f"{field}:"))
                stack.extend(int(c) for c in Path(f"/proc/{current}/task/{current}/children").read_text().split())
            except (OSError, StopIteration):
                pass
        return total

    started = time.perf_counter()
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    peak = 0
    while process.poll() is None:
        peak = max(peak, memory(process.pid))
        time.sleep(0.002)
    return time.perf_counter() - started, peak / 1024, process.returncode


def polygraphy_python() -> Path | None:
    try:
        venv = cached_venv("polygraphy-venv", [f"{REPO}[device]", "polygraphy", "colored"])
    except AssertionError as err:  # not installable here
        print(f"polygraphy: not installed ({str(err).splitlines()[-1][:100]})")
        return None
    return venv / "bin" / "python"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device-python", type=Path, default=None)
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    python = args.device_python or cached_venv("device-venv", [f"{REPO}[device]"]) / "bin" / "python"
    work = Path(tempfile.mkdtemp(prefix="pe-export-device-check-"))
    import_tensorflow()
    saved_model = work / "encoder"
    build_encoder(None, multi_io=True).export(str(saved_model), verbose=False)
    models = {"onnx": work / "m.onnx", "tflite": work / "m.tflite"}
    export_onnx(saved_model, models["onnx"], ExportOptions(verify=False))
    export_tflite(saved_model, models["tflite"], ExportOptions(verify=False))
    bundle = work / "golden"
    make_golden(saved_model, bundle, GoldenOptions(samples=16))
    for kind, script in BARE.items():
        (work / f"bare_{kind}.py").write_text(script)
    commands = {}
    for kind, model in models.items():
        commands[(kind, "bare script")] = [str(python), str(work / f"bare_{kind}.py"), str(model), str(bundle)]
        commands[(kind, "pe-export parity")] = [str(python), "-m", "pe_export.cli", "parity", str(model), str(bundle)]
        commands[(kind, "--no-isolate")] = [*commands[(kind, "pe-export parity")], "--no-isolate"]
    polygraphy = polygraphy_python()
    if polygraphy:
        (work / "polygraphy_files.py").write_text(POLYGRAPHY_FILES)
        subprocess.run([str(polygraphy), str(work / "polygraphy_files.py"), str(bundle), str(work)], check=True)
        tool = polygraphy.parent / "polygraphy"
        commands[("onnx", "polygraphy run")] = [
            str(tool),
            "run",
            str(models["onnx"]),
            "--onnxrt",
            "--load-inputs",
            str(work / "inputs.json"),
            "--load-outputs",
            str(work / "outputs.json"),
            "--atol",
            "1e-4",
            "--rtol",
            "1e-4",
        ]
    figures: dict[tuple[str, str], list[tuple[float, float, int]]] = {key: [] for key in commands}
    shared: dict[tuple[str, str], list[float]] = {key: [] for key in commands}
    for _ in range(args.runs):  # interleaved, so that drift hits every command alike
        for key, command in commands.items():
            figures[key].append(tree_peak(command))
        for key, command in commands.items():  # PSS apart: reading it slows the polling that times a run
            shared[key].append(tree_peak(command, "Pss")[1])
    print(f"checker python: {python}; 16 samples; medians of {args.runs} runs; memory: peak of the tree's sum")
    print(
        f"{'model':<7} {'command':<17} {'wall s':>7} {'× bare':>7} {'RSS MiB':>8} {'× bare':>7} {'PSS MiB':>8} "
        f"{'× bare':>7} {'exit':>5}"
    )
    for (kind, name), runs in figures.items():
        wall, peak = statistics.median(r[0] for r in runs), statistics.median(r[1] for r in runs)
        pss = statistics.median(shared[(kind, name)])
        bare = figures[(kind, "bare script")]
        bare_wall, bare_peak = statistics.median(r[0] for r in bare), statistics.median(r[1] for r in bare)
        bare_pss = statistics.median(shared[(kind, "bare script")])
        codes = sorted({r[2] for r in runs})
        print(
            f"{kind:<7} {name:<17} {wall:>7.3f} {wall / bare_wall:>6.2f}x {peak:>8.1f} {peak / bare_peak:>6.2f}x "
            f"{pss:>8.1f} {pss / bare_pss:>6.2f}x {','.join(map(str, codes)):>5}"
        )
    figures_json = {f"{k}/{n}": {"runs": runs, "pss_mib": shared[(k, n)]} for (k, n), runs in figures.items()}
    (work / "figures.json").write_text(json.dumps(figures_json))


if __name__ == "__main__":
    main()
