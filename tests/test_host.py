"""The machine beside its figures: the CPU's name and its int8 instructions, read from Linux's cpuinfo."""

from __future__ import annotations

from pathlib import Path

from pe_export.host import INT8_FEATURES, describe_host

XEON_AMX = """processor\t: 0
vendor_id\t: GenuineIntel
model name\t: Intel(R) Xeon(R) Platinum 8488C
flags\t\t: fpu sse avx2 avx512f avx512_vnni avx512_bf16 amx_bf16 amx_tile amx_int8

processor\t: 1
model name\t: Intel(R) Xeon(R) Platinum 8488C
flags\t\t: fpu sse avx2 avx512f avx512_vnni amx_int8
"""
ORIN = """processor\t: 0
BogoMIPS\t: 62.50
Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm lrcpc dcpop asimddp
CPU implementer\t: 0x41
CPU part\t: 0xd42
"""


def test_x86_int8_instructions_in_their_listed_order(tmp_path: Path) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(XEON_AMX)
    host = describe_host(cpuinfo)
    assert host.model == "Intel(R) Xeon(R) Platinum 8488C"
    assert host.int8_features == ("avx2", "avx512_vnni", "amx_int8")  # amx_bf16 and avx512_bf16 are not int8
    assert host.line().endswith("int8 instructions: avx2, avx512_vnni, amx_int8")


def test_arm_core_without_a_name_is_named_by_its_part_numbers(tmp_path: Path) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(ORIN)
    host = describe_host(cpuinfo)
    assert host.model == "ARM implementer 0x41 part 0xd42" and host.int8_features == ("asimddp",)


def test_no_cpuinfo_claims_no_instruction(tmp_path: Path) -> None:
    host = describe_host(tmp_path / "absent")
    assert host.int8_features == () and host.cpus >= 1 and host.model
    assert host.line().endswith("int8 instructions: none of " + "/".join(INT8_FEATURES))
