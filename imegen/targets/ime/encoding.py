"""Binary encoding of the SpacemiT K1 IME instructions (XSMTVDot: vmadot / vmadot1..3).

Stock assemblers do not know these instructions, so generated code emits them as `.word`.
Closed form (docs/ime-isa.md §3, checked against LLVM's MC tests):

    base   : 0xE200002B | vs2<<20 | vs1<<15 |            sg<<12 | vd<<7
    slide N: 0xE600002B | vs2<<20 | vs1<<15 | (N-1)<<14 | sg<<12 | vd<<7   (vs1 even)

For slide 3, (N-1)<<14 sets bit 15, which is vs1's bit 0; that is why vs1 must be even there.
"""

from __future__ import annotations

OPCODE_CUSTOM1 = 0x2B
FUNCT7_BASE = 0b1110001
FUNCT7_SLIDE = 0b1110011

# sg field; key = (A = vs1, B = vs2) signedness.
SIGN_CODE = {"uu": 0, "us": 1, "su": 2, "ss": 3}
_SIGN_NAME = {v: k for k, v in SIGN_CODE.items()}
# LLVM mnemonic suffix: signed x signed has none.
_SIGN_SUFFIX = {"ss": "", "uu": "u", "us": "us", "su": "su"}


def mnemonic(signedness: str, slide: int) -> str:
    """LLVM spelling without the "smt." prefix, e.g. ("su", 1) -> "vmadot1su"."""
    _check_variant(signedness, slide)
    return "vmadot" + (str(slide) if slide else "") + _SIGN_SUFFIX[signedness]


def _check_variant(signedness: str, slide: int) -> None:
    if signedness not in SIGN_CODE:
        raise ValueError(f"signedness must be one of {sorted(SIGN_CODE)}, got {signedness!r}")
    if slide not in (0, 1, 2, 3):
        raise ValueError(f"slide must be 0..3, got {slide!r}")


def _check_registers(vd: int, vs1: int, vs2: int, slide: int) -> None:
    for name, r in (("vd", vd), ("vs1", vs1), ("vs2", vs2)):
        if not isinstance(r, int) or not 0 <= r <= 31:
            raise ValueError(f"{name} must be a vector register number 0..31, got {r!r}")
    if vd % 2:
        raise ValueError(f"vd must be even (the int32 result occupies v{vd}, v{vd}+1), got v{vd}")
    dest = {vd, vd + 1}
    if slide:
        if vs1 % 2:
            raise ValueError(f"slide forms read A from the pair {{vs1, vs1+1}}: vs1 must be even, got v{vs1}")
        if dest & {vs1, vs1 + 1}:
            raise ValueError(f"destination group v{vd}-v{vd + 1} overlaps the A pair v{vs1}-v{vs1 + 1}")
    elif vs1 in dest:
        raise ValueError(f"destination group v{vd}-v{vd + 1} overlaps vs1 = v{vs1}")
    if vs2 in dest:
        raise ValueError(f"destination group v{vd}-v{vd + 1} overlaps vs2 = v{vs2}")


def encode_vmadot(vd: int, vs1: int, vs2: int, *, signedness: str = "ss", slide: int = 0) -> int:
    """32-bit instruction word for `vmadot{slide}{sign} vd, vs1, vs2`; ValueError if illegal."""
    _check_variant(signedness, slide)
    _check_registers(vd, vs1, vs2, slide)
    funct7 = FUNCT7_SLIDE if slide else FUNCT7_BASE
    word = funct7 << 25 | vs2 << 20 | vs1 << 15 | SIGN_CODE[signedness] << 12 | vd << 7 | OPCODE_CUSTOM1
    if slide:
        word |= (slide - 1) << 14
    return word


def decode_vmadot(word: int) -> dict:
    """Inverse of encode_vmadot: {"vd", "vs1", "vs2", "signedness", "slide", "mnemonic"}.

    Raises ValueError if `word` is not a K1 vmadot encoding (including reserved field values).
    """
    if not 0 <= word <= 0xFFFFFFFF:
        raise ValueError(f"not a 32-bit word: {word!r}")
    funct7 = word >> 25
    if word & 0x7F != OPCODE_CUSTOM1 or funct7 not in (FUNCT7_BASE, FUNCT7_SLIDE):
        raise ValueError(f"0x{word:08x} is not a vmadot word (opcode/funct7 mismatch)")
    if word >> 7 & 1:
        raise ValueError(f"0x{word:08x}: vd field must be even")
    vd = word >> 7 & 0x1F
    vs2 = word >> 20 & 0x1F
    signedness = _SIGN_NAME[word >> 12 & 3]
    if funct7 == FUNCT7_BASE:
        if word >> 14 & 1:
            raise ValueError(f"0x{word:08x}: bit 14 is reserved (must be 0) in the base form")
        vs1, slide = word >> 15 & 0x1F, 0
    else:
        funct2 = word >> 14 & 3
        if funct2 == 3:
            raise ValueError(f"0x{word:08x}: slide field 0b11 is reserved")
        vs1, slide = (word >> 16 & 0xF) << 1, funct2 + 1
    return {"vd": vd, "vs1": vs1, "vs2": vs2, "signedness": signedness, "slide": slide,
            "mnemonic": mnemonic(signedness, slide)}
