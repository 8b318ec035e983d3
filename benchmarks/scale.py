"""Export cost at the sizes users ship, side by side with the bare converters: wall time and the peak resident
memory of the whole process tree (its summed RSS sampled every 50 ms, or a process's own kernel high-water mark
where that is higher: a spike between samples), per format, plain and --quantize dynamic-int8.

    python benchmarks/scale.py [--sizes minilm,base,large,xlmr-large] [--formats tflite,onnx]
                               [--int8] [--float16] [--static-int8] [--cap-gb 21]
                               [--repeat 3]

Random-init keras-hub BertBackbones built in code (weights drawn from a seeded normal so no two are equal, as
in a trained model): MiniLM-sized (6 layers, d=384), BERT-base (12, 768) and BERT-large (24, 1024) shapes, vocab
30522, 512 positions; and xlmr-large, an XLMRobertaBackbone of XLM-R-large's shape (vocab 250002, 24 layers,
d=1024: 2.24 GB of float32 weights, past the 2 GiB a TFLite flatbuffer or a protobuf holds). Each command runs in
its own process; one that passes --cap-gb of process-tree memory is killed and shown as such (the machine would
otherwise thrash for minutes). Every pe-export run verifies its file. The last column is the wall time against
pe-export's own fp32 export of the same model and format (the int8 rows: dynamic-int8 as it is, and with a
--min-cosine that every-weight-int8 misses, so the keep-float search runs).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

SHAPES = {  # num_layers, hidden_dim, num_heads, intermediate_dim
    "minilm": (6, 384, 12, 1536),
    "base": (12, 768, 12, 3072),
    "large": (24, 1024, 16, 4096),
    "mid": (6, 512, 8, 2048),  # the size tests/test_scale.py holds to the memory bound
    "xlmr-large": (24, 1024, 16, 4096),  # XLM-R-large: 560M parameters, 2.24 GB of float32, past 2 GiB
}
VOCAB, POSITIONS = 30522, 512
FAMILY = {"xlmr-large": ("XLMRobertaBackbone", 250002)}  # size → (keras-hub class, vocabulary); else BERT
STRICT_COSINE = 0.9999  # random-init BERT-base all-int8: 0.99965

BUILD = """
import sys
sys.path.insert(0, sys.argv[8])
from pathlib import Path
from tests.fixtures.keras_hub_models import export_random_bert
layers, hidden, heads, ff, vocab, positions = (int(a) for a in sys.argv[2:8])
export_random_bert(Path(sys.argv[1]), num_layers=layers, hidden_dim=hidden, num_heads=heads, intermediate_dim=ff,
                   vocabulary_size=vocab, max_sequence_length=positions, family=sys.argv[9])
"""
REPO = Path(__file__).resolve().parents[1]
BARE_TFLITE = """
import sys, tensorflow as tf
converter = tf.lite.TFLiteConverter.from_saved_model(sys.argv[1])
converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS, tf.lite.OpsSet.SELECT_TF_OPS]
if sys.argv[3] in ("dynamic-int8", "float16"):
    converter.optimizations = [tf.lite.Optimize.DEFAULT]
if sys.argv[3] == "float16":
    converter.target_spec.supported_types = [tf.float16]
open(sys.argv[2], "wb").write(converter.convert())
"""


@dataclass
class Measured:
    wall_s: float
    peak_bytes: int
    returncode: int
    killed: bool

    def cells(self) -> tuple[str, str]:
        if self.killed:
            return f"killed {self.wall_s:.0f} s", f">{self.peak_bytes / 1e9:.1f} GB (cap)"
        if self.returncode != 0:
            return f"exit {self.returncode}", f"{self.peak_bytes / 1e9:.2f} GB"
        return f"{self.wall_s:.1f} s", f"{self.peak_bytes / 1e9:.2f} GB"


def measure(command: list[str], cap_bytes: int) -> Measured:
    """Run ``command``; its wall time and the peak RSS of its process tree: the larger of the summed RSS as sampled
    and the highest of its processes' own high-water marks (``VmHWM``: the kernel's, per process, from its exec:
    a spike shorter than the 50 ms between samples stays in it)."""
    import psutil

    started = time.perf_counter()
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    root, peak, killed = psutil.Process(process.pid), 0, False
    high_water: dict[int, int] = {}
    while process.poll() is None:
        total = 0
        try:
            for member in [root, *root.children(recursive=True)]:
                try:
                    total += member.memory_info().rss
                    high_water[member.pid] = max(high_water.get(member.pid, 0), _vm_hwm(member.pid))
                except psutil.Error:
                    pass
        except psutil.Error:
            pass
        peak = max(peak, total)
        if total > cap_bytes:
            for member in [*root.children(recursive=True), root]:
                try:
                    member.kill()
                except psutil.Error:
                    pass
            killed = True
        time.sleep(0.05)
    wall = time.perf_counter() - started
    stderr = process.stderr.read().decode(errors="replace") if process.stderr else ""
    if process.returncode and not killed:
        print(f"  {' '.join(command[:3])} …: exit {process.returncode}: {stderr.strip().splitlines()[-1:]}")
    return Measured(wall, max(peak, *high_water.values(), 0), process.returncode, killed)


def _vm_hwm(pid: int) -> int:
    """The process's resident high-water mark in bytes (Linux /proc; 0 where it cannot be read). Reset when the
    process execs, so a child forked from a large parent does not carry the parent's."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return 0


def build(size: str, folder: Path) -> Path:
    path = folder / f"{size}_savedmodel"
    if not path.exists():
        layers, hidden, heads, ff = SHAPES[size]
        family, vocab = FAMILY.get(size, ("BertBackbone", VOCAB))
        args = [str(path), str(layers), str(hidden), str(heads), str(ff), str(vocab), str(POSITIONS), str(REPO), family]
        subprocess.run([sys.executable, "-c", BUILD, *args], check=True, capture_output=True)
    return path


def variables_mb(saved_model: Path) -> float:
    """The SavedModel's variables on disk (a Keras export stores most weights twice)."""
    return sum(p.stat().st_size for p in (saved_model / "variables").glob("*")) / 1e6


def median_run(runs: list[Measured]) -> Measured:
    """The median wall time and peak of runs that all succeeded; else the first that did not."""
    failed = [run for run in runs if run.returncode or run.killed]
    if failed:
        return failed[0]
    wall, peak = statistics.median(r.wall_s for r in runs), int(statistics.median(r.peak_bytes for r in runs))
    return Measured(wall, peak, 0, False)


def paired(bare: list[str], ours: list[str], cap: int, repeat: int) -> tuple[list[Measured], list[Measured]]:
    """``repeat`` runs of each, in turn (bare, ours, bare, …): a ratio taken pair by pair holds while the
    machine's speed drifts (this shared one drifted 1.6x between days)."""
    them, us = [], []
    for _ in range(repeat):
        if bare:
            them.append(measure(bare, cap))
        us.append(measure(ours, cap))
    return them, us


def rows_for(
    size: str, saved_model: Path, formats: list[str], modes: list[str], cap: int, out: Path, repeat: int = 1
) -> list[list[str]]:
    rows = []
    for file_format in formats:
        fp32: Measured | None = None
        for mode in modes:
            target = out / f"{size}.{mode.replace(' ', '_')}.{file_format}"
            quantize = mode.split()[0]
            if file_format == "tflite":
                bare = [sys.executable, "-c", BARE_TFLITE, str(saved_model), str(target) + ".bare", quantize]
            elif mode == "none":
                bare = [sys.executable, "-m", "tf2onnx.convert", "--saved-model", str(saved_model)]
                bare += ["--opset", "17", "--output", str(target) + ".bare"]
            else:
                bare = []  # tf2onnx has no int8 of its own; the ratio is to pe-export's own fp32 export
            ours = ["pe-export", file_format, str(saved_model), "-o", str(target), "--overwrite"]
            if mode != "none":
                ours += ["--quantize", *mode.split()]
            their_runs, our_runs = paired(bare, ours, cap, repeat)
            them = median_run(their_runs) if their_runs else None
            us = median_run(our_runs)
            fp32 = us if mode == "none" else fp32
            label = f"{file_format} {mode if mode != 'none' else 'fp32'}"
            row = [size, label, *_compared(them, us, file_format), _times_fp32(us, fp32)]
            if their_runs and them is not None and not (them.returncode or us.returncode) and repeat > 1:
                ratios = sorted(u.wall_s / t.wall_s for t, u in zip(their_runs, our_runs, strict=True))
                row[7] = f"{statistics.median(ratios):.2f}x ({ratios[0]:.2f}–{ratios[-1]:.2f})"
            rows.append(row)
            print("  " + " | ".join(rows[-1]), flush=True)
    return rows


def _compared(them: Measured | None, us: Measured, file_format: str) -> list[str]:
    if them is None:
        return ["-", "-", "-", *us.cells(), "-", "-"]
    ok = them.returncode == 0 and us.returncode == 0
    ratio_t = f"{us.wall_s / them.wall_s:.2f}x" if ok else "-"
    ratio_m = f"{us.peak_bytes / them.peak_bytes:.2f}x" if ok else "-"
    bare_name = "TFLite converter" if file_format == "tflite" else "tf2onnx"
    return [bare_name, *them.cells(), *us.cells(), ratio_t, ratio_m]


def _times_fp32(us: Measured, fp32: Measured | None) -> str:
    """The wall time against pe-export's own fp32 export of the same model and format."""
    if fp32 is None or us is fp32 or fp32.returncode or us.returncode:
        return "-"
    return f"{us.wall_s / fp32.wall_s:.2f}x"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="minilm,base,large")
    parser.add_argument("--formats", default="tflite,onnx")
    parser.add_argument(
        "--int8",
        action="store_true",
        help=f"also --quantize dynamic-int8, plain and with --min-cosine {STRICT_COSINE} (a target all-int8 misses, "
        "so the keep-float search runs)",
    )
    parser.add_argument(
        "--float16", action="store_true", help="also --quantize float16 (TFLite: beside the converter's own)"
    )
    parser.add_argument(
        "--static-int8",
        action="store_true",
        help="also --quantize int8 (TFLite: full integer, beside the bare converter's float32 conversion; ONNX: "
        "static QDQ, against pe-export's fp32)",
    )
    parser.add_argument("--cap-gb", type=float, default=21.0)
    parser.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="runs of each command, bare and pe-export in turn: medians, and the "
        "time ratio as the median of the pairs' (with their range)",
    )
    parser.add_argument("--work", type=Path, default=None, help="keep SavedModels here between runs")
    args = parser.parse_args()
    modes = ["none", "dynamic-int8", f"dynamic-int8 --min-cosine {STRICT_COSINE}"] if args.int8 else ["none"]
    modes += ["float16"] if args.float16 else []
    modes += ["int8"] if args.static_int8 else []  # ONNX: float16 arithmetic (its measured plan), against fp32
    with tempfile.TemporaryDirectory() as scratch:
        work = args.work or Path(scratch)
        work.mkdir(parents=True, exist_ok=True)
        table = []
        for size in args.sizes.split(","):
            saved_model = build(size, work)
            print(f"{size}: {SHAPES[size]} SavedModel variables {variables_mb(saved_model):,.0f} MB", flush=True)
            table += rows_for(
                size, saved_model, args.formats.split(","), modes, int(args.cap_gb * 1e9), work, args.repeat
            )
    header = ["model", "export", "bare", "bare wall", "bare peak", "pe-export wall", "pe-export peak", "time", "memory"]
    header.append("x fp32 time")
    widths = [max(len(str(row[i])) for row in [header, *table]) for i in range(len(header))]
    for row in [header, *table]:
        print("  ".join(str(cell).ljust(width) for cell, width in zip(row, widths, strict=True)))


if __name__ == "__main__":
    main()
