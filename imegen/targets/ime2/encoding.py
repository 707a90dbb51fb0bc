"""Binary encoding of SpacemiT IME2's matrix instructions (`XSMTVDotII`, the K3's A100 cores).

Stock assemblers do not know them, so code emits them as `.word`. Every form is custom-1 (0x2B) with
bit 31 set; bits [30:29] give the data type and [28:26] the family (docs/ime2-isa.md §3, from chapter 8
of SpacemiT's "AI Matrix Extension Instruction Set", checked against LLVM's and binutils' test vectors):

    base  vmadot*       : 1 DT 000 1 vs2 vs1          sg    vd[4:1] 0     (DT: 10 i4, 11 i8)
    slide vmadotN*      : 1 11 001 1 vs2 vs1[4:1] N-1 (2 bits, [15:14]) sg[13:12] vd[4:1] 0
    sparse vmadot*.sp   : 1 DT 010 v vs2 vs1[4:1] imm2[1] sg vd[4:1] imm2[0]       (v: mask v0/v1)
    scaled vmadot*.hp   : 1 DT hs  v vs2 vs1 imm3 vd                               (v: scale v0/v1)
    vfwmadot{,1,2,3}    : 1001111 vs2 vs1 1 N (2 bits, [13:12]) vd                 (FP16/BF16 -> FP32)

sg is the K1's signedness code (00 uu, 01 us, 10 su, 11 ss for A = vs1, B = vs2), so the int8 base and
slide words are the K1's. `.hp` moves signedness into the family field (hs: 011 uu, 100 ss, 101 su,
110 us) to free [14:12] for imm3. vfwmadot is the one floating-point form: DT 00 and family 111, no
signedness; its data type (FP16 or BF16) is the control bit MCPM.BF16, not a field of the word.
"""

from __future__ import annotations

OPCODE_CUSTOM1 = 0x2B

DTYPE_CODE = {"i4": 0b10, "i8": 0b11}
_DTYPE_NAME = {v: k for k, v in DTYPE_CODE.items()}

FAMILY_BASE = 0b000
FAMILY_SLIDE = 0b001
FAMILY_SPARSE = 0b010

# key = (A = vs1, B = vs2) signedness, "s" signed, "u" unsigned.
SIGN_CODE = {"uu": 0, "us": 1, "su": 2, "ss": 3}
_SIGN_NAME = {v: k for k, v in SIGN_CODE.items()}
HP_SIGN_FAMILY = {"uu": 0b011, "ss": 0b100, "su": 0b101, "us": 0b110}
_HP_SIGN_NAME = {v: k for k, v in HP_SIGN_FAMILY.items()}
# Mnemonic suffix: signed x signed has none.
_SIGN_SUFFIX = {"ss": "", "uu": "u", "us": "us", "su": "su"}

# Selector ranges (docs/ime2-isa.md §3): imm2 picks a 256-bit (i8) or 512-bit (i4) mask segment of v0/v1,
# imm3 one of eight 128-bit scale groups.
SPARSE_SEGMENTS = {"i8": 4, "i4": 2}
SCALE_GROUPS = 8

# vfwmadot (spec §8.5): [31:25] = 1001111, [14:12] = 1, slide (100 base, 101-111 slide 1-3).
VFWMADOT_FUNCT7 = 0b1001111


def mnemonic(signedness: str, dtype: str = "i8", slide: int = 0, form: str = "base") -> str:
    """The opcode as assemblers spell it (the data type is an operand, not part of it):
    ("su", slide=2) -> "smt.vmadot2su", ("uu", form="hp") -> "smt.vmadotu.hp"."""
    _check_choice("signedness", signedness, SIGN_CODE)
    _check_choice("dtype", dtype, DTYPE_CODE)
    _check_choice("form", form, ("base", "slide", "sp", "hp"))
    head = "smt.vmadot" + (str(slide) if slide else "") + _SIGN_SUFFIX[signedness]
    return head + {"base": "", "slide": "", "sp": ".sp", "hp": ".hp"}[form]


def _check_choice(name: str, value, allowed) -> None:
    if value not in allowed:
        raise ValueError(f"{name} must be one of {sorted(allowed)}, got {value!r}")


def _check_vreg(name: str, r) -> None:
    if not isinstance(r, int) or isinstance(r, bool) or not 0 <= r <= 31:
        raise ValueError(f"{name} must be a vector register number 0..31, got {r!r}")


def _check_even(name: str, r: int, why: str) -> None:
    if r % 2:
        raise ValueError(f"{name} must be even ({why}), got v{r}")


def _check_disjoint(dest: set[int], dest_name: str, sources: dict[str, set[int]]) -> None:
    for name, regs in sources.items():
        if dest & regs:
            raise ValueError(f"destination {dest_name} overlaps {name} "
                             f"(v{', v'.join(map(str, sorted(dest & regs)))})")


def _pair(r: int) -> set[int]:
    return {r, r + 1}


def _pair_name(r: int) -> str:
    return f"v{r}-v{r + 1}"


def _check_tile_operands(vd: int, vs1: int, vs2: int, slide: int, result: str) -> None:
    """The register rules vmadot and vfwmadot share: C in the even pair vd, vd+1; A in vs1 (a slide form: the even
    pair vs1, vs1+1); B in vs2; C overlapping neither."""
    for name, r in (("vd", vd), ("vs1", vs1), ("vs2", vs2)):
        _check_vreg(name, r)
    _check_even("vd", vd, f"the {result} result occupies v{vd}, v{vd}+1")
    a_regs = {vs1}
    if slide:
        _check_even("vs1", vs1, "slide forms read A from the pair vs1, vs1+1")
        a_regs = _pair(vs1)
    _check_disjoint(_pair(vd), _pair_name(vd), {"vs1 (A)": a_regs, "vs2 (B)": {vs2}})


def encode_vmadot(vd: int, vs1: int, vs2: int, *, signedness: str = "ss", dtype: str = "i8",
                  slide: int = 0) -> int:
    """`smt.vmadot{slide}{sign} vd, vs1, vs2, {dtype}`: int32 C[8x8] in vd, vd+1 += A x B^T.

    i8: A 8x16 in vs1 (slide N: rows N..N+7 of the 16x16 pair vs1, vs1+1), B^T 8x16 in vs2.
    i4: A 8x32, B^T 8x32 (packed nibbles, no slide form). ValueError if the spec makes it illegal.
    """
    _check_choice("signedness", signedness, SIGN_CODE)
    _check_choice("dtype", dtype, DTYPE_CODE)
    if slide not in (0, 1, 2, 3):
        raise ValueError(f"slide must be 0..3, got {slide!r}")
    if slide and dtype != "i8":
        raise ValueError(f"the sliding-window forms exist for i8 only, not {dtype}")
    _check_tile_operands(vd, vs1, vs2, slide, "int32")
    family = FAMILY_SLIDE if slide else FAMILY_BASE
    word = (1 << 31 | DTYPE_CODE[dtype] << 29 | family << 26 | 1 << 25 | vs2 << 20 | vs1 << 15
            | SIGN_CODE[signedness] << 12 | vd << 7 | OPCODE_CUSTOM1)
    if slide:
        word |= (slide - 1) << 14  # slide 3 sets bit 15, vs1's bit 0: why vs1 is even there
    return word


def encode_vmadot_sp(vd: int, vs1: int, vs2: int, *, mask: int, imm2: int, signedness: str = "ss",
                     dtype: str = "i8") -> int:
    """`smt.vmadot{sign}.sp vd, vs1, vs2, v{mask}, imm2, {dtype}`: int32 C[8x8] in vd, vd+1 += A x B^T with A
    dense in the pair vs1, vs1+1 (i8 8x32, i4 8x64), B 4:2-compressed in vs2 and its mask nibbles in segment
    imm2 of v{mask} (docs/ime2-isa.md §6.3)."""
    _check_choice("signedness", signedness, SIGN_CODE)
    _check_choice("dtype", dtype, DTYPE_CODE)
    _check_choice("mask", mask, (0, 1))
    if imm2 not in range(SPARSE_SEGMENTS[dtype]):
        raise ValueError(f"imm2 must be 0..{SPARSE_SEGMENTS[dtype] - 1} for {dtype} "
                         f"(a {1024 // SPARSE_SEGMENTS[dtype]}-bit mask segment), got {imm2!r}")
    for name, r in (("vd", vd), ("vs1", vs1), ("vs2", vs2)):
        _check_vreg(name, r)
    _check_even("vd", vd, f"the int32 result occupies v{vd}, v{vd}+1")
    _check_even("vs1", vs1, "the sparse A tile occupies vs1, vs1+1")
    _check_disjoint(_pair(vd), _pair_name(vd),
                    {"vs1 (A)": _pair(vs1), "vs2 (B)": {vs2}, f"the mask register v{mask}": {mask}})
    return (1 << 31 | DTYPE_CODE[dtype] << 29 | FAMILY_SPARSE << 26 | mask << 25 | vs2 << 20
            | vs1 << 15 | (imm2 >> 1) << 15 | SIGN_CODE[signedness] << 12 | vd << 7 | (imm2 & 1) << 7
            | OPCODE_CUSTOM1)


def encode_vmadot_hp(vd: int, vs1: int, vs2: int, *, scale: int, imm3: int, signedness: str = "ss",
                     dtype: str = "i8") -> int:
    """`smt.vmadot{sign}.hp vd, vs1, vs2, v{scale}, imm3, {dtype}`: fp16/bf16 C[8x8] in vd (one register)
    += (A x B^T) x scale group imm3 of v{scale}.

    imegen's emulator runs it with FP16 scales and C (docs/ime2-isa.md §6.2)."""
    _check_choice("signedness", signedness, SIGN_CODE)
    _check_choice("dtype", dtype, DTYPE_CODE)
    _check_choice("scale", scale, (0, 1))
    if imm3 not in range(SCALE_GROUPS):
        raise ValueError(f"imm3 must be 0..{SCALE_GROUPS - 1} (a 128-bit scale group), got {imm3!r}")
    for name, r in (("vd", vd), ("vs1", vs1), ("vs2", vs2)):
        _check_vreg(name, r)
    _check_disjoint({vd}, f"v{vd}", {"vs1 (A)": {vs1}, "vs2 (B)": {vs2}, f"the scale register v{scale}": {scale}})
    return (1 << 31 | DTYPE_CODE[dtype] << 29 | HP_SIGN_FAMILY[signedness] << 26 | scale << 25
            | vs2 << 20 | vs1 << 15 | imm3 << 12 | vd << 7 | OPCODE_CUSTOM1)


def encode_vfwmadot(vd: int, vs1: int, vs2: int, *, slide: int = 0) -> int:
    """`smt.vfwmadot{slide} vd, vs1, vs2`: fp32 C[8x8] in vd, vd+1 += A x B^T, A[8x8] in vs1 (slide N: rows
    N..N+7 of the 16x8 pair vs1, vs1+1) and B^T[8x8] in vs2, FP16 (or BF16 under MCPM.BF16; imegen's emulator
    runs FP16: docs/ime2-isa.md §6.4). ValueError if the spec makes it illegal."""
    if slide not in (0, 1, 2, 3):
        raise ValueError(f"slide must be 0..3, got {slide!r}")
    _check_tile_operands(vd, vs1, vs2, slide, "fp32")
    return (VFWMADOT_FUNCT7 << 25 | vs2 << 20 | vs1 << 15 | (0b100 | slide) << 12 | vd << 7 | OPCODE_CUSTOM1)


def decode(word: int) -> dict:
    """Inverse of the encoders: {"form": "base" | "slide" | "sp" | "hp", "mnemonic", "dtype", "signedness",
    "vd", "vs1", "vs2", ...} plus "slide", or "mask" and "imm2", or "scale" and "imm3"; for vfwmadot
    {"form": "vfwmadot", "mnemonic", "vd", "vs1", "vs2", "slide"} (no data type: MCPM.BF16 holds it).

    Raises ValueError for anything else, reserved field values included. Register constraints are not
    re-checked: a word the encoder would refuse for overlapping registers still decodes."""
    if not isinstance(word, int) or not 0 <= word <= 0xFFFFFFFF:
        raise ValueError(f"not a 32-bit word: {word!r}")
    if word & 0x7F != OPCODE_CUSTOM1 or not word >> 31:
        raise ValueError(f"0x{word:08x} is not an IME2 matrix word (opcode or bit 31)")
    if word >> 25 == VFWMADOT_FUNCT7:
        return _decode_vfwmadot(word)
    dt, family = word >> 29 & 3, word >> 26 & 7
    if dt not in _DTYPE_NAME:
        raise ValueError(f"0x{word:08x}: data type field {dt:02b} is not i4 (10) or i8 (11)")
    fields = {"dtype": _DTYPE_NAME[dt], "vs2": word >> 20 & 31}
    if family in _HP_SIGN_NAME:
        fields.update(form="hp", signedness=_HP_SIGN_NAME[family], scale=word >> 25 & 1,
                      vs1=word >> 15 & 31, imm3=word >> 12 & 7, vd=word >> 7 & 31)
    elif family == FAMILY_SPARSE:
        fields.update(form="sp", signedness=_SIGN_NAME[word >> 12 & 3], mask=word >> 25 & 1,
                      vs1=(word >> 16 & 15) << 1, imm2=(word >> 15 & 1) << 1 | (word >> 7 & 1),
                      vd=(word >> 8 & 15) << 1)
        if word >> 14 & 1:
            raise ValueError(f"0x{word:08x}: bit 14 is reserved (must be 0) in the sparse form")
        if fields["imm2"] >= SPARSE_SEGMENTS[fields["dtype"]]:
            raise ValueError(f"0x{word:08x}: imm2 = {fields['imm2']} is reserved for {fields['dtype']}")
    elif family in (FAMILY_BASE, FAMILY_SLIDE):
        _decode_dense(word, family, fields)
    else:
        raise ValueError(f"0x{word:08x}: family field {family:03b} is reserved")
    fields["mnemonic"] = mnemonic(fields["signedness"], fields["dtype"], fields.get("slide", 0), fields["form"])
    return fields


def _decode_dense(word: int, family: int, fields: dict) -> None:
    if not word >> 25 & 1:
        raise ValueError(f"0x{word:08x}: bit 25 must be 1 in vmadot / vmadotN")
    if word >> 7 & 1:
        raise ValueError(f"0x{word:08x}: vd field must be even")
    fields.update(signedness=_SIGN_NAME[word >> 12 & 3], vd=word >> 7 & 31)
    if family == FAMILY_BASE:
        if word >> 14 & 1:
            raise ValueError(f"0x{word:08x}: bit 14 is reserved (must be 0) in the base form")
        fields.update(form="base", vs1=word >> 15 & 31, slide=0)
        return
    if fields["dtype"] != "i8":
        raise ValueError(f"0x{word:08x}: the sliding-window forms are reserved for {fields['dtype']}")
    slide_code = word >> 14 & 3
    if slide_code == 3:
        raise ValueError(f"0x{word:08x}: slide field 0b11 is reserved")
    fields.update(form="slide", vs1=(word >> 16 & 15) << 1, slide=slide_code + 1)


def _decode_vfwmadot(word: int) -> dict:
    funct3 = word >> 12 & 7
    if not funct3 & 0b100:
        raise ValueError(f"0x{word:08x}: vfwmadot field [14:12] = {funct3:03b} is reserved (100 to 111)")
    slide, vd, vs1 = funct3 & 3, word >> 7 & 31, word >> 15 & 31
    if vd % 2:
        raise ValueError(f"0x{word:08x}: vd field must be even in vfwmadot")
    if slide and vs1 % 2:
        raise ValueError(f"0x{word:08x}: vs1 field must be even in vfwmadot{slide}")
    return {"form": "vfwmadot", "mnemonic": "smt.vfwmadot" + (str(slide) if slide else ""), "vd": vd, "vs1": vs1,
            "vs2": word >> 20 & 31, "slide": slide}
