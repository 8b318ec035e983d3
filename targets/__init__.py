"""Device target profiles (installed as pe_export.targets): data in profiles.json, read here."""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from pe_export.errors import BadInputError

PROFILES = Path(__file__).with_name("profiles.json")


@dataclass(frozen=True)
class TargetProfile:
    name: str
    description: str
    platform: dict[str, str]
    runtimes: dict[str, list[str]]  # file kind ("tflite", "onnx") → runtimes in preference order
    providers: tuple[str, ...]
    docker: str | None
    bench: dict[str, int]
    parity: dict[str, float]  # timeout_s: seconds per runtime call (TensorRT builds its engine in the first)
    tolerances: dict[str, dict[str, float]]  # precision → atol/rtol replacing the defaults on this target

    def runtime_for(self, path: Path, installed: list[str]) -> str | None:
        """The first of this target's runtimes for the file that is installed here."""
        kind = Path(path).suffix.lower().lstrip(".")
        return next((name for name in self.runtimes.get(kind, []) if name in installed), None)


PROFILE_KEYS = ("description", "platform", "runtimes", "providers", "docker", "bench", "parity", "tolerances")


@cache
def _raw() -> dict[str, Any]:
    """The profiles file, each entry with every key a profile has; a damaged file is one line saying what is wrong."""
    try:
        profiles = json.loads(PROFILES.read_text())
    except (OSError, ValueError) as err:
        raise BadInputError(f"{PROFILES} is not a readable profiles file ({err}); reinstall pe-export") from err
    if not isinstance(profiles, dict) or not all(isinstance(entry, dict) for entry in profiles.values()):
        raise BadInputError(f"{PROFILES}: expected an object of profiles by name; reinstall pe-export")
    for name, entry in profiles.items():
        missing = [key for key in PROFILE_KEYS if key not in entry]
        if missing:
            raise BadInputError(f"{PROFILES}: target {name!r} lacks {', '.join(missing)}; reinstall pe-export")
    return profiles


def profile_names() -> list[str]:
    return list(_raw())


def get_profile(name: str) -> TargetProfile:
    profiles = _raw()
    if name not in profiles:
        raise BadInputError(f"unknown target {name!r}; expected one of: {', '.join(profiles)}")
    entry = profiles[name]
    _check_tolerances(name, entry["tolerances"])
    return TargetProfile(
        name=name,
        description=entry["description"],
        platform=entry["platform"],
        runtimes=entry["runtimes"],
        providers=tuple(entry["providers"]),
        docker=entry["docker"],
        bench=entry["bench"],
        parity=entry["parity"],
        tolerances=entry["tolerances"],
    )


def _check_tolerances(name: str, tolerances: dict[str, Any]) -> None:
    """A profile's tolerances name known precisions and give numbers ≥ 0 for atol/rtol only."""
    from pe_export.parity.tolerances import DEFAULT_TOLERANCES

    for precision, values in tolerances.items():
        if precision not in DEFAULT_TOLERANCES or not isinstance(values, dict):
            raise BadInputError(
                f"target {name!r}: tolerances for {precision!r}; expected a precision "
                f"({', '.join(DEFAULT_TOLERANCES)}) mapped to atol/rtol"
            )
        for key, value in values.items():
            if key not in ("atol", "rtol") or not isinstance(value, (int, float)) or not value >= 0:
                raise BadInputError(f"target {name!r}: {precision} {key}={value!r}; expected atol/rtol ≥ 0")
