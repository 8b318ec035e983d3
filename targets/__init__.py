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
    tolerances: dict[str, Any]

    def runtime_for(self, path: Path, installed: list[str]) -> str | None:
        """The first of this target's runtimes for the file that is installed here."""
        kind = Path(path).suffix.lower().lstrip(".")
        return next((name for name in self.runtimes.get(kind, []) if name in installed), None)


@cache
def _raw() -> dict[str, Any]:
    return json.loads(PROFILES.read_text())


def profile_names() -> list[str]:
    return list(_raw())


def get_profile(name: str) -> TargetProfile:
    profiles = _raw()
    if name not in profiles:
        raise BadInputError(f"unknown target {name!r}; expected one of: {', '.join(profiles)}")
    entry = profiles[name]
    return TargetProfile(
        name=name,
        description=entry["description"],
        platform=entry["platform"],
        runtimes=entry["runtimes"],
        providers=tuple(entry["providers"]),
        docker=entry["docker"],
        bench=entry["bench"],
        tolerances=entry["tolerances"],
    )
