"""X60 occupancy from LLVM's hardware-measured SpacemiT-X60 scheduling model.

LLVM's RISCVSchedSpacemitX60.td gives, per instruction group, the cycles its unit (vector
load/store VLS, integer VIEU, floating-point VFP) stays busy (ReleaseAtCycles), measured on a
BPI-F3 and tabulated by LMUL (docs/ime-isa.md §7 "X60 occupancies measured on hardware"). The
groups are this module's KINDS; the QEMU plugin (insn_count.c) histograms every executed vector
instruction by the same kinds ("{tag}.occ.{kind}.b{bucket}"), so `measured_cycles` turns counts
into unit cycles, and `tile_block` does the same statically for one (tile, K block) of a plan.
vmadot is not in LLVM's model: one per cycle (SpacemiT's cpufp throughput, as x60.py).

Where the measured tables name one value for a group LLVM calls the worst case of several
measured ones, the per-instruction measurement quoted in the same file is used instead (vadd/vsub
1/2/4/8 beside the logical ops' 2/4/8/16).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ...plan import KernelPlan
from ...targets.ime.asm import AsmOp

VLEN = 256
LMULS = ("mf8", "mf4", "mf2", "m1", "m2", "m4", "m8")  # bucket b of an LMUL-bucketed kind: LMULS[b]


def _by_lmul(*cycles: int) -> tuple[int, ...]:
    """Cycles for LMUL MF8..M8, padded for the plugin's larger buckets (EMUL up to 64 registers)."""
    return cycles + (cycles[-1] * 2, cycles[-1] * 4, cycles[-1] * 8)


# kind -> (unit, cycles by bucket). Buckets: LMUL (EMUL for load/store, registers for whole/mv_nr,
# MF8 = bucket 0); strided/indexed: VLMAX = VLEN * 2^(b - 9) elements (LLVM: VLMAX, or VLMAX / 2).
KINDS: dict[str, tuple[str, tuple[float, ...]]] = {
    "load": ("vls", _by_lmul(3, 3, 3, 3, 4, 8, 16)),
    "store": ("vls", _by_lmul(2, 2, 2, 3, 4, 8, 19)),
    "whole": ("vls", _by_lmul(3, 3, 3, 3, 4, 8, 16)),  # vl<N>r / vs<N>r: 3, 4, 8, 16
    "mask_ls": ("vls", (2,) * 10),
    "strided": ("vls", tuple(VLEN * 2.0 ** (b - 9) for b in range(10))),
    "indexed": ("vls", tuple(VLEN * 2.0 ** (b - 9) / 2 for b in range(10))),
    "add": ("vieu", _by_lmul(1, 1, 1, 1, 2, 4, 8)),  # vadd/vsub/vmin/vmax, vmul/vmacc, saturating
    "logic": ("vieu", _by_lmul(1, 1, 1, 2, 4, 8, 16)),  # logical, shifts, vzext, vmv/vmerge, vrgather.vx, vslideup.vx, widening
    "narrow": ("vieu", _by_lmul(1, 1, 2, 4, 8, 16, 32)),
    "gather": ("vieu", _by_lmul(1, 1, 1, 4, 16, 64, 256)),  # vrgather.vv, vrgatherei16.vv (SEW > 8)
    "gather16_e8": ("vieu", _by_lmul(1, 1, 2, 8, 32, 128, 256)),
    "slide": ("vieu", _by_lmul(1, 1, 1, 3, 5, 9, 17)),  # vslidedown, vslideup.vi, vslide1*
    "cmp": ("vieu", _by_lmul(1, 1, 1, 2, 4, 8, 18)),
    "compress": ("vieu", _by_lmul(1, 1, 1, 3, 10, 36, 136)),
    "red": ("vieu", _by_lmul(1, 1, 2, 2, 4, 10, 35)),
    "div": ("vieu", _by_lmul(12, 12, 12, 24, 48, 96, 192)),
    "mv_xs": ("vieu", (6,) * 10),
    "mv_sx": ("vieu", (4,) * 10),  # vmv.s.x, vfmv.f.s, vfmv.s.f
    "mv_nr": ("vieu", _by_lmul(4, 4, 4, 4, 4, 8, 16)),  # vmv<N>r.v: 4, 4, 8, 16
    "mask": ("vieu", (1,) * 10),
    "pop": ("vieu", (2,) * 10),
    "fadd": ("vfp", _by_lmul(1, 1, 1, 1, 2, 4, 8)),  # vfadd/vfmul/vfmacc, vfmin/vfmax
    "fcvt": ("vfp", _by_lmul(1, 1, 1, 2, 4, 8, 16)),  # vfcvt, vfsgnj, vfmv.v.f/vfmerge, vfrec7, vfclass
    "fwcvt": ("vfp", _by_lmul(1, 1, 2, 4, 8, 16, 32)),  # vfwcvt/vfncvt, vfwadd/vfwsub (narrow LMUL)
    "fred": ("vfp", _by_lmul(8, 8, 8, 8, 14, 20, 57)),
    "fdiv": ("vfp", _by_lmul(12, 12, 12, 12, 24, 48, 96)),
}
UNITS = ("vls", "vieu", "vfp")


def measured_cycles(counts: dict[str, float], tags=("kernel", "callee")) -> dict[str, float] | None:
    """Unit cycles (vls, vieu, vfp) of counted instructions under LLVM's measured occupancies; None
    for counts made before the plugin histogrammed kinds."""
    if not any(k.startswith(f"{tags[0]}.occ.") for k in counts):
        return None
    out = dict.fromkeys(UNITS, 0.0)
    for kind, (unit, cycles) in KINDS.items():
        out[unit] += sum(counts.get(f"{t}.occ.{kind}.b{b}", 0) * c for t in tags for b, c in enumerate(cycles))
    return out


# ---------------------------------------------------------------------------------------------
# Static: one (tile, K block) of an IME plan, read off its instructions


@dataclass(frozen=True)
class Occupancy:
    """Cycles per unit for one (tile, block); vmadots and vector instructions counted."""

    vls: float
    vieu: float
    vfp: float
    ime: float
    vector_issue: int
    vmadots: int

    @property
    def cycles(self) -> float:
        return max(self.vls, self.vieu, self.vfp, self.ime, self.vector_issue)

    @property
    def bound(self) -> str:
        units = {"VLS": self.vls, "VIEU": self.vieu, "VFP": self.vfp, "IME": self.ime, "vector issue": self.vector_issue}
        return max(units, key=units.get)

    @property
    def per_vmadot(self) -> float:
        return self.cycles / self.vmadots


@dataclass
class _Vtype:
    sew: int = 8
    lmul: str = "m1"
    vl: int = 32

    def set(self, text: str) -> None:
        m = re.match(r"vset(i?)vli\s+\S+,\s*(\S+),\s*e(\d+),\s*(m\w+)", text)
        if not m:  # vsetvl with a register vtype: not emitted by imegen's plans
            raise ValueError(f"cannot follow vtype through {text!r}")
        self.sew, self.lmul = int(m.group(3)), m.group(4)
        self.vl = min(int(m.group(2)), self.vlmax) if m.group(1) else self.vlmax  # AVL in a register: at most VLMAX

    @property
    def index(self) -> int:
        return LMULS.index(self.lmul)

    @property
    def regs(self) -> float:
        return 2.0 ** (self.index - 3)

    @property
    def vlmax(self) -> int:
        return int(VLEN * self.regs) // self.sew


def _kind(m: str, vt: _Vtype) -> tuple[str, int]:
    """(LLVM kind, bucket) of one vector instruction under vtype: insn_count.c's decode, by mnemonic."""
    lb = vt.index
    vlmax_b = lb - 3 - (vt.sew.bit_length() - 1) + 9
    if m.startswith("vmadot") or m == ".word":
        return "vmadot", 0
    if mm := re.match(r"v[ls](\d)r(?:e\d+)?\.v$", m):
        return "whole", int(mm.group(1)).bit_length() - 1 + 3
    if m in ("vlm.v", "vsm.v"):
        return "mask_ls", 3
    if mm := re.match(r"v([ls])e(\d+)\.v$", m):
        return ("load" if mm.group(1) == "l" else "store"), lb + int(mm.group(2)).bit_length() - vt.sew.bit_length()
    if re.match(r"v[ls]se\d+\.v$", m):
        return "strided", vlmax_b
    if re.match(r"v[ls][uo]xei\d+\.v$", m):
        return "indexed", vlmax_b
    if mm := re.match(r"vmv(\d)r\.v$", m):
        return "mv_nr", int(mm.group(1)).bit_length() - 1 + 3
    fixed = {"vmv.x.s": "mv_xs", "vmv.s.x": "mv_sx", "vfmv.f.s": "mv_sx", "vfmv.s.f": "mv_sx", "vcpop.m": "pop", "vfirst.m": "pop"}
    if m in fixed:
        return fixed[m], lb
    if m in ("vrgather.vv", "vrgatherei16.vv"):
        return ("gather16_e8" if m == "vrgatherei16.vv" and vt.sew == 8 else "gather"), lb
    if m.startswith(("vslidedown", "vslide1", "vfslide1")) or m == "vslideup.vi":
        return "slide", lb
    if m.startswith(("vms", "vmf", "vmadc", "vmsbc")):
        return "cmp", lb
    if m.startswith("vf"):
        if m.startswith(("vfwcvt", "vfncvt", "vfwadd", "vfwsub")):
            return "fwcvt", lb
        if m.startswith(("vfw",)):
            return "logic", lb
        if m.startswith(("vfcvt", "vfsgnj", "vfmv.v", "vfmerge", "vfrec", "vfrsqrt", "vfclass")):
            return "fcvt", lb
        if m.startswith(("vfred", "vfwred")):
            return "fred", lb
        if m.startswith(("vfdiv", "vfrdiv", "vfsqrt")):
            return "fdiv", lb
        return "fadd", lb
    if re.match(r"v(add|sub|rsub|min|max|minu|maxu|sadd|saddu|ssub|ssubu|aadd|aaddu|asub|asubu|mul|mulh\w*|macc|madd|nmsac|nmsub|smul)\.", m):
        return "add", lb
    if re.match(r"vn(srl|sra|clip|clipu)\.", m):
        return "narrow", lb
    if m.startswith(("vred", "vwred")):
        return "red", lb
    if m.startswith(("vdiv", "vrem")):
        return "div", lb
    if m.startswith("vcompress"):
        return "compress", lb
    if re.match(r"vm(and|nand|andn|or|nor|orn|xor|xnor)\.mm$", m):
        return "mask", lb
    return "logic", lb  # logical, shifts, vzext/vsext, vmv/vmerge, vrgather.vx/vi, vslideup.vx, vid, widening


def _model_charge(m: str, vt: _Vtype) -> float:
    """What the bench's model (x60.py) charges: 16-byte beats on VLS, one element a cycle for strided and
    indexed accesses, two DLEN-128 beats a cycle on VIEU/VFP (twice the EMUL for widening/narrowing)."""
    if mm := re.match(r"v[ls](\d)r(?:e\d+)?\.v$", m):
        return max(1, int(mm.group(1)) * VLEN // 8 // 16)
    if mm := re.match(r"v[ls]e(\d+)\.v$", m):
        return max(1, -(-vt.vl * int(mm.group(1)) // 8 // 16))
    if re.match(r"v[ls](se|[uo]xei)\d+\.v$", m):
        return vt.vl
    if mm := re.match(r"vmv(\d)r\.v$", m):  # whole-register move: N registers whatever the vtype
        return max(1.0, int(mm.group(1)) * VLEN / 128) / 2
    wide = m.startswith(("vfw", "vfncvt", "vw", "vnsr", "vnclip"))
    return max(1.0, (2 if wide else 1) * vt.regs * VLEN / 128) / 2


def instruction_cost(vset: str, instruction: str) -> tuple[str, float, float]:
    """(unit, LLVM occupancy, bench-model charge) of one vector instruction after the given vset."""
    vt = _Vtype()
    vt.set(vset)
    return _cost(instruction, vt)


def _cost(text: str, vt: _Vtype) -> tuple[str, float, float]:
    m = ".word" if text.startswith(".word") else text.split()[0]
    kind, bucket = _kind(m, vt)
    if kind == "vmadot":
        return "ime", 1.0, 1.0
    unit, cycles = KINDS[kind]
    return unit, cycles[max(0, min(9, bucket))], _model_charge(m, vt)


def tile_block_ops(plan: KernelPlan) -> tuple[AsmOp, ...]:
    """The instructions one (tile, K block) runs: block start, the loop's iterations, fold, block end."""
    I = plan.ime
    return (*I.acc_zero, *I.prologue, *I.entry, *I.body * I.iterations_per_block, *I.fold, *I.block_end)


def kinds(texts: list[str]) -> dict[str, int]:
    """The plugin's histogram keys ("occ.KIND.bBUCKET") of an instruction sequence, read off its text."""
    vt, out = _Vtype(), {}
    for text in texts:
        if text.startswith("vsetvl "):
            vt.sew, vt.lmul, vt.vl = 8, "m1", 32
        elif text.startswith("vset"):
            vt.set(text)
        elif text.startswith("v"):
            kind, bucket = _kind(text.split()[0], vt)
            key = f"occ.{kind}.b{max(0, min(9, bucket))}"
            out[key] = out.get(key, 0) + 1
    return out


def walk(texts: list[str], vt: _Vtype | None = None) -> dict[str, Occupancy]:
    """{'llvm': ..., 'model': ...} of an instruction sequence (assembly text; scalar lines are skipped,
    `.word` is a vmadot, a vsetvl from registers leaves e8/m1 as the plugin assumes)."""
    vt = vt or _Vtype()
    sums = {k: dict.fromkeys(("vls", "vieu", "vfp", "ime"), 0.0) for k in ("llvm", "model")}
    issue = vmadots = 0
    for text in texts:
        if text.startswith("vsetvl "):
            vt.sew, vt.lmul, vt.vl = 8, "m1", 32
        elif text.startswith("vset"):
            vt.set(text)
        elif text.startswith((".word", "v")):
            unit, llvm, model = _cost(text, vt)
            sums["llvm"][unit] += llvm
            sums["model"][unit] += model
            issue += 1
            vmadots += unit == "ime"
    return {k: Occupancy(v["vls"], v["vieu"], v["vfp"], v["ime"], issue, vmadots) for k, v in sums.items()}


def tile_block(plan: KernelPlan) -> dict[str, Occupancy]:
    """walk() of one (tile, K block) in steady state (the vtype a block ends with is the one the next
    starts with). The asm only: C code around a per-block asm statement is not seen."""
    texts = [op.text for op in tile_block_ops(plan)]
    vt = _Vtype()
    for text in texts:  # the vtype in force at a block's start
        if text.startswith("vset"):
            vt.set(text)
    return walk(texts, vt)


def summary(plan: KernelPlan) -> list[str]:
    """explain's lines: both estimates for one (tile, block)."""
    est = tile_block(plan)
    out = [f"  X60 per (tile, block), static: {est['llvm'].vector_issue} vector instructions, {est['llvm'].vmadots} vmadot"]
    for key, label in (("llvm", "LLVM's measured occupancies"), ("model", "the bench's model (x60.py)")):
        o = est[key]
        out.append(f"    {label:<28} VLS {o.vls:g}, VIEU {o.vieu:g}, VFP {o.vfp:g}, IME {o.ime:g}, issue {o.vector_issue} cycles: "
                   f"{o.bound} binds, {o.per_vmadot:.2f} cycles per vmadot")
    return out
