"""`rllib_grpo.models.precision.cpu_has_bf16_matmul`: bf16 compute only where the CPU has
native bf16 matmul instructions (x86 AVX512-BF16 or AMX, Arm BF16)."""

from __future__ import annotations

import pytest

from rllib_grpo.models.precision import cpu_has_bf16_matmul

ZEN4 = "flags\t\t: fpu avx2 avx512f avx512_bf16 avx512_vnni\n"
SAPPHIRE = "flags\t\t: fpu avx2 avx512f amx_tile amx_bf16 amx_int8\n"
SKYLAKE = "flags\t\t: fpu avx2 avx512f avx512bw avx512_vnni\n"
GRAVITON3 = "Features\t: fp asimd bf16 i8mm sve\n"
GRAVITON2 = "Features\t: fp asimd asimddp\n"


@pytest.mark.parametrize("cpuinfo, expected", [(ZEN4, True), (SAPPHIRE, True), (SKYLAKE, False),
                                               (GRAVITON3, True), (GRAVITON2, False)])
def test_bf16_matmul_flags(tmp_path, cpuinfo, expected):
    path = tmp_path / "cpuinfo"
    path.write_text(cpuinfo)
    assert cpu_has_bf16_matmul(str(path)) is expected


def test_unreadable_cpuinfo_means_no_bf16(tmp_path):
    assert cpu_has_bf16_matmul(str(tmp_path / "missing")) is False


def test_a_flag_in_the_model_name_does_not_count(tmp_path):
    path = tmp_path / "cpuinfo"
    path.write_text("model name\t: avx512_bf16 bf16\n" + SKYLAKE)
    assert cpu_has_bf16_matmul(str(path)) is False
