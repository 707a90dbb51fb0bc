"""The static X60 occupancy estimate (imegen/perf/occupancy.py) against LLVM's measured table
(docs/ime-isa.md §7, copied here by hand from RISCVSchedSpacemitX60.td, not from the module)."""

from __future__ import annotations

import pytest

from imegen.ir import specs_from_text
from imegen.perf import occupancy
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
