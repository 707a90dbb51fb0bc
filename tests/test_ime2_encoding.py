"""imegen.targets.ime2.encoding against the public assemblers' IME2 test vectors, chapter 8's encoding
tables, the K1 encoder (the int8 words are the K1's) and the register constraints (docs/ime2-isa.md §3, §4)."""

from __future__ import annotations

import itertools
import random
import re
from pathlib import Path

import pytest

from imegen.targets.ime import encoding as k1
from imegen.targets.ime2.encoding import decode, encode_vfwmadot, encode_vmadot, encode_vmadot_hp, encode_vmadot_sp

DOC = (Path(__file__).resolve().parents[1] / "docs" / "ime2-isa.md").read_text()

# llvm/test/MC/RISCV/xsmtvdotii-valid.s (llvm-mc -mcpu=spacemit-a100), integer forms; the data type
# operand defaults to i8.
LLVM_VECTORS = """
smt.vmadot v0, v31, v2, i4                0xc22fb02b
smt.vmadot v0, v31, v2, i8                0xe22fb02b
smt.vmadot v0, v31, v2                    0xe22fb02b
smt.vmadot1 v0, v2, v4, i8                0xe641302b
smt.vmadot.sp v16, v2, v8, v0, 1, i4      0xc88138ab
smt.vmadot.sp v16, v2, v8, v0, 1, i8      0xe88138ab
smt.vmadot.sp v16, v2, v8, v1, 2, i8      0xea81b82b
smt.vmadot.hp v16, v2, v8, v0, 3, i4      0xd081382b
smt.vmadot.hp v16, v2, v8, v0, 2, i8      0xf081282b
smt.vmadot.hp v16, v2, v8, v1, 4, i8      0xf281482b
"""
# binutils gas/testsuite/gas/riscv/x-smt-vdot-ii.d (as -march=rv64gcv_xsmtvdotii), integer forms. gas does
# not check register overlap: its base forms use v2, v3, v4, which the spec forbids (v3 is vd+1).
BINUTILS_VECTORS = """
smt.vmadot v2, v3, v4, i4                 0xc241b12b
smt.vmadotu v2, v3, v4, i4                0xc241812b
smt.vmadotsu v2, v3, v4, i4               0xc241a12b
smt.vmadotus v2, v3, v4, i4               0xc241912b
smt.vmadot v2, v3, v4                     0xe241b12b
smt.vmadotu v2, v3, v4                    0xe241812b
smt.vmadotsu v2, v3, v4                   0xe241a12b
smt.vmadotus v2, v3, v4                   0xe241912b
smt.vmadot1u v2, v4, v5                   0xe652012b
smt.vmadot1 v2, v4, v5                    0xe652312b
smt.vmadot1su v2, v4, v5                  0xe652212b
smt.vmadot1us v2, v4, v5                  0xe652112b
smt.vmadot2u v2, v4, v5                   0xe652412b
smt.vmadot2 v2, v4, v5                    0xe652712b
smt.vmadot2su v2, v4, v5                  0xe652612b
smt.vmadot2us v2, v4, v5                  0xe652512b
smt.vmadot3u v2, v4, v5                   0xe652812b
smt.vmadot3 v2, v4, v5                    0xe652b12b
smt.vmadot3su v2, v4, v5                  0xe652a12b
smt.vmadot3us v2, v4, v5                  0xe652912b
smt.vmadotu.sp v2, v4, v5, v0, 0, i4      0xc852012b
smt.vmadotu.sp v2, v4, v5, v0, 1, i4      0xc85201ab
smt.vmadot.sp v2, v4, v5, v0, 0, i4       0xc852312b
smt.vmadotsu.sp v2, v4, v5, v0, 0, i4     0xc852212b
smt.vmadotus.sp v2, v4, v5, v0, 0, i4     0xc852112b
smt.vmadotu.sp v2, v4, v5, v0, 0          0xe852012b
smt.vmadotu.sp v2, v4, v5, v0, 1          0xe85201ab
smt.vmadot.sp v2, v4, v5, v0, 0           0xe852312b
smt.vmadotsu.sp v2, v4, v5, v0, 0         0xe852212b
smt.vmadotus.sp v2, v4, v5, v0, 0         0xe852112b
smt.vmadotu.sp v2, v4, v5, v0, 2          0xe852812b
smt.vmadotu.sp v2, v4, v5, v0, 3          0xe85281ab
smt.vmadot.sp v2, v4, v5, v0, 2           0xe852b12b
smt.vmadotsu.sp v2, v4, v5, v0, 2         0xe852a12b
smt.vmadotus.sp v2, v4, v5, v0, 2         0xe852912b
smt.vmadotu.sp v2, v4, v5, v1, 2          0xea52812b
smt.vmadot.sp v2, v4, v5, v1, 2           0xea52b12b
smt.vmadotu.hp v2, v3, v4, v0, 0, i4      0xcc41812b
smt.vmadotu.hp v2, v3, v4, v0, 1, i4      0xcc41912b
smt.vmadotu.hp v2, v3, v4, v0, 0          0xec41812b
smt.vmadot.hp v2, v3, v4, v0, 0, i4       0xd041812b
smt.vmadotsu.hp v2, v3, v4, v0, 0, i4     0xd441812b
smt.vmadotus.hp v2, v3, v4, v0, 0, i4     0xd841812b
smt.vmadotu.hp v2, v3, v4, v1, 0, i4      0xce41812b
"""
# The same files' vfwmadot words (FP16/BF16 -> FP32). LLVM's take a format operand (fp16 or bfp16) that does not
# change the word (MCPM.BF16 selects the format); gas's base form uses v2, v3, v4, where v3 is vd+1 (illegal).
VFWMADOT_VECTORS = [
    ("llvm", "smt.vfwmadot v2, v4, v6", 0x9E62412B),
    ("llvm", "smt.vfwmadot1 v2, v4, v6", 0x9E62512B),
    ("binutils", "smt.vfwmadot v2, v3, v4", 0x9E41C12B),
    ("binutils", "smt.vfwmadot1 v2, v4, v5", 0x9E52512B),
    ("binutils", "smt.vfwmadot2 v2, v4, v5", 0x9E52612B),
    ("binutils", "smt.vfwmadot3 v2, v4, v5", 0x9E52712B),
]
VFWMADOT_RE = re.compile(r"smt\.vfwmadot([123]?) v(\d+), v(\d+), v(\d+)")
# The same files' layout words: not matrix forms, so decode refuses them.
NOT_INTEGER_FORMS = {
    "smt.vnpack.vv v1, v3, v5, 1": 0x625190AB, "smt.vnspack4.vv v1, v3, v5, 1": 0x4251D0AB,
    "smt.vpack.vv v2, v4, v5, 1": 0x6652112B, "smt.vupack.vv v2, v4, v5, 1": 0x6652512B,
}

ASM_RE = re.compile(r"smt\.vmadot([123]?)(u|su|us)?(\.sp|\.hp)?\s+v(\d+),\s*v(\d+),\s*v(\d+)"
                    r"(?:,\s*v([01]),\s*(\d))?(?:,\s*(i4|i8))?\s+(0x[0-9a-f]{8})")
SUFFIX_TO_SIGN = {None: "ss", "u": "uu", "su": "su", "us": "us"}
SIGNS = ("ss", "uu", "us", "su")


def parse(vectors: str) -> list[tuple[str, dict, int]]:
    out = []
    for line in vectors.strip().splitlines():
        m = ASM_RE.fullmatch(line.strip())
        assert m, line
        slide, suffix, form, vd, vs1, vs2, v01, imm, dtype, word = m.groups()
        fields = {"form": form[1:] if form else ("slide" if slide else "base"), "signedness": SUFFIX_TO_SIGN[suffix],
                  "dtype": dtype or "i8", "vd": int(vd), "vs1": int(vs1), "vs2": int(vs2)}
        if fields["form"] in ("base", "slide"):
            fields["slide"] = int(slide or 0)
        elif fields["form"] == "sp":
            fields.update(mask=int(v01), imm2=int(imm))
        else:
            fields.update(scale=int(v01), imm3=int(imm))
        out.append((line.rsplit(None, 1)[0].strip(), fields, int(word, 16)))
    return out


VECTORS = parse(LLVM_VECTORS) + parse(BINUTILS_VECTORS)


def legal(f: dict) -> bool:
    """The spec's register constraints (§2.3, §5.1.4, §5.2.4, §5.3.5, §5.4.5), restated apart from the encoder."""
    if f["form"] == "hp":
        return f["vd"] not in (f["vs1"], f["vs2"], f["scale"])
    dest = {f["vd"], f["vd"] + 1}
    a = {f["vs1"], f["vs1"] + 1} if f["form"] == "sp" or f.get("slide") else {f["vs1"]}
    sources = a | {f["vs2"]} | ({f["mask"]} if f["form"] == "sp" else set())
    return f["vd"] % 2 == 0 and not dest & sources


def encode(f: dict) -> int:
    common = dict(signedness=f["signedness"], dtype=f["dtype"])
    if f["form"] == "sp":
        return encode_vmadot_sp(f["vd"], f["vs1"], f["vs2"], mask=f["mask"], imm2=f["imm2"], **common)
    if f["form"] == "hp":
        return encode_vmadot_hp(f["vd"], f["vs1"], f["vs2"], scale=f["scale"], imm3=f["imm3"], **common)
    return encode_vmadot(f["vd"], f["vs1"], f["vs2"], slide=f["slide"], **common)


@pytest.mark.parametrize("asm, fields, word", VECTORS, ids=[f"{v[0]}" for v in VECTORS])
def test_assembler_vector(asm, fields, word):
    got = decode(word)
    assert got.pop("mnemonic") == asm.split()[0]
    assert got == fields
    if legal(fields):
        assert encode(fields) == word
    else:
        with pytest.raises(ValueError, match="overlaps"):
            encode(fields)


def test_vectors_cover_every_integer_mnemonic():
    """All 24 integer mnemonics, and both data types of every form that has two (chapter 8's tables cover
    the rest: test_chapter_8_tables)."""
    mnemonics = {asm.split()[0] for asm, _, _ in VECTORS}
    suffixes = ("", "u", "su", "us")
    want = {f"smt.vmadot{x}{form}" for x in suffixes for form in ("", ".sp", ".hp")}
    want |= {f"smt.vmadot{n}{x}" for n in (1, 2, 3) for x in suffixes}
    assert mnemonics == want
    forms = {(f["form"], f["dtype"]) for _, f, _ in VECTORS}
    assert forms == {(form, dt) for form in ("base", "sp", "hp") for dt in ("i4", "i8")} | {("slide", "i8")}


@pytest.mark.parametrize("asm, word", NOT_INTEGER_FORMS.items())
def test_decode_refuses_other_ime2_forms(asm, word):
    with pytest.raises(ValueError):
        decode(word)


def test_doc_lists_every_vector():
    for asm, _, word in VECTORS:
        assert f"| `{asm}` | `0x{word:08x}` |" in DOC, asm
    for _, asm, word in VFWMADOT_VECTORS:
        assert f"| `{asm}` | `0x{word:08x}` |" in DOC, asm


def vfwmadot_fields(asm: str) -> dict:
    slide, vd, vs1, vs2 = VFWMADOT_RE.fullmatch(asm).groups()
    return {"form": "vfwmadot", "vd": int(vd), "vs1": int(vs1), "vs2": int(vs2), "slide": int(slide or 0)}


def vfwmadot_legal(f: dict) -> bool:
    """§6.1.5, §6.2.4, §8.5 restated apart from the encoder: vd even, vs1 even for the slides (A is the pair),
    the pair vd, vd+1 off vs1 (and vs1+1 for the slides) and vs2."""
    a = {f["vs1"], f["vs1"] + 1} if f["slide"] else {f["vs1"]}
    return f["vd"] % 2 == 0 and not (f["slide"] and f["vs1"] % 2) and not {f["vd"], f["vd"] + 1} & (a | {f["vs2"]})


@pytest.mark.parametrize("source, asm, word", VFWMADOT_VECTORS, ids=[f"{s}: {a}" for s, a, _ in VFWMADOT_VECTORS])
def test_vfwmadot_assembler_vector(source, asm, word):
    fields = vfwmadot_fields(asm)
    got = decode(word)
    assert got.pop("mnemonic") == asm.split()[0]
    assert got == fields
    kwargs = {k: fields[k] for k in ("vd", "vs1", "vs2")}
    if vfwmadot_legal(fields):
        assert encode_vfwmadot(**kwargs, slide=fields["slide"]) == word
    else:
        with pytest.raises(ValueError, match="overlaps"):
            encode_vfwmadot(**kwargs, slide=fields["slide"])


def test_vfwmadot_chapter_8_5_and_round_trip():
    """§8.5's tables field by field ([31:25] 1001111, [14:12] 100 / 101 / 110 / 111), over every register
    combination: legal ones encode to that word and decode back, the rest raise."""
    for slide, vd, vs1, vs2 in itertools.product(range(4), range(32), range(32), range(32)):
        fields = {"form": "vfwmadot", "vd": vd, "vs1": vs1, "vs2": vs2, "slide": slide}
        if not vfwmadot_legal(fields):
            with pytest.raises(ValueError):
                encode_vfwmadot(vd, vs1, vs2, slide=slide)
            continue
        word = encode_vfwmadot(vd, vs1, vs2, slide=slide)
        assert word == 0b1001111 << 25 | vs2 << 20 | vs1 << 15 | (0b100 + slide) << 12 | vd << 7 | 0b0101011
        got = decode(word)
        assert got.pop("mnemonic") == "smt.vfwmadot" + (str(slide) if slide else "")
        assert got == fields


# Chapter 8's tables, transcribed: for each mnemonic the constant fields [28:26], [25] and [14:12] (None:
# an operand's), and whether [15] is fixed to 1 (vmadot3*: "{vs1[4:1],1}").
SPEC_TABLES = {
    # §8.1: [28:26] 000, [25] 1, funct3 [14:12] = signedness
    ("base", "uu", 0): (0b000, 1, 0b000, 0), ("base", "us", 0): (0b000, 1, 0b001, 0),
    ("base", "su", 0): (0b000, 1, 0b010, 0), ("base", "ss", 0): (0b000, 1, 0b011, 0),
    # §8.2: [28:26] 001, [25] 1, [14:12] 0sg (vmadot1, vmadot3) or 1sg (vmadot2), [15] 1 for vmadot3
    **{("slide", s, n): (0b001, 1, (4 if n == 2 else 0) | code, int(n == 3))
       for s, code in (("uu", 0), ("us", 1), ("su", 2), ("ss", 3)) for n in (1, 2, 3)},
    # §8.3: [28:26] 010, [25] mask register, [14:12] = signedness, imm2 in [15] and [7]
    ("sp", "uu", 0): (0b010, None, 0b000, None), ("sp", "us", 0): (0b010, None, 0b001, None),
    ("sp", "su", 0): (0b010, None, 0b010, None), ("sp", "ss", 0): (0b010, None, 0b011, None),
    # §8.4: [28:26] = signedness, [25] scale register, [14:12] imm3
    ("hp", "uu", 0): (0b011, None, None, None), ("hp", "us", 0): (0b110, None, None, None),
    ("hp", "su", 0): (0b101, None, None, None), ("hp", "ss", 0): (0b100, None, None, None),
}
DT = {"i4": 0b10, "i8": 0b11}


def table_word(form: str, sign: str, slide: int, dtype: str, vd: int, vs1: int, vs2: int, sel: int, imm: int) -> int:
    f28, f25, f14, b15 = SPEC_TABLES[(form, sign, slide)]
    word = 1 << 31 | DT[dtype] << 29 | f28 << 26 | (sel if f25 is None else f25) << 25 | vs2 << 20 | 0x2B
    if form in ("base", "hp"):
        word |= vs1 << 15 | vd << 7
    else:
        word |= (vs1 >> 1) << 16 | (vd >> 1) << 8
    if form == "slide":
        word |= b15 << 15
    if form == "sp":
        word |= (imm >> 1) << 15 | (imm & 1) << 7
    return word | (imm if f14 is None else f14) << 12


def test_chapter_8_tables():
    """Every table row of §8.1-8.4 with sampled registers and selectors: the encoder puts each field where
    the table says."""
    rng = random.Random(8)
    for (form, sign, slide), dtype in itertools.product(SPEC_TABLES, ("i4", "i8")):
        if form == "slide" and dtype == "i4":
            continue  # §8.2: DT is i8 only
        done = 0
        while done < 50:
            vd, vs1, vs2, sel = rng.randrange(32), rng.randrange(32), rng.randrange(32), rng.randrange(2)
            imm = rng.randrange({"sp": 4 if dtype == "i8" else 2, "hp": 8}.get(form, 1))
            fields = {"form": form, "signedness": sign, "dtype": dtype, "vd": vd, "vs1": vs1, "vs2": vs2,
                      "slide": slide, "mask": sel, "imm2": imm, "scale": sel, "imm3": imm}
            if form in ("slide", "sp") and vs1 % 2 or not legal(fields):
                continue
            assert encode(fields) == table_word(form, sign, slide, dtype, vd, vs1, vs2, sel, imm), fields
            done += 1


def test_int8_words_are_the_k1_words():
    """The int8 base and slide encodings are the K1's (which tests/test_ime_encoding.py checks against LLVM),
    over every register combination either encoder accepts."""
    for sign, slide, vd, vs1, vs2 in itertools.product(SIGNS, range(4), range(0, 32, 2), range(32), range(32)):
        try:
            want = k1.encode_vmadot(vd, vs1, vs2, signedness=sign, slide=slide)
        except ValueError:
            with pytest.raises(ValueError):
                encode_vmadot(vd, vs1, vs2, signedness=sign, slide=slide)
            continue
        assert encode_vmadot(vd, vs1, vs2, signedness=sign, slide=slide) == want


def test_int4_round_trip_and_constraints():
    """Every int4 (sign, vd, vs1, vs2): legal ones round-trip to distinct words, the rest raise."""
    seen: dict[int, tuple] = {}
    for sign, vd, vs1, vs2 in itertools.product(SIGNS, range(32), range(32), range(32)):
        fields = {"form": "base", "signedness": sign, "dtype": "i4", "vd": vd, "vs1": vs1, "vs2": vs2, "slide": 0}
        if not legal(fields):
            with pytest.raises(ValueError):
                encode(fields)
            continue
        word = encode(fields)
        d = decode(word)
        d.pop("mnemonic")
        assert d == fields
        assert word not in seen
        seen[word] = (sign, vd, vs1, vs2)
    assert len(seen) > 50_000


INVALID = [
    ("odd vd", dict(vd=1, vs1=4, vs2=6), "even"),
    ("vs1 is vd+1", dict(vd=2, vs1=3, vs2=6), "overlaps"),
    ("vs2 is vd", dict(vd=2, vs1=4, vs2=2, dtype="i4"), "overlaps"),
    ("slide with odd vs1", dict(vd=2, vs1=5, vs2=8, slide=1), "even"),
    ("slide pair is vd", dict(vd=4, vs1=4, vs2=8, slide=2), "overlaps"),
    ("i4 slide", dict(vd=2, vs1=4, vs2=8, slide=1, dtype="i4"), "i8 only"),
    ("bad dtype", dict(vd=2, vs1=4, vs2=8, dtype="i2"), "dtype"),
    ("bad slide", dict(vd=2, vs1=4, vs2=8, slide=4), "slide"),
    ("vd out of range", dict(vd=32, vs1=0, vs2=4), "0..31"),
]


@pytest.mark.parametrize("label, kwargs, reason", INVALID, ids=[c[0] for c in INVALID])
def test_invalid_raises(label, kwargs, reason):
    with pytest.raises(ValueError, match=reason):
        encode_vmadot(**kwargs)


@pytest.mark.parametrize("call, reason", [
    (lambda: encode_vmadot_sp(16, 2, 8, mask=0, imm2=2, dtype="i4"), "imm2 must be 0..1"),
    (lambda: encode_vmadot_sp(16, 3, 8, mask=0, imm2=0), "vs1 must be even"),
    (lambda: encode_vmadot_sp(0, 2, 8, mask=0, imm2=0), "mask register"),
    (lambda: encode_vmadot_sp(16, 2, 8, mask=2, imm2=0), "mask"),
    (lambda: encode_vmadot_hp(16, 2, 8, scale=0, imm3=8), "imm3"),
    (lambda: encode_vmadot_hp(16, 16, 8, scale=0, imm3=0), "overlaps"),
    (lambda: encode_vmadot_hp(1, 2, 8, scale=1, imm3=0), "scale register"),
])
def test_invalid_sp_hp_raise(call, reason):
    with pytest.raises(ValueError, match=reason):
        call()


@pytest.mark.parametrize("call, reason", [
    (lambda: encode_vfwmadot(1, 4, 6), "vd must be even"),
    (lambda: encode_vfwmadot(2, 3, 6, slide=1), "vs1 must be even"),
    (lambda: encode_vfwmadot(2, 3, 6), "overlaps vs1"),
    (lambda: encode_vfwmadot(4, 4, 8, slide=2), "overlaps vs1"),
    (lambda: encode_vfwmadot(2, 0, 3), "overlaps vs2"),
    (lambda: encode_vfwmadot(2, 4, 6, slide=4), "slide"),
    (lambda: encode_vfwmadot(32, 4, 6), "0..31"),
])
def test_invalid_vfwmadot_raise(call, reason):
    with pytest.raises(ValueError, match=reason):
        call()


@pytest.mark.parametrize("word, reason", [
    (0xE22FB02B | 1 << 14, "bit 14"),                # base form, bit 14 reserved
    (0xE641302B | 3 << 14, "0b11"),                  # slide field 0b11 reserved
    (0xC641302B, "reserved for i4"),                 # vmadot1 with DT = i4
    (0xE22FB02B & ~(1 << 25), "bit 25"),             # base form with bit 25 clear
    (0xE22FB02B | 1 << 7, "even"),                   # odd vd
    (0xA22FB02B, "data type"),                       # DT = 01
    (0xFE2FB02B, "family"),                          # DT = i8, family 111 (vfwmadot's, with DT 00)
    (0xC88138AB | 1 << 15, "imm2 = 3"),              # i4 sparse, imm2 = 3
    (0xE88138AB | 1 << 14, "bit 14"),                # sparse, bit 14 reserved
    (0x622FB02B, "bit 31"),                          # bit 31 clear
    (0xE22FB02A, "opcode"),                          # wrong major opcode
    (0x9E62012B, "reserved"),                        # vfwmadot with [14:12] = 000
    (0x9E62312B, "reserved"),                        # vfwmadot with [14:12] = 011
    (0x9E6241AB, "vd field must be even"),           # vfwmadot v3, v4, v6
    (0x9E52D12B, "vs1 field must be even"),          # vfwmadot1 v2, v5, v5
])
def test_decode_rejects(word, reason):
    with pytest.raises(ValueError, match=reason):
        decode(word)
