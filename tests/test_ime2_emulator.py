"""The SIGILL IME2 emulator (imegen/runtime/ime2_emu.c) against an independent NumPy model of the spec's
semantics and against the spec's own usage examples, under QEMU at VLEN 1024.
The block-scaled `.hp` forms are modelled with np.float16 arithmetic, one operation at a time (§6.2).

The driver tests/c/ime2_emu_test.c executes the real `.word` encodings from imegen.targets.ime2.encoding;
this file generates the asm for them (ime2_variants.h) and the input records. docs/ime2-isa.md §2 (semantics),
§5 (vtype), §7 (the spec's usage examples).
"""

from __future__ import annotations

import itertools
import signal
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from imegen import toolchain
from imegen.perf.baselines.llama_cpp.ime2 import encode_pack, encode_vnpack4
from imegen.targets.ime2.encoding import encode_vmadot, encode_vmadot_hp, encode_vmadot_sp, mnemonic

C_DIR = Path(__file__).parent / "c"
VLEN = 1024
VLENB = VLEN // 8
SIGNS = ("ss", "uu", "us", "su")
INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
ALL_VREGS = ", ".join(f'"v{r}"' for r in range(32))

missing = toolchain.missing_tools()
pytestmark = pytest.mark.skipif(
    any(t in missing for t in (toolchain.CLANG, toolchain.QEMU)),
    reason=f"cross toolchain missing: {missing}")


# ---------------------------------------------------------------- NumPy model (spec §5.1.3, §5.2.3, §2.7.2)

@dataclass(frozen=True)
class Op:
    """One vmadot instruction: its signedness (A = vs1, B = vs2), data type and slide."""
    sign: str
    dtype: str = "i8"
    slide: int = 0

    @property
    def name(self) -> str:
        return f"{mnemonic(self.sign, self.dtype, self.slide)} ({self.dtype})"


def elements(reg_bytes: np.ndarray, dtype: str, is_signed: bool) -> np.ndarray:
    """The register bytes as int64 elements: int8, or int4 with element 2n in the low nibble of byte n."""
    if dtype == "i8":
        return reg_bytes.view(np.int8 if is_signed else np.uint8).astype(np.int64)
    nibbles = np.stack([reg_bytes & 0x0F, reg_bytes >> 4], axis=1).reshape(-1).astype(np.int64)
    return np.where(nibbles >= 8, nibbles - 16, nibbles) if is_signed else nibbles


def vmadot_exact(c: np.ndarray, a: np.ndarray, b: np.ndarray, op: Op) -> np.ndarray:
    """C[8x8] + A[8xK] @ B^T in int64, no wrap. a = bytes of vs1 || vs1+1 (256), b = bytes of vs2 (128)."""
    k = 16 if op.dtype == "i8" else 32
    A = elements(a, op.dtype, op.sign[0] == "s").reshape(-1, k)[op.slide:op.slide + 8]
    B = elements(b, op.dtype, op.sign[1] == "s").reshape(8, k)  # row j holds column j of B
    return c.astype(np.int64).reshape(8, 8) + A @ B.T


def wrap32(x: np.ndarray) -> np.ndarray:
    return x.astype(np.int64).astype(np.uint32).view(np.int32)  # keeps the low 32 bits


def run_ops(c, a, b, ops) -> tuple[np.ndarray, bool]:
    """The int32 C after `ops` in order, and whether any step left the int32 range (and wrapped)."""
    wrapped = False
    for op in ops:
        exact = vmadot_exact(c, a, b, op)
        wrapped |= bool(((exact < INT32_MIN) | (exact > INT32_MAX)).any())
        c = wrap32(exact).reshape(64)
    return c, wrapped


# ---------------------------------------------------------------- variants (one asm function each)

@dataclass(frozen=True)
class Variant:
    name: str
    vd: int
    vs1: int
    vs2: int
    sew: int  # the vsetvli before the instructions: e{sew}, m1, vl = VLMAX
    ops: tuple[Op, ...]

    @property
    def a_regs(self) -> list[int]:
        return [self.vs1, self.vs1 + 1] if any(op.slide for op in self.ops) else [self.vs1]

    def words(self) -> list[int]:
        return [encode_vmadot(self.vd, self.vs1, self.vs2, signedness=op.sign, dtype=op.dtype, slide=op.slide)
                for op in self.ops]


FORMS = [Op(s, "i8", n) for n in range(4) for s in SIGNS] + [Op(s, "i4") for s in SIGNS]


def form_variant(i: int, op: Op) -> Variant:
    """Over the first 16 variants every register 0..31 gets loaded from and stored to, so every case of the
    emulator's spill/fill switches runs; the SEW cycles through the three the A100's known user issues."""
    vd = 2 * (i % 16)
    return Variant(op.name, vd, (vd + 8) % 32, (vd + 19) % 32, (8, 16, 32)[i % 3], (op,))


FORM_VARIANTS = [form_variant(i, op) for i, op in enumerate(FORMS)]
# The spec's usage examples, with the spec's own registers (docs/ime2-isa.md §7).
SPEC_BASE = Variant("spec 5.1.6", 16, 0, 1, 8, (Op("ss"),))
SPEC_SLIDE = Variant("spec 5.2.6", 16, 0, 8, 8, (Op("ss"), Op("ss", slide=1), Op("ss", slide=2)))
SPEC_SLIDE_FIRST_TWO = Variant("spec 5.2.6, first two", 16, 0, 8, 8, (Op("ss"), Op("ss", slide=1)))
SPEC_HP_DOT = Variant("spec 5.4.7, its integer dot product", 16, 2, 8, 16, (Op("ss"),))
SPEC_VARIANTS = [SPEC_BASE, SPEC_SLIDE, SPEC_SLIDE_FIRST_TWO, SPEC_HP_DOT]


@dataclass(frozen=True)
class PackVariant:
    """One smt.vpack.vv / smt.vupack.vv: vd, vd+1 (out) from vs1 (the record's a[:128]) and vs2 (b)."""
    name: str
    vd: int
    vs1: int
    vs2: int
    sew: int
    imm2: int
    unpack: bool
    ops: tuple[str, ...] = ("pack",)  # one emulated instruction

    @property
    def a_regs(self) -> list[int]:
        return [self.vs1]

    def words(self) -> list[int]:
        return [encode_pack(self.vd, self.vs1, self.vs2, self.imm2, unpack=self.unpack)]


def pack_model(a: np.ndarray, b: np.ndarray, sew: int, imm2: int, unpack: bool) -> np.ndarray:
    """Spec §7.3 / §7.4 (docs/ime2-isa.md §6.1): the 256 bytes of vd || vd+1. pack_len is SEW for imm2 0,
    else 128 << (imm2 - 1) bits. vpack interleaves vs1's and vs2's chunks; vupack sends the even chunks of
    the stream vs1 || vs2 to vd and the odd ones to vd+1."""
    chunk = sew // 8 if imm2 == 0 else 16 << (imm2 - 1)
    if unpack:
        stream = np.concatenate([a[:VLENB], b]).reshape(-1, chunk)
        return np.concatenate([stream[0::2].reshape(-1), stream[1::2].reshape(-1)])
    return np.stack([a[:VLENB].reshape(-1, chunk), b.reshape(-1, chunk)], axis=1).reshape(-1)


PACK_VARIANTS = [PackVariant(f"{'vupack' if unpack else 'vpack'} imm2={imm2} e{sew}", vd, vs1, vs2, sew, imm2, unpack)
                 for n, (unpack, imm2, sew, (vd, vs1, vs2)) in enumerate(itertools.product(
                     (False, True), range(4), (8, 16, 32, 64), [(24, 4, 5), (2, 30, 30), (0, 2, 31)]))
                 if imm2 == 0 or sew in (8, 32)]
@dataclass(frozen=True)
class Npack4Variant:
    """One smt.vnpack4.vv vd, vs1, vs2, imm2 (one register out): stores vd, then vs1 (it must come out unchanged)."""
    name: str
    vd: int
    vs1: int
    vs2: int
    sew: int
    imm2: int
    ops: tuple[str, ...] = ("vnpack4",)

    def words(self) -> list[int]:
        return [encode_vnpack4(self.vd, self.vs1, self.vs2, self.imm2)]


def npack4_model(a: np.ndarray, b: np.ndarray, imm2: int) -> np.ndarray:
    """docs/ime2-isa.md §9.1: vd's 128 bytes in chunks of pack_len = 32 << imm2 bits, alternately from vs1 (a)
    and vs2 (b), each the low nibbles of the next 2 x pack_len bits of its source, byte 2j of it in bits 3:0 and
    byte 2j+1 in bits 7:4 of byte j; the same under every SEW."""
    def nibbles(reg: np.ndarray) -> np.ndarray:
        return (reg[0::2] & 15) | (reg[1::2] & 15) << 4  # (64,): all of the register, in order
    chunk = 4 << imm2
    return np.stack([nibbles(a).reshape(-1, chunk), nibbles(b).reshape(-1, chunk)], axis=1).reshape(-1)


# Every imm2 under every SEW (the reading ignores SEW: llama.cpp issues it under e8 and e16), vs1 = vs2 as
# llama.cpp's m1 kernels issue it, and registers spread over the file.
NPACK4_VARIANTS = [Npack4Variant(f"vnpack4 imm2={imm2} e{sew} v{vd}, v{vs1}, v{vs2}", vd, vs1, vs2, sew, imm2)
                   for imm2 in range(4) for sew, (vd, vs1, vs2) in zip((8, 16, 32, 64),
                                                                   [(12, 16, 17), (8, 3, 3), (31, 0, 30), (1, 29, 2)])]


@dataclass(frozen=True)
class HpOp:
    """One vmadot*.hp: signedness, data type and the scale group imm3 (8 FP16 scales, one per column)."""
    sign: str
    dtype: str
    imm3: int

    @property
    def name(self) -> str:
        return f"{mnemonic(self.sign, self.dtype, form='hp')} imm3={self.imm3} ({self.dtype})"


@dataclass(frozen=True)
class HpVariant:
    """vmadot*.hp into vd (64 FP16, one register) with the scales in v{scale}; stores vd and the scale register."""
    name: str
    vd: int
    vs1: int
    vs2: int
    scale: int
    sew: int
    ops: tuple[HpOp, ...]

    def words(self) -> list[int]:
        return [encode_vmadot_hp(self.vd, self.vs1, self.vs2, scale=self.scale, imm3=op.imm3, signedness=op.sign,
                                 dtype=op.dtype) for op in self.ops]


HP_FORMS = [(s, d) for d in ("i8", "i4") for s in SIGNS]
# Every signedness and data type once, every imm3 once, both scale registers, odd and even vd, vs1 or vs2 in
# the scale register that is not used, SEW 8/16/32.
HP_REGS = [(3, 16, 24, 0), (16, 2, 8, 1), (31, 30, 1, 0), (9, 0, 10, 1), (22, 23, 21, 0), (5, 6, 7, 1),
           (28, 1, 27, 0), (13, 14, 15, 1)]
HP_FORM_VARIANTS = [HpVariant(HpOp(sign, dtype, i).name, *HP_REGS[i], (8, 16, 32)[i % 3], (HpOp(sign, dtype, i),))
                    for i, (sign, dtype) in enumerate(HP_FORMS)]
# Four instructions accumulating into one FP16 C, as llama.cpp's kernels do (the high and low nibbles of A).
HP_CHAIN = HpVariant("hp chain", 20, 4, 12, 0, 16, (HpOp("ss", "i8", 0), HpOp("su", "i4", 4), HpOp("uu", "i4", 1),
                                                     HpOp("us", "i8", 7)))
# Spec §5.4.7 with its own registers and vtype: smt.vmadot.hp v16, v2, v8, v0, 0, i8 under e16.
SPEC_HP = HpVariant("spec 5.4.7", 16, 2, 8, 0, 16, (HpOp("ss", "i8", 0),))
HP_VARIANTS = HP_FORM_VARIANTS + [HP_CHAIN, SPEC_HP]
VARIANTS = FORM_VARIANTS + SPEC_VARIANTS + PACK_VARIANTS + HP_VARIANTS + NPACK4_VARIANTS


def register_moves(v) -> tuple[list[tuple[int, str]], list[tuple[int, str]]]:
    """(loads, stores) of a variant as (register, asm operand). .hp: C is vd alone, the scales come from s, and
    the scale register is stored back (it must come out unchanged)."""
    if isinstance(v, HpVariant):
        return [(v.vd, "c0"), (v.vs1, "a0"), (v.vs2, "b"), (v.scale, "s")], [(v.vd, "o0"), (v.scale, "o1")]
    if isinstance(v, Npack4Variant):
        return [(v.vd, "c0"), (v.vs1, "a0"), (v.vs2, "b")], [(v.vd, "o0"), (v.vs1, "o1")]
    return ([(v.vd, "c0"), (v.vd + 1, "c1"), *((r, f"a{k}") for k, r in enumerate(v.a_regs)), (v.vs2, "b")],
            [(v.vd, "o0"), (v.vd + 1, "o1")])


def variant_function(i: int, v) -> str:
    loads, stores = register_moves(v)
    lines = [f"vsetvli t0, zero, e{v.sew}, m1, ta, ma",
             *(f"vl1r.v v{r}, (%[{x}])" for r, x in loads),
             *(f".word 0x{w:08x}" for w in v.words()),
             *(f"vs1r.v v{r}, (%[{x}])" for r, x in stores)]
    asm = "\n".join(f'        "{line}\\n\\t"' for line in lines)
    clobbers = ", ".join(f'"v{r}"' for r in sorted({r for r, _ in loads}))
    return f"""
/* {v.name}: v{v.vd}, v{v.vs1}, v{v.vs2} under e{v.sew} */
static void variant_{i}(const void *c, const void *a, const void *b, const void *s, void *out) {{
    const char *cc = c, *ac = a;
    char *oc = out;
    __asm__ volatile(
{asm}
        :
        : [c0] "r"(cc), [c1] "r"(cc + {VLENB}), [a0] "r"(ac), [a1] "r"(ac + {VLENB}), [b] "r"(b), [s] "r"(s),
          [o0] "r"(oc), [o1] "r"(oc + {VLENB})
        : "memory", "t0" VCLOBBERS({clobbers}, "vl", "vtype"));
}}
"""


# ---------------------------------------------------------------- probes (one raw word each)

@dataclass(frozen=True)
class Probe:
    name: str
    word: int
    vtype: str
    refusal: str | None  # None: the emulator runs it; else a fragment of the reason it prints before SIGILL
    avl: int | None = None  # None: vl = VLMAX (vsetvli with rs1 = zero); else this AVL


VALID_I8 = encode_vmadot(8, 16, 24)
VALID_I4 = encode_vmadot(8, 16, 24, dtype="i4")
VALID_SLIDE = encode_vmadot(8, 16, 24, slide=3)
NOT_RUN = "not an IME2 instruction it runs"
BAD_VTYPE = "LMUL 1 and vl = VLMAX"
OVERLAP = "overlaps a source"
VALID_HP = encode_vmadot_hp(8, 16, 24, scale=1, imm3=7, signedness="us", dtype="i4")
HP_OVERLAP = "vd of vmadot*.hp is vs1, vs2 or the scale register"


def with_field(word: int, shift: int, width: int, value: int) -> int:
    """`word` with bits [shift + width - 1 : shift] replaced: illegal words the encoder refuses to build."""
    mask = (1 << width) - 1
    return word & ~(mask << shift) | value << shift


PROBES = [
    Probe("i8_e8", VALID_I8, "e8, m1, ta, ma", None),
    Probe("i8_e16", VALID_I8, "e16, m1, ta, ma", None),
    Probe("i8_e32", VALID_I8, "e32, m1, ta, ma", None),
    Probe("i4_e32", VALID_I4, "e32, m1, ta, ma", None),
    Probe("slide3_e16", VALID_SLIDE, "e16, m1, ta, ma", None),
    Probe("i8_e32_vl32_explicit", VALID_I8, "e32, m1, ta, ma", None, avl=32),
    # LMUL != 1 is illegal (spec §5.1.4); vl < VLMAX and SEW 64 are refused (docs/ime2-isa.md §5).
    Probe("i8_e32_m2", VALID_I8, "e32, m2, ta, ma", BAD_VTYPE),
    Probe("i4_e8_mf2", VALID_I4, "e8, mf2, ta, ma", BAD_VTYPE),
    Probe("i8_e8_m8", VALID_I8, "e8, m8, ta, ma", BAD_VTYPE),
    Probe("i8_e64", VALID_I8, "e64, m1, ta, ma", BAD_VTYPE),
    Probe("i8_e8_vl64", VALID_I8, "e8, m1, ta, ma", BAD_VTYPE, avl=64),
    Probe("i4_e32_vl16", VALID_I4, "e32, m1, ta, ma", BAD_VTYPE, avl=16),
    Probe("i8_e16_vl63", VALID_I8, "e16, m1, ta, ma", BAD_VTYPE, avl=63),
    # Register constraints (spec §2.3, §5.1.4, §5.2.4).
    Probe("odd_vd", VALID_I8 | 1 << 7, "e8, m1, ta, ma", NOT_RUN),
    Probe("vs2_is_vd", with_field(VALID_I8, 20, 5, 8), "e8, m1, ta, ma", OVERLAP),
    Probe("vs2_is_vd_plus_1", with_field(VALID_I4, 20, 5, 9), "e8, m1, ta, ma", OVERLAP),
    Probe("vs1_is_vd_plus_1", with_field(VALID_I8, 15, 5, 9), "e8, m1, ta, ma", OVERLAP),
    Probe("slide_pair_is_vd", with_field(VALID_SLIDE, 16, 4, 4), "e8, m1, ta, ma", OVERLAP),
    # Reserved encodings (spec §8.1, §8.2).
    Probe("base_bit14_reserved", VALID_I8 | 1 << 14, "e8, m1, ta, ma", NOT_RUN),
    Probe("slide_field_0b11_reserved", VALID_SLIDE | 1 << 14, "e8, m1, ta, ma", NOT_RUN),
    Probe("i4_slide_reserved", with_field(encode_vmadot(8, 16, 24, slide=1), 29, 2, 0b10), "e8, m1, ta, ma", NOT_RUN),
    Probe("dtype_01_reserved", with_field(VALID_I8, 29, 2, 0b01), "e8, m1, ta, ma", NOT_RUN),
    Probe("dtype_00", with_field(VALID_I8, 29, 2, 0b00), "e8, m1, ta, ma", NOT_RUN),
    Probe("bit25_clear", VALID_I8 & ~(1 << 25), "e8, m1, ta, ma", NOT_RUN),
    Probe("family_111_reserved", with_field(VALID_I8, 26, 3, 0b111), "e8, m1, ta, ma", NOT_RUN),
    # Valid IME2 forms this emulator does not run: they must die, not compute something.
    Probe("vmadot_sp", encode_vmadot_sp(8, 16, 24, mask=0, imm2=1), "e8, m1, ta, ma", NOT_RUN),
    Probe("vfwmadot", 0x9E62412B, "e16, m1, ta, ma", NOT_RUN),  # smt.vfwmadot v2, v4, v6 (LLVM MC test)
    Probe("vpack", 0x6652112B, "e8, m1, ta, ma", None),  # smt.vpack.vv v2, v4, v5, 1 (LLVM MC test)
    Probe("vupack_e64", 0x6652512B, "e64, m1, ta, ma", None),  # smt.vupack.vv v2, v4, v5, 1 (LLVM MC test)
    Probe("vpack_m2", 0x6652112B, "e8, m2, ta, ma", "vpack/vupack need LMUL 1"),
    Probe("vupack_vl16", 0x6652512B, "e8, m1, ta, ma", "vpack/vupack need LMUL 1", avl=16),
    Probe("vpack_vs1_is_vd_plus_1", encode_pack(2, 3, 5, 1, unpack=False), "e8, m1, ta, ma", OVERLAP),
    Probe("vupack_vs2_is_vd", encode_pack(2, 4, 2, 1, unpack=True), "e8, m1, ta, ma", OVERLAP),
    Probe("vpack_odd_vd", 0x6652112B | 1 << 7, "e8, m1, ta, ma", NOT_RUN),
    # smt.vnpack4.vv (spec §8.6.2, docs/ime2-isa.md §9.1): binutils' and LLVM's words run; LMUL != 1, vl < VLMAX
    # and vd = a source are refused; the saturating vnspack4 ([14] = 1) is not run.
    Probe("vnpack4_binutils", 0x4241812B, "e8, m1, ta, ma", None),  # smt.vnpack4.vv v2,v3,v4,0 (binutils)
    Probe("vnpack4_llvm_e16", 0x425190AB, "e16, m1, ta, ma", None),  # smt.vnpack4.vv v1, v3, v5, 1 (LLVM MC)
    Probe("vnpack4_m2", 0x4241812B, "e8, m2, ta, ma", "vnpack4 needs LMUL 1"),
    Probe("vnpack4_vl16", 0x4241812B, "e8, m1, ta, ma", "vnpack4 needs LMUL 1", avl=16),
    Probe("vnpack4_vd_is_vs1", encode_vnpack4(3, 3, 4, 3), "e8, m1, ta, ma", "vd of vnpack4 is a source"),
    Probe("vnpack4_vd_is_vs2", encode_vnpack4(4, 3, 4, 3), "e16, m1, ta, ma", "vd of vnpack4 is a source"),
    Probe("vnspack4_binutils", 0x4241C12B, "e8, m1, ta, ma", NOT_RUN),  # smt.vnspack4.vv v2,v3,v4,0 (binutils)
    # .hp (spec §5.4.5, §8.4): vd may be odd; vd = vs1, vs2 or the scale register, LMUL != 1 and reserved
    # data types are refused.
    Probe("hp_i4_imm7_e16", VALID_HP, "e16, m1, ta, ma", None),
    Probe("hp_i8_odd_vd_e8", encode_vmadot_hp(9, 0, 1, scale=1, imm3=0, signedness="su"), "e8, m1, ta, ma", None),
    Probe("hp_e32", encode_vmadot_hp(31, 2, 2, scale=0, imm3=3, signedness="uu"), "e32, m1, ta, ma", None),
    Probe("hp_m2", VALID_HP, "e16, m2, ta, ma", BAD_VTYPE),
    Probe("hp_e64", VALID_HP, "e64, m1, ta, ma", BAD_VTYPE),
    Probe("hp_vl32", VALID_HP, "e16, m1, ta, ma", BAD_VTYPE, avl=32),
    Probe("hp_vd_is_vs1", with_field(VALID_HP, 15, 5, 8), "e16, m1, ta, ma", HP_OVERLAP),
    Probe("hp_vd_is_vs2", with_field(VALID_HP, 20, 5, 8), "e16, m1, ta, ma", HP_OVERLAP),
    Probe("hp_vd_is_scale", with_field(VALID_HP, 7, 5, 1), "e16, m1, ta, ma", HP_OVERLAP),
    Probe("hp_dtype_01_reserved", with_field(VALID_HP, 29, 2, 0b01), "e16, m1, ta, ma", NOT_RUN),
    Probe("hp_dtype_00_reserved", with_field(VALID_HP, 29, 2, 0b00), "e16, m1, ta, ma", NOT_RUN),
    Probe("custom1_zero", 0x0000002B, "e8, m1, ta, ma", NOT_RUN),
    Probe("compressed_unimp", 0x00000000, "e8, m1, ta, ma", ""),  # no word to report: dies silently
]


def probe_function(k: int, p: Probe) -> str:
    setvl = "vsetvli t0, zero" if p.avl is None else f"li t0, {p.avl}\\n\\tvsetvli t0, t0"
    return f"""
/* {p.name} */
static void probe_{k}(void) {{
    __asm__ volatile("{setvl}, {p.vtype}\\n\\t.word 0x{p.word:08x}"
                     : : : "memory", "t0" VCLOBBERS({ALL_VREGS}, "vl", "vtype"));
}}
"""


def vtype_probe_function() -> str:
    # One asm block, so no compiler-emitted vsetvli can sit between the reads. e16 with an explicit
    # AVL of VLMAX and the unusual mask-undisturbed policy: all of it must survive the trap.
    return f"""
static void vtype_probe(unsigned long r[4]) {{
    unsigned long vl0, vt0, vl1, vt1;
    __asm__ volatile(
        "li t0, 64\\n\\t"
        "vsetvli zero, t0, e16, m1, ta, mu\\n\\t"
        "csrr %[vl0], vl\\n\\t"
        "csrr %[vt0], vtype\\n\\t"
        ".word 0x{VALID_I8:08x}\\n\\t"
        "csrr %[vl1], vl\\n\\t"
        "csrr %[vt1], vtype"
        : [vl0] "=&r"(vl0), [vt0] "=&r"(vt0), [vl1] "=r"(vl1), [vt1] "=r"(vt1)
        :
        : "memory", "t0" VCLOBBERS("v8", "v9", "vl", "vtype"));
    r[0] = vl0; r[1] = vt0; r[2] = vl1; r[3] = vt1;
}}
"""


def generate_header() -> str:
    parts = ["/* Generated by tests/test_ime2_emulator.py */",
             f"#define N_VARIANTS {len(VARIANTS)}", f"#define N_PROBES {len(PROBES)}"]
    parts += [variant_function(i, v) for i, v in enumerate(VARIANTS)]
    parts.append("static const variant_fn variants[N_VARIANTS] = {"
                 + ", ".join(f"variant_{i}" for i in range(len(VARIANTS))) + "};")
    parts += [probe_function(k, p) for k, p in enumerate(PROBES)]
    parts.append("static const probe_fn probes[N_PROBES] = {"
                 + ", ".join(f"probe_{k}" for k in range(len(PROBES))) + "};")
    parts.append(vtype_probe_function())
    return "\n".join(parts) + "\n"


# ---------------------------------------------------------------- builds

# (driver compiler, emulator compiler). GCC 12 cannot build vector code but can build both the
# emulator (rv64gc) and the driver (asm only), so it is exercised for both parts.
BUILDS = [("clang", "clang"), ("clang", "gcc"), ("gcc", "gcc")]


@pytest.fixture(scope="module")
def gen_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("ime2_gen")
    (d / "ime2_variants.h").write_text(generate_header())
    return d


def build(gen_dir: Path, main_cc: str, emu_cc: str) -> Path:
    if (emu_cc == "gcc" or main_cc == "gcc") and toolchain.GCC in missing:
        pytest.skip(f"{toolchain.GCC} not installed")
    exe = gen_dir / f"ime2_emu_test_{main_cc}_{emu_cc}"
    if not exe.exists():
        # rv64gc: the emulator's C code must not touch the live vector registers.
        obj = toolchain.compile_c([toolchain.RUNTIME_DIR / "ime2_emu.c"], gen_dir / f"ime2_emu_{emu_cc}.o",
                                  compiler=emu_cc, march="rv64gc")
        toolchain.compile_c([C_DIR / "ime2_emu_test.c", obj], exe, compiler=main_cc,
                            include_dirs=[gen_dir, toolchain.RUNTIME_DIR])
    return exe


@pytest.fixture(scope="module", params=BUILDS, ids=[f"main-{m}_emu-{e}" for m, e in BUILDS])
def exe(request, gen_dir) -> Path:
    return build(gen_dir, *request.param)


@pytest.fixture(scope="module")
def clang_exe(gen_dir) -> Path:
    return build(gen_dir, "clang", "clang")


def run(exe: Path, args, **kwargs):
    return toolchain.run(exe, args, vlen=VLEN, ime=True, **kwargs)


# ---------------------------------------------------------------- records

Record = tuple[int, np.ndarray, np.ndarray, np.ndarray]  # variant, c[64] int32, a[256] uint8, b[128] uint8
# int8 -128, 127, 0, -1/255; as int4 pairs the same bytes are (-8|8, -8|8), (7, 7), (0, 0), (-1|15, -1|15),
# and 0x08 / 0xF7 mix the nibble extremes within a byte.
BYTE_EXTREMES = (0x80, 0x7F, 0x00, 0xFF, 0x08, 0xF7)
CONSTANT_PATTERNS = (0x80, 0x7F, 0x00, 0xFF)


def random_c(rng) -> np.ndarray:
    return rng.integers(INT32_MIN, INT32_MAX, 64, endpoint=True, dtype=np.int64).astype(np.int32)


def form_records(rng: np.random.Generator, v: int) -> list[Record]:
    recs = [(v, random_c(rng), rng.integers(0, 256, 256, dtype=np.uint8), rng.integers(0, 256, 128, dtype=np.uint8))
            for _ in range(24)]
    # Constant extreme byte patterns, from zero and from both ends of int32 (the latter wrap).
    for pa, pb, c0 in itertools.product(CONSTANT_PATTERNS, CONSTANT_PATTERNS, (0, INT32_MAX - 3, INT32_MIN + 3)):
        recs.append((v, np.full(64, c0, np.int32), np.full(256, pa, np.uint8), np.full(128, pb, np.uint8)))
    # Per-byte mixtures of the extremes, so signed and unsigned readings disagree everywhere.
    extremes = np.array(BYTE_EXTREMES, np.uint8)
    recs += [(v, random_c(rng), rng.choice(extremes, 256), rng.choice(extremes, 128)) for _ in range(8)]
    return recs


def spec_record(variant: Variant, a_rows: list[list[int]], b_rows: list[list[int]]) -> Record:
    """A record from a spec example's matrices: A's rows and B's columns (the spec lists B^T's rows), each
    placed at the start of a 16-byte row of the A100 tile, the rest zero. The A60 examples' 4x8 tiles thus
    sit in the top-left corner of the 8x16 one, where they compute the same sums."""
    a = np.zeros((16, 16), np.int8)
    b = np.zeros((8, 16), np.int8)
    for i, row in enumerate(a_rows):
        a[i, :len(row)] = row
    for j, col in enumerate(b_rows):
        b[j, :len(col)] = col
    return (VARIANTS.index(variant), np.zeros(64, np.int32), a.view(np.uint8).reshape(-1), b.view(np.uint8).reshape(-1))


# Spec §5.1.6 (A60 example): int8 A[4x8] and B given as its four columns; C printed below.
SPEC_516_A = [[0, 1, 2, 3, 4, 5, 6, 7], [1, 2, 3, 4, 5, 6, 7, 8], [2, 3, 4, 5, 6, 7, 8, 9], [4, 5, 6, 7, 8, 9, 10, 11]]
SPEC_516_BT = [[0, 1, 2, 3, 4, 5, 6, 7], [1, 2, 3, 4, 5, 6, 7, 8], [2, 3, 4, 5, 6, 7, 8, 9], [11, 4, 5, 6, 7, 8, 9, 10]]
SPEC_516_C = [[140, 168, 196, 224], [168, 204, 240, 284], [196, 240, 284, 344], [252, 312, 372, 464]]
# Spec §5.2.6 (A60 example): the 8-row feature map (rows 6-7 zero), the same B; vmadot, vmadot1, vmadot2.
SPEC_526_A = SPEC_516_A + [[5, 6, 7, 8, 9, 10, 11, 12], [6, 7, 8, 9, 10, 11, 12, 13], [0] * 8, [0] * 8]
SPEC_526_AFTER_SLIDE1 = [[308, 372, 436, 224], [364, 444, 524, 628], [448, 552, 656, 808], [532, 660, 788, 988]]
SPEC_526_C = [[504, 612, 720, 852], [616, 756, 896, 1092], [728, 900, 1072, 1332], [840, 1044, 1248, 1572]]
# The spec prints 224 (row 0, column 3, after vmadot1): that cell's value before vmadot1. Adding row 1 of
# A times column 3 of B (11+8+15+24+35+48+63+80 = 284) gives 508, and only 508 is consistent with the
# 852 it prints after vmadot2 (508 + 344). docs/ime2-isa.md §8.
SPEC_526_TYPOS = {(0, 3): (224, 508)}
# Spec §5.4.7 (A100 example, smt.vmadot.hp ... i8): A = B^T = rows i..i+15; FP16 scales 1..8 for columns
# 0..7; C printed in FP16. Its integer dot product is the base vmadot's 8x16x8 result.
SPEC_547_AB = [[i + k for k in range(16)] for i in range(8)]
SPEC_547_SCALE = np.arange(1, 9, dtype=np.float16)
SPEC_547_C = [[1240, 2720, 4440, 6400, 8600, 11040, 13720, 16640],
              [1360, 2992, 4896, 7072, 9520, 12240, 15232, 18496],
              [1480, 3264, 5352, 7744, 10440, 13440, 16736, 20352],
              [1600, 3536, 5808, 8416, 11360, 14640, 18256, 22208],
              [1720, 3808, 6264, 9088, 12280, 15840, 19776, 24064],
              [1840, 4080, 6720, 9760, 13200, 17040, 21280, 25920],
              [1960, 4352, 7176, 10432, 14120, 18240, 22784, 27776],
              [2080, 4624, 7632, 11104, 15040, 19440, 24304, 29632]]

SPEC_RECORDS = [spec_record(SPEC_BASE, SPEC_516_A, SPEC_516_BT), spec_record(SPEC_SLIDE, SPEC_526_A, SPEC_516_BT),
                spec_record(SPEC_SLIDE_FIRST_TWO, SPEC_526_A, SPEC_516_BT),
                spec_record(SPEC_HP_DOT, SPEC_547_AB, SPEC_547_AB)]


def make_records(rng: np.random.Generator) -> list[Record]:
    recs = [r for v in range(len(FORM_VARIANTS)) for r in form_records(rng, v)]
    for v in SPEC_VARIANTS:  # the multi-instruction sequences on random data too
        idx = VARIANTS.index(v)
        recs += [(idx, random_c(rng), rng.integers(0, 256, 256, dtype=np.uint8),
                  rng.integers(0, 256, 128, dtype=np.uint8)) for _ in range(8)]
    return recs + SPEC_RECORDS


NO_SCALES = np.zeros(VLENB, np.uint8)


def encode_record(v: int, c: np.ndarray, a: np.ndarray, b: np.ndarray, s: np.ndarray = NO_SCALES) -> bytes:
    """One driver record; s (the scale register) is read by the .hp variants only."""
    return struct.pack("<i", v) + c.astype("<i4").tobytes() + a.tobytes() + b.tobytes() + s.tobytes()


def encode_records(recs) -> bytes:
    return b"".join(encode_record(*r) for r in recs)


def parse_results(stdout: bytes) -> tuple[np.ndarray, int]:
    lines = stdout.decode().split("\n")
    assert lines[-1] == "" and lines[-2].startswith("count "), lines[-3:]
    rows = np.array([[int(x) for x in ln.split()] for ln in lines[:-2]], dtype=np.int64)
    return rows, int(lines[-2].split()[1])


@pytest.fixture(scope="module")
def records() -> list[Record]:
    return make_records(np.random.default_rng(20260413))


@pytest.fixture(scope="module")
def results(clang_exe, records) -> np.ndarray:
    got, count = parse_results(run(clang_exe, ["run"], input=encode_records(records), timeout=120).stdout)
    assert count == sum(len(VARIANTS[v].ops) for v, *_ in records), "every vmadot must go through the emulator"
    return got


def spec_result(results: np.ndarray, variant: Variant) -> np.ndarray:
    """The emulator's C[8x8] for the spec example record of `variant` (the records end with them)."""
    k = len(SPEC_RECORDS) - [r[0] for r in SPEC_RECORDS].index(VARIANTS.index(variant))
    return results[-k].reshape(8, 8)


# ---------------------------------------------------------------- .hp: NumPy model and records (spec §5.4.3)

FP16_CANONICAL_NAN = 0x7E00  # RISC-V's canonical NaN (the emulator's NaN result; NumPy's payloads vary)
STEPS = ("convert", "multiply", "add")
EVENTS = tuple(f"tie {st}" for st in STEPS) + ("overflow", "subnormal", "nan")


def hp_model(c: np.ndarray, a: np.ndarray, b: np.ndarray, s: np.ndarray, ops) -> np.ndarray:
    """The spec's pseudocode in np.float16, one rounding per operation: for each instruction in turn,
    C[i][j] = fp16(C[i][j] + fp16(fp16(tmp[i][j]) * scale[8*imm3 + j])), tmp the exact integer dot product.
    c: the 64 FP16 of vd; s: the 128 bytes of the scale register."""
    c = c.astype(np.float16).reshape(8, 8)
    scales = s.view(np.float16)
    with np.errstate(all="ignore"):
        for op in ops:
            tmp = vmadot_exact(np.zeros(64, np.int64), a, b, Op(op.sign, op.dtype))
            product = tmp.astype(np.float64).astype(np.float16) * scales[8 * op.imm3:8 * op.imm3 + 8][None, :]
            c = c + product
    return c.reshape(64)


def rounding_events(c: np.ndarray, a: np.ndarray, b: np.ndarray, s: np.ndarray, ops) -> dict[str, int]:
    """How often the model's steps hit what the test must cover: an exact tie at each step (float64 holds every
    step's exact value), a finite step overflowing to inf, a subnormal result, a NaN made from non-NaNs."""
    events = dict.fromkeys(EVENTS, 0)
    c = c.astype(np.float16).reshape(8, 8)
    scales = s.view(np.float16)

    def step(exact: np.ndarray, name: str, inputs_finite: np.ndarray) -> np.ndarray:
        rounded = exact.astype(np.float16)
        wide = rounded.astype(np.float64)
        ok = np.isfinite(wide) & np.isfinite(exact) & (wide != exact)
        neighbour = np.nextafter(rounded, np.where(exact > wide, np.float16(np.inf), np.float16(-np.inf)))
        events[f"tie {name}"] += int((ok & (2 * np.abs(exact - wide) == np.abs(neighbour.astype(np.float64) - wide))).sum())
        events["overflow"] += int((inputs_finite & np.isinf(rounded)).sum())
        events["subnormal"] += int((np.abs(wide) < 2.0**-14) .sum() - (wide == 0).sum())
        return rounded

    with np.errstate(all="ignore"):
        for op in ops:
            tmp = vmadot_exact(np.zeros(64, np.int64), a, b, Op(op.sign, op.dtype)).astype(np.float64)
            t16 = step(tmp, "convert", np.ones(tmp.shape, bool))
            sc = scales[8 * op.imm3:8 * op.imm3 + 8][None, :]
            p16 = step(t16.astype(np.float64) * sc.astype(np.float64), "multiply", np.isfinite(t16) & np.isfinite(sc))
            new = step(c.astype(np.float64) + p16.astype(np.float64), "add", np.isfinite(c) & np.isfinite(p16))
            events["nan"] += int((np.isnan(new) & ~np.isnan(c) & ~np.isnan(p16)).sum())
            c = new
    return events


def fp16_bytes(x) -> np.ndarray:
    return np.asarray(x, np.float16).view(np.uint8)


def hp_records(rng: np.random.Generator, v: int) -> list[tuple]:
    """Records (variant, c, a, b, s) for an .hp variant: quantization-like scales (rounding at every step),
    random 16-bit patterns (every class of FP16: subnormal, inf, NaN, -0), subnormal scales (subnormal
    products), and extreme codes with large scales or ±0 (tmp or products beyond 65504: inf, inf - inf,
    inf x 0)."""
    def rand_bytes(n):
        return rng.integers(0, 256, n, dtype=np.uint8)

    def extreme_bytes(n):
        return rng.choice(np.array(BYTE_EXTREMES, np.uint8), n)

    def small_bytes(n):  # mostly zero, small codes: small tmp, so subnormal scales give subnormal products
        return rng.choice(np.array([0, 0, 0, 1, 0x11, 0xF0], np.uint8), n)

    def record(c16, a, b, scales):
        c = np.concatenate([fp16_bytes(c16), np.zeros(VLENB, np.uint8)]).view(np.int32)
        return (v, c, a, b, fp16_bytes(scales))

    recs = []
    for _ in range(6):
        recs.append(record(rng.uniform(-60, 60, 64), rand_bytes(256), rand_bytes(128), rng.uniform(1e-4, 2e-2, 64)))
        recs.append(record(rng.integers(0, 2**16, 64, dtype=np.uint16).view(np.float16), rand_bytes(256),
                           rand_bytes(128), rng.integers(0, 2**16, 64, dtype=np.uint16).view(np.float16)))
        subnormal = (rng.integers(0, 2**11, 64, dtype=np.uint16) | rng.integers(0, 2, 64, dtype=np.uint16) << 15)
        recs.append(record(rng.choice([0.0, -0.0, 2.0**-24, -(2.0**-20), 1e-5], 64), small_bytes(256),
                           small_bytes(128), subnormal.view(np.float16)))
        recs.append(record(rng.choice([0.0, -0.0, 6e4, -6e4, 1.0], 64), extreme_bytes(256), extreme_bytes(128),
                           rng.choice([0.0, -0.0, 1.0, -3.0, 7.5, 4e3], 64)))
    return recs


def hp_result(row: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A driver output row of an .hp variant: (vd as 64 FP16 bit patterns, the scale register's 128 bytes)."""
    raw = row.astype(np.int32).view(np.uint8)
    return raw[:VLENB].view(np.uint16), raw[VLENB:]


def assert_fp16_equal(got_bits: np.ndarray, want: np.ndarray, msg: str) -> None:
    """Bit for bit (so -0 differs from +0); NaN must be the canonical one."""
    want_bits = np.where(np.isnan(want), FP16_CANONICAL_NAN, want.view(np.uint16))
    np.testing.assert_array_equal(got_bits, want_bits, err_msg=msg)


# Spec §5.4.7's registers: A, B and the FP16 scales (1..8 for columns 0-7 in group 0, the rest zero).
SPEC_547_RECORD = (VARIANTS.index(SPEC_HP), np.zeros(64, np.int32),
                   np.concatenate([np.array(SPEC_547_AB, np.int8).view(np.uint8).reshape(-1), np.zeros(VLENB, np.uint8)]),
                   np.array(SPEC_547_AB, np.int8).view(np.uint8).reshape(-1),
                   fp16_bytes(np.concatenate([SPEC_547_SCALE, np.zeros(56)])))


# ---------------------------------------------------------------- tests

def test_every_form_matches_numpy(exe, records):
    """All 16 int8 forms (4 signednesses x slide 0-3) and the 4 int4 forms, under e8/e16/e32, in every build."""
    got, count = parse_results(run(exe, ["run"], input=encode_records(records), timeout=120).stdout)
    assert count == sum(len(VARIANTS[v].ops) for v, *_ in records), "every vmadot must go through the emulator"
    assert got.shape == (len(records), 64)
    wrapped = set()
    for (v, c, a, b), row in zip(records, got):
        want, did_wrap = run_ops(c, a, b, VARIANTS[v].ops)
        np.testing.assert_array_equal(row, want, err_msg=f"variant {v}: {VARIANTS[v].name}")
        if did_wrap:
            wrapped.add(v)
    assert wrapped >= set(range(len(FORM_VARIANTS))), "each form must include an int32 wrap-around case"


def test_vpack_vupack_match_the_spec_model(exe):
    """vpack and vupack at every imm2, imm2 0 under every SEW (it is pack_len), against pack_model."""
    rng = np.random.default_rng(7)
    first = VARIANTS.index(PACK_VARIANTS[0])
    recs = [(first + i, random_c(rng), rng.integers(0, 256, 256, dtype=np.uint8), rng.integers(0, 256, 128, dtype=np.uint8))
            for i in range(len(PACK_VARIANTS)) for _ in range(3)]
    got, count = parse_results(run(exe, ["run"], input=encode_records(recs), timeout=120).stdout)
    assert count == len(recs)
    for (v, _, a, b), row in zip(recs, got):
        pv = VARIANTS[v]
        a_reg = b if pv.vs1 == pv.vs2 else a[:VLENB]  # one register: the driver loads vs2's data last
        want = pack_model(a_reg, b, pv.sew, pv.imm2, pv.unpack)
        np.testing.assert_array_equal(row.astype(np.int32).view(np.uint8), want, err_msg=pv.name)


def test_vnpack4_matches_the_kernel_reading(exe):
    """vnpack4 at every imm2 and SEW, vs1 = vs2 too, against npack4_model on random and extreme bytes; vs1 comes
    out unchanged. The kernels pin the reading (tests/test_llama_ime2.py); this pins the emulator to the model."""
    rng = np.random.default_rng(17)
    first = VARIANTS.index(NPACK4_VARIANTS[0])
    extremes = np.array(BYTE_EXTREMES, np.uint8)
    recs = [(first + i, random_c(rng), gen(256), gen(128)) for i in range(len(NPACK4_VARIANTS))
            for gen in (lambda n: rng.integers(0, 256, n, dtype=np.uint8), lambda n: rng.choice(extremes, n))]
    got, count = parse_results(run(exe, ["run"], input=encode_records(recs), timeout=120).stdout)
    assert count == len(recs)
    for (v, _, a, b), row in zip(recs, got):
        nv = VARIANTS[v]
        a_reg = b if nv.vs1 == nv.vs2 else a[:VLENB]  # one register: the driver loads vs2's data last
        out = row.astype(np.int32).view(np.uint8)
        np.testing.assert_array_equal(out[:VLENB], npack4_model(a_reg, b, nv.imm2), err_msg=nv.name)
        np.testing.assert_array_equal(out[VLENB:], a_reg, err_msg=f"{nv.name}: vs1 changed")


def test_npack4_model_by_hand():
    """The model on a worked register: bytes 0x21, 0x43 (low nibbles 1, 3) -> 0x31; 0xF7, 0x08 -> 0x87; imm2 0
    interleaves 4-byte chunks of vd."""
    a = np.zeros(VLENB, np.uint8)
    b = np.zeros(VLENB, np.uint8)
    a[:4] = [0x21, 0x43, 0xF7, 0x08]
    b[:2] = [0x1E, 0x2D]
    out = npack4_model(a, b, 0)
    assert list(out[:6]) == [0x31, 0x87, 0, 0, 0xDE, 0]
    assert list(npack4_model(a, b, 3)[:2]) == [0x31, 0x87] and npack4_model(a, b, 3)[32] == 0xDE


def test_forms_cover_the_integer_instructions():
    assert {(op.sign, op.dtype, op.slide) for v in FORM_VARIANTS for op in v.ops} == \
        set(itertools.product(SIGNS, ["i8"], range(4))) | set(itertools.product(SIGNS, ["i4"], [0]))
    assert {v.sew for v in FORM_VARIANTS if v.ops[0].dtype == "i4"} == {8, 16, 32}


def test_spec_example_5_1_6(results):
    """The base vmadot example's printed C (A60 tile, in the top-left corner of the A100 one)."""
    c = spec_result(results, SPEC_BASE)
    np.testing.assert_array_equal(c[:4, :4], SPEC_516_C)
    np.testing.assert_array_equal(c[:, 4:], 0)  # B's columns 4-7 are zero
    np.testing.assert_array_equal(c[4:], 0)     # so are A's rows 4-7


def test_spec_example_5_2_6(results):
    """vmadot, vmadot1, vmadot2 accumulating into one C: the printed C after vmadot1 and after vmadot2."""
    after_slide1 = np.array(SPEC_526_AFTER_SLIDE1)
    for (i, j), (printed, corrected) in SPEC_526_TYPOS.items():
        assert after_slide1[i, j] == printed
        after_slide1[i, j] = corrected
    np.testing.assert_array_equal(spec_result(results, SPEC_SLIDE_FIRST_TWO)[:4, :4], after_slide1)
    np.testing.assert_array_equal(spec_result(results, SPEC_SLIDE)[:4, :4], SPEC_526_C)


def test_spec_example_5_4_7_integer_part(results):
    """The A100's 8x16x8 int8 tile: the .hp example's FP16 output is fp16(fp16(A x B^T) x scale), so the base
    vmadot on its A and B must reproduce every printed value through that formula."""
    c = spec_result(results, SPEC_HP_DOT)
    scaled = (c.astype(np.float16) * SPEC_547_SCALE).astype(np.float16)
    np.testing.assert_array_equal(scaled.astype(np.float64), SPEC_547_C)


def test_hp_forms_match_the_numpy_model(exe):
    """Every .hp signedness x data type, every imm3, both scale registers, the four-instruction chain, in every
    build: bit for bit against hp_model (three roundings per instruction). The data must reach ties at each
    step, overflow, subnormal results and NaN, or the comparison would say little about them."""
    rng = np.random.default_rng(5407)
    recs = [r for hv in HP_VARIANTS[:-1] for r in hp_records(rng, VARIANTS.index(hv))]
    got, count = parse_results(run(exe, ["run"], input=encode_records(recs), timeout=120).stdout)
    assert count == sum(len(VARIANTS[r[0]].ops) for r in recs), "every .hp word must go through the emulator"
    totals = dict.fromkeys(EVENTS, 0)
    for (v, c, a, b, sc), row in zip(recs, got):
        hv = VARIANTS[v]
        c16 = c.view(np.uint8)[:VLENB].view(np.float16)
        vd, scale_reg = hp_result(row)
        assert_fp16_equal(vd, hp_model(c16, a, b, sc, hv.ops), hv.name)
        np.testing.assert_array_equal(scale_reg, sc, err_msg=f"{hv.name}: the scale register changed")
        for k, n in rounding_events(c16, a, b, sc, hv.ops).items():
            totals[k] += n
    assert all(n >= 5 for n in totals.values()), totals


def test_hp_variants_cover_every_form():
    ops = [op for hv in HP_FORM_VARIANTS for op in hv.ops]
    assert {(op.sign, op.dtype) for op in ops} == set(itertools.product(SIGNS, ("i8", "i4")))
    assert {op.imm3 for op in ops} == set(range(8))
    assert {hv.scale for hv in HP_FORM_VARIANTS} == {0, 1} and {hv.sew for hv in HP_FORM_VARIANTS} == {8, 16, 32}
    assert any(hv.vd % 2 for hv in HP_FORM_VARIANTS)


def test_hp_model_rounds_each_step():
    """The model itself: the steps round separately, to nearest even. tmp = 2049 converts to 2048 (a tie, even
    wins); 3 x (1 + 2^-10) = 3 + 3 * 2^-10 lies halfway in [2, 4) and rounds up to the even 3 + 2^-8. With
    C = 1024, tmp = 3 and scale 1.8330078125 the product 5.4990234375 rounds to 5.5, and 1029.5 to the even
    1030; a fused multiply-add (one rounding of 1029.499...) would give 1029."""
    def one_cell(c0, tmp, scale):
        a = np.zeros(256, np.uint8)
        b = np.zeros(128, np.uint8)
        a[0], a[1], b[0], b[1] = 255, tmp - 255 * (tmp // 255), tmp // 255, 1  # uu: 255 * q + r = tmp
        s = fp16_bytes([scale] + [0] * 63)
        return hp_model(np.full(64, c0, np.float16), a, b, s, (HpOp("uu", "i8", 0),))[0]

    assert one_cell(0, 2049, 1.0) == 2048 and one_cell(0, 2051, 1.0) == 2052
    assert one_cell(0, 3, 1 + 2.0**-10) == 3 + 2.0**-8
    assert one_cell(1024.0, 3, 1.8330078125) == 1030


def test_spec_example_5_4_7(clang_exe):
    """smt.vmadot.hp v16, v2, v8, v0, 0, i8 as the spec runs it: all 64 printed FP16 values."""
    got, count = parse_results(run(clang_exe, ["run"], input=encode_records([SPEC_547_RECORD])).stdout)
    assert count == 1
    vd, _ = hp_result(got[0])
    np.testing.assert_array_equal(vd.view(np.float16).astype(np.float64), np.array(SPEC_547_C).reshape(64))


def test_vl_vtype_preserved(exe):
    vl0, vt0, vl1, vt1, count = map(int, run(exe, ["vtype"]).stdout.split())
    assert (vl0, vt0) == (64, 0x48)  # vl 64 = VLMAX at e16, m1, ta, mu
    assert (vl1, vt1) == (vl0, vt0)
    assert count == 1


@pytest.mark.parametrize("vlen", [256, 512])
def test_refuses_wrong_vlen(clang_exe, vlen):
    with pytest.raises(toolchain.ToolchainError) as ei:
        toolchain.run(clang_exe, ["vtype"], vlen=vlen)
    assert ei.value.returncode == 3
    assert "IME2 requires VLEN=1024" in ei.value.stderr


@pytest.mark.parametrize("k, probe", list(enumerate(PROBES)), ids=[p.name for p in PROBES])
def test_probe(clang_exe, k, probe):
    """A legal vmadot survives; every other word, and a legal one under a vtype IME2 refuses, dies by SIGILL
    after the emulator says why."""
    if probe.refusal is None:
        assert run(clang_exe, ["probe", str(k)]).stdout.split() == [b"survived", b"1"]
        return
    with pytest.raises(toolchain.ToolchainError) as ei:
        run(clang_exe, ["probe", str(k)])
    assert ei.value.returncode == -signal.SIGILL, ei.value
    if probe.refusal:
        assert f"illegal instruction 0x{probe.word:08x}" in ei.value.stderr
        assert probe.refusal in ei.value.stderr
