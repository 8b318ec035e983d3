"""Parse tegrastats lines (JetPack 4 to 7; Nano, TX2, Xavier, Orin and Thor boards).

Power rails appear as ``NAME cur/avg`` (JetPack 4, no unit), ``NAME curmW/avgmW`` (JetPack 5/6)
or ``NAME curmW/avgmW/maxmW`` (newer releases). Temperatures are ``name@47.5C`` (optionally
``/max``); a sensor that is absent on the module (the CV cores of an Orin NX, say) reads -256C
and is dropped. ``NC`` rails are unconnected monitor channels and are dropped too.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

# A rail value ends the token: "RAM 1438/30622MB" and "IRAM 0/252kB" are not rails.
_RAIL = re.compile(r"\b([A-Za-z][A-Za-z0-9_]*) (\d+)(?:mW)?/(\d+)(?:mW)?(?:/(\d+)(?:mW)?)?(?![\w/])")
_TEMP = re.compile(r"\b([A-Za-z][A-Za-z0-9_]*)@(-?\d+(?:\.\d+)?)C\b")
_RAM = re.compile(r"\bRAM (\d+)/(\d+)MB")
_CPU = re.compile(r"\bCPU \[([^\]]*)\]")
_GPU = re.compile(r"\bGR3D_FREQ (\d+)%")
_TIMESTAMP = re.compile(r"^(\d\d-\d\d-\d{4} \d\d:\d\d:\d\d) ")
UNCONNECTED_RAIL = "NC"
# tegrastats prints this for a thermal zone whose sensor the module does not have.
ABSENT_SENSOR_C = -256.0
# Rails that measure the whole module input, so the others are parts of them (Orin Nano/NX:
# VDD_IN; Nano, TX1, TX2: POM_5V_IN or VDD_IN). The AGX modules have no such rail: Xavier's
# GPU/CPU/SOC/CV/VDDRQ/SYS5V and AGX Orin's VDD_GPU_SOC/VDD_CPU_CV/VIN_SYS_5V0/VDDQ_VDD2_1V8AO
# are separate supplies (VIN_SYS_5V0 is the 5 V system rail, not the input), so module power
# is their sum there. Neither includes the carrier board.
INPUT_RAILS = ("VDD_IN", "POM_5V_IN")
# Whole-board inputs (AGX Thor, JetPack 7: VIN, carrier board included): left out of module power.
# Reported by Thor users; not yet checked against a capture of ours.
BOARD_RAILS = ("VIN",)


@dataclass
class Sample:
    timestamp: str | None = None  # "MM-DD-YYYY hh:mm:ss" where tegrastats prints one
    ram_used_mb: int | None = None
    ram_total_mb: int | None = None
    cpu_load: list[int | None] = field(default_factory=list)  # per core, None when the core is off
    gpu_load: int | None = None
    rails_mw: dict[str, int] = field(default_factory=dict)  # instantaneous power per rail
    temps_c: dict[str, float] = field(default_factory=dict)

    @property
    def power_basis(self) -> str | None:
        """Which rails `total_mw` reads: an input rail's name, or the summed rails joined by '+'."""
        for rail in INPUT_RAILS:
            if rail in self.rails_mw:
                return rail
        module = [rail for rail in self.rails_mw if rail not in BOARD_RAILS]
        return "+".join(module) if module else None

    @property
    def total_mw(self) -> int | None:
        """Module power: the input rail where the module has one, else the sum of its rails."""
        basis = self.power_basis
        if basis is None:
            return None
        return sum(self.rails_mw[rail] for rail in basis.split("+"))


def parse_line(line: str) -> Sample:
    sample = Sample()
    stamp = _TIMESTAMP.match(line)
    if stamp:
        sample.timestamp = stamp.group(1)
    ram = _RAM.search(line)
    if ram:
        sample.ram_used_mb, sample.ram_total_mb = int(ram.group(1)), int(ram.group(2))
    cpu = _CPU.search(line)
    if cpu:
        for core in cpu.group(1).split(","):
            load = re.match(r"\s*(\d+)%", core)
            sample.cpu_load.append(int(load.group(1)) if load else None)
    gpu = _GPU.search(line)
    if gpu:
        sample.gpu_load = int(gpu.group(1))
    sample.rails_mw = {name: int(current) for name, current, _, _ in _RAIL.findall(line) if name != UNCONNECTED_RAIL}
    sample.temps_c = {
        name.lower(): float(value) for name, value in _TEMP.findall(line) if float(value) > ABSENT_SENSOR_C
    }
    return sample


def mean_power_mw(samples: list[Sample]) -> float | None:
    totals = [s.total_mw for s in samples if s.total_mw is not None]
    return sum(totals) / len(totals) if totals else None
