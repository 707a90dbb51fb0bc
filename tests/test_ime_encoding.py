"""encode_vmadot / decode_vmadot against LLVM's MC test vectors and the register constraints."""

from __future__ import annotations

import itertools
import re

import pytest

from imegen.targets.ime.encoding import decode_vmadot, encode_vmadot, mnemonic

# llvm/test/MC/RISCV/xsmtvdot-valid.s (docs/ime-isa.md §3.1)
LLVM_VECTORS = """
smt.vmadot v16, v0, v8        0xe280382b
smt.vmadotu v18, v1, v9       0xe290892b
smt.vmadotsu v20, v2, v10     0xe2a12a2b
smt.vmadotus v22, v3, v11     0xe2b19b2b
smt.vmadot1 v24, v16, v12     0xe6c83c2b
smt.vmadot1u v26, v18, v13    0xe6d90d2b
smt.vmadot1su v28, v20, v14   0xe6ea2e2b
smt.vmadot1us v30, v22, v15   0xe6fb1f2b
smt.vmadot2 v0, v24, v4       0xe64c702b
smt.vmadot2u v2, v26, v5      0xe65d412b
smt.vmadot2su v4, v28, v6     0xe66e622b
smt.vmadot2us v6, v30, v8     0xe68f532b
smt.vmadot3 v2, v0, v8        0xe680b12b
smt.vmadot3u v10, v2, v9      0xe691852b
smt.vmadot3su v12, v4, v10    0xe6a2a62b
smt.vmadot3us v14, v6, v11    0xe6b3972b
"""

ASM_RE = re.compile(r"smt\.vmadot([123]?)(u|su|us)?\s+v(\d+),\s*v(\d+),\s*v(\d+)\s+(0x[0-9a-f]{8})$")
SUFFIX_TO_SIGN = {None: "ss", "u": "uu", "su": "su", "us": "us"}
SIGNS = ("ss", "uu", "us", "su")


def parse_vectors() -> list[tuple[str, dict, int]]:
    out = []
    for line in LLVM_VECTORS.strip().splitlines():
        m = ASM_RE.fullmatch(line.strip())
        assert m, line
        slide, suffix, vd, vs1, vs2, word = m.groups()
        fields = {"vd": int(vd), "vs1": int(vs1), "vs2": int(vs2),
                  "signedness": SUFFIX_TO_SIGN[suffix], "slide": int(slide or 0)}
        out.append((line.split()[0], fields, int(word, 16)))
    return out


VECTORS = parse_vectors()


def test_all_sixteen_variants_covered():
    assert len(VECTORS) == 16
    assert {(f["signedness"], f["slide"]) for _, f, _ in VECTORS} == set(itertools.product(SIGNS, range(4)))


@pytest.mark.parametrize("asm, fields, word", VECTORS, ids=[v[0] for v in VECTORS])
def test_llvm_vector(asm, fields, word):
    f = dict(fields)
    assert encode_vmadot(f.pop("vd"), f.pop("vs1"), f.pop("vs2"), **f) == word
    assert decode_vmadot(word) == {**fields, "mnemonic": asm.removeprefix("smt.")}
    assert "smt." + mnemonic(fields["signedness"], fields["slide"]) == asm


def is_legal(vd: int, vs1: int, vs2: int, slide: int) -> bool:
    """Constraints restated independently of the encoder (notes §1.3, LLVM xsmtvdot-invalid.s)."""
    dest = {vd, vd + 1}
    a_regs = {vs1, vs1 + 1} if slide else {vs1}
    return vd % 2 == 0 and (not slide or vs1 % 2 == 0) and not dest & (a_regs | {vs2})


def test_exhaustive_round_trip_and_constraints():
    """Every (variant, vd, vs1, vs2): legal ones round-trip to distinct words, the rest raise."""
    seen: dict[int, tuple] = {}
    for sign, slide, vd, vs1, vs2 in itertools.product(SIGNS, range(4), range(32), range(32), range(32)):
        if not is_legal(vd, vs1, vs2, slide):
            with pytest.raises(ValueError):
                encode_vmadot(vd, vs1, vs2, signedness=sign, slide=slide)
            continue
        word = encode_vmadot(vd, vs1, vs2, signedness=sign, slide=slide)
        d = decode_vmadot(word)
        assert (d["vd"], d["vs1"], d["vs2"], d["signedness"], d["slide"]) == (vd, vs1, vs2, sign, slide)
        assert word not in seen, (word, seen.get(word))
        seen[word] = (sign, slide, vd, vs1, vs2)
    assert len(seen) > 100_000  # sanity: the legal space is not accidentally tiny


# The cases of llvm/test/MC/RISCV/xsmtvdot-invalid.s plus range/argument errors.
INVALID = [
    ("vmadot v1, v2, v4", dict(vd=1, vs1=2, vs2=4), "even"),
    ("vmadot v2, v2, v4", dict(vd=2, vs1=2, vs2=4), "overlap"),
    ("vmadot v4, v2, v4", dict(vd=4, vs1=2, vs2=4), "overlap"),
    ("vmadot v2, v3, v4", dict(vd=2, vs1=3, vs2=4), "overlap"),
    ("vmadot v2, v4, v3", dict(vd=2, vs1=4, vs2=3), "overlap"),
    ("vmadot1 v1, v2, v2", dict(vd=1, vs1=2, vs2=2, slide=1), "even"),
    ("vmadot1 v2, v5, v4", dict(vd=2, vs1=5, vs2=4, slide=1), "even"),
    ("vmadot1 v2, v2, v4", dict(vd=2, vs1=2, vs2=4, slide=1), "overlap"),
    ("vmadot1 v2, v4, v2", dict(vd=2, vs1=4, vs2=2, slide=1), "overlap"),
    ("vmadot1 v0, v1, v2", dict(vd=0, vs1=1, vs2=2, slide=1), "even"),
    ("vmadot1 v0, v2, v1", dict(vd=0, vs1=2, vs2=1, slide=1), "overlap"),
    ("vmadot3 v2, v2, v8", dict(vd=2, vs1=2, vs2=8, slide=3), "overlap"),
    ("vd out of range", dict(vd=32, vs1=0, vs2=1), "0..31"),
    ("negative vs2", dict(vd=2, vs1=0, vs2=-1), "0..31"),
    ("bad signedness", dict(vd=2, vs1=0, vs2=1, signedness="s"), "signedness"),
    ("bad slide", dict(vd=2, vs1=0, vs2=4, slide=4), "slide"),
]


@pytest.mark.parametrize("label, kwargs, reason", INVALID, ids=[c[0] for c in INVALID])
def test_invalid_raises(label, kwargs, reason):
    with pytest.raises(ValueError, match=reason):
        encode_vmadot(**kwargs)


@pytest.mark.parametrize("word", [
    0x0000002B,                # custom-1 but funct7 = 0
    0xE280382B | 1 << 14,      # base form: bit 14 reserved
    0xE680B12B | 1 << 14,      # slide field 0b11 reserved
    0xE280382B | 1 << 7,       # odd vd
    0xE280382A,                # wrong major opcode
])
def test_decode_rejects_non_vmadot(word):
    with pytest.raises(ValueError):
        decode_vmadot(word)
