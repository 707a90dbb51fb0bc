"""The X60 model's tiling floors (imegen/perf/model/floors.py) are floors of the code imegen generates,
and the hand-derived values hold."""

from pathlib import Path

import pytest

from imegen.ir import specs_from_text
from imegen.perf.model import floors, occupancy
from imegen.plan import plan_kernel

ROOT = Path(__file__).resolve().parents[1]
IME = "target = ime  compute = int8  bits = 4  zero_point = asymmetric  unpack = planar  scales = inline"
# Admitted IME gemm configs of every kind the tuner ranks (staged and in-tile B, fp32 accumulators in
# registers and in memory, both spreads, fp16 scales).
CONFIGS = [
    "tile = 8x8  k_unroll = 2  panel = 8  block = 32  stage_b = m_block  scale_type = fp16  a_scale_type = fp16",
    "tile = 8x8  k_unroll = 2  panel = 8  block = 64  stage_b = m_block  spread = per_register",
    "tile = 4x8  k_unroll = 2  panel = 8  block = 32  stage_b = m_block",
    "tile = 8x8  k_unroll = 2  panel = 8  block = 32  spread = per_register",
    "tile = 8x16  k_unroll = 2  panel = 16  block = 128  spread = per_register",
    "tile = 8x12  k_unroll = 2  panel = 12  block = 64  spread = per_register  scale_type = fp16",
    "tile = 4x16  k_unroll = 2  panel = 16  block = 32",
    "tile = 12x4  k_unroll = 2  panel = 4  block = 128",
    "tile = 8x12  k_unroll = 2  panel = 24  block = 64  stage_b = m_block  scale_type = fp16  a_scale_type = fp16",
]


@pytest.mark.parametrize("settings", CONFIGS)
def test_floor_is_below_the_generated_tile_in_both_views(settings):
    """A floor a generated kernel beats would be wrong: every admitted tile fits the floor's register
    count, and its static (tile, block) cycles are at or above the floor under both views."""
    spec = specs_from_text(f"kernel t {{ op = gemm  {IME}  {settings} }}")[0]
    plan = plan_kernel(spec)
    t = floors.of_spec(spec)
    assert t in floors.tilings()
    est = occupancy.tile_block(plan)
    for view, floor_view in (("model", "model"), ("llvm", "measured")):
        assert est[view].vmadots == t.a * t.b * spec.block // 8
        assert est[view].per_vmadot >= t.per_vmadot(spec.block, floor_view) - 1e-9, (view, est[view])


def test_hand_derived_floors():
    # 8x8 staged: 2 A + 2 B registers a k-step for 4 vmadot, 2 VLS cycles each, at any block.
    staged = floors.Tiling(2, 2, fp32_in_registers=True, int4=False)
    assert staged.registers == 20
    assert [staged.per_vmadot(b, v) for b in (32, 64, 128) for v in ("model", "measured", "robust")] == [2.0] * 9
    # 8x16 with 4-bit codes and fp32 accumulators in memory, block 128: (2 + 2) x 16 + 4 x 8 = 96 registers
    # moved (192 VLS cycles) for 128 vmadot, but the vector issue slot binds: 128 vmadots, 96 / 8 loads and
    # one vand or vsrl for each of the 4 x 16 unpacked registers (no int4 vmadot on the K1).
    t = floors.Tiling(2, 4, False, True)
    assert t.cycles(128)["vls"] == 192 and t.per_vmadot(128) == (128 + 12 + 64) / 128
    # The best 4-bit kind: 12x8 with fp32 in registers, 6 vmadots, 2 unpacks and 3 + 1 registers moved a k-step.
    cost, t = floors.best(128, "robust", int4=True)
    assert (t.a, t.b, t.fp32_in_registers) == (3, 2, True) and cost == pytest.approx((6 + 2 + 4 / 8) / 6)
    # With fp32 accumulators in registers no tile beyond 6 vmadot tiles fits: int8 B bottoms out at 8x12 / 12x8.
    cost, t = floors.best(32, "robust", fp32_in_registers=True, int4=False)
    assert cost == pytest.approx(5 / 3) and t.a * t.b == 6
    assert floors.Tiling(3, 3, True, False).registers > floors.REGISTERS
    # Folding fp32 accumulators through memory costs 8 VLS cycles per vmadot tile and block: 2 per vmadot at block 32.
    assert floors.Tiling(3, 4, False, False).per_vmadot(32) == pytest.approx(2 * 7 / 12 + 2)


def test_report_names_the_cells_the_tuned_tiling_cannot_reach():
    text = floors.report(ROOT / "bench" / "results").split("Fold budgets")[0]
    cells = {tuple(line.split()[:3]): line for line in text.splitlines() if line.split()[:1] in (["gate/up"], ["lm_head"], ["down"])}
    for block in ("32", "64", "128"):  # no int8-B floor fits, and no 4-bit tiling leaves room for a fold
        assert "beyond every tiling's reach" in cells[("lm_head", "512", block)]
    assert "DRAM-bound" in cells[("down", "512", "32")]
    for c in floors.cell_budgets(ROOT / "bench" / "results"):  # 1.5x of a roofline of 1 cycle per vmadot or more
        assert c["allowed"] >= 1.5 - 1e-9


def test_fold_budgets():
    """Whole-register loads, the k_unroll that fits and the issue slots left for the fold, by hand."""
    assert [floors.load_instructions(n) for n in (1, 2, 3, 4, 6, 8, 12)] == [1, 1, 2, 1, 2, 1, 2]
    # 12x8 / 8x12 with fp32 accumulators in registers: 24 + 5 registers, so one k-step an iteration;
    # 3 A and 2 B registers (or 2 and 3) take 3 loads: block 32 = 24 vmadots + 12 loads.
    for t in (floors.Tiling(3, 2, True, False), floors.Tiling(2, 3, True, False)):
        assert t.k_unroll() == 1 and t.issue_per_block(32) == 36
        # int(1.88 x 24 - 36) issue slots; 1.88 x 24 - 2 x 5 x 4 VLS cycles
        assert floors.fold_budget(t, 32, 1.88) == floors.Budget(9, pytest.approx(1.88 * 24 - 40))
    # 8x8 staged: 16 accumulator registers leave room for 4 k-steps (one vl8r-free pair of vl4r loads).
    staged = floors.Tiling(2, 2, True, False)
    assert staged.k_unroll() == 4 and staged.issue_per_block(32) == 18
    assert floors.fold_budget(staged, 32, 1.88) is None  # its operand floor (2.00) is above 1.88 already
    # What a kernel spends outside its (tile, block) loop comes off both budgets; 8x12 at block 64 (1.67
    # per vmadot of VLS) no longer fits 1.86 once 0.2 VLS cycles per vmadot are spent elsewhere.
    t = floors.Tiling(2, 3, True, False)
    assert floors.fold_budget(t, 64, 1.86, floors.Overhead(issue=0.1)) == floors.Budget(12, pytest.approx(1.86 * 48 - 80))
    assert floors.fold_budget(t, 64, 1.86, floors.Overhead(vls=0.2)) is None
    # fp32 accumulators in memory: 12x16's 24 of them loaded and stored once per block (3 + 3 instructions).
    assert floors.Tiling(3, 4, False, False).issue_per_block(128) == 12 * 16 + 16 * (2 + 1) + 6
    # 4-bit codes unpacked in the tile, 12x8 at block 128: 96 vmadots, 16 A loads of 3 registers (vl2r + vl1r),
    # 8 code loads (2 registers, 2 k-steps each), 32 unpacks = 168, above the 154 slots 1.61 per vmadot allows
    # (lm_head M = 512): no fold fits, though its floor (1.42) does.
    t = floors.Tiling(3, 2, True, True)
    assert t.k_unroll() == 1 and t.spare_registers() == 1 and t.issue_per_block(128) == 96 + 32 + 8 + 32
    assert t.per_vmadot(128, "robust") < 1.61 and floors.fold_budget(t, 128, 1.61) is None
    assert floors.fold_budget(t, 128, 1.9) == floors.Budget(int(1.9 * 96 - 168), pytest.approx(1.9 * 96 - 2 * 4 * 16))
    # The staged a16 fold the tuner picks at block 32: 12 vector instructions and a 1-instruction block start
    # (vsetvli excluded: a scalar issue slot under the model). Its (tile, block) is exactly that on top of
    # 16 vmadots and 2 whole-register loads (A, B) per iteration: the budget and the kernel count alike.
    spec = specs_from_text(f"kernel t {{ op = gemm  {IME}  {CONFIGS[0]} }}")[0]
    assert floors.fold_instructions(spec) == 13
    assert occupancy.tile_block(plan_kernel(spec))["model"].vector_issue == 16 + 2 * 2 + 13


def test_overhead_is_what_the_counts_spend_beyond_the_static_tile_block():
    """A bench row's counts less its kernel's (tile, block) cost: the staged a16 8x8 block 32 spends 33
    vector instructions and 34 VLS cycles (model) per 16 vmadots; 100 (tile, block)s plus 160 more vector
    instructions and 320 more VLS cycles' worth of bytes are 0.1 and 0.2 per vmadot."""
    spec = specs_from_text(f"kernel t {{ op = gemm  {IME}  {CONFIGS[0]} }}")[0]
    est = occupancy.tile_block(plan_kernel(spec))["model"]
    assert (est.vector_issue, est.vls, est.vmadots) == (33, 34, 16)
    row = {"vmadot": 1600, "vload": 33 * 100 - 1600 + 160, "vstore": 0, "vlsx": 0, "valu": 0, "vfpu": 0,
           "vec_bytes": (34 * 100 + 320) * 16}
    over = floors.overhead_of(row, spec)
    assert over.issue == pytest.approx(0.1) and over.vls == pytest.approx(0.2)
    # VLS-bound, the modeled time is the VLS's cycles (indexed stores charged by the element): 1600 vmadots
    # on 4 cores in 1000 cycles each = 2.5 VLS cycles per vmadot, 34 / 16 of them in the (tile, block)s.
    vls_bound = {**row, "bound_4cores": "vls", "ms_4cores": 1000 / 2.0e9 * 1e3}
    assert floors.overhead_of(vls_bound, spec).vls == pytest.approx(2.5 - 34 / 16)


def test_report_gives_fold_budgets():
    text = floors.report(ROOT / "bench" / "results").split("Fold budgets")[1]
    rows = {tuple(line.split()[:3]): line for line in text.splitlines()[1:]}
    assert "largest budget    9 (8x12, k_unroll 1, spare registers 3)" in rows[("gate/up", "512", "32")]
    assert "tuned fold  13, issue  33 of  30" in rows[("gate/up", "512", "32")]  # 16 vmadots x 1.88 allowed
    assert "with the tuned kernel's overhead" in rows[("gate/up", "512", "64")]
    assert "no int8-B tiling's operand floor fits" in rows[("lm_head", "512", "32")]
