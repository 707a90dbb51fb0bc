"""The SIGILL IME emulator (imegen/runtime/ime_emu.c) against a NumPy reference, under QEMU.

The driver tests/c/ime_emu_test.c executes the real `.word` encodings from encode_vmadot;
this file generates the asm for them (ime_variants.h) and the input records.
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
from imegen.targets.ime.encoding import encode_vmadot, mnemonic

C_DIR = Path(__file__).parent / "c"
SIGNS = ("ss", "uu", "us", "su")
# Variant index -> (signedness, slide); the C driver only knows the index.
VARIANTS = [(sign, slide) for slide in range(4) for sign in SIGNS]
INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
ALL_VREGS = ", ".join(f'"v{r}"' for r in range(32))

missing = toolchain.missing_tools()
pytestmark = pytest.mark.skipif(
    any(t in missing for t in (toolchain.CLANG, toolchain.QEMU)),
    reason=f"cross toolchain missing: {missing}")


# ---------------------------------------------------------------- NumPy reference (notes §1.4)

def vmadot_ref(c: np.ndarray, a64: np.ndarray, b: np.ndarray, sign: str, slide: int) -> np.ndarray:
    """C[4x4] += A[4x8] @ B^T in int64, then wrapped to int32. a64 = bytes of vs1 || vs1+1."""
    a_dt, b_dt = (np.int8 if s == "s" else np.uint8 for s in sign)
    A = a64.view(a_dt).reshape(8, 8)[slide:slide + 4].astype(np.int64)
    B = b.view(b_dt).reshape(4, 8).astype(np.int64)  # row j holds column j of B
    exact = c.reshape(4, 4).astype(np.int64) + A @ B.T
    return exact.astype(np.uint32).view(np.int32).reshape(16)  # int64 -> uint32 keeps low 32 bits


def vmadot_exact(c, a64, b, sign, slide) -> np.ndarray:
    a_dt, b_dt = (np.int8 if s == "s" else np.uint8 for s in sign)
    A = a64.view(a_dt).reshape(8, 8)[slide:slide + 4].astype(np.int64)
    return c.astype(np.int64) + (A @ b.view(b_dt).reshape(4, 8).astype(np.int64).T).reshape(16)


# ---------------------------------------------------------------- generated asm (ime_variants.h)

def variant_registers(i: int) -> tuple[int, int, int]:
    """vd, vs1, vs2 for variant i: over the 16 variants every register 0..31 gets loaded
    from and stored to, so every case of the emulator's spill/fill switches runs."""
    vd = 2 * i
    return vd, (vd + 8) % 32, (vd + 19) % 32


def variant_function(i: int, sign: str, slide: int) -> str:
    vd, vs1, vs2 = variant_registers(i)
    word = encode_vmadot(vd, vs1, vs2, signedness=sign, slide=slide)
    a_regs = [vs1, vs1 + 1] if slide else [vs1]
    lines = ["vsetvli t0, zero, e8, m1, ta, ma",
             f"vl1r.v v{vd}, (%[c0])", f"vl1r.v v{vd + 1}, (%[c1])",
             *(f"vl1r.v v{r}, (%[a{k}])" for k, r in enumerate(a_regs)),
             f"vl1r.v v{vs2}, (%[b])",
             f".word 0x{word:08x}",
             f"vs1r.v v{vd}, (%[o0])", f"vs1r.v v{vd + 1}, (%[o1])"]
    asm = "\n".join(f'        "{line}\\n\\t"' for line in lines)
    clobbers = ", ".join(f'"v{r}"' for r in sorted({vd, vd + 1, vs2, *a_regs}))
    return f"""
/* {mnemonic(sign, slide)} v{vd}, v{vs1}, v{vs2} */
static void variant_{i}(const void *c, const void *a, const void *b, void *out) {{
    const char *cc = c, *ac = a;
    char *oc = out;
    __asm__ volatile(
{asm}
        :
        : [c0] "r"(cc), [c1] "r"(cc + 32), [a0] "r"(ac), [a1] "r"(ac + 32), [b] "r"(b),
          [o0] "r"(oc), [o1] "r"(oc + 32)
        : "memory", "t0" VCLOBBERS({clobbers}, "vl", "vtype"));
}}
"""


@dataclass(frozen=True)
class Probe:
    name: str
    word: int
    vtype: str
    survives: bool
    avl: int | None = None  # None: vl = VLMAX (vsetvli with rs1 = zero); else vsetivli AVL


VALID_WORD = encode_vmadot(8, 16, 24)
PROBES = [
    Probe("vmadot_e8m1", VALID_WORD, "e8, m1, ta, ma", True),
    Probe("vmadot_lmul2", VALID_WORD, "e32, m2, ta, ma", False),  # IME requires LMUL = 1
    Probe("custom1_funct7_0", 0x0000002B, "e8, m1, ta, ma", False),
    Probe("base_bit14_reserved", VALID_WORD | 1 << 14, "e8, m1, ta, ma", False),
    Probe("slide_funct2_reserved", encode_vmadot(8, 16, 24, slide=3) | 1 << 14, "e8, m1, ta, ma", False),
    Probe("odd_vd", VALID_WORD | 1 << 7, "e8, m1, ta, ma", False),
    Probe("compressed_unimp", 0x00000000, "e8, m1, ta, ma", False),
    # The MAC unit is selected by vl x SEW: the K1 has only the int8 one (SEW 8, vl x SEW = 256).
    Probe("vmadot_e8_vl16", VALID_WORD, "e8, m1, ta, ma", False, avl=16),
    Probe("vmadot_e8_vl8", VALID_WORD, "e8, m1, ta, ma", False, avl=8),
    Probe("vmadot_e8_vl31", VALID_WORD, "e8, m1, ta, ma", False, avl=31),
    Probe("vmadot_e16", VALID_WORD, "e16, m1, ta, ma", False),
    Probe("vmadot_e32", VALID_WORD, "e32, m1, ta, ma", False),
    Probe("vmadot_e64", VALID_WORD, "e64, m1, ta, ma", False),
    Probe("vmadot_e8_mf2", VALID_WORD, "e8, mf2, ta, ma", False),
    Probe("vmadot_e8_vl32_explicit", VALID_WORD, "e8, m1, ta, ma", True, avl=32),
]


def probe_function(k: int, p: Probe) -> str:
    setvl = "vsetvli t0, zero" if p.avl is None else (f"vsetivli t0, {p.avl}" if p.avl < 32
                                                       else f"li t0, {p.avl}\\n\\tvsetvli t0, t0")
    return f"""
/* {p.name} */
static void probe_{k}(void) {{
    __asm__ volatile("{setvl}, {p.vtype}\\n\\t.word 0x{p.word:08x}"
                     : : : "memory", "t0" VCLOBBERS({ALL_VREGS}, "vl", "vtype"));
}}
"""


def vtype_probe_function() -> str:
    # One asm block, so no compiler-emitted vsetvli can sit between the reads.
    return f"""
static void vtype_probe(unsigned long r[4]) {{
    unsigned long vl0, vt0, vl1, vt1;
    __asm__ volatile(
        "li t0, 32\\n\\t"
        "vsetvli zero, t0, e8, m1, ta, mu\\n\\t"
        "csrr %[vl0], vl\\n\\t"
        "csrr %[vt0], vtype\\n\\t"
        ".word 0x{VALID_WORD:08x}\\n\\t"
        "csrr %[vl1], vl\\n\\t"
        "csrr %[vt1], vtype"
        : [vl0] "=&r"(vl0), [vt0] "=&r"(vt0), [vl1] "=r"(vl1), [vt1] "=r"(vt1)
        :
        : "memory", "t0" VCLOBBERS("v8", "v9", "vl", "vtype"));
    r[0] = vl0; r[1] = vt0; r[2] = vl1; r[3] = vt1;
}}
"""


def generate_header() -> str:
    parts = ["/* Generated by tests/test_ime_emulator.py */",
             f"#define N_VARIANTS {len(VARIANTS)}", f"#define N_PROBES {len(PROBES)}"]
    parts += [variant_function(i, s, n) for i, (s, n) in enumerate(VARIANTS)]
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
    d = tmp_path_factory.mktemp("ime_gen")
    (d / "ime_variants.h").write_text(generate_header())
    return d


def build(gen_dir: Path, main_cc: str, emu_cc: str) -> Path:
    if emu_cc == "gcc" or main_cc == "gcc":
        if toolchain.GCC in missing:
            pytest.skip(f"{toolchain.GCC} not installed")
    exe = gen_dir / f"ime_emu_test_{main_cc}_{emu_cc}"
    if not exe.exists():
        obj = toolchain.compile_ime_emu(gen_dir / f"ime_emu_{emu_cc}.o", compiler=emu_cc)
        toolchain.compile_c([C_DIR / "ime_emu_test.c", obj], exe, compiler=main_cc,
                            include_dirs=[gen_dir, toolchain.RUNTIME_DIR])
    return exe


@pytest.fixture(scope="module", params=BUILDS, ids=[f"main-{m}_emu-{e}" for m, e in BUILDS])
def exe(request, gen_dir) -> Path:
    return build(gen_dir, *request.param)


@pytest.fixture(scope="module")
def clang_exe(gen_dir) -> Path:
    return build(gen_dir, "clang", "clang")


# ---------------------------------------------------------------- records

BYTE_EXTREMES = (0x80, 0x7F, 0x00, 0xFF)  # -128, 127, 0, 255 (or -1)


def make_records(rng: np.random.Generator) -> list[tuple[int, np.ndarray, np.ndarray, np.ndarray]]:
    recs = []
    for v in range(len(VARIANTS)):
        for _ in range(40):
            recs.append((v, rng.integers(INT32_MIN, INT32_MAX, 16, endpoint=True, dtype=np.int64).astype(np.int32),
                         rng.integers(0, 256, 64, dtype=np.uint8), rng.integers(0, 256, 32, dtype=np.uint8)))
        # Constant extreme byte patterns, from zero and from both ends of int32 (the latter wrap).
        for pa, pb, c0 in itertools.product(BYTE_EXTREMES, BYTE_EXTREMES, (0, INT32_MAX - 3, INT32_MIN + 3)):
            recs.append((v, np.full(16, c0, np.int32), np.full(64, pa, np.uint8), np.full(32, pb, np.uint8)))
        # Per-byte mixtures of the extremes, so signed and unsigned readings disagree everywhere.
        for _ in range(8):
            recs.append((v, rng.integers(INT32_MIN, INT32_MAX, 16, endpoint=True, dtype=np.int64).astype(np.int32),
                         rng.choice(np.array(BYTE_EXTREMES, np.uint8), 64),
                         rng.choice(np.array(BYTE_EXTREMES, np.uint8), 32)))
    return recs


def encode_records(recs) -> bytes:
    return b"".join(struct.pack("<i", v) + c.astype("<i4").tobytes() + a.tobytes() + b.tobytes()
                    for v, c, a, b in recs)


def parse_results(stdout: bytes) -> tuple[np.ndarray, int]:
    lines = stdout.decode().split("\n")
    assert lines[-1] == "" and lines[-2].startswith("count "), lines[-3:]
    rows = np.array([[int(x) for x in ln.split()] for ln in lines[:-2]], dtype=np.int64)
    return rows, int(lines[-2].split()[1])


# ---------------------------------------------------------------- tests

def test_all_variants_match_numpy(exe):
    recs = make_records(np.random.default_rng(20240422))
    proc = toolchain.run(exe, ["run"], input=encode_records(recs), timeout=60)
    got, count = parse_results(proc.stdout)
    assert count == len(recs), "every vmadot must have gone through the emulator"
    assert got.shape == (len(recs), 16)
    wrapped = set()
    for (v, c, a, b), row in zip(recs, got):
        sign, slide = VARIANTS[v]
        want = vmadot_ref(c, a, b, sign, slide)
        np.testing.assert_array_equal(row, want, err_msg=f"{mnemonic(sign, slide)} variant {v}")
        exact = vmadot_exact(c, a, b, sign, slide)
        if ((exact < INT32_MIN) | (exact > INT32_MAX)).any():
            wrapped.add(v)
    assert wrapped == set(range(len(VARIANTS))), "each variant must include an int32 wrap-around case"


def test_vl_vtype_preserved(exe):
    vl0, vt0, vl1, vt1, count = map(int, toolchain.run(exe, ["vtype"]).stdout.split())
    assert (vl0, vt0) == (32, 0x40)  # vl 32, e8, m1, ta, mu: the one legal IME vtype, unusual policy bits
    assert (vl1, vt1) == (vl0, vt0)
    assert count == 1


@pytest.mark.parametrize("vlen", [128, 512])
def test_refuses_wrong_vlen(clang_exe, vlen):
    with pytest.raises(toolchain.ToolchainError) as ei:
        toolchain.run(clang_exe, ["vtype"], vlen=vlen)
    assert ei.value.returncode == 3
    assert "IME requires VLEN=256" in ei.value.stderr


@pytest.mark.parametrize("k, probe", list(enumerate(PROBES)), ids=[p.name for p in PROBES])
def test_probe(clang_exe, k, probe):
    """A valid vmadot survives; any other illegal word (or LMUL != 1) still dies by SIGILL."""
    if probe.survives:
        assert toolchain.run(clang_exe, ["probe", str(k)]).stdout.split() == [b"survived", b"1"]
        return
    with pytest.raises(toolchain.ToolchainError) as ei:
        toolchain.run(clang_exe, ["probe", str(k)])
    assert ei.value.returncode == -signal.SIGILL, ei.value
