"""Parse tegrastats lines (JetPack 5 and 6; Orin and Xavier formats).

Power rails appear as ``NAME cur/avg`` (JetPack 5/6) or ``NAME cur/avg/max`` (6.1+), in mW,
with Orin names (VDD_GPU_SOC, VDD_CPU_CV, VIN_SYS_5V0, VDDQ_VDD2_1V8AO) or Xavier names
(GPU, CPU, SOC, CV, VDDRQ, SYS5V). Temperatures are ``name@47.5C`` (optionally ``/max``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

_RAIL = re.compile(r"\b([A-Za-z][A-Za-z0-9_]*) (\d+)mW/(\d+)mW(?:/(\d+)mW)?")
_TEMP = re.compile(r"\b([A-Za-z][A-Za-z0-9_]*)@(-?\d+(?:\.\d+)?)C\b")
_RAM = re.compile(r"\bRAM (\d+)/(\d+)MB")
_CPU = re.compile(r"\bCPU \[([^\]]*)\]")
_GPU = re.compile(r"\bGR3D_FREQ (\d+)%")
# Rails that already include the others: summing them would count power twice.
INPUT_RAILS = ("VDD_IN", "VIN_SYS_5V0", "POM_5V_IN", "SYS5V")


@dataclass
class Sample:
    ram_used_mb: int | None = None
    ram_total_mb: int | None = None
    cpu_load: list[int | None] = field(default_factory=list)  # per core, None when the core is off
    gpu_load: int | None = None
    rails_mw: dict[str, int] = field(default_factory=dict)  # instantaneous power per rail
    temps_c: dict[str, float] = field(default_factory=dict)

    @property
    def total_mw(self) -> int | None:
        """Board input power where a rail measures it, else the sum of the module rails."""
        for rail in INPUT_RAILS:
            if rail in self.rails_mw:
                return self.rails_mw[rail]
        return sum(self.rails_mw.values()) if self.rails_mw else None


def parse_line(line: str) -> Sample:
    sample = Sample()
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
    sample.rails_mw = {name: int(current) for name, current, _, _ in _RAIL.findall(line)}
    sample.temps_c = {name.lower(): float(value) for name, value in _TEMP.findall(line)}
    return sample


def mean_power_mw(samples: list[Sample]) -> float | None:
    totals = [s.total_mw for s in samples if s.total_mw is not None]
    return sum(totals) / len(totals) if totals else None
