"""Atomic output: write to a temporary file beside the target, then rename over it."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

from pe_export.errors import BadInputError, OutputExistsError


def check_output_path(path: Path, *, overwrite: bool, suffix: str) -> None:
    """Refuse early: wrong suffix, missing parent, a directory, or an existing file without overwrite."""
    if path.suffix.lower() != suffix:
        raise BadInputError(f"output {path} should end in {suffix}; pass -o NAME{suffix}")
    if path.is_dir():
        raise BadInputError(f"output {path} is a directory; pass a file name ending in {suffix}")
    if not path.parent.exists():
        raise BadInputError(f"output folder {path.parent} does not exist; create it first")
    if path.exists() and not overwrite:
        raise OutputExistsError(f"{path} already exists; pass --overwrite to replace it")


def atomic_write_bytes(path: Path, data: bytes, *, overwrite: bool) -> None:
    """Write ``data`` so that ``path`` is either absent/old or complete, never partial."""
    path = Path(path)
    descriptor, temp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    temp = Path(temp_name)
    try:
        with os.fdopen(descriptor, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(temp, 0o644)
        if overwrite:
            os.replace(temp, path)
        else:
            # link() fails if the target appeared meanwhile: no silent overwrite by a racing writer.
            try:
                os.link(temp, path)
            except FileExistsError as err:
                raise OutputExistsError(f"{path} already exists; pass --overwrite to replace it") from err
            temp.unlink()
    finally:
        with contextlib.suppress(FileNotFoundError):
            temp.unlink()
