"""Atomic writes: the target is absent/old or complete, never partial; no temp file is left."""

from __future__ import annotations

from pathlib import Path

import pytest

from pe_export.errors import OutputExistsError
from pe_export.fileio import atomic_write_bytes


def test_write_then_refuse_then_overwrite(tmp_path: Path) -> None:
    target = tmp_path / "m.tflite"
    atomic_write_bytes(target, b"one", overwrite=False)
    with pytest.raises(OutputExistsError):
        atomic_write_bytes(target, b"two", overwrite=False)
    assert target.read_bytes() == b"one"
    atomic_write_bytes(target, b"three", overwrite=True)
    assert target.read_bytes() == b"three"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.tflite"]


def test_failure_mid_write_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    def broken_fsync(fd: int) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(os, "fsync", broken_fsync)
    with pytest.raises(OSError, match="disk full"):
        atomic_write_bytes(tmp_path / "m.onnx", b"x" * 1000, overwrite=False)
    assert list(tmp_path.iterdir()) == []


def test_interrupt_mid_write_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """SIGINT arrives as KeyboardInterrupt wherever Python is: here, between write and rename."""
    import os

    def interrupted(fd: int) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "fsync", interrupted)
    with pytest.raises(KeyboardInterrupt):
        atomic_write_bytes(tmp_path / "m.tflite", b"x" * 1000, overwrite=True)
    assert list(tmp_path.iterdir()) == []
