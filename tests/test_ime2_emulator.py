"""The SIGILL IME2 emulator (imegen/runtime/ime2_emu.c) against an independent NumPy model of the spec's
semantics and against the spec's own usage examples, under QEMU at VLEN 1024.
The block-scaled `.hp` forms are modelled with np.float16 arithmetic, one operation at a time (§6.2), the 4:2 sparse
`.sp` forms as B recovered by the mask and a dense product (§6.3), vfwmadot in np.float32, one rounded sum per
product in the spec's order (§6.4); the last section rebuilds the emulator with other readings and checks that
these tests catch each.

The driver tests/c/ime2_emu_test.c executes the real `.word` encodings from imegen.targets.ime2.encoding;
this file generates the asm for them (ime2_variants.h) and the input records. docs/ime2-isa.md §2 (semantics),
§5 (vtype), §7 (the spec's usage examples).
"""

from __future__ import annotations

import itertools
import os
import signal
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from imegen import toolchain
from imegen.perf.baselines.llama_cpp.ime2 import encode_pack, encode_vnpack4
from imegen.targets.ime2.encoding import encode_vfwmadot, encode_vmadot, encode_vmadot_hp, encode_vmadot_sp, mnemonic

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


@dataclass(frozen=True)
class SpOp:
    """One vmadot*.sp: signedness (A = vs1, B = vs2), data type and the mask segment imm2."""
    sign: str
    dtype: str
    imm2: int

    @property
    def name(self) -> str:
        return f"{mnemonic(self.sign, self.dtype, form='sp')} imm2={self.imm2} ({self.dtype})"


@dataclass(frozen=True)
class SpVariant:
    """vmadot*.sp into vd, vd+1 (int32) from A in vs1, vs1+1 (the record's a), B in vs2 (b) and the mask in
    v{mask} (the record's s)."""
    name: str
    vd: int
    vs1: int
    vs2: int
    mask: int
    sew: int
    ops: tuple[SpOp, ...]

    @property
    def a_regs(self) -> list[int]:
        return [self.vs1, self.vs1 + 1]

    def words(self) -> list[int]:
        return [encode_vmadot_sp(self.vd, self.vs1, self.vs2, mask=self.mask, imm2=op.imm2, signedness=op.sign,
                                 dtype=op.dtype) for op in self.ops]


# Every signedness x data type, every imm2 (i8 0-3, i4 0-1), both mask registers, registers spread over the file,
# SEW 8/16/32; a mask register that is also B (both only read).
SP_REGS = [(16, 2, 8, 0), (4, 10, 13, 1), (30, 28, 27, 1), (18, 20, 22, 0), (24, 26, 3, 1), (6, 12, 15, 0),
           (12, 14, 3, 1), (2, 4, 7, 0)]
SP_OPS = [SpOp(s, "i8", i % 4) for i, s in enumerate(SIGNS)] + [SpOp(s, "i8", (i + 2) % 4) for i, s in enumerate(SIGNS)] \
    + [SpOp(s, "i4", i % 2) for i, s in enumerate(SIGNS)]
SP_FORM_VARIANTS = [SpVariant(op.name, *SP_REGS[i % len(SP_REGS)], (8, 16, 32)[i % 3], (op,))
                    for i, op in enumerate(SP_OPS)]
SP_SHARED = SpVariant("sp, mask register is B", 10, 12, 1, 1, 8, (SpOp("su", "i8", 3),))
SP_CHAIN = SpVariant("sp chain", 20, 2, 9, 0, 16, (SpOp("ss", "i8", 0), SpOp("uu", "i4", 1), SpOp("us", "i8", 2)))
# Spec §5.3.7 with its own registers and vtype: smt.vmadot.sp v16, v2, v8, v0, 0, i8 under e8.
SPEC_SP = SpVariant("spec 5.3.7", 16, 2, 8, 0, 8, (SpOp("ss", "i8", 0),))
SP_VARIANTS = SP_FORM_VARIANTS + [SP_SHARED, SP_CHAIN, SPEC_SP]


@dataclass(frozen=True)
class FwVariant:
    """vfwmadot (slide 0) and vfwmadot1/2/3 into vd, vd+1 (64 fp32) from FP16 A in vs1 (slides: vs1, vs1+1) and
    B^T in vs2, one word per entry of `slides`."""
    name: str
    vd: int
    vs1: int
    vs2: int
    sew: int
    ops: tuple[int, ...]  # the slides, in order

    @property
    def a_regs(self) -> list[int]:
        return [self.vs1, self.vs1 + 1] if any(self.ops) else [self.vs1]

    def words(self) -> list[int]:
        return [encode_vfwmadot(self.vd, self.vs1, self.vs2, slide=s) for s in self.ops]


FW_FORM_VARIANTS = [FwVariant("vfwmadot", 16, 2, 8, 16, (0,)), FwVariant("vfwmadot1", 0, 30, 29, 8, (1,)),
                    FwVariant("vfwmadot2", 26, 4, 6, 32, (2,)), FwVariant("vfwmadot3", 8, 10, 7, 16, (3,)),
                    FwVariant("vfwmadot, vs1 = vs2", 12, 5, 5, 16, (0,)),
                    FwVariant("vfwmadot x2, vfwmadot3 into one C", 22, 18, 1, 16, (0, 3, 0))]
# Spec §6.1.7 and §6.2.7 with their registers and vtype (e16): vfwmadot v16, v2, v8; then vfwmadot,
# vfwmadot1, vfwmadot2 into v16 from v0 (v0, v1) and v8, each printed output.
SPEC_FW = FwVariant("spec 6.1.7", 16, 2, 8, 16, (0,))
SPEC_FW_SLIDES = [FwVariant(f"spec 6.2.7, {n + 1} instructions", 16, 0, 8, 16, tuple(range(n + 1))) for n in range(3)]
FW_VARIANTS = FW_FORM_VARIANTS + [SPEC_FW] + SPEC_FW_SLIDES
VARIANTS = FORM_VARIANTS + SPEC_VARIANTS + PACK_VARIANTS + HP_VARIANTS + NPACK4_VARIANTS + SP_VARIANTS + FW_VARIANTS


def register_moves(v) -> tuple[list[tuple[int, str]], list[tuple[int, str]]]:
    """(loads, stores) of a variant as (register, asm operand). .hp: C is vd alone, the scales come from s, and
    the scale register is stored back (it must come out unchanged)."""
    if isinstance(v, HpVariant):
        return [(v.vd, "c0"), (v.vs1, "a0"), (v.vs2, "b"), (v.scale, "s")], [(v.vd, "o0"), (v.scale, "o1")]
    if isinstance(v, Npack4Variant):
        return [(v.vd, "c0"), (v.vs1, "a0"), (v.vs2, "b")], [(v.vd, "o0"), (v.vs1, "o1")]
    if isinstance(v, SpVariant):  # the mask last: it may also be B
        return ([(v.vd, "c0"), (v.vd + 1, "c1"), (v.vs1, "a0"), (v.vs1 + 1, "a1"), (v.vs2, "b"), (v.mask, "s")],
                [(v.vd, "o0"), (v.vd + 1, "o1")])
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
SP_VALID = encode_vmadot_sp(16, 2, 24, mask=1, imm2=2)  # vd = v16, A in v2, v3, B in v24, mask v1
SP_SEGMENT = "imm2 of vmadot*.sp i4 selects a mask segment beyond v0/v1"
SP_OVERLAP = "the destination pair vd, vd+1 of vmadot*.sp overlaps a source register"
FW_VALID = encode_vfwmadot(8, 16, 24)
FW_VALID_SLIDE = encode_vfwmadot(8, 16, 24, slide=3)
FW_OVERLAP = "the destination pair vd, vd+1 of vfwmadot overlaps a source register"


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
    # vmadot*.sp (spec §5.3.5, §8.3): the assemblers' words run; LMUL != 1, vl < VLMAX, an i4 imm2 beyond the
    # mask register, the pair vd, vd+1 on vs1, vs1+1, vs2 or the mask register are refused; [14] is reserved.
    Probe("sp_llvm_i4", 0xC88138AB, "e8, m1, ta, ma", None),  # smt.vmadot.sp v16, v2, v8, v0, 1, i4 (LLVM MC)
    Probe("sp_llvm_v1", 0xEA81B82B, "e16, m1, ta, ma", None),  # smt.vmadot.sp v16, v2, v8, v1, 2, i8 (LLVM MC)
    Probe("sp_binutils_imm3", 0xE85281AB, "e32, m1, ta, ma", None),  # smt.vmadotu.sp v2,v4,v5,v0,3 (binutils)
    Probe("sp_m2", 0xE88138AB, "e8, m2, ta, ma", BAD_VTYPE),
    Probe("sp_e64", 0xE88138AB, "e64, m1, ta, ma", BAD_VTYPE),
    Probe("sp_vl16", 0xE88138AB, "e8, m1, ta, ma", BAD_VTYPE, avl=16),
    Probe("sp_i4_imm2_2", with_field(0xC88138AB, 15, 1, 1) & ~(1 << 7), "e8, m1, ta, ma", SP_SEGMENT),
    Probe("sp_i4_imm2_3", with_field(0xC88138AB, 15, 1, 1), "e8, m1, ta, ma", SP_SEGMENT),
    # Both pairs start even, so the pair vs1, vs1+1 meets vd, vd+1 only as vs1 = vd.
    Probe("sp_vs1_pair_is_vd", with_field(SP_VALID, 16, 4, 8), "e8, m1, ta, ma", SP_OVERLAP),  # vs1 = vd = v16
    Probe("sp_pairs_adjacent", with_field(SP_VALID, 16, 4, 7), "e8, m1, ta, ma", None),  # vs1 = v14: legal
    Probe("sp_vs2_is_vd", with_field(SP_VALID, 20, 5, 16), "e8, m1, ta, ma", SP_OVERLAP),
    Probe("sp_vs2_is_vd_plus_1", with_field(SP_VALID, 20, 5, 17), "e8, m1, ta, ma", SP_OVERLAP),
    Probe("sp_mask_v1_is_vd_plus_1", with_field(SP_VALID, 8, 4, 0), "e8, m1, ta, ma", SP_OVERLAP),  # vd = v0
    Probe("sp_mask_v0_is_vd", with_field(with_field(SP_VALID, 8, 4, 0), 25, 1, 0), "e8, m1, ta, ma", SP_OVERLAP),
    Probe("sp_bit14_reserved", SP_VALID | 1 << 14, "e8, m1, ta, ma", NOT_RUN),
    Probe("sp_dtype_00", with_field(SP_VALID, 29, 2, 0b00), "e8, m1, ta, ma", NOT_RUN),
    # vfwmadot (spec §6.1.5, §6.2.4, §8.5): the assemblers' words run (gas's v2, v3, v4 is illegal: v3 is vd+1);
    # LMUL != 1, vl < VLMAX, odd vd, odd vs1 in a slide form, the pair vd, vd+1 on a source are refused;
    # [14:12] 0xx is reserved.
    Probe("vfwmadot_llvm", 0x9E62412B, "e16, m1, ta, ma", None),  # smt.vfwmadot v2, v4, v6 (LLVM MC test)
    Probe("vfwmadot1_llvm", 0x9E62512B, "e8, m1, ta, ma", None),  # smt.vfwmadot1 v2, v4, v6 (LLVM MC test)
    Probe("vfwmadot2_binutils", 0x9E52612B, "e32, m1, ta, ma", None),  # smt.vfwmadot2 v2, v4, v5 (binutils)
    Probe("vfwmadot3_binutils", 0x9E52712B, "e16, m1, ta, ma", None),  # smt.vfwmadot3 v2, v4, v5 (binutils)
    Probe("vfwmadot_binutils_vs1_is_vd_plus_1", 0x9E41C12B, "e16, m1, ta, ma", FW_OVERLAP),  # v2, v3, v4
    Probe("vfwmadot_m2", FW_VALID, "e16, m2, ta, ma", BAD_VTYPE),
    Probe("vfwmadot_mf2", FW_VALID, "e16, mf2, ta, ma", BAD_VTYPE),
    Probe("vfwmadot_e64", FW_VALID, "e64, m1, ta, ma", BAD_VTYPE),
    Probe("vfwmadot_vl32", FW_VALID, "e16, m1, ta, ma", BAD_VTYPE, avl=32),
    Probe("vfwmadot_odd_vd", FW_VALID | 1 << 7, "e16, m1, ta, ma", "vd of vfwmadot must be even"),
    Probe("vfwmadot3_odd_vd", FW_VALID_SLIDE | 1 << 7, "e16, m1, ta, ma", "vd of vfwmadot must be even"),
    Probe("vfwmadot1_odd_vs1", with_field(FW_VALID_SLIDE, 15, 5, 17), "e16, m1, ta, ma",
          "vs1 of vfwmadot1/2/3 must be even"),
    Probe("vfwmadot_vs1_is_vd", with_field(FW_VALID, 15, 5, 8), "e16, m1, ta, ma", FW_OVERLAP),
    Probe("vfwmadot_vs1_is_vd_plus_1", with_field(FW_VALID, 15, 5, 9), "e16, m1, ta, ma", FW_OVERLAP),
    Probe("vfwmadot_vs2_is_vd", with_field(FW_VALID, 20, 5, 8), "e16, m1, ta, ma", FW_OVERLAP),
    Probe("vfwmadot_vs2_is_vd_plus_1", with_field(FW_VALID, 20, 5, 9), "e16, m1, ta, ma", FW_OVERLAP),
    Probe("vfwmadot3_vs1_pair_is_vd", with_field(FW_VALID_SLIDE, 15, 5, 8), "e16, m1, ta, ma", FW_OVERLAP),
    Probe("vfwmadot3_pairs_adjacent", with_field(FW_VALID_SLIDE, 15, 5, 6), "e16, m1, ta, ma", None),  # v6, v7
    Probe("vfwmadot_funct3_000_reserved", with_field(FW_VALID, 12, 3, 0b000), "e16, m1, ta, ma", NOT_RUN),
    Probe("vfwmadot_funct3_011_reserved", with_field(FW_VALID, 12, 3, 0b011), "e16, m1, ta, ma", NOT_RUN),
    Probe("vfwmadot_bit25_clear", FW_VALID & ~(1 << 25), "e16, m1, ta, ma", NOT_RUN),
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


# ---------------------------------------------------------------- vmadot*.sp: NumPy model and records (spec §5.3)

# §5.3.4's case table: the two positions (of four) each valid mask nibble selects, bit b = position b. The other
# ten nibbles select nothing (§5.3.3).
SP_PICK_LSB = {0b0011: (0, 1), 0b0101: (0, 2), 0b0110: (1, 2), 0b1001: (0, 3), 0b1010: (1, 3), 0b1100: (2, 3)}


def sp_model(c: np.ndarray, a: np.ndarray, b: np.ndarray, s: np.ndarray, ops, wrap: bool = True) -> np.ndarray:
    """docs/ime2-isa.md §6.3, written as B recovered: A dense 8 x K (K = 32 for i8, 64 for i4) in the 256 bytes of
    vs1, vs1+1; B^T compressed 8 x K/2 in vs2; per column j and group g of four k, mask nibble
    64*imm2 + 8j + g (i4: 128*imm2 + 16j + g) of s, element order of §2.7.2, puts B's two stored values of the
    group at the positions it selects. C += A @ recovered^T, wrapped to int32 after each instruction (wrap=False:
    the exact sum, to see whether it left the int32 range)."""
    c = c.astype(np.int64).reshape(8, 8)
    nibbles = np.stack([s & 15, s >> 4], axis=1).reshape(-1)
    for op in ops:
        k = 32 if op.dtype == "i8" else 64
        groups = k // 4
        A = elements(a, op.dtype, op.sign[0] == "s").reshape(8, k)
        B = elements(b, op.dtype, op.sign[1] == "s").reshape(8, k // 2)
        seg = nibbles[op.imm2 * 8 * groups:(op.imm2 + 1) * 8 * groups].reshape(8, groups)
        recovered = np.zeros((8, k), np.int64)
        for j, g in np.ndindex(8, groups):
            pos = SP_PICK_LSB.get(int(seg[j, g]))
            if pos:
                recovered[j, 4 * g + pos[0]], recovered[j, 4 * g + pos[1]] = B[j, 2 * g], B[j, 2 * g + 1]
        c = c + A @ recovered.T
        c = wrap32(c).astype(np.int64) if wrap else c
    return c.reshape(64)


def sp_records(rng: np.random.Generator, v: int) -> list[tuple]:
    """Random bytes with random masks (mostly invalid nibbles: no contribution), with masks of valid nibbles
    only, extreme bytes with valid masks from both ends of int32 (wrap-around), and all-zero / all-invalid masks."""
    valid = np.array(list(SP_PICK_LSB), np.uint8)

    def valid_mask():
        return valid[rng.integers(0, 6, VLENB)] | valid[rng.integers(0, 6, VLENB)] << 4

    def rand(n):
        return rng.integers(0, 256, n, dtype=np.uint8)

    extremes = np.array(BYTE_EXTREMES, np.uint8)
    recs = [(v, random_c(rng), rand(256), rand(128), rand(128)) for _ in range(4)]
    recs += [(v, random_c(rng), rand(256), rand(128), valid_mask()) for _ in range(8)]
    recs += [(v, np.full(64, c0, np.int32), rng.choice(extremes, 256), rng.choice(extremes, 128), valid_mask())
             for c0 in (INT32_MAX - 5, INT32_MIN + 5, 0)]
    recs += [(v, random_c(rng), rand(256), rand(128), np.full(VLENB, m, np.uint8)) for m in (0x00, 0xFF, 0x77)]
    return recs


def sp_inputs(v: SpVariant, a, b, s):
    """What the registers held: the driver loads B and then the mask, so a mask register that is B holds s."""
    return a, (s if v.vs2 == v.mask else b), s


# Spec §5.3.7 as its program loads it: A (8 x 32, its data: rows 3-7's second halves start at 15 + row), B
# compressed (its data: row 7 holds 0 where its comment shows 10), the 32 mask bytes (4 per column), C printed.
SPEC_537_A = [list(range(r, r + 16)) + list(range(16 + r if r < 3 else 15 + r, (16 + r if r < 3 else 15 + r) + 16))
              for r in range(8)]
SPEC_537_B = [list(range(j, j + 16)) for j in range(7)] + [[7, 8, 9, 0] + list(range(11, 23))]
SPEC_537_MASK = [m for m in (0x99, 0xAA, 0xCC, 0x55, 0x66, 0x33, 0x99, 0xAA) for _ in range(4)]
SPEC_537_C = [[2544, 2856, 3184, 3200, 3528, 3576, 4032, 4322],
              [2664, 2992, 3336, 3368, 3712, 3776, 4248, 4544],
              [2784, 3128, 3488, 3536, 3896, 3976, 4464, 4766],
              [2812, 3164, 3532, 3588, 3956, 4044, 4540, 4840],
              [2932, 3300, 3684, 3756, 4140, 4244, 4756, 5062],
              [3052, 3436, 3836, 3924, 4324, 4444, 4972, 5284],
              [3172, 3572, 3988, 4092, 4508, 4644, 5188, 5506],
              [3292, 3708, 4140, 4260, 4692, 4844, 5404, 5728]]
SPEC_537_RECORD = (VARIANTS.index(SPEC_SP), np.zeros(64, np.int32), np.array(SPEC_537_A, np.int8).view(np.uint8).reshape(-1),
                   np.array(SPEC_537_B, np.int8).view(np.uint8).reshape(-1),
                   np.concatenate([np.array(SPEC_537_MASK, np.uint8), np.zeros(VLENB - 32, np.uint8)]))


# ---------------------------------------------------------------- vfwmadot: NumPy model and records (spec §6)

FP32_CANONICAL_NAN = 0x7FC00000


def fw_products(a: np.ndarray, b: np.ndarray, slide: int) -> np.ndarray:
    """[i, j, q] = A[i][q] * B[j][q] in float32, exact (two FP16 significands: 22 bits). a: the 128 FP16 of vs1,
    vs1+1 (slide n: rows n..n+7 of its 16 rows of 8), b: the 64 FP16 of vs2 (row j = column j of B)."""
    A = a[8 * slide:8 * slide + 64].reshape(8, 8).astype(np.float32)
    B = b.reshape(8, 8).astype(np.float32)
    return A[:, None, :] * B[None, :, :]


def sum_sequential(c, p):  # the spec's pseudocode: vd[p] = vd[p] + product, q = 0..7, each sum rounded to fp32
    for q in range(8):
        c = c + p[:, :, q]
    return c


def sum_reversed(c, p):
    for q in reversed(range(8)):
        c = c + p[:, :, q]
    return c


def sum_pairwise(c, p):
    pairs = [p[:, :, q] + p[:, :, q + 1] for q in range(0, 8, 2)]
    return c + ((pairs[0] + pairs[1]) + (pairs[2] + pairs[3]))


def sum_products_first(c, p):
    t = p[:, :, 0]
    for q in range(1, 8):
        t = t + p[:, :, q]
    return c + t


def sum_wide(c, p):  # a wide (float64) accumulator, one rounding to fp32 at the end
    return (c.astype(np.float64) + p.astype(np.float64).sum(axis=2)).astype(np.float32)


OTHER_ORDERS = {"reversed": sum_reversed, "pairwise": sum_pairwise, "products first": sum_products_first,
                "one rounding (wide accumulator)": sum_wide}


def fw_model(c: np.ndarray, a: np.ndarray, b: np.ndarray, slides, order=sum_sequential) -> np.ndarray:
    """C (64 fp32 as bits) after the vfwmadot / vfwmadotN `slides`, in np.float32 (correctly rounded, gradual
    underflow). c: int32 bit patterns of vd, vd+1; a, b: FP16 arrays."""
    acc = c.astype(np.int32).view(np.float32).reshape(8, 8)
    with np.errstate(all="ignore"):
        for slide in slides:
            acc = order(acc, fw_products(a, b, slide)).astype(np.float32)
    return acc.reshape(64)


def fp32_bits(x: np.ndarray) -> np.ndarray:
    """Bit patterns, NaN as RISC-V's canonical one (the emulator's; NumPy's payloads vary)."""
    x = np.asarray(x, np.float32)
    return np.where(np.isnan(x), np.uint32(FP32_CANONICAL_NAN), x.view(np.uint32)).astype(np.uint32)


FW_EVENTS = ("inexact sum", "tie", "nan from non-nan", "inf result", "subnormal accumulator", "fp16 subnormal input")


def fw_events(c: np.ndarray, a: np.ndarray, b: np.ndarray, slides) -> dict[str, int]:
    """What the data hit, step by step along the spec's order: a sum that rounds, an exact tie (decided in float64
    when TwoSum says float64 holds the sum exactly), NaN made from non-NaNs (inf - inf, inf x 0), infinite
    results, subnormal accumulators going in, FP16 subnormal inputs."""
    ev = dict.fromkeys(FW_EVENTS, 0)
    acc = c.astype(np.int32).view(np.float32).reshape(8, 8)
    with np.errstate(all="ignore"):
        for slide in slides:
            A = a[8 * slide:8 * slide + 64]
            ev["fp16 subnormal input"] += int(((A != 0) & (np.abs(A) < 2.0**-14)).sum() + ((b != 0) & (np.abs(b) < 2.0**-14)).sum())
            prods = fw_products(a, b, slide)
            for q in range(8):
                x, y = acc.astype(np.float64), prods[:, :, q].astype(np.float64)
                ev["subnormal accumulator"] += int(((acc != 0) & (np.abs(acc) < 2.0**-126)).sum())
                new = acc + prods[:, :, q]
                s = x + y
                bb = s - x
                err = (x - (s - bb)) + (y - bb)
                finite = np.isfinite(x) & np.isfinite(y)
                exact64 = finite & (err == 0)
                inexact = finite & ((err != 0) | (new.astype(np.float64) != s))
                ev["inexact sum"] += int(inexact.sum())
                toward = np.nextafter(new, np.where(s > new, np.float32(np.inf), np.float32(-np.inf)))
                gap = np.abs(toward.astype(np.float64) - new.astype(np.float64))
                ev["tie"] += int((exact64 & inexact & (2 * np.abs(s - new.astype(np.float64)) == gap)).sum())
                ev["nan from non-nan"] += int((np.isnan(new) & ~np.isnan(acc) & ~np.isnan(prods[:, :, q])).sum())
                ev["inf result"] += int(np.isinf(new).sum())
                acc = new
    return ev


def f16(x) -> np.ndarray:
    return np.asarray(x, np.float64).astype(np.float16)


def fw_record(v: int, c32, a16, b16) -> tuple:
    """A driver record: c as the fp32 bits of vd, vd+1; a the 128 FP16 of vs1, vs1+1; b the 64 FP16 of vs2."""
    def as_f16(x):
        x = np.asarray(x)
        return x if x.dtype == np.float16 else f16(x)

    c = np.asarray(c32, np.float32).reshape(64).view(np.int32)
    a = np.zeros(128, np.float16)
    a[:as_f16(a16).size] = as_f16(a16).reshape(-1)
    return (v, c, a.view(np.uint8), as_f16(b16).reshape(64).view(np.uint8))


def random_fp16_bits(rng, n) -> np.ndarray:
    return rng.integers(0, 2**16, n, dtype=np.uint16).view(np.float16)


def fw_records(rng: np.random.Generator, v: int) -> list[tuple]:
    """Moderate values (rounding at most sums), random 16/32-bit patterns (every class: subnormal, inf, NaN, -0),
    FP16 subnormals against tiny and subnormal accumulators, large magnitudes (products up to 65504^2, sums of
    mixed signs that round, +-inf, inf x 0), and small integers on accumulators in [2^24, 2^25), where the
    spacing is 2 and odd sums are ties."""
    recs = []
    for _ in range(3):
        recs.append(fw_record(v, rng.normal(0, 100, 64), f16(rng.normal(0, 4, 128)), f16(rng.normal(0, 4, 64))))
        recs.append(fw_record(v, rng.integers(0, 2**32, 64, dtype=np.uint32).view(np.float32),
                              random_fp16_bits(rng, 128), random_fp16_bits(rng, 64)))
        tiny_c = rng.choice(np.array([0.0, -0.0, 1e-40, -3e-39, 2.0**-149, 1e-12, -1e-10], np.float32), 64)
        sub = (rng.integers(0, 2**10, 192, dtype=np.uint16) | rng.integers(0, 2, 192, dtype=np.uint16) << 15)
        sub = np.where(rng.random(192) < 0.25, f16(rng.normal(0, 1e-3, 192)).view(np.uint16), sub).view(np.float16)
        recs.append(fw_record(v, tiny_c, sub[:128], sub[128:]))
        big = f16(rng.choice([-1, 1], 192) * rng.uniform(1000, 65504, 192))
        big[rng.integers(0, 192, 16)] = rng.choice(f16([np.inf, -np.inf, 0.0, -0.0]), 16)
        big_c = rng.choice([-1, 1], 64) * rng.uniform(0, 3e9, 64)
        big_c[rng.integers(0, 64, 8)] = rng.choice([np.inf, -np.inf], 8)
        recs.append(fw_record(v, big_c, big[:128], big[128:]))
        recs.append(fw_record(v, 2.0 * rng.integers(2**23, 2**24, 64), f16(rng.integers(-3, 4, 128)),
                              f16(rng.integers(-3, 4, 64))))
    return recs


# The order the spec's pseudocode gives, made visible (docs/ime2-isa.md §6.4): in cell (0, 0) C = 0 meets the
# products 2^24, 1, 1, 1, 1, 1, 1, -2^24: each 2^24 + 1 is a tie that rounds back to 2^24, so q = 0..7 ends at 0,
# where q = 7..0 ends at 6 (exact all the way) and a single rounding at 6. In cell (1, 1) C = 2^24 meets eight
# products 1: the sequential order leaves 2^24, while summing the products first (pairwise or not) gives 2^24 + 8.
ORDER_A = np.zeros((8, 8))
ORDER_B = np.zeros((8, 8))
ORDER_A[0], ORDER_B[0] = [4096, 1, 1, 1, 1, 1, 1, -4096], [4096, 1, 1, 1, 1, 1, 1, 4096]
ORDER_A[1], ORDER_B[1] = np.ones(8), np.ones(8)
ORDER_C = np.zeros((8, 8))
ORDER_C[1, 1] = 2.0**24

# Spec §6.1.7 and §6.2.7: A = rows r..r+7 (16 rows for the slides), B^T = rows j..j+7; the printed C.
SPEC_FW_A = [[r + k for k in range(8)] for r in range(16)]
SPEC_617_C = [[140, 168, 196, 224, 252, 280, 308, 336], [168, 204, 240, 276, 312, 348, 384, 420],
              [196, 240, 284, 328, 372, 416, 460, 504], [224, 276, 328, 380, 432, 484, 536, 588],
              [252, 312, 372, 432, 492, 552, 612, 672], [280, 348, 416, 484, 552, 620, 688, 756],
              [308, 384, 460, 536, 612, 688, 764, 840], [336, 420, 504, 588, 672, 756, 840, 924]]
SPEC_627_AFTER_SLIDE1 = [[308, 372, 436, 500, 564, 628, 692, 756], [364, 444, 524, 604, 684, 764, 844, 924],
                         [420, 516, 612, 708, 804, 900, 996, 1092], [476, 588, 700, 812, 924, 1036, 1148, 1260],
                         [532, 660, 788, 916, 1044, 1172, 1300, 1428], [588, 732, 876, 1020, 1164, 1308, 1452, 1596],
                         [644, 804, 964, 1124, 1284, 1444, 1604, 1764], [700, 876, 1052, 1228, 1404, 1580, 1756, 1932]]
SPEC_627_AFTER_SLIDE2 = [[504, 612, 720, 828, 936, 1044, 1152, 1260], [588, 720, 852, 984, 1116, 1248, 1380, 1512],
                         [672, 828, 984, 1140, 1296, 1452, 1608, 1764], [756, 936, 1116, 1296, 1476, 1656, 1836, 2016],
                         [840, 1044, 1248, 1452, 1656, 1860, 2064, 2268], [924, 1152, 1380, 1608, 1836, 2064, 2292, 2520],
                         [1008, 1260, 1512, 1764, 2016, 2268, 2520, 2772],
                         [1092, 1368, 1644, 1920, 2196, 2472, 2748, 3024]]
SPEC_FW_PRINTED = {SPEC_FW: SPEC_617_C, SPEC_FW_SLIDES[0]: SPEC_617_C, SPEC_FW_SLIDES[1]: SPEC_627_AFTER_SLIDE1,
                   SPEC_FW_SLIDES[2]: SPEC_627_AFTER_SLIDE2}


def fw_inputs(v: FwVariant, a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The FP16 the registers held: with vs1 = vs2 the driver's load of B wins."""
    a16, b16 = a.view(np.float16), b.view(np.float16)
    if v.vs1 == v.vs2:
        a16 = np.concatenate([b16, a16[64:]])
    return a16, b16


def fw_spec_records() -> list[tuple]:
    return [fw_record(VARIANTS.index(v), np.zeros(64), f16(SPEC_FW_A if any(v.ops) else SPEC_FW_A[:8]),
                      f16(SPEC_FW_A[:8])) for v in SPEC_FW_PRINTED]


def run_records(exe: Path, recs) -> np.ndarray:
    got, count = parse_results(run(exe, ["run"], input=encode_records(recs), timeout=120).stdout)
    assert count == sum(len(VARIANTS[r[0]].ops) for r in recs), "every word must go through the emulator"
    return got.astype(np.int64).astype(np.uint32)  # the driver prints int32


def fw_mismatches(got: np.ndarray, recs) -> list[str]:
    bad = []
    for (v, c, a, b, *_), row in zip(recs, got):
        a16, b16 = fw_inputs(VARIANTS[v], a, b)
        want = fp32_bits(fw_model(c, a16, b16, VARIANTS[v].ops))
        if not np.array_equal(row, want):
            bad.append(f"{VARIANTS[v].name}: {int((row != want).sum())} cells")
    return bad


def sp_mismatches(got: np.ndarray, recs) -> list[str]:
    bad = []
    for (v, c, a, b, s), row in zip(recs, got):
        sv = VARIANTS[v]
        want = sp_model(c, *sp_inputs(sv, a, b, s), sv.ops).astype(np.int32).view(np.uint32)
        if not np.array_equal(row, want):
            bad.append(f"{sv.name}: {int((row != want).sum())} cells")
    return bad


@pytest.fixture(scope="module")
def sp_recs() -> list[tuple]:
    rng = np.random.default_rng(5307)
    return [r for sv in SP_VARIANTS[:-1] for r in sp_records(rng, VARIANTS.index(sv))] + [SPEC_537_RECORD]


@pytest.fixture(scope="module")
def fw_recs() -> list[tuple]:
    rng = np.random.default_rng(6104)
    recs = [r for fv in FW_FORM_VARIANTS for r in fw_records(rng, VARIANTS.index(fv))]
    order = fw_record(VARIANTS.index(FW_FORM_VARIANTS[0]), ORDER_C, f16(ORDER_A), f16(ORDER_B))
    return recs + [order] + fw_spec_records()


def test_sp_forms_match_the_numpy_model(exe, sp_recs):
    """Every .sp signedness x data type, every imm2, both mask registers, a mask register that is also B, a chain
    of three into one C, in every build: against sp_model (B recovered by the mask, then a dense product)."""
    assert sp_mismatches(run_records(exe, sp_recs), sp_recs) == []
    wrapped = {v for v, c, a, b, s in sp_recs if len(VARIANTS[v].ops) == 1 and not np.all(
        np.abs(sp_model(c, *sp_inputs(VARIANTS[v], a, b, s), VARIANTS[v].ops, wrap=False) + 0.5) < 2.0**31)}
    assert wrapped >= {VARIANTS.index(sv) for sv in SP_FORM_VARIANTS}, "each form must include an int32 wrap-around"


def test_sp_variants_cover_every_form():
    ops = [op for sv in SP_FORM_VARIANTS for op in sv.ops]
    assert {(op.sign, op.dtype) for op in ops} == set(itertools.product(SIGNS, ("i8", "i4")))
    assert {op.imm2 for op in ops if op.dtype == "i8"} == set(range(4))
    assert {op.imm2 for op in ops if op.dtype == "i4"} == set(range(2))
    assert {sv.mask for sv in SP_FORM_VARIANTS} == {0, 1} and {sv.sew for sv in SP_FORM_VARIANTS} == {8, 16, 32}


def test_spec_example_5_3_7(clang_exe):
    """smt.vmadot.sp v16, v2, v8, v0, 0, i8 as the spec runs it: all 64 printed values."""
    got = run_records(clang_exe, [SPEC_537_RECORD])
    np.testing.assert_array_equal(got[0].astype(np.uint32).view(np.int32).reshape(8, 8), SPEC_537_C)


def test_sp_model_reads_the_spec_example():
    """The model alone reproduces §5.3.7's printed C, and the readings it rejects do not (docs/ime2-isa.md §6.3):
    the mask bits taken most significant first, as the example's comment draws the recovered B, match only 24 of
    the 64 cells; B as the example's comment draws it (10 where the program's data hold 0) misses too."""
    v, c, a, b, s = SPEC_537_RECORD
    op = (SpOp("ss", "i8", 0),)
    np.testing.assert_array_equal(sp_model(c, a, b, s, op).reshape(8, 8), SPEC_537_C)
    msb = {sum(1 << (3 - p) for p in pos): pos for pos in SP_PICK_LSB.values()}
    saved = dict(SP_PICK_LSB)
    try:
        SP_PICK_LSB.clear()
        SP_PICK_LSB.update(msb)
        assert (sp_model(c, a, b, s, op).reshape(8, 8) == SPEC_537_C).sum() == 24
    finally:
        SP_PICK_LSB.clear()
        SP_PICK_LSB.update(saved)
    comment_b = np.array(SPEC_537_B, np.int8)
    comment_b[7, 3] = 10
    assert not np.array_equal(sp_model(c, a, comment_b.view(np.uint8).reshape(-1), s, op).reshape(8, 8), SPEC_537_C)


def test_vfwmadot_matches_the_numpy_model(exe, fw_recs):
    """vfwmadot and vfwmadot1/2/3, under e8/e16/e32, vs1 = vs2, three into one C, in every build: bit for bit
    against fw_model (the spec's order, one fp32 rounding per product; NaN canonical, the sign of zero compared).
    The data must reach rounding sums, ties, NaN from non-NaNs, infinities, subnormal accumulators and FP16
    subnormal inputs, or the comparison would say little about them."""
    assert fw_mismatches(run_records(exe, fw_recs), fw_recs) == []
    totals = dict.fromkeys(FW_EVENTS, 0)
    for v, c, a, b, *_ in fw_recs:
        for k, n in fw_events(c, *fw_inputs(VARIANTS[v], a, b), VARIANTS[v].ops).items():
            totals[k] += n
    assert all(n >= 20 for n in totals.values()), totals


def test_vfwmadot_data_tell_the_summation_orders_apart(fw_recs):
    """Every other order (reversed, pairwise, products first, one rounding) gives other bits than the spec's on
    many cells of the test's data, so test_vfwmadot_matches_the_numpy_model fails for an emulator that used one."""
    for name, order in OTHER_ORDERS.items():
        differ = 0
        for v, c, a, b, *_ in fw_recs:
            a16, b16 = fw_inputs(VARIANTS[v], a, b)
            ops = VARIANTS[v].ops
            differ += int((fp32_bits(fw_model(c, a16, b16, ops, order)) != fp32_bits(fw_model(c, a16, b16, ops))).sum())
        assert differ >= 50, f"{name}: only {differ} cells differ"


def test_vfwmadot_follows_the_spec_order(clang_exe, fw_recs):
    """The constructed cells, worked by hand (ORDER_A): q = 0..7 with a rounded fp32 sum at each step gives 0 and
    2^24; the other orders give 6 (reversed, one rounding), 5 (pairwise) and 2^24 + 8 (products first)."""
    rec = fw_recs[-1 - len(SPEC_FW_PRINTED)]
    got = run_records(clang_exe, [rec])[0].view(np.float32).reshape(8, 8)
    assert got[0, 0] == 0 and got[1, 1] == 2.0**24
    others = {name: fw_model(rec[1], rec[2].view(np.float16), rec[3].view(np.float16), (0,), order).reshape(8, 8)
              for name, order in OTHER_ORDERS.items()}
    assert [(o[0, 0], o[1, 1]) for o in others.values()] == [(6, 2**24), (5, 2**24 + 8), (0, 2**24 + 8), (6, 2**24 + 8)]


def test_vfwmadot_model_on_hand_worked_cells():
    """The model alone: FP16 subnormal x subnormal (2^-24 x 2^-24 = 2^-48) is kept, not flushed; 65504^2 is exact;
    inf x 0 is NaN; -0 + (-0 x 1) stays -0 while +0 + (-0) is +0; an fp32 subnormal accumulator is kept."""
    def cell(c0, a_row, b_row):
        a = np.zeros(128, np.float16)
        b = np.zeros(64, np.float16)
        a[:8], b[:8] = f16(a_row), f16(b_row)
        return fp32_bits(fw_model(np.full(64, np.float32(c0)).view(np.int32), a, b, (0,)))[0]

    assert cell(0, [2.0**-24] + [0] * 7, [2.0**-24] + [0] * 7) == np.float32(2.0**-48).view(np.uint32)
    assert cell(0, [65504] + [0] * 7, [65504] + [0] * 7) == np.float32(65504.0**2).view(np.uint32)
    assert cell(0, [np.inf] + [0] * 7, [0] * 8) == FP32_CANONICAL_NAN
    assert cell(-0.0, [-0.0] * 8, [1] * 8) == 0x80000000 and cell(0.0, [-0.0] * 8, [1] * 8) == 0
    assert cell(2.0**-140, [0] * 8, [0] * 8) == np.float32(2.0**-140).view(np.uint32)


@pytest.mark.parametrize("variant", list(SPEC_FW_PRINTED), ids=[v.name for v in SPEC_FW_PRINTED])
def test_spec_examples_6_1_7_and_6_2_7(clang_exe, fw_recs, variant):
    """vfwmadot v16, v2, v8 (§6.1.7) and vfwmadot, vfwmadot1, vfwmadot2 into v16 from v0, v1 and v8 (§6.2.7),
    under e16: every printed value, after each instruction."""
    rec = next(r for r in fw_recs[-len(SPEC_FW_PRINTED):] if r[0] == VARIANTS.index(variant))
    got = run_records(clang_exe, [rec])[0].view(np.float32).reshape(8, 8)
    np.testing.assert_array_equal(got, np.array(SPEC_FW_PRINTED[variant], np.float32))


def test_vfwmadot_variants_cover_every_form():
    assert {s for fv in FW_FORM_VARIANTS for s in fv.ops} == {0, 1, 2, 3}
    assert {fv.sew for fv in FW_FORM_VARIANTS} == {8, 16, 32}


@pytest.mark.parametrize("probe_name", ["vfwmadot_llvm", "sp_llvm_i4"])
def test_new_forms_run_only_on_named_harts(clang_exe, monkeypatch, probe_name):
    """IMEGEN_IME_HARTS holds for vfwmadot and .sp as for the other forms: on host CPU 1 with hart 1 named the
    word runs; with only hart 0 named it dies by SIGILL, saying so."""
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs two CPUs: one with IME2, one without")
    k = [p.name for p in PROBES].index(probe_name)
    monkeypatch.setattr(toolchain, "_on_named_ime_harts", lambda ime: ["taskset", "-c", "1"])
    monkeypatch.setenv("IMEGEN_IME_HARTS", "1")
    assert run(clang_exe, ["probe", str(k)]).stdout.split() == [b"survived", b"1"]
    monkeypatch.setenv("IMEGEN_IME_HARTS", "0")
    with pytest.raises(toolchain.ToolchainError) as ei:
        run(clang_exe, ["probe", str(k)])
    assert ei.value.returncode == -signal.SIGILL
    assert "on hart 1, which IMEGEN_IME_HARTS does not name" in ei.value.stderr


# ---------------------------------------------------------------- the tests can fail: other readings built in

FW_ORDER_LINE = "for (unsigned q = 0; q < FW_K; q++) /* the spec's order: one rounded FP32 sum per product */"
FW_SLIDE_LINE = "const uint16_t *a_rows = a + d->slide * FW_K;"
SP_PICK_LINE = "[0x3] = 0x10 | 0, [0x5] = 0x20 | 0, [0x6] = 0x20 | 1, [0x9] = 0x30 | 0, [0xa] = 0x30 | 1, [0xc] = 0x30 | 2,"
SP_MASK_LINE = "unsigned pick = SP_PICK[mask_nibble(mask, segment + j * groups + g)];"
WRONG_EMULATORS = {
    "vfwmadot summed q = 7..0": (FW_ORDER_LINE, "for (unsigned q = FW_K; q-- > 0;)"),
    "vfwmadot slides by elements, not rows": (FW_SLIDE_LINE, "const uint16_t *a_rows = a + d->slide;"),
    "sp mask bits most significant first": (SP_PICK_LINE, "[0x3] = 0x30 | 2, [0x5] = 0x30 | 1, [0x6] = 0x20 | 1, "
                                                          "[0x9] = 0x30 | 0, [0xa] = 0x20 | 0, [0xc] = 0x10 | 0,"),
    "sp mask indexed by A's row": (SP_MASK_LINE, SP_MASK_LINE.replace("j * groups", "i * groups")),
}


@pytest.mark.parametrize("reading", list(WRONG_EMULATORS))
def test_other_readings_fail(tmp_path, gen_dir, fw_recs, sp_recs, reading):
    """runtime/ime2_emu.c rebuilt with another reading of the spec (none of them shipped): the model comparison
    catches each, and the spec's examples catch all but the reversed order (their sums are exact)."""
    line, other = WRONG_EMULATORS[reading]
    text = (toolchain.RUNTIME_DIR / "ime2_emu.c").read_text()
    assert text.count(line) == 1, "ime2_emu.c changed: update WRONG_EMULATORS"
    src = tmp_path / "ime2_emu.c"
    src.write_text(text.replace(line, other))
    obj = toolchain.compile_c([src], tmp_path / "emu.o", compiler="clang", march="rv64gc",
                              include_dirs=[toolchain.RUNTIME_DIR])
    exe = toolchain.compile_c([C_DIR / "ime2_emu_test.c", obj], tmp_path / "wrong", compiler="clang",
                              include_dirs=[gen_dir, toolchain.RUNTIME_DIR])
    if reading.startswith("vfwmadot"):
        bad = fw_mismatches(run_records(exe, fw_recs), fw_recs)
        spec_bad = [b for b in bad if b.startswith("spec")]
    else:
        bad = sp_mismatches(run_records(exe, sp_recs), sp_recs)
        spec_bad = [b for b in bad if b.startswith("spec")]
    assert bad, f"{reading}: nothing caught it"
    assert bool(spec_bad) == (reading != "vfwmadot summed q = 7..0"), spec_bad
