"""Parity harness figures: streaming memory and TF-free cold start, side by side.

    python benchmarks/parity_stream.py [--device-python PATH]

Builds the tiny encoder (pe_export/encoders/tiny.py), exports .tflite and .onnx, writes golden bundles of 100,
1,000 and 10,000 samples, and runs check_parity in a fresh process for each (model, bundle): peak
RSS of the checking process and of its isolated runtime child, time to first result,
total time, and the cold start (process start → first result). With --device-python (a
venv made by `pip install '.[device]'`, no TensorFlow) the checks run there; by default
the cached venv from tests/test_device_extra.py is used when it exists.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from pe_export.api import export_onnx, export_tflite  # noqa: E402
from pe_export.converters.options import ExportOptions  # noqa: E402
from pe_export.encoders.tiny import build_encoder  # noqa: E402
from pe_export.golden import GoldenOptions, make_golden  # noqa: E402
from pe_export.native import import_tensorflow  # noqa: E402
from tests.helpers import measured_parity  # noqa: E402

SAMPLE_COUNTS = (100, 1000, 10000)
BATCH, SEQ_LEN = 8, 64


def default_device_python() -> Path | None:
    found = (Path.home() / ".cache" / "pe-export-tests").glob("device-venv-*/bin/python")
    newest = sorted(found, key=lambda p: p.parent.parent.stat().st_mtime)
    return newest[-1] if newest else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device-python", type=Path, default=default_device_python())
    args = parser.parse_args()
    python = args.device_python or Path(sys.executable)
    work = Path(tempfile.mkdtemp(prefix="pe-export-bench-"))
    import_tensorflow()
    saved_model = work / "encoder"
    build_encoder(None, multi_io=True).export(str(saved_model), verbose=False)
    models = {"tflite": work / "m.tflite", "onnx": work / "m.onnx"}
    export_tflite(saved_model, models["tflite"], ExportOptions(verify=False))
    export_onnx(saved_model, models["onnx"], ExportOptions(verify=False))
    bundles = {}
    for count in SAMPLE_COUNTS:
        bundles[count] = work / f"golden-{count}"
        make_golden(saved_model, bundles[count], GoldenOptions(samples=count, batch=BATCH, seq_len=SEQ_LEN))

    print(f"checker python: {python} ({'TF-free device venv' if args.device_python else 'this interpreter'})")
    header = (
        f"{'model':<7} {'samples':>7} {'bundle MB':>9} {'parent RSS MB':>13} {'child RSS MB':>12} "
        f"{'first result s':>14} {'total s':>8} {'cold start s':>12} {'TF imported':>11}"
    )
    print(header)
    for kind, model in models.items():
        for count, bundle in bundles.items():
            size = sum(p.stat().st_size for p in bundle.rglob("*") if p.is_file()) / 2**20
            f = measured_parity(python, model, bundle, work)
            print(
                f"{kind:<7} {count:>7} {size:>9.1f} {f['parent_peak_rss_mb']:>13.1f} {f['child_peak_rss_mb']:>12.1f} "
                f"{f['first_result_s']:>14.2f} {f['total_s']:>8.2f} {f['cold_start_s']:>12.2f} "
                f"{'yes' if f['tensorflow_imported'] else 'no':>11}"
            )


if __name__ == "__main__":
    main()
