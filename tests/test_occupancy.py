"""The static X60 occupancy estimate (imegen/perf/model/occupancy.py) against LLVM's measured table
(docs/ime-isa.md §7, copied here by hand from RISCVSchedSpacemitX60.td, not from the module)."""

from __future__ import annotations

import pytest

from imegen.ir import specs_from_text
from imegen.perf.count import measure
from imegen.perf.model import occupancy, x60
from imegen.plan import plan_kernel


@pytest.mark.parametrize("vset, instruction, unit, llvm, model", [
    ("vsetvli t0, zero, e32, m4, ta, ma", "vrgatherei16.vv v24, v16, v30", "vieu", 64, 4),
    ("vsetvli t0, zero, e8, m1, ta, ma", "vrgatherei16.vv v8, v9, v10", "vieu", 8, 1),
    ("vsetvli t0, zero, e32, m1, ta, ma", "vrgather.vv v8, v9, v10", "vieu", 4, 1),
    ("vsetvli t0, zero, e8, m1, ta, ma", "vle8.v v1, (a0)", "vls", 3, 2),
    ("vsetvli t0, zero, e8, m1, ta, ma", "vl4re8.v v20, (a0)", "vls", 8, 8),
    ("vsetivli zero, 4, e32, m1, ta, ma", "vlse32.v v16, (a0), a1", "vls", 8, 4),  # VLMAX, not vl
    ("vsetivli zero, 2, e64, m1, ta, ma", "vlse64.v v16, (a0), zero", "vls", 4, 2),
    ("vsetvli t0, zero, e32, m8, ta, ma", "vse32.v v0, (a0)", "vls", 19, 16),
    ("vsetvli t0, zero, e32, m4, ta, ma", "vluxei16.v v20, (a0), v28", "vls", 16, 32),
    ("vsetvli t0, zero, e16, m1, ta, ma", "vfwcvt.f.f.v v8, v9", "vfp", 4, 2),
    ("vsetvli t0, zero, e8, m2, ta, ma", "vand.vi v18, v16, 15", "vieu", 4, 2),
    ("vsetvli t0, zero, e8, m4, ta, ma", "vsub.vv v16, v16, v24", "vieu", 4, 4),
    ("vsetvli t0, zero, e32, m4, ta, ma", "vfmacc.vv v8, v0, v20", "vfp", 4, 4),
    ("vsetvli t0, zero, e32, m8, ta, ma", "vfcvt.f.x.v v0, v0", "vfp", 16, 8),
    ("vsetvli t0, zero, e8, m1, ta, ma", ".word 0xe32a302b", "ime", 1, 1),
])
def test_instruction_costs_follow_llvms_measured_table(vset, instruction, unit, llvm, model):
    assert occupancy.instruction_cost(vset, instruction) == (unit, llvm, model)


def test_8x8_block32_fold_is_gather_bound_under_measured_occupancies():
    """The tuned prefill tile (8x8, k_unroll 2, block 32): the bench model sees the vector issue slot
    bind (16 vmadot + 25 others); LLVM's measured occupancies put three LMUL-4 vrgathers (64 cycles
    each) on the VIEU, 14.25 cycles per vmadot."""
    spec = specs_from_text("kernel t { target = ime  compute = int8  bits = 4  block = 32  zero_point = asymmetric  "
                           "tile = 8x8  k_unroll = 2  panel = 16  scale_type = fp32 }")[0]
    est = occupancy.tile_block(plan_kernel(spec))
    model, llvm = est["model"], est["llvm"]
    assert (model.vmadots, model.vector_issue, model.bound) == (16, 41, "vector issue")
    assert llvm.bound == "VIEU" and llvm.vieu == 3 * 64 + 36 and llvm.per_vmadot == pytest.approx(14.25)



def test_per_register_spread_takes_the_gathers_off_the_critical_unit():
    """spread = per_register: the same tile's three LMUL-4 vrgathers (64 cycles each) become eight LMUL-1
    ones (4 cycles each) and two whole-register copies (4 each): 7 more vector instructions (the bench
    model's binding slot), a third of the measured VIEU cycles."""
    text = ("kernel t { target = ime  compute = int8  bits = 4  block = 32  zero_point = asymmetric  "
            "tile = 8x8  k_unroll = 2  panel = 16  scale_type = fp32  spread = %s }")
    group, split = (occupancy.tile_block(plan_kernel(specs_from_text(text % s)[0])) for s in ("group", "per_register"))
    assert split["model"].vector_issue == group["model"].vector_issue + 7
    assert split["llvm"].vieu == 36 + 8 * 4 + 2 * 4 and split["llvm"].per_vmadot == pytest.approx(76 / 16)
    assert split["llvm"].per_vmadot < group["llvm"].per_vmadot / 2.5


NEEDS_TOOLS = pytest.mark.skipif(bool(__import__("imegen.toolchain", fromlist=["missing_tools"]).missing_tools()),
                                 reason="needs the cross toolchains and qemu-riscv64")


@NEEDS_TOOLS
@pytest.mark.parametrize("settings", ["tile = 8x8  spread = group", "tile = 8x8  spread = per_register",
                                      "tile = 4x8  spread = per_register", "tile = 1x16  op = gemv  k_unroll = 4  panel = 16",
                                      "tile = 8x16  panel = 16"])
def test_one_more_block_costs_what_the_static_walk_says(settings):
    """The counting plugin, on the generated kernel under QEMU: one more K block of a one-tile call adds
    exactly the unit cycles the static walk of the plan's (tile, block) gives, under LLVM's measured
    occupancies and under the bench's model alike (the tile part: the call minus prepare_a)."""

    spec = specs_from_text("defaults { target = ime  compute = int8  bits = 4  block = 32  zero_point = asymmetric  "
                           f"k_unroll = 2  panel = 8  scale_type = fp16 }}\nkernel t {{ {settings} }}")[0]
    plan = plan_kernel(spec)
    tm, tn = spec.tile_m, spec.tile_n
    one, two = measure.run_cases(measure.build_bench(plan), [(tm, tn, 64), (tm, tn, 96)])
    tiles = [{k: c.matmul[k] - c.prep[k] for k in c.matmul} for c in (one, two)]
    block = {k: tiles[1][k] - tiles[0][k] for k in tiles[0]}
    static = occupancy.tile_block(plan)
    assert occupancy.measured_cycles(block) == {"vls": static["llvm"].vls, "vieu": static["llvm"].vieu, "vfp": static["llvm"].vfp}
    cyc = x60.core_cycles(block)
    assert (cyc.vieu, cyc.vfp, cyc.ime, cyc.vector_issue) == (static["model"].vieu, static["model"].vfp,
                                                                static["model"].ime, static["model"].vector_issue)
