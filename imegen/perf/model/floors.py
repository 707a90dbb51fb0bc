"""Floors of the X60 model for IME gemm tiles: the fewest cycles per vmadot a register tiling can
reach from its operand and accumulator traffic alone, before any fold, block start or edge cost.

Why: the prefill goal of issue 10 is 1.5x of a roofline that charges one cycle per vmadot. The
model's own machine cannot feed a vmadot from memory at that rate: every operand register costs
VLS cycles and 32 vector registers bound the tile. These floors say what the best tile of each kind
can reach at a block size, so a cell's budget (cycles per vmadot that 1.5x allows) tells which tile
kinds could meet it at all, and how much of the budget their fold may take.

A tile of a x b vmadot tiles (TM = 4a rows, TN = 4b columns) over one quantization block of
s = block / 8 k-steps (docs/ime-isa.md §2, §7; imegen/perf/model/x60.py):
  vmadot        a*b*s: one IME cycle and one vector issue slot each (one vector instruction a cycle)
  operands      a A registers a k-step, and b B registers (int8: staged B or 8-bit codes) or b/2
                (4-bit codes unpacked in the tile: a 32-byte register holds 4 columns x 16 k)
  accumulators  int32: 2 registers per vmadot tile, live for the block; fp32: 2 per vmadot tile
                kept in registers across blocks, or loaded and stored once per block (4ab registers)
  registers     2ab + (2ab with fp32 in registers) + a + b (int8) or a + 2b (codes and one unpacked
                k-step) <= 32
  VLS           >= 2 cycles per 32-byte register moved: the model charges 16 bytes a cycle, LLVM's
                measured occupancies 3 cycles at LMUL 1 and 4/8/16 at LMUL 2/4/8
  VIEU          4-bit codes: >= 1 cycle per unpacked register under the model, 2 under LLVM's (vand, vsrl)
  vector issue  >= the vmadots plus one load instruction per 8 registers moved, plus (4-bit codes) one
                vand or vsrl per unpacked register: the K1 has no int4 vmadot (docs/ime-isa.md §1)
Everything here is MODELED and a lower bound: a real kernel adds its fold, zero points and edges.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

from ... import ir
from ...errors import SpecError
from ...plan import plan_kernel
from ...targets.ime import rules as ime_rules
from ..search.settings import validate
from . import occupancy, x60

REGISTERS = 32
VLS_PER_REGISTER = 2  # cycles per 32-byte register, both views (LMUL >= 2 loads; LMUL 1 costs 3 under LLVM's)
GOAL = 1.5  # issue 10: prefill within 1.5x of the roofline
MIN_FOLD = 4  # vector instructions any fold takes: A and B scales loaded, dots converted, one multiply-accumulate


@dataclass(frozen=True)
class Tiling:
    a: int  # vmadot tiles down (TM = 4a)
    b: int  # vmadot tiles across (TN = 4b)
    fp32_in_registers: bool
    int4: bool  # 4-bit codes loaded and unpacked in the tile (else int8 B: staged or 8-bit)

    @property
    def name(self) -> str:
        b_kind = "4-bit codes unpacked in the tile" if self.int4 else "int8 B (staged or 8-bit)"
        return f"{4 * self.a}x{4 * self.b}, fp32 accumulators {'in registers' if self.fp32_in_registers else 'in memory'}, {b_kind}"

    @property
    def registers(self) -> int:
        acc = 2 * self.a * self.b * (2 if self.fp32_in_registers else 1)
        return acc + self.a + (2 * self.b if self.int4 else self.b)

    def cycles(self, block: int, measured: bool = False) -> dict[str, float]:
        """Lower bounds on each unit's cycles for one (tile, block)."""
        s = block // 8
        vmadot = self.a * self.b * s
        moved = (self.a + (self.b / 2 if self.int4 else self.b)) * s + (0 if self.fp32_in_registers else 4 * self.a * self.b)
        unpack = self.b * s if self.int4 else 0
        return {"ime": vmadot, "issue": vmadot + moved / 8 + unpack, "vls": VLS_PER_REGISTER * moved,
                "vieu": self.b * s * (2 if measured else 1) if self.int4 else 0.0}

    def k_unroll(self) -> int:
        """The most k-steps (1, 2 or 4) one loop iteration can load next to the accumulators: A and B
        registers a k-step (int8 B), or A registers a k-step beside one code register and one unpacked
        register per 4 columns (4-bit codes: a code register serves 2 k-steps, each unpacked in place of
        the last)."""
        fixed = self.registers - self.step_registers
        return max(ku for ku in (1, 2, 4) if fixed + ku * self.step_registers <= REGISTERS)

    @property
    def step_registers(self) -> int:
        """Registers each further k-step of an iteration adds: A and B (int8 B), or A alone (4-bit codes)."""
        return self.a if self.int4 else self.a + self.b

    def spare_registers(self) -> int:
        return REGISTERS - self.registers - (self.k_unroll() - 1) * self.step_registers

    def issue_per_block(self, block: int) -> float:
        """Vector issue slots of one (tile, block) for its vmadots, whole-register operand loads
        (k_unroll() k-steps an iteration; 4-bit codes: b registers every 2 k-steps), the 4-bit codes'
        unpacking (one vand or vsrl per unpacked register) and, with fp32 accumulators in memory, their
        whole-register load and store; the fold's arithmetic, accumulator zeroing and loop overhead come on top."""
        ku, s = self.k_unroll(), block // 8
        facc = 0 if self.fp32_in_registers else 2 * load_instructions(2 * self.a * self.b)
        if self.int4:  # codes every 2 k-steps, one vand or vsrl per unpacked register
            operands = s / ku * load_instructions(self.a * ku) + s / 2 * load_instructions(self.b) + self.b * s
        else:
            operands = s / ku * (load_instructions(self.a * ku) + load_instructions(self.b * ku))
        return self.a * self.b * s + operands + facc

    def per_vmadot(self, block: int, view: str = "model") -> float:
        """view: "model" (x60.py's charges), "measured" (LLVM's occupancies) or "robust" (the slower)."""
        views = (False, True) if view == "robust" else (view == "measured",)
        return max(max(self.cycles(block, m).values()) for m in views) / (self.a * self.b * (block // 8))


def load_instructions(registers: int) -> int:
    """Whole-register loads (vl1r, vl2r, vl4r, vl8r: aligned groups of 1, 2, 4, 8) that fill `registers`."""
    return registers // 8 + bin(registers % 8).count("1")


@dataclass(frozen=True)
class Overhead:
    """Per vmadot, what a kernel spends outside its steady-state (tile, block) loop: B staging, A
    quantization, tile starts and ends, edges. Measured on the tuned kernel of a cell (overhead_of)
    and charged to every tiling of its kind as an estimate: staging, quantization and C stores scale
    with the elements, not with the tile."""
    issue: float = 0.0  # vector instructions (exact counts)
    vls: float = 0.0  # VLS cycles: exact where the cell is VLS-bound, else its accessed bytes at 16 a cycle (at least)


def overhead_of(row: dict, s: ir.KernelSpec) -> Overhead:
    """A bench.csv row's counts less its kernel's static (tile, block) cost times its (tile, block)s. Where
    the row is VLS-bound its modeled time is the VLS's cycles (indexed C stores charged by the element, as
    x60 does); elsewhere the bytes its vector loads and stores accessed, at 16 a cycle, bound them below."""
    p = x60.X60
    est = occupancy.tile_block(plan_kernel(s))["model"]
    vmadot = float(row["vmadot"])
    vector = sum(float(row[c]) for c in x60.VECTOR_CLASSES)
    vls = float(row["vec_bytes"]) / (p.dlen // 8) / p.vls_beats_per_cycle
    if row.get("bound_4cores") == "vls":
        vls = max(vls, float(row["ms_4cores"]) * 1e-3 * p.clock_hz * p.ime_cores)
    return Overhead(max(0.0, vector / vmadot - est.vector_issue / est.vmadots), max(0.0, vls / vmadot - est.vls / est.vmadots))


@dataclass(frozen=True)
class Budget:
    issue: int  # vector instructions per (tile, block) for the fold, block start and loop overhead
    vls: float  # VLS cycles per (tile, block) for the fold's loads (scales, tables)


def fold_budget(t: Tiling, block: int, allowed: float, over: Overhead = Overhead()) -> Budget | None:
    """What a tiling leaves its fold within `allowed` cycles per vmadot under the model, after its
    vmadots, whole-register operand loads and (4-bit codes) unpacking (one vector instruction a cycle;
    2 VLS cycles per operand register) and `over` (None: its operand floor and the overhead alone are
    above `allowed`, or what its loads and unpacking leave is less than any fold takes, MIN_FOLD)."""
    if t.per_vmadot(block, "robust") + over.vls > allowed:
        return None
    vmadots = t.a * t.b * (block // 8)
    issue = int((allowed - over.issue) * vmadots - t.issue_per_block(block))
    if issue < MIN_FOLD:
        return None
    return Budget(issue, (allowed - over.vls) * vmadots - t.cycles(block)["vls"])


def largest_budget(block: int, allowed: float, over: Overhead = Overhead(), int4: bool = False) -> tuple[Budget | None, Tiling | None]:
    """The tiling of a B kind (int8 B, or 4-bit codes unpacked in the tile) with the largest fold budget
    (fewest registers on a tie), or (None, None)."""
    fits = [(b, t) for t in tilings() if t.int4 == int4 and (b := fold_budget(t, block, allowed, over)) is not None]
    return max(fits, key=lambda x: (x[0].issue, -x[1].registers)) if fits else (None, None)


def _tiling_note(t: Tiling) -> str:
    return f"{4 * t.a}x{4 * t.b}, k_unroll {t.k_unroll()}, spare registers {t.spare_registers()}"


def fold_instructions(s: ir.KernelSpec) -> int:
    """Vector issue slots of a kernel's block fold and block start (the int32 accumulators zeroed, zero
    points spread): what a fold budget pays for. vsetvli is not counted: the model issues it in a
    scalar slot (x60.VECTOR_CLASSES, as occupancy.walk), so it does not take from the budget."""
    I = plan_kernel(s).ime
    return sum(op.text.startswith("v") and not op.text.startswith("vset") for op in (*I.acc_zero, *I.prologue, *I.fold))


def tilings() -> list[Tiling]:
    """Every tiling whose registers fit the file."""
    return [t for a in range(1, 9) for b in range(1, 9) for f in (True, False) for i in (False, True)
            if (t := Tiling(a, b, f, i)).registers <= REGISTERS]


def best(block: int, view: str = "model", **kind) -> tuple[float, Tiling]:
    """The lowest floor at a block among tilings of the given kind (fp32_in_registers=, int4=), fewest
    registers first on a tie."""
    pool = [t for t in tilings() if all(getattr(t, k) == v for k, v in kind.items())]
    return min(((t.per_vmadot(block, view), t) for t in pool), key=lambda x: (x[0], x[1].registers))


def of_spec(s: ir.KernelSpec) -> Tiling:
    """The tiling an IME gemm kernel uses."""
    return Tiling(s.tile_m // 4, s.tile_n // 4, ime_rules.fp32_acc_in_registers(s), s.bits == 4 and not ime_rules.staged(s))


def spec_of_config(config: str) -> ir.KernelSpec:
    """The spec of a bench.csv config column ("op=gemm bits=4 ..."), through the tuner's validator."""
    spec = validate(dict(kv.split("=") for kv in config.split()))
    if isinstance(spec, SpecError):
        raise spec
    return spec


# ---------------------------------------------------------------------------------------------
# The report: each kind's floor, and each prefill cell's budget next to it


def _kinds_table(blocks) -> list[str]:
    lines = ["Best tiling of each kind (floor cycles per vmadot: the model | LLVM's measured occupancies):",
             f"{'kind':<66}" + "".join(f"  block {blk:<11}" for blk in blocks)]
    for f in (True, False):
        for i in (False, True):
            cells, name = [], ""
            for blk in blocks:
                (m, t), (o, _) = (best(blk, view, fp32_in_registers=f, int4=i) for view in ("model", "measured"))
                cells.append(f"  {m:4.2f} | {o:4.2f} {4 * t.a}x{4 * t.b}")
                name = t.name.split(", ", 1)[1]
            lines.append(f"{name:<66}" + "".join(f"{c:<19}" for c in cells))
    return lines


def cell_budgets(results: Path) -> list[dict]:
    """Prefill cells of the committed bench (M 128 and 512, every shape but k/v): the cycles per vmadot
    that 1.5x of the roofline allows on 4 cores, next to what the tuned kernel reached."""
    p = x60.X60
    rows = []
    with open(results / "bench.csv", newline="") as f:
        for r in csv.DictReader(f):
            # rows without the X60's 4-core roofline (IME2's, modeled on the A100) have no budget here
            if r["kernel"] != "imegen" or not r["roofline_ms_4cores"] or int(r["M"]) == 1 or r["shape"] == "k/v":
                continue
            vmadot_per_core = float(r["vmadot"]) / p.ime_cores
            allowed = GOAL * float(r["roofline_ms_4cores"]) * 1e-3 * p.clock_hz / vmadot_per_core
            rows.append({"shape": r["shape"], "M": int(r["M"]), "block": int(r["block"]), "config": r["config"],
                         "x_model": float(r["x_roofline_4cores"]), "x_measured": float(r["x_roofline_4cores_llvm_occ"]),
                         "bound": r["bound_4cores"], "allowed": allowed, "row": r})
    return rows


def report(results: Path, blocks=(32, 64, 128)) -> str:
    lines = ["imegen floors: what any IME register tiling can reach under the X60 model (MODELED lower bounds, "
             "imegen/perf/model/floors.py: operand and fp32 accumulator traffic only; folds, zero points and edges come on top)", ""]
    lines += _kinds_table(blocks)
    lines += ["", f"Prefill cells of {results}/bench.csv not within {GOAL}x of the roofline (either view): the cycles per "
              f"vmadot {GOAL}x allows on 4 cores, against the floor of the tuned kernel's tiling and of the best tiling:",
              f"{'shape':<8}{'M':>4}{'block':>6}  {'x roof (model|LLVM)':>20}  {'bound':<13}{'allows':>7}  "
              f"{'tuned tiling floor':>18}  {'best tiling floor':>17}  verdict"]
    notes = []
    for c in cell_budgets(results):
        if max(c["x_model"], c["x_measured"]) <= GOAL:
            continue
        spec = spec_of_config(c["config"])
        own = of_spec(spec)
        own_floor = own.per_vmadot(c["block"], "robust")
        floor, t = best(c["block"], "robust")
        over = overhead_of(c["row"], spec)
        (bare, k), (paid, kp) = (largest_budget(c["block"], c["allowed"], ov) for ov in (Overhead(), over))
        fits = bare is not None
        n = bare.issue if fits else None
        after = (f"{paid.issue} and {paid.vls:.1f} VLS cycles" if paid else "none fits") + " after the tuned kernel's overhead"
        if fits:
            beyond = (f"beyond its tiling's floor: {4 * k.a}x{4 * k.b}-class tiles fit, with a fold of at most {n} vector "
                      f"instructions ({after}; fold budgets below)")
        elif (b4 := largest_budget(c["block"], c["allowed"], int4=True))[0]:
            beyond = (f"beyond its tiling's floor and every int8-B one's: needs 4-bit codes unpacked in the tile, "
                      f"{4 * b4[1].a}x{4 * b4[1].b} at best, with a fold of at most {b4[0].issue} vector instructions")
        else:
            beyond = (f"beyond every tiling's reach under the model: int8 B's operand floor is above it, and 4-bit codes "
                      f"unpacked in the tile ({4 * t.a}x{4 * t.b}'s floor {floor:.2f}) leave fewer issue slots than any "
                      f"fold takes ({MIN_FOLD}) once their whole-register loads and unpacking (one vand or vsrl per "
                      f"register) are counted")
        verdict = "; ".join(
            (["DRAM-bound: needs a schedule moving fewer bytes"] if c["bound"] == "dram" else [])
            + [beyond if own_floor > c["allowed"] else "its tiling's floor fits: the fold and loop overhead decide"])
        lines.append(f"{c['shape']:<8}{c['M']:>4}{c['block']:>6}  {c['x_model']:>9.2f} | {c['x_measured']:<8.2f}  "
                     f"{c['bound']:<13}{c['allowed']:>7.2f}  {own_floor:>18.2f}  {floor:>11.2f} {4 * t.a}x{4 * t.b}  {verdict}")
        issue = occupancy.tile_block(plan_kernel(spec))["model"].vector_issue
        notes.append(f"{c['shape']:<8}{c['M']:>4}{c['block']:>6}  tuned fold {fold_instructions(spec):>3}, "
                     f"issue {issue:>3} of {int(c['allowed'] * own.a * own.b * (c['block'] // 8)):>3}  "
                     + (f"largest budget {n:>4} ({_tiling_note(k)}); with the tuned kernel's overhead "
                        f"({over.issue:.3f} issue, {over.vls:.3f} VLS cycles per vmadot) "
                        + (f"{paid.issue} and {paid.vls:.1f} VLS cycles ({_tiling_note(kp)})" if paid else "none")
                        if fits else "no int8-B tiling's operand floor fits"))
    lines += ["", "Fold budgets (the model's issue slot, one vector instruction a cycle): per (tile, block), the vector "
              "instructions an int8-B tiling whose operand floor fits leaves within 1.5x for its fold, block start and "
              "loop after its vmadots and whole-register operand loads, against the tuned kernel's fold and block start ('fold') "
              "and its vector issue slots per (tile, block), of those 1.5x allows its tiling (vsetvli excluded throughout: "
              "the model issues it in a scalar slot). Then the same once a kernel of the kind also pays what the tuned one "
              "spends per vmadot outside its (tile, block) loop (B staging, A quantization, tile ends; its counts less its "
              "static (tile, block) cost), with the VLS cycles left for the fold's loads (its A and B scales take one at "
              "least each):", *notes]
    return "\n".join(lines)

