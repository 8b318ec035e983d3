"""Safe output: every path checked before the work starts, files staged beside their target and renamed
into place only when they are whole (and, for exports, verified), with the permissions the user's umask
gives any other tool's files."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from pe_export.errors import BadInputError, OutputExistsError


def check_output_path(path: Path, *, overwrite: bool, suffix: str, flag: str = "-o") -> None:
    """Refuse early: wrong suffix, a name too long, a directory, a missing or unwritable folder, or an existing
    file without overwrite."""
    path = Path(path)
    if path.suffix.lower() != suffix:
        raise BadInputError(f"{flag} {path}: expected a file name ending in {suffix}; pass {flag} NAME{suffix}")
    try:
        check_output_folder(path.parent, flag=flag, what=str(path))
        limit = _name_max(path.parent) - STAGING_CHARS
        if len(os.fsencode(path.name)) > limit:
            raise BadInputError(
                f"{flag}: the file name is {len(os.fsencode(path.name))} bytes long; this file "
                f"system takes names up to {limit + STAGING_CHARS} (pe-export needs {STAGING_CHARS} "
                "of them while it writes); pass a shorter name"
            )
        if path.is_dir():
            raise BadInputError(f"{flag} {path} is a directory; pass a file name ending in {suffix}")
        if (path.exists() or path.is_symlink()) and not overwrite:
            raise OutputExistsError(f"{path} already exists; pass --overwrite to replace it")
    except OSError as err:  # what the file system says of the path itself (a loop of links, …)
        raise BadInputError(f"{flag} {path}: {err.strerror or err}") from err


def check_output_folder(folder: Path, *, flag: str, what: str) -> None:
    """The folder an output goes in exists and this user can create files there."""
    folder = Path(folder) if str(folder) else Path(".")
    try:
        is_folder = folder.is_dir()
    except OSError as err:
        raise BadInputError(f"{flag} {what}: {err.strerror or err}") from err
    if not is_folder:
        raise BadInputError(f"{flag} {what}: folder {folder} does not exist; create it first")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise BadInputError(
            f"{flag} {what}: cannot create files in {folder} (permission denied); choose a folder you can write"
        )


STAGING_CHARS = 24  # ".<stem>.<8 random>.partial<suffix>": what a staged name adds to the output's


def _name_max(folder: Path) -> int:
    try:
        return int(os.pathconf(folder, "PC_NAME_MAX"))
    except (OSError, ValueError):
        return 255


def file_mode() -> int:
    """What the umask gives a new file (0o644 under the usual 022), as open() would."""
    return 0o666 & ~_umask()


def folder_mode() -> int:
    """What the umask gives a new folder (0o755 under the usual 022), as mkdir would."""
    return 0o777 & ~_umask()


def _umask() -> int:
    current = os.umask(0o022)  # reading the umask means setting it; put it straight back
    os.umask(current)
    return current


def atomic_write_bytes(path: Path, data: bytes, *, overwrite: bool) -> None:
    """Write ``data`` so that ``path`` is either absent/old or complete, never partial."""
    with staged_file(path) as temp:
        write_staged(temp, data, path)
        publish(temp, path, overwrite=overwrite)


@contextlib.contextmanager
def staged_file(path: Path) -> Iterator[Path]:
    """A temporary path beside ``path`` with the same suffix (runtimes choose by it), removed on exit
    unless published: an interrupted or failed run leaves nothing behind."""
    path = Path(path)
    try:
        descriptor, temp_name = tempfile.mkstemp(
            prefix=f".{path.stem}.", suffix=f".partial{path.suffix}", dir=path.parent
        )
    except OSError as err:  # the folder went away or became unwritable since the check
        raise BadInputError(f"cannot write {path}: {err.strerror or err}") from err
    os.close(descriptor)
    temp = Path(temp_name)
    try:
        yield temp
    finally:
        with contextlib.suppress(FileNotFoundError):
            temp.unlink()


@contextlib.contextmanager
def staged_in_folder(path: Path) -> Iterator[Path]:
    """``path``'s name in a temporary folder beside it, for a file that brings files of its own (ONNX
    external data, found by a name relative to the model): removed, with all in it, unless published."""
    path = Path(path)
    try:
        folder = Path(tempfile.mkdtemp(prefix=f".{path.stem}.", suffix=".partial", dir=path.parent))
    except OSError as err:
        raise BadInputError(f"cannot write {path}: {err.strerror or err}") from err
    try:
        yield folder / path.name
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def write_staged(temp: Path, data: bytes, path: Path) -> None:
    """The bytes into a staged file; a full disk is the user's to fix, not a bug."""
    try:
        temp.write_bytes(data)
    except OSError as err:
        raise BadInputError(f"cannot write {path}: {err.strerror or err} ({len(data):,} B)") from err


def publish(temp: Path, path: Path, *, overwrite: bool) -> None:
    """Make the staged ``temp`` the file at ``path``: synced, the umask's permissions, renamed into place."""
    with open(temp, "rb+") as handle:
        os.fsync(handle.fileno())
    os.chmod(temp, file_mode())
    try:
        if overwrite:
            os.replace(temp, path)
            return
        # link() fails if the target appeared meanwhile: no silent overwrite by a racing writer.
        os.link(temp, path)
    except FileExistsError as err:
        raise OutputExistsError(f"{path} already exists; pass --overwrite to replace it") from err
    except IsADirectoryError as err:
        raise BadInputError(f"{path} is a directory; pass a file name") from err
    temp.unlink()
