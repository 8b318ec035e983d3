"""A large bundle is streamed: peak memory does not grow with the number of samples."""

from __future__ import annotations

import sys
from pathlib import Path

from pe_export.golden import GoldenOptions, make_golden
from tests.helpers import measured_parity

# Peak RSS may grow this much from the small to the large bundle; the large bundle holds
# more than four times as many bytes, so holding it in memory could not pass.
ALLOWED_GROWTH_MB = 8.0
SMALL, LARGE, BATCH, SEQ_LEN = 100, 4000, 8, 64


def test_peak_rss_is_flat_in_bundle_size(saved_model, exported_file, tmp_path: Path) -> None:
    model = exported_file("encoder_multi_io", "onnx")
    small, large = tmp_path / "small", tmp_path / "large"
    make_golden(saved_model("encoder_multi_io"), small, GoldenOptions(samples=SMALL, batch=BATCH, seq_len=SEQ_LEN))
    make_golden(saved_model("encoder_multi_io"), large, GoldenOptions(samples=LARGE, batch=BATCH, seq_len=SEQ_LEN))
    large_bytes = sum(p.stat().st_size for p in large.rglob("*.npz"))
    assert large_bytes > 4 * ALLOWED_GROWTH_MB * 2**20  # held in memory, it would blow the allowance

    figures = {
        name: measured_parity(sys.executable, model, bundle, tmp_path)
        for name, bundle in (("small", small), ("large", large))
    }
    for name, f in figures.items():
        print(
            f"{name}: {f['samples']} samples, parent peak RSS {f['parent_peak_rss_mb']:.1f} MB, "
            f"runtime child peak RSS {f['child_peak_rss_mb']:.1f} MB, total {f['total_s']:.2f} s"
        )
        assert f["passed"]
    growth = max(figures["large"][key] - figures["small"][key] for key in ("parent_peak_rss_mb", "child_peak_rss_mb"))
    assert growth < ALLOWED_GROWTH_MB, figures
