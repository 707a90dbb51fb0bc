"""The X60 cost model's arithmetic (imegen/perf/model/x60.py): resource bounds, bytes, roofline."""

from __future__ import annotations

import pytest

from imegen.ir import specs_from_text
from imegen.perf.model import x60
from imegen.plan import plan_kernel


# ---------------------------------------------------------------------------------------------
# The X60 model


def test_model_arithmetic_by_hand():
    p = x60.X60
    counts = {"kernel.int": 1000, "kernel.branch": 100, "kernel.mem": 600, "kernel.fp": 300, "kernel.div": 2,
              "kernel.vset": 50, "kernel.vload": 200, "kernel.vstore": 10, "kernel.vlsx": 5, "kernel.valu": 400,
              "kernel.vfpu": 100, "kernel.vmadot": 800,
              "kernel.vload.beats": 400, "kernel.vstore.beats": 40, "kernel.vlsx.elems": 40,
              "kernel.vieu.e0": 300, "kernel.vieu.e-1": 100,  # m1: 2 beats, mf2: 1 beat
              "kernel.vfp.e2": 100,  # m4: 8 beats
              "callee.int": 50}
    c = x60.core_cycles(counts)
    total = 1000 + 100 + 600 + 300 + 2 + 50 + 200 + 10 + 5 + 400 + 100 + 800 + 50
    assert c.issue == total / 2
    assert c.scalar_mem == 300 and c.scalar_fp == 300 and c.divider == 30
    assert c.vector_issue == 200 + 10 + 5 + 400 + 100 + 800
    assert c.vls == 400 + 40 + 40
    assert c.vieu == (300 * 2 + 100 * 1) / 2
    assert c.vfp == 100 * 8 / 2
    assert c.ime == 800
    assert c.cycles == total / 2 and c.bound == "issue"
    groups = x60.group_totals(counts)
    assert groups == {"vmadot": 800, "vec ld/st": 215, "vec cfg": 50, "vec ALU": 500, "scalar": 2052}
    assert p.peak_ops_per_core == 2 * 128 * 2.0e9


def test_roofline_and_bytes():
    # Decode of a 896 x 896 int4 block-32 weight: 401408 B codes + 28 x 896 fp32 scales + 896 x 14 zero-point bytes.
    assert x60.ort_weight_bytes(896, 896, 32) == 401408 + 100352 + 12544
    need = x60.compulsory_bytes(1, 896, 896, 32)
    t, bound = x60.roofline(1, 896, 896, 32, cores=4)
    assert bound == "memory" and t == pytest.approx(need / x60.X60.dram_effective)
    t, bound = x60.roofline(4096, 4096, 4096, 32, cores=1)
    assert bound == "compute" and t == pytest.approx(2 * 4096 ** 3 / 512e9)


def test_dram_traffic_streams_b_once_per_m_block():
    (plan,) = [plan_kernel(s) for s in specs_from_text("kernel a { compute = int8 target = ime tile = 4x16 zero_point = asymmetric }")]
    assert x60.workspace_bytes(plan, 128, 896) == 128 * 896 + 128 * 28 * 8  # 140 KB: one M block
    assert x60.dram_traffic(plan, 128, 896, 896).b_passes == 1
    # 1120 workspace bytes per row: M blocks of 384 KiB / 1120 = 351 -> 348 rows (a multiple of the tile)
    big = x60.dram_traffic(plan, 512, 896, 896)
    assert big.b_passes == 2
    assert x60.packed_b_bytes(plan, 896, 896) == 56 * 28 * (256 + 64 + 16)
    # matmul quantizes each M block into one reused buffer: written back once, one block's worth
    buffer = x60.workspace_bytes(plan, 348, 896)
    assert buffer < x60.workspace_bytes(plan, 512, 896)
    assert big.dram == 2 * x60.packed_b_bytes(plan, 896, 896) + 4 * 512 * 896 + buffer + 4 * 512 * 896


def test_a_workspace_prepared_whole_is_read_back_when_it_outgrows_the_l2():
    """fp32 staging prepares all of A first: written once and, beyond the A block budget, read back from DRAM."""
    (plan,) = [plan_kernel(s) for s in specs_from_text("kernel a { compute = fp32 target = rvv tile = 4x16 }")]
    small, big = x60.workspace_bytes(plan, 8, 896), x60.workspace_bytes(plan, 512, 896)
    assert small < plan.a_block_bytes < big
    assert x60.a_workspace_dram(plan, 8, 896, 1) == small and x60.a_workspace_dram(plan, 512, 896, 1) == 2 * big


def test_least_dram_is_a_floor_of_the_kernels_schedule():
    """least_dram gives A the whole L2 and any number of K chunks: never more than the kernel's own schedule
    moves, equal but for A's workspace buffer where one M block already holds A, and at Qwen's down projection with M = 512 (K = 4864)
    above the 1.5 x roofline bytes the issue asks for (B must stream several times, or C be re-read)."""
    (plan,) = [plan_kernel(s) for s in specs_from_text("kernel a { compute = int8 target = ime tile = 8x8 zero_point = asymmetric }")]
    for M, N, K in [(128, 896, 896), (512, 4864, 896), (128, 896, 4864), (512, 896, 4864), (512, 151936, 896)]:
        assert x60.least_dram(plan, M, N, K) <= x60.dram_traffic(plan, M, N, K).dram
    assert x60.least_dram(plan, 128, 896, 896) == x60.dram_traffic(plan, 128, 896, 896).dram - x60.a_workspace_dram(plan, 128, 896, 1)
    floor = x60.least_dram(plan, 512, 896, 4864)
    assert floor < x60.dram_traffic(plan, 512, 896, 4864).dram
    assert floor > 1.5 * x60.compulsory_bytes(512, 896, 4864, 32)


def test_modeled_time_is_max_of_core_and_dram():
    (plan,) = [plan_kernel(s) for s in specs_from_text("kernel a { compute = int8 target = ime tile = 1x16 op = gemv zero_point = asymmetric }")]
    m = x60.model(plan, 1, 896, 896, {"kernel.int": 2_000_000}, cores=1)
    assert m.core_s == pytest.approx(1_000_000 / 2e9) and m.bound == "issue"
    assert m.time_s == m.core_s > m.dram_s
    m = x60.model(plan, 1, 896, 896, {"kernel.int": 2}, cores=4)
    assert m.bound == "dram" and m.time_s == m.dram_s
    assert m.efficiency == pytest.approx(m.time_s / m.roofline_s) and m.efficiency >= 1.0


def test_llama_q8_workspace_is_read_back_when_it_outgrows_the_l2():
    """llama.cpp's ime.cpp quantizes all of A before its barrier: its Q8 workspace (36 bytes per 32 values)
    is written once and, beyond the L2, read back from DRAM by the tasks."""
    from imegen.perf.baselines.llama_cpp import counts, rows
    def others(M, N, K):
        w = N * K // 32 * 18
        passes = counts.split(1, M, N)[2] if w > x60.X60.l2_bytes // 2 else 1
        return w * passes + 4 * M * K + 4 * M * N
    assert rows.dram_bytes(1, 896, 4864) == others(1, 896, 4864) + 152 * 36
    assert rows.dram_bytes(512, 896, 4864) == others(512, 896, 4864) + 2 * 512 * 152 * 36
