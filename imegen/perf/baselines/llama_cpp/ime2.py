"""The peer check of imegen's IME2 emulator (runtime/ime2_emu.c) against SpacemiT's own IME2 kernels:
llama.cpp's `ime2_kernels.cpp` from the llama-cpp-python sdist (source.py; nothing of it enters the
repository), built at test time by clang-19 with ime2_driver.cpp, run under qemu-riscv64 at VLEN 1024 with
the emulator installed, its results compared with a NumPy model of what the kernel computes (its scalar
reference `gemm_kernel_*_mrow_ref` in the same file states it), computed from the input bytes alone.

Build-time translation (translate): the vendor mnemonics become `.word`s from imegen's IME2 encoders:
`vmadot{,u,su,us} ..., i8|i4` and `vmadot{,u,su,us}.hp ..., v0|v1, imm3, i8|i4` (targets/ime2/encoding.py),
`vpack.vv` / `vupack.vv` (encode_pack, spec §8.6.1) and `vnpack4.vv` (encode_vnpack4, §8.6.2; the emulator
runs it in the reading docs/ime2-isa.md §9.1 gives, which these kernels pin). Policy-less `vsetvli` lines get
`, tu, mu` (clang-19 requires a policy), as for IME1. `vsetvli ..., x0, e64, mf2` becomes `e64, m1`: QEMU
(ELEN 64) sets vill for SEW 64 at LMUL 1/2, which the V spec allows an implementation to refuse and the K3
evidently accepts; the kernels use it only to slide 16-byte A sub-blocks between tile rows (i8i2k_m1:
vslideup into zeroed registers from registers zero past their first 16 bytes; i8i3k_m1: vslidedown, of which
only tile row 0 is used), where m1 leaves every row that reaches C unchanged.

Which kernel needs what (the live code of ime2_kernels.cpp; docs/ime2-isa.md §9): every one of them lays
out operands or results with vpack/vupack, so the emulator runs those two as well. Checked here, m4 and m1
paths each: i8i8 (`gemm_kernel_i8i8`: Q8 weights, vmadot i8 + vpack + vupack), i8i2k (Q2_K: m4
vmadotsu.hp, m1 vmadotsu i8; both vmadotsu/vmadotu for the zero points), i8i3k (Q3_K: m4 vmadot i8, m1
vmadot.hp), i8i5 (Q5_0 and Q5_1: vmadot i8, vpack at pack_len SEW 8) and Q4_0's two (i8i4 for K blocks of 32,
i8i4_hp for 256-code super-blocks: vnpack4 + vmadotsu.hp/vmadotu.hp i4); and the two MoE entry points, driven
by ime.cpp's expert walk (MoECase): moe_m2_gemm_kernel_i8i4 (two token rows per call, vnpack4 at imm2 2 +
vmadotsu.hp/vmadotu.hp i4; Q4_0 and, with zero points, Q4_1) and moe_m2_gemm_kernel_i8i5 (vmadot i8, vpack,
vupack; Q5_0 and Q5_1). gemm_kernel_i8mxfp4 runs its scalar reference (its dispatcher's `#if 1`) and
moe_m2_gemm_kernel_i8mxfp4's call is commented out, so neither has IME2 to check."""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .... import cache, toolchain
from ....targets.ime2.encoding import encode_vmadot, encode_vmadot_hp
from ....toolchain import ToolchainError
from .source import SDIST_SHA256, SPACEMIT, sources

HERE = Path(__file__).parent
DRIVER = HERE / "ime2_driver.cpp"
MARCH = "rv64gcv_zfh_zvfh"
VLEN = 1024
BLK_LEN = 32  # the kernels' fixed K block (their asm steps A and B by 32 codes)
NB_COLS = 32  # B is repacked in groups of 32 columns

_PACK_SIGN = {"": "ss", "u": "uu", "su": "su", "us": "us"}


def encode_vnpack4(vd: int, vs1: int, vs2: int, imm2: int) -> int:
    """`smt.vnpack4.vv vd, vs1, vs2, imm2` (spec §8.6.2): [31:26] 010000, [25] 1, vs2, vs1, [14] 0 (1 is the
    saturating vnspack4), [13:12] imm2, vd (any register), custom-1."""
    if not (0 <= min(vd, vs1, vs2) and max(vd, vs1, vs2) <= 31 and 0 <= imm2 <= 3):
        raise ValueError(f"vnpack4 operands out of range: v{vd}, v{vs1}, v{vs2}, {imm2}")
    return 0b010000 << 26 | 1 << 25 | vs2 << 20 | vs1 << 15 | imm2 << 12 | vd << 7 | 0x2B


def encode_pack(vd: int, vs1: int, vs2: int, imm2: int, *, unpack: bool) -> int:
    """`smt.vpack.vv` / `smt.vupack.vv vd, vs1, vs2, imm2` (spec §8.6.1): [31:26] 011001, [25] 1, vs2, vs1,
    [14] unpack, [13:12] imm2, vd (even: the result is the pair vd, vd+1), custom-1."""
    if not (0 <= vd <= 30 and vd % 2 == 0 and 0 <= vs1 <= 31 and 0 <= vs2 <= 31 and 0 <= imm2 <= 3):
        raise ValueError(f"vpack operands out of range: v{vd}, v{vs1}, v{vs2}, {imm2}")
    return (0b011001 << 26 | 1 << 25 | vs2 << 20 | vs1 << 15 | int(unpack) << 14 | imm2 << 12 | vd << 7
            | 0x2B)


@dataclass(frozen=True)
class Translation:
    text: str
    vmadot: int   # emulated vmadot words (integer C)
    hp: int       # emulated vmadot*.hp words (FP16 C)
    pack: int     # emulated vpack/vupack words
    npack4: int   # emulated vnpack4.vv words
    vsetvli: int  # policies added
    e64_mf2: int  # `vsetvli ..., x0, e64, mf2` made `e64, m1` (QEMU sets vill for SEW 64 at LMUL 1/2)


def translate(text: str) -> Translation:
    """ime2_kernels.cpp with its IME2 mnemonics as `.word` and every vsetvli with a policy."""
    def vmadot(m: re.Match) -> str:
        word = encode_vmadot(int(m[2]), int(m[3]), int(m[4]), signedness=_PACK_SIGN[m[1]], dtype=m[5])
        return f".word 0x{word:08x}"

    def vmadot_hp(m: re.Match) -> str:
        word = encode_vmadot_hp(int(m[2]), int(m[3]), int(m[4]), scale=int(m[5]), imm3=int(m[6]),
                                signedness=_PACK_SIGN[m[1]], dtype=m[7])
        return f".word 0x{word:08x}"

    def pack(m: re.Match) -> str:
        return f".word 0x{encode_pack(int(m[2]), int(m[3]), int(m[4]), int(m[5]), unpack=m[1] == 'u'):08x}"

    def npack4(m: re.Match) -> str:
        return f".word 0x{encode_vnpack4(int(m[1]), int(m[2]), int(m[3]), int(m[4])):08x}"

    text, n_npack4 = re.subn(r"\bvnpack4\.vv\s+v(\d+),\s*v(\d+),\s*v(\d+),\s*(\d)\b", npack4, text)
    text, n_hp = re.subn(r"\bvmadot(u|su|us|)\.hp\s+v(\d+),\s*v(\d+),\s*v(\d+),\s*v([01]),\s*(\d),\s*(i8|i4)\b",
                         vmadot_hp, text)
    text, n_vmadot = re.subn(r"\bvmadot(u|su|us|)\s+v(\d+),\s*v(\d+),\s*v(\d+),\s*(i8|i4)\b", vmadot, text)
    text, n_pack = re.subn(r"\bv(u?)pack\.vv\s+v(\d+),\s*v(\d+),\s*v(\d+),\s*(\d)\b", pack, text)
    left = re.search(r"\b(?:v\w*madot|v\w*pack)\w*(?:\.\w+)?\s+v\d+", text)
    if left:
        raise ToolchainError(f"ime2_kernels.cpp: an IME2 instruction the translation does not handle: {left[0]!r}", [])
    text, n_mf2 = re.subn(r"(vsetvli\s+\w+,\s*x0,\s*e64,\s*)mf2\b", r"\1m1", text)
    text, n_vset = re.subn(r"(vseti?vli\s+[\w%\[\]]+,\s*[\w%\[\]]+,\s*e\d+,\s*m?f?\d+)(\s*\\n)", r"\1, tu, mu\2", text)
    return Translation(text, n_vmadot, n_hp, n_pack, n_npack4, n_vset, n_mf2)


def build(log=None, *, emulator: str | None = None) -> Path:
    """The driver linked with the translated ime2_kernels.cpp and the IME2 emulator (cached). `emulator`: the
    text of another emulator source to link instead of runtime/ime2_emu.c (the tests link variants of it that
    read vnpack4 differently, to show that the kernels tell the readings apart)."""
    ggml = sources(log)
    spacemit = ggml / SPACEMIT
    tr = translate((spacemit / "ime2_kernels.cpp").read_text())
    emu_text = emulator if emulator is not None else (toolchain.RUNTIME_DIR / "ime2_emu.c").read_text()
    inputs = cache.Inputs(files=(DRIVER, *toolchain.runtime_files()),
                          strings=(SDIST_SHA256, tr.text, MARCH, emu_text), tools=(toolchain.CLANG,))

    def fill(d: Path) -> None:
        if log:
            log("llama.cpp: building ime2_kernels.cpp and the IME2 driver (clang-19)")
        (d / "ime2_kernels.cpp").write_text(tr.text)
        (d / "ime2_emu.c").write_text(emu_text)
        cxx = [toolchain.CLANG.replace("clang", "clang++"), "--target=riscv64-linux-gnu", "--gcc-toolchain=/usr",
               f"-march={MARCH}", "-O2", "-std=c++20", "-DRISCV64_SPACEMIT_IME2",
               *[f"-isystem{p}" for p in (spacemit, ggml / "include", ggml / "src", ggml / "src/ggml-cpu")],
               f"-I{toolchain.RUNTIME_DIR}"]
        objs = [d / "ime2_kernels.o", d / "driver.o", d / "ime2_emu.o"]
        _run([*cxx, "-c", str(d / "ime2_kernels.cpp"), "-o", str(objs[0])], "compiling ime2_kernels.cpp")
        _run([*cxx, "-Wall", "-Wextra", "-Werror", "-c", str(DRIVER), "-o", str(objs[1])], "compiling the driver")
        # rv64gc: the emulator's C code must not touch the live vector registers.
        toolchain.compile_c([d / "ime2_emu.c"], objs[2], march="rv64gc", include_dirs=[toolchain.RUNTIME_DIR])
        _run([*cxx, "-static", *map(str, objs), "-o", str(d / "ime2_peer")], "linking")

    return cache.entry("llama-ime2", inputs.key(), fill) / "ime2_peer"


def _run(cmd: list[str], what: str) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise ToolchainError(f"llama.cpp IME2 build: {what} failed", cmd, proc.returncode, proc.stdout, proc.stderr)


# ---------------------------------------------------------------- i8i8: data and the NumPy model

def row_groups(M: int) -> list[int]:
    """The rows each call of the entry point takes (ime.cpp's walk: 4 while 4 are left, else 1)."""
    groups = []
    while M - sum(groups) >= 4:
        groups.append(4)
    return groups + [1] * (M - sum(groups))


def m4_rows(M: int) -> np.ndarray:
    """(M,) bool: the rows the dispatcher hands to an _m4 kernel (the others go to _m1)."""
    return np.repeat([g == 4 for g in row_groups(M)], row_groups(M)).astype(bool)


@dataclass(frozen=True)
class I8I8Case:
    """Q8 A (per row and block of 32: fp32 scale, int8 codes) times Q8 B (per column and block: fp16 scale,
    int8 codes): C[m][n] = sum over blocks of (sum_k a * b) * a_scale * b_scale, as gemm_kernel_i8i8_mrow_ref."""
    a_codes: np.ndarray   # (M, k_blks, 32) int8
    a_scales: np.ndarray  # (M, k_blks) fp32
    b_codes: np.ndarray   # (N, k_blks, 32) int8
    b_scales: np.ndarray  # (N, k_blks) fp16

    @staticmethod
    def random(rng: np.random.Generator, M: int, N: int, k_blks: int) -> I8I8Case:
        return I8I8Case(rng.integers(-128, 128, (M, k_blks, BLK_LEN)).astype(np.int8),
                        rng.uniform(0.001, 0.02, (M, k_blks)).astype(np.float32),
                        rng.integers(-128, 128, (N, k_blks, BLK_LEN)).astype(np.int8),
                        rng.uniform(0.001, 0.02, (N, k_blks)).astype(np.float16))

    blk_len = BLK_LEN

    @property
    def shape(self) -> tuple[int, int, int]:
        return self.a_codes.shape[0], self.b_codes.shape[0], self.a_codes.shape[1]

    def a_bytes(self) -> bytes:
        """Each row group (row_groups), per k block: its rows' fp32 scales, int16 sums (unused by i8i8:
        random), then the rows' codes row after row (mrow_ref's a_data[mi * blk_len + bi])."""
        M, k_blks, _ = self.a_codes.shape
        sums = np.random.default_rng(1).integers(-2**15, 2**15, (M, k_blks)).astype(np.int16)
        out, m = [], 0
        for g in row_groups(M):
            for kb in range(k_blks):
                out += [self.a_scales[m:m + g, kb].tobytes(), sums[m:m + g, kb].tobytes(),
                        self.a_codes[m:m + g, kb].tobytes()]
            m += g
        return b"".join(out)

    def b_bytes(self) -> bytes:
        """Per group of 32 columns, per k block: the 32 fp16 scales, then the 32 columns' codes column after
        column (mrow_ref's b_data[ci * blk_len + bi])."""
        N, k_blks, _ = self.b_codes.shape
        out = []
        for n in range(0, N, NB_COLS):
            for kb in range(k_blks):
                out += [self.b_scales[n:n + NB_COLS, kb].tobytes(), self.b_codes[n:n + NB_COLS, kb].tobytes()]
        return b"".join(out)

    def reference(self) -> tuple[np.ndarray, np.ndarray]:
        """(C, bound): exact integer block dots, scaled in float64; bound = sum of |terms| for the tolerance."""
        dots = np.einsum("mbk,nbk->mnb", self.a_codes.astype(np.int64), self.b_codes.astype(np.int64))
        terms = dots * self.a_scales.astype(np.float64)[:, None, :] * self.b_scales.astype(np.float64)[None, :, :]
        return terms.sum(axis=2), np.abs(terms).sum(axis=2)


@dataclass(frozen=True)
class PeerRun:
    C: np.ndarray
    rows: tuple[int, ...]  # what each call of the entry point reported
    emulated: int          # IME2 instructions the emulator ran


def run(exe: Path, kernel: str, case, work: Path) -> PeerRun:
    """Run llama.cpp's gemm_kernel_<kernel> on `case` (its a_bytes/b_bytes) under QEMU at VLEN 1024 with the
    IME2 emulator."""
    M, N, k_blks = case.shape
    if N % NB_COLS:
        raise ValueError(f"N = {N}: the kernels store whole groups of {NB_COLS} columns")
    work.mkdir(parents=True, exist_ok=True)
    (work / "a.bin").write_bytes(case.a_bytes())
    (work / "b.bin").write_bytes(case.b_bytes())
    if isinstance(case, MoECase):
        (work / "calls.txt").write_text(case.calls_text())
    cmd = [toolchain.QEMU, "-L", str(toolchain.SYSROOT), "-cpu", toolchain.qemu_cpu(VLEN), str(exe),
           kernel, str(M), str(N), str(k_blks), str(case.blk_len), str(work)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        raise ToolchainError("llama.cpp IME2 driver failed", cmd, proc.returncode, proc.stdout, proc.stderr)
    lines = proc.stdout.split("\n")
    rows = tuple(int(x.split()[1]) for x in lines if x.startswith("rows "))
    emulated = int(next(x for x in lines if x.startswith("emulated ")).split()[1])
    C = np.fromfile(work / "c.bin", dtype=np.float32).reshape(M, N)
    return PeerRun(C, rows, emulated)


def run_i8i8(exe: Path, case: I8I8Case, work: Path) -> PeerRun:
    return run(exe, "i8i8", case, work)


def max_error(run: PeerRun, case: I8I8Case) -> float:
    """max |C - reference| in units of 1e-5 x sum|terms| (fp32 accumulation of fp32-converted block dots)."""
    want, bound = case.reference()
    return float((np.abs(run.C.astype(np.float64) - want) / (1e-5 * bound + 1e-30)).max())


# ---------------------------------------------------------------- K-quants (Q2_K, Q3_K): data and NumPy models

QK_K = 256      # a K-quant super-block: 16 sub-blocks of 16 codes, one int scale per sub-block and column
SUB = 16
SUBS = QK_K // SUB


def q8k_a_bytes(codes: np.ndarray, scales: np.ndarray, sums: np.ndarray) -> bytes:
    """Q8_K A (ime2_kernels' mrow_ref and the m1/m4 loads): each row group, per super-block, the rows' fp32
    scales, then their 16 int16 sub-block sums row after row, then their 256 codes row after row."""
    out, m = [], 0
    for g in row_groups(codes.shape[0]):
        for kb in range(codes.shape[1]):
            out += [scales[m:m + g, kb].tobytes(), sums[m:m + g, kb].tobytes(), codes[m:m + g, kb].tobytes()]
        m += g
    return b"".join(out)


def pack_2bit(codes: np.ndarray) -> bytes:
    """nrow_block_q*_k's qs for 32 columns of one super-block ((32, 256) values 0..3): per group g of 64 k,
    column ci, byte bi holds k = 64g + 16j + bi in bits 2j+1:2j, at offset g*512 + ci*16 + bi (ime_kernels.h)."""
    c = codes.astype(np.uint8).reshape(NB_COLS, 4, 4, SUB)          # ci, g, j, bi
    packed = c[:, :, 0] | c[:, :, 1] << 2 | c[:, :, 2] << 4 | c[:, :, 3] << 6
    return packed.transpose(1, 0, 2).tobytes()                     # g, ci, bi


def sub_block_dots(a_codes: np.ndarray, b_values: np.ndarray) -> np.ndarray:
    """(M, N, k_blks, 16): the exact integer dot product of every 16-code sub-block."""
    M, kb = a_codes.shape[:2]
    N = b_values.shape[0]
    return np.einsum("mbsk,nbsk->mnbs", a_codes.astype(np.int64).reshape(M, kb, SUBS, SUB),
                     b_values.astype(np.int64).reshape(N, kb, SUBS, SUB))


def fp16_block_sum(dots: np.ndarray, sub_scales: np.ndarray) -> np.ndarray:
    """What a chain of 16 vmadot*.hp computes per super-block (docs/ime2-isa.md §6.2): starting from +0, per
    sub-block s in order, H = fp16(H + fp16(fp16(dot_s) * scale_s)), every step rounded to nearest even.
    dots (M, N, kb, 16) int64, sub_scales (N, kb, 16) float16; returns (M, N, kb) float16."""
    H = np.zeros(dots.shape[:3], np.float16)
    with np.errstate(over="ignore", invalid="ignore"):
        for s in range(SUBS):
            H = H + dots[..., s].astype(np.float64).astype(np.float16) * sub_scales[None, :, :, s]
    return H


@dataclass(frozen=True)
class Q2KCase:
    """Q8_K A times Q2_K B (ggml's block_q2_K repacked into nrow_block_q2_k<32>: per column and super-block a
    4-bit scale and 4-bit zero point per sub-block, 2-bit codes, fp16 d and dmin):
    C[m][n] = sum over super-blocks of a_scale * (d * sum_s scale_s * dot_s + dmin * sum_s zp_s * a_sum_s),
    with a_sum_s the int16 sums stored with A (the kernel reads them; it does not sum the codes). llama.cpp's A
    quantizer stores minus the codes' sum (rvv_kernels.cpp), which makes this ggml's d * scale * q - dmin * zp;
    random() does the same."""
    a_codes: np.ndarray    # (M, kb, 256) int8
    a_scales: np.ndarray   # (M, kb) fp32
    a_sums: np.ndarray     # (M, kb, 16) int16
    b_codes: np.ndarray    # (N, kb, 256) 0..3
    b_sub_scales: np.ndarray  # (N, kb, 16) 0..15
    b_zps: np.ndarray      # (N, kb, 16) 0..15
    b_d: np.ndarray        # (N, kb) fp16
    b_dmin: np.ndarray     # (N, kb) fp16

    blk_len = QK_K

    @property
    def shape(self) -> tuple[int, int, int]:
        return self.a_codes.shape[0], self.b_codes.shape[0], self.a_codes.shape[1]

    @staticmethod
    def random(rng: np.random.Generator, M: int, N: int, kb: int) -> Q2KCase:
        a = rng.integers(-128, 128, (M, kb, QK_K)).astype(np.int8)
        return Q2KCase(a, rng.uniform(0.001, 0.02, (M, kb)).astype(np.float32),
                       -a.reshape(M, kb, SUBS, SUB).astype(np.int16).sum(axis=3, dtype=np.int16),
                       rng.integers(0, 4, (N, kb, QK_K)), rng.integers(0, 16, (N, kb, SUBS)),
                       rng.integers(0, 16, (N, kb, SUBS)),
                       rng.uniform(-0.02, 0.02, (N, kb)).astype(np.float16),
                       rng.uniform(0.0, 0.02, (N, kb)).astype(np.float16))

    def a_bytes(self) -> bytes:
        return q8k_a_bytes(self.a_codes, self.a_scales, self.a_sums)

    def b_bytes(self) -> bytes:
        """Per group of 32 columns and super-block, nrow_block_q2_k<32>: scales[512], whose low nibble at
        s*32 + ci is column ci's scale for sub-block s and whose high nibble at ci*16 + s is its zero point (the
        two are laid out transposed: repack.cpp, and both kernels read them so), qs[2048], scales16[32] (d),
        zeros16[32] (dmin)."""
        N, kb, _ = self.b_codes.shape
        out = []
        for n in range(0, N, NB_COLS):
            cols = slice(n, n + NB_COLS)
            for k in range(kb):
                lo = self.b_sub_scales[cols, k].T.reshape(-1).astype(np.uint8)
                hi = self.b_zps[cols, k].reshape(-1).astype(np.uint8)
                out += [(lo | hi << 4).tobytes(), pack_2bit(self.b_codes[cols, k]),
                        self.b_d[cols, k].tobytes(), self.b_dmin[cols, k].tobytes()]
        return b"".join(out)

    def zero_point_sums(self) -> np.ndarray:
        """(M, N, kb): sum_s zp_s * a_sum_s, exact."""
        return np.einsum("mbs,nbs->mnb", self.a_sums.astype(np.int64), self.b_zps.astype(np.int64))

    def reference(self, *, fp16: bool = True) -> tuple[np.ndarray, np.ndarray]:
        """(C, bound) for the rows as the dispatcher takes them. m1 rows (gemm_kernel_i8i2k_m1): the integer
        sum_s scale_s * dot_s and the zero-point sum are exact in int32 and in the fp32 they are converted to.
        m4 rows (gemm_kernel_i8i2k_m4): the scaled sub-block dots accumulate in FP16 through vmadotsu.hp with
        scale_s' = fp16(fp16(scale_s * d) / 16), and the sum is multiplied back by 16 (fp16 = False: the same
        without any FP16 rounding, to show that the check can tell). bound = sum over super-blocks of the
        magnitudes of the fp32 terms."""
        dots = sub_block_dots(self.a_codes, self.b_codes)
        Z = self.zero_point_sums().astype(np.float64)
        d, dmin = self.b_d.astype(np.float64)[None], self.b_dmin.astype(np.float64)[None]
        a_scale = self.a_scales.astype(np.float64)[:, None, :]
        exact = np.einsum("mnbs,nbs->mnb", dots, self.b_sub_scales.astype(np.int64)).astype(np.float64) * d
        if fp16:
            sub = (self.b_sub_scales.astype(np.float16) * self.b_d[:, :, None]) * np.float16(1 / 16)
            hp = 16 * fp16_block_sum(dots, sub).astype(np.float64)
        else:
            hp = exact
        main = np.where(m4_rows(self.a_codes.shape[0])[:, None, None], hp, exact)
        terms = a_scale * (main + dmin * Z)
        bound = np.abs(a_scale) * (np.abs(main) + np.abs(dmin * Z))
        return terms.sum(axis=2), bound.sum(axis=2)


@dataclass(frozen=True)
class Q3KCase:
    """Q8_K A times Q3_K B (ggml's block_q3_K repacked into nrow_block_q3_k<32>: per column and super-block an
    int8 scale per sub-block (ggml's 6-bit scale - 32), codes q - 4 * (1 - h) in -4..3 from 2-bit q and a high
    bit h, fp16 d): C[m][n] = sum over super-blocks of a_scale * d * sum_s scale_s * dot_s. The A sums are
    stored but unused."""
    a_codes: np.ndarray       # (M, kb, 256) int8
    a_scales: np.ndarray      # (M, kb) fp32
    b_low: np.ndarray         # (N, kb, 256) 0..3
    b_high: np.ndarray        # (N, kb, 256) 0/1
    b_sub_scales: np.ndarray  # (N, kb, 16) -32..31
    b_d: np.ndarray           # (N, kb) fp16

    blk_len = QK_K

    @property
    def shape(self) -> tuple[int, int, int]:
        return self.a_codes.shape[0], self.b_low.shape[0], self.a_codes.shape[1]

    @staticmethod
    def random(rng: np.random.Generator, M: int, N: int, kb: int) -> Q3KCase:
        return Q3KCase(rng.integers(-128, 128, (M, kb, QK_K)).astype(np.int8),
                       rng.uniform(0.001, 0.02, (M, kb)).astype(np.float32),
                       rng.integers(0, 4, (N, kb, QK_K)), rng.integers(0, 2, (N, kb, QK_K)),
                       rng.integers(-32, 32, (N, kb, SUBS)), rng.uniform(-0.02, 0.02, (N, kb)).astype(np.float16))

    def b_values(self) -> np.ndarray:
        return self.b_low.astype(np.int64) - 4 * (1 - self.b_high.astype(np.int64))

    def a_bytes(self) -> bytes:
        M, kb, _ = self.a_codes.shape
        sums = np.random.default_rng(2).integers(-2**15, 2**15, (M, kb, SUBS)).astype(np.int16)  # unused: random
        return q8k_a_bytes(self.a_codes, self.a_scales, sums)

    def b_bytes(self) -> bytes:
        """Per group of 32 columns and super-block, nrow_block_q3_k<32>: scales[512] (int8 at s*32 + ci),
        hmask[1024] (uint16 at s*32 + ci, bit i = h of code i of sub-block s), qs[2048], scales16[32] (d)."""
        N, kb, _ = self.b_low.shape
        bit = (1 << np.arange(SUB)).astype(np.uint16)
        out = []
        for n in range(0, N, NB_COLS):
            cols = slice(n, n + NB_COLS)
            for k in range(kb):
                hmask = (self.b_high[cols, k].reshape(NB_COLS, SUBS, SUB).astype(np.uint16) * bit).sum(
                    axis=2, dtype=np.uint16)
                out += [self.b_sub_scales[cols, k].T.astype(np.int8).tobytes(), hmask.T.astype("<u2").tobytes(),
                        pack_2bit(self.b_low[cols, k]), self.b_d[cols, k].tobytes()]
        return b"".join(out)

    def reference(self, *, fp16: bool = True) -> tuple[np.ndarray, np.ndarray]:
        """(C, bound) for the rows as the dispatcher takes them. m4 rows (gemm_kernel_i8i3k_m4: vmadot i8):
        sum_s scale_s * dot_s is exact in int32 (|.| <= 16 x 32 x 16 x 128 x 4) and in fp32. m1 rows
        (gemm_kernel_i8i3k_m1): vmadot.hp with scale_s' = fp16(fp16(scale_s) * fp16(d / 16)), accumulated in
        FP16 over the super-block, times fp32(a_scale * 16) (fp16 = False: without FP16 rounding)."""
        dots = sub_block_dots(self.a_codes, self.b_values())
        d = self.b_d.astype(np.float64)[None]
        a_scale = self.a_scales.astype(np.float64)[:, None, :]
        exact = np.einsum("mnbs,nbs->mnb", dots, self.b_sub_scales.astype(np.int64)).astype(np.float64) * d
        if fp16:
            sub = self.b_sub_scales.astype(np.float16) * (self.b_d * np.float16(1 / 16))[:, :, None]
            hp = 16 * fp16_block_sum(dots, sub).astype(np.float64)
        else:
            hp = exact
        main = np.where(m4_rows(self.a_codes.shape[0])[:, None, None], exact, hp)
        terms = a_scale * main
        return terms.sum(axis=2), np.abs(terms).sum(axis=2)


# ---------------------------------------------------------------- Q5_0 / Q5_1: data and the NumPy model

def q8_a_bytes(codes: np.ndarray, scales: np.ndarray, sums: np.ndarray) -> bytes:
    """Q8 A with one int16 sum per row and block of 32 (q8_blk_size(32, true)): each row group, per block, the
    rows' fp32 scales, their sums, then their codes row after row."""
    out, m = [], 0
    for g in row_groups(codes.shape[0]):
        for kb in range(codes.shape[1]):
            out += [scales[m:m + g, kb].tobytes(), sums[m:m + g, kb].tobytes(), codes[m:m + g, kb].tobytes()]
        m += g
    return b"".join(out)


@dataclass(frozen=True)
class Q5Case:
    """Q8 A times Q5 B (nrow_block_q5_0<32> or, with zero points, nrow_block_q5_1<32>: per column and block of 32
    an fp16 scale d, [a uint8 zero point z], 5-bit codes q = low nibble | high bit << 4, 0..31):
    C[m][n] = sum over blocks of a_scale * d * (dot(a, q) + z * a_sum), z = 16 for Q5_0, with a_sum the int16
    sum stored with A (gemm_kernel_i8i5_mrow_ref; the kernels add it as stored). llama.cpp's A quantizer
    stores minus the codes' sum, which makes this d * (q - z); random() does the same."""
    a_codes: np.ndarray   # (M, kb, 32) int8
    a_scales: np.ndarray  # (M, kb) fp32
    a_sums: np.ndarray    # (M, kb) int16
    b_codes: np.ndarray   # (N, kb, 32) 0..31
    b_d: np.ndarray       # (N, kb) fp16
    b_zps: np.ndarray | None  # (N, kb) uint8 for Q5_1, None for Q5_0

    blk_len = BLK_LEN

    @property
    def shape(self) -> tuple[int, int, int]:
        return self.a_codes.shape[0], self.b_codes.shape[0], self.a_codes.shape[1]

    @property
    def kernel(self) -> str:
        return "i8i5" if self.b_zps is None else "i8i5zp"

    @staticmethod
    def random(rng: np.random.Generator, M: int, N: int, kb: int, *, zero_points: bool) -> Q5Case:
        a = rng.integers(-128, 128, (M, kb, BLK_LEN)).astype(np.int8)
        return Q5Case(a, rng.uniform(0.001, 0.02, (M, kb)).astype(np.float32),
                      -a.astype(np.int16).sum(axis=2, dtype=np.int16), rng.integers(0, 32, (N, kb, BLK_LEN)),
                      rng.uniform(-0.02, 0.02, (N, kb)).astype(np.float16),
                      rng.integers(0, 256, (N, kb)).astype(np.uint8) if zero_points else None)

    def a_bytes(self) -> bytes:
        return q8_a_bytes(self.a_codes, self.a_scales, self.a_sums)

    def b_bytes(self) -> bytes:
        """Per group of 32 columns and block: scales16[32], [zp[32]], qh[128] (column ci's 32 high bits as a
        little-endian word at 4*ci, bit k for code k), qs[512] (byte ci*16 + i: code 2i low nibble, 2i+1 high)."""
        N, kb, _ = self.b_codes.shape
        bit = (1 << np.arange(BLK_LEN, dtype=np.uint64))
        out = []
        for n in range(0, N, NB_COLS):
            cols = slice(n, n + NB_COLS)
            for k in range(kb):
                q = self.b_codes[cols, k].astype(np.uint8)
                qh = ((q >> 4).astype(np.uint64) * bit).sum(axis=1).astype("<u4")
                qs = (q[:, 0::2] & 15) | (q[:, 1::2] & 15) << 4
                zp = b"" if self.b_zps is None else self.b_zps[cols, k].tobytes()
                out += [self.b_d[cols, k].tobytes(), zp, qh.tobytes(), qs.tobytes()]
        return b"".join(out)

    def reference(self) -> tuple[np.ndarray, np.ndarray]:
        """(C, bound): the integer block sums are exact in int32 and fp32 (|.| <= 32 x 128 x 31 + 255 x 32768);
        bound = sum of the fp32 terms' magnitudes."""
        dots = np.einsum("mbk,nbk->mnb", self.a_codes.astype(np.int64), self.b_codes.astype(np.int64))
        zps = np.full(self.b_d.shape, 16, np.int64) if self.b_zps is None else self.b_zps.astype(np.int64)
        acc = dots + zps[None] * self.a_sums.astype(np.int64)[:, None, :]
        terms = acc * self.a_scales.astype(np.float64)[:, None, :] * self.b_d.astype(np.float64)[None]
        return terms.sum(axis=2), np.abs(terms).sum(axis=2)


# ---------------------------------------------------------------- Q4_0: gemm_kernel_i8i4 (blocks of 32), gemm_kernel_i8i4_hp (256)

def pack_nibbles(codes: np.ndarray) -> np.ndarray:
    """Q4_0's qs as the kernels read them ((..., 2j) codes 0..15 -> (..., j) bytes): code 2j in bits 3:0 of byte j,
    code 2j+1 in bits 7:4 (gemm_kernel_i8i4_mrow_ref's b0 = b & 0x0F, b1 = b >> 4)."""
    c = codes.astype(np.uint8)
    return c[..., 0::2] | c[..., 1::2] << 4


def split_dots(a_codes: np.ndarray, b_codes: np.ndarray, sub: int) -> tuple[np.ndarray, np.ndarray]:
    """(hi, lo), each (M, N, blocks): the exact dots of B's codes with A's high nibbles (a >> 4, signed -8..7) and
    low nibbles (a & 15, 0..15) per run of `sub` codes: the kernels split A so (vsrl + vnpack4, vmadotsu /
    vmadotu i4), and a = 16 * hi + lo."""
    M, N = a_codes.shape[0], b_codes.shape[0]
    a = a_codes.astype(np.int64).reshape(M, -1, sub)
    b = b_codes.astype(np.int64).reshape(N, -1, sub)
    return np.einsum("mbk,nbk->mnb", a >> 4, b), np.einsum("mbk,nbk->mnb", a & 15, b)


def hp_step(H: np.ndarray, dot: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """One vmadot*.hp cell (docs/ime2-isa.md §6.2): fp16(H + fp16(fp16(dot) * scale)), each step rounded."""
    with np.errstate(over="ignore", invalid="ignore"):
        return H + dot.astype(np.float64).astype(np.float16) * scale


@dataclass(frozen=True)
class Q40Case:
    """Q8 A (per row and block of 32: fp32 scale, int16 sum, int8 codes) times Q4_0 B (per column and block: fp16
    scale d, codes q 0..15): C = sum over blocks of a_scale * d * (dot(a, q) + 8 * a_sum), a_sum stored with A
    (gemm_kernel_i8i4_mrow_ref; llama.cpp's quantizer stores minus the codes' sum, making it d * (q - 8);
    random() does the same). What the kernels compute (m1 and m4 alike): H = fp16(int16(8 * a_sum)) in an FP16
    .hp tile, then vmadotsu.hp with A's high nibbles at scale 16 and vmadotu.hp with its low nibbles at scale 1
    (hp_step each), then a_scale * (d * H) in fp32."""
    a_codes: np.ndarray   # (M, kb, 32) int8
    a_scales: np.ndarray  # (M, kb) fp32
    a_sums: np.ndarray    # (M, kb) int16
    b_codes: np.ndarray   # (N, kb, 32) 0..15
    b_d: np.ndarray       # (N, kb) fp16

    blk_len = BLK_LEN
    kernel = "i8i4"

    @property
    def shape(self) -> tuple[int, int, int]:
        return self.a_codes.shape[0], self.b_codes.shape[0], self.a_codes.shape[1]

    @staticmethod
    def random(rng: np.random.Generator, M: int, N: int, kb: int, *, extreme: bool = False) -> Q40Case:
        """Random codes, or (extreme) A codes at -127/127 (llama.cpp's quantizer never writes -128: its scale is
        max / 127) and B codes at 0/15: the FP16 tile then reaches about 60000, and fp16(dot) rounds."""
        if extreme:
            a = np.where(rng.random((M, kb, BLK_LEN)) < 0.5, -127, 127).astype(np.int8)
            b = np.where(rng.random((N, kb, BLK_LEN)) < 0.5, 0, 15)
        else:
            a = rng.integers(-127, 128, (M, kb, BLK_LEN)).astype(np.int8)
            b = rng.integers(0, 16, (N, kb, BLK_LEN))
        return Q40Case(a, rng.uniform(0.001, 0.02, (M, kb)).astype(np.float32),
                       -a.astype(np.int16).sum(axis=2, dtype=np.int16), b,
                       rng.uniform(-0.02, 0.02, (N, kb)).astype(np.float16))

    def a_bytes(self) -> bytes:
        return q8_a_bytes(self.a_codes, self.a_scales, self.a_sums)

    def b_bytes(self) -> bytes:
        """Per group of 32 columns and block: the 32 fp16 scales, then column ci's 16 bytes at ci * 16."""
        N, kb, _ = self.b_codes.shape
        out = []
        for n in range(0, N, NB_COLS):
            for k in range(kb):
                out += [self.b_d[n:n + NB_COLS, k].tobytes(), pack_nibbles(self.b_codes[n:n + NB_COLS, k]).tobytes()]
        return b"".join(out)

    def reference(self) -> tuple[np.ndarray, np.ndarray]:
        """(C, bound): the FP16 part step by step (the int16 product 8 * a_sum as the kernel's e16 vmul/vsll
        forms it), the fp32 part in float64; bound = sum of the fp32 terms' magnitudes."""
        hi, lo = split_dots(self.a_codes, self.b_codes, BLK_LEN)
        zp = (8 * self.a_sums.astype(np.int64)).astype(np.int16)          # (M, kb), wraps like the kernel
        H = np.broadcast_to(zp.astype(np.float64).astype(np.float16)[:, None, :], hi.shape)
        H = hp_step(hp_step(H, hi, np.float16(16)), lo, np.float16(1))
        terms = self.a_scales.astype(np.float64)[:, None, :] * (self.b_d.astype(np.float64)[None] * H)
        return terms.sum(axis=2), np.abs(terms).sum(axis=2)


HP_SUPER = 256  # gemm_kernel_i8i4_hp's K block: 8 sub-blocks of 32 codes
HP_SUBS = 8


@dataclass(frozen=True)
class Q40HPCase:
    """Q8 HP A times Q4_0 B in 256-code super-blocks (gemm_kernel_i8i4_hp, which llama.cpp takes when K is a
    multiple of 256). A per row group (4 rows for _m4, else 1) and super-block, as quantize_a_*row_i8_hp writes
    it: 8 x (the group's fp16 sub-block scales, its rows' 32 codes each), then the rows' fp16 sums [row][8]
    (fp16(fp16(-sum) * 8)), then the rows' fp16 scale_avg. Only the group's first row's scales are read (the
    4-row quantizer shares one scale per sub-block; mrow_ref reads a_scale_row[0] and a_scale_avg_row[0]).
    B per column and sub-block: fp16 d and 32 codes 0..15.

    Per super-block and cell: s = fp16(d * a_scale), s16 = s times 16 (m1: fp16(s * 16); m4: fp16(d * fp16(a_scale
    * 16))); per sub-block, in order, the fp32 term avg * fp16(s * a_sum) and the FP16 tile H += high-nibble dot
    at s16, then low-nibble dot at s (hp_step); at the end the fp32 term avg * H."""
    a_codes: np.ndarray       # (M, kb, 256) int8
    a_sub_scales: np.ndarray  # (M, kb, 8) fp16 (a group reads its first row's)
    a_sums: np.ndarray        # (M, kb, 8) fp16
    a_avg: np.ndarray         # (M, kb) fp16 (a group reads its first row's)
    b_codes: np.ndarray       # (N, kb, 256) 0..15
    b_d: np.ndarray           # (N, kb, 8) fp16

    blk_len = HP_SUPER
    kernel = "i8i4hp"

    @property
    def shape(self) -> tuple[int, int, int]:
        return self.a_codes.shape[0], self.b_codes.shape[0], self.a_codes.shape[1]

    @staticmethod
    def random(rng: np.random.Generator, M: int, N: int, kb: int, *, extreme: bool = False) -> Q40HPCase:
        if extreme:
            a = np.where(rng.random((M, kb, HP_SUPER)) < 0.5, -127, 127).astype(np.int8)
            b = np.where(rng.random((N, kb, HP_SUPER)) < 0.5, 0, 15)
        else:
            a = rng.integers(-127, 128, (M, kb, HP_SUPER)).astype(np.int8)
            b = rng.integers(0, 16, (N, kb, HP_SUPER))
        sums = -a.astype(np.int64).reshape(M, kb, HP_SUBS, 32).sum(axis=3)
        return Q40HPCase(a, rng.uniform(0.5, 1.5, (M, kb, HP_SUBS)).astype(np.float16),
                         sums.astype(np.float16) * np.float16(8), rng.uniform(0.001, 0.02, (M, kb)).astype(np.float16),
                         b, rng.uniform(-0.02, 0.02, (N, kb, HP_SUBS)).astype(np.float16))

    def a_bytes(self) -> bytes:
        out, m = [], 0
        for g in row_groups(self.a_codes.shape[0]):
            rows = slice(m, m + g)
            for kb in range(self.a_codes.shape[1]):
                for s in range(HP_SUBS):
                    out += [self.a_sub_scales[rows, kb, s].tobytes(),
                            self.a_codes[rows, kb, 32 * s:32 * s + 32].tobytes()]
                out += [self.a_sums[rows, kb].tobytes(), self.a_avg[rows, kb].tobytes()]
            m += g
        return b"".join(out)

    def b_bytes(self) -> bytes:
        N, kb, _ = self.b_codes.shape
        out = []
        for n in range(0, N, NB_COLS):
            cols = slice(n, n + NB_COLS)
            for k in range(kb):
                for s in range(HP_SUBS):
                    out += [self.b_d[cols, k, s].tobytes(),
                            pack_nibbles(self.b_codes[cols, k, 32 * s:32 * s + 32]).tobytes()]
        return b"".join(out)

    def leaders(self) -> np.ndarray:
        """(M,) the first row of each row's group: whose scales the kernel reads."""
        groups = row_groups(self.a_codes.shape[0])
        return np.repeat(np.cumsum([0] + groups[:-1]), groups)

    def reference(self) -> tuple[np.ndarray, np.ndarray]:
        M, kb = self.a_codes.shape[:2]
        lead = self.leaders()
        m4 = m4_rows(M)[:, None, None]
        a_s = self.a_sub_scales[lead][:, None]                       # (M, 1, kb, 8)
        d = self.b_d[None]                                           # (1, N, kb, 8)
        s = d * a_s                                                  # fp16 products
        with np.errstate(over="ignore"):
            s16 = np.where(m4[..., None], d * (a_s * np.float16(16)), s * np.float16(16))
        hi, lo = split_dots(self.a_codes, self.b_codes, 32)          # (M, N, kb * 8)
        hi, lo = hi.reshape(*hi.shape[:2], kb, HP_SUBS), lo.reshape(*lo.shape[:2], kb, HP_SUBS)
        avg = self.a_avg[lead].astype(np.float64)[:, None, :]        # (M, 1, kb)
        H = np.zeros(hi.shape[:3], np.float16)
        zp_terms = []
        for k in range(HP_SUBS):
            with np.errstate(over="ignore"):
                z = s[..., k] * self.a_sums[:, None, :, k]
            zp_terms.append(avg * z.astype(np.float64))
            H = hp_step(hp_step(H, hi[..., k], s16[..., k]), lo[..., k], s[..., k])
        terms = np.stack(zp_terms + [avg * H.astype(np.float64)])   # (9, M, N, kb)
        return terms.sum(axis=(0, 3)), np.abs(terms).sum(axis=(0, 3))


def error_units(run: PeerRun, reference: tuple[np.ndarray, np.ndarray]) -> float:
    """max |C - model| in units of 1e-5 x the sum of the fp32 terms' magnitudes."""
    want, bound = reference
    return float((np.abs(run.C.astype(np.float64) - want) / (1e-5 * bound + 1e-30)).max())


def q40_definition(case: Q40Case | Q40HPCase) -> np.ndarray:
    """What the kernels approximate: the product of the dequantized matrices in float64, A = a_scale * code (HP:
    the group's scale_avg x its sub-block scale x code), B = d * (q - 8). The models above differ from it by
    the kernels' FP16 rounding only (and, for HP, the fp16 rounding of the stored sums)."""
    M, N = case.shape[:2]
    if isinstance(case, Q40Case):
        A = case.a_codes.astype(np.float64) * case.a_scales.astype(np.float64)[:, :, None]
        B = case.b_d.astype(np.float64)[:, :, None] * (case.b_codes - 8)
        return A.reshape(M, -1) @ B.reshape(N, -1).T
    lead = case.leaders()
    a_scale = case.a_avg[lead].astype(np.float64)[:, :, None] * case.a_sub_scales[lead].astype(np.float64)
    A = case.a_codes.astype(np.float64).reshape(M, -1, HP_SUBS, 32) * a_scale[..., None]
    B = case.b_d.astype(np.float64)[..., None] * (case.b_codes.reshape(N, -1, HP_SUBS, 32) - 8)
    return A.reshape(M, -1) @ B.reshape(N, -1).T


# ---------------------------------------------------------------- MoE: moe_m2_gemm_kernel_i8i4, moe_m2_gemm_kernel_i8i5

@dataclass(frozen=True)
class MoECall:
    """One call of ime.cpp's expert walk: two (token, slot) rows through moe_m2_gemm_kernel_* (`pair`), or the
    row left over through gemm_kernel_* with count_m 1 (its m1 path)."""
    expert: int
    tokens: tuple[int, ...]  # A rows (1 or 2)
    outs: tuple[int, ...]    # C rows: token * slots + slot


def moe_walk(ids: np.ndarray) -> tuple[MoECall, ...]:
    """ime.cpp's MUL_MAT_ID walk for one thread: per expert in order, the (token, slot) rows routed to it in
    token order, two at a time through the m2 kernel, an odd last one through the expert's gemm_kernel."""
    tokens, slots = ids.shape
    calls = []
    for e in np.unique(ids):
        rows = [(t, s) for t in range(tokens) for s in range(slots) if ids[t, s] == e]
        for i in range(0, len(rows) - 1, 2):
            (t0, s0), (t1, s1) = rows[i], rows[i + 1]
            calls.append(MoECall(int(e), (t0, t1), (t0 * slots + s0, t1 * slots + s1)))
        if len(rows) % 2:
            t, s = rows[-1]
            calls.append(MoECall(int(e), (t,), (t * slots + s,)))
    return tuple(calls)


@dataclass(frozen=True)
class MoECase:
    """A MUL_MAT_ID: each token's Q8 A row (per block of 32: fp32 scale, int16 sum, int8 codes, as
    quantize_a_row_i8 writes it) times the B of each expert its slots select (`ids`, distinct per token), one C
    row per token and slot. B per expert, column and block: fp16 d, [a uint8 zero point z], codes q: 4-bit
    (Q4_0, or Q4_1 / Q4_K with z) or 5-bit (Q5_0, Q5_1 with z). What the kernels compute per block, their
    scalar references (moe_gemm_kernel_i8i{4,5}_mrow_ref) a_scale * d * (dot(a, q) + z * a_sum), z = 8 (Q4_0)
    or 16 (Q5_0) without zero points; llama.cpp's quantizer stores a_sum = minus the codes' sum, making it
    d * (q - z). The 5-bit kernels form the integer sum exactly; the 4-bit ones go through FP16 .hp tiles
    (reference())."""
    a_codes: np.ndarray   # (T, kb, 32) int8
    a_scales: np.ndarray  # (T, kb) fp32
    a_sums: np.ndarray    # (T, kb) int16
    b_codes: np.ndarray   # (E, N, kb, 32) 0..15 or 0..31
    b_d: np.ndarray       # (E, N, kb) fp16
    b_zps: np.ndarray | None  # (E, N, kb) uint8, or None
    ids: np.ndarray       # (T, slots) expert of each token's slot
    bits: int             # 4 or 5

    blk_len = BLK_LEN

    @property
    def shape(self) -> tuple[int, int, int]:
        """(C rows, N, K blocks)."""
        return self.ids.size, self.b_codes.shape[1], self.a_codes.shape[1]

    @property
    def kernel(self) -> str:
        return f"moe_i8i{self.bits}" + ("" if self.b_zps is None else "zp")

    @staticmethod
    def random(rng: np.random.Generator, tokens: int, N: int, kb: int, experts: int, slots: int, *, bits: int,
               zero_points: bool, extreme: bool = False) -> MoECase:
        """Random routing (each token's slots distinct experts) and random codes, or (extreme) A codes -127/127
        (llama.cpp's quantizer never writes -128), B codes at both ends, zero points at both ends (Q4_1: 0..15,
        repack's clamp; Q5_1: 0..255)."""
        E, top = experts, 2 ** bits
        if extreme:
            a = np.where(rng.random((tokens, kb, BLK_LEN)) < 0.5, -127, 127).astype(np.int8)
            b = np.where(rng.random((E, N, kb, BLK_LEN)) < 0.5, 0, top - 1)
        else:
            a = rng.integers(-127, 128, (tokens, kb, BLK_LEN)).astype(np.int8)
            b = rng.integers(0, top, (E, N, kb, BLK_LEN))
        zp_top = 16 if bits == 4 else 256
        zps = None
        if zero_points:
            zps = (np.where(rng.random((E, N, kb)) < 0.5, 0, zp_top - 1) if extreme
                   else rng.integers(0, zp_top, (E, N, kb))).astype(np.uint8)
        ids = np.stack([rng.permutation(E)[:slots] for _ in range(tokens)])
        return MoECase(a, rng.uniform(0.001, 0.02, (tokens, kb)).astype(np.float32),
                       -a.astype(np.int16).sum(axis=2, dtype=np.int16), b,
                       rng.uniform(-0.02, 0.02, (E, N, kb)).astype(np.float16), zps, ids, bits)

    def calls(self) -> tuple[MoECall, ...]:
        return moe_walk(self.ids)

    def calls_text(self) -> str:
        lines = [" ".join(map(str, (len(c.tokens), c.expert, *c.tokens, *c.outs))) for c in self.calls()]
        return "\n".join(lines) + "\n"

    def a_bytes(self) -> bytes:
        """Token after token, each row's blocks: fp32 scale, int16 sum, 32 codes (q8_blk_size(32, true))."""
        T, kb, _ = self.a_codes.shape
        return b"".join(self.a_scales[t, k].tobytes() + self.a_sums[t, k].tobytes() + self.a_codes[t, k].tobytes()
                        for t in range(T) for k in range(kb))

    def b_bytes(self) -> bytes:
        """Expert after expert, each as its gemm_kernel reads it: per group of 32 columns and block, 4-bit: the 32
        fp16 scales, [32 zero points], column ci's 16 bytes of nibbles at ci * 16; 5-bit: nrow_block_q5_0/1<32>
        (Q5Case.b_bytes)."""
        out = []
        for e in range(self.b_codes.shape[0]):
            zps = None if self.b_zps is None else self.b_zps[e]
            if self.bits == 5:
                out.append(Q5Case(self.a_codes, self.a_scales, self.a_sums, self.b_codes[e], self.b_d[e],
                                  zps).b_bytes())
                continue
            for n in range(0, self.b_codes.shape[1], NB_COLS):
                cols = slice(n, n + NB_COLS)
                for k in range(self.b_codes.shape[2]):
                    out += [self.b_d[e, cols, k].tobytes(), b"" if zps is None else zps[cols, k].tobytes(),
                            pack_nibbles(self.b_codes[e, cols, k]).tobytes()]
        return b"".join(out)

    def single_rows(self) -> np.ndarray:
        """(C rows,) bool: the rows the walk leaves to gemm_kernel's m1 path."""
        single = np.zeros(self.ids.size, bool)
        for c in self.calls():
            if len(c.outs) == 1:
                single[c.outs[0]] = True
        return single

    def expert_terms(self, e: int, single: np.ndarray) -> np.ndarray:
        """(T, N, kb) the fp32 terms every token would add with expert e's B, through the m2 kernel or, where
        `single` (T,), gemm_kernel's m1 path."""
        a_scale = self.a_scales.astype(np.float64)[:, None, :]
        d = self.b_d[e].astype(np.float64)[None]
        a_sum = self.a_sums.astype(np.int64)[:, None, :]
        zp = None if self.b_zps is None else self.b_zps[e].astype(np.int64)[None]
        if self.bits == 5:
            # moe_m2 and m1 alike: the integer sum dot + z * a_sum, exact in int32 and fp32.
            dots = np.einsum("tbk,nbk->tnb", self.a_codes.astype(np.int64), self.b_codes[e].astype(np.int64))
            return a_scale * d * (dots + (16 if zp is None else zp) * a_sum)
        hi, lo = split_dots(self.a_codes, self.b_codes[e], BLK_LEN)
        if zp is None:
            # Both paths: the .hp tile starts at fp16(int16(8 * a_sum)) (e16 shift or multiply), then the
            # high nibbles at scale 16 and the low ones at 1; then a_scale * (d * H) in fp32 (as Q40Case).
            start = (8 * a_sum).astype(np.int16).astype(np.float64).astype(np.float16)
            H = hp_step(hp_step(np.broadcast_to(start, hi.shape), hi, np.float16(16)), lo, np.float16(1))
            return a_scale * (d * H.astype(np.float64))
        # Zero points: the tile starts at +0; the m2 kernel adds z * a_sum as an exact int32 in fp32, the m1
        # path (gemm_kernel_i8i4_m1) forms it in int16 (e16 vmul: it wraps) and converts it to fp16.
        H = hp_step(hp_step(np.zeros(hi.shape, np.float16), hi, np.float16(16)), lo, np.float16(1))
        zsum = zp * a_sum
        m1_zsum = zsum.astype(np.int16).astype(np.float64).astype(np.float16).astype(np.float64)
        zsum = np.where(single[:, None, None], m1_zsum, zsum)
        return a_scale * d * (H.astype(np.float64) + zsum)

    def reference(self) -> tuple[np.ndarray, np.ndarray]:
        """(C, bound): C row t * slots + s from token t's terms with expert ids[t, s], summed over blocks;
        bound = the sum of those terms' magnitudes."""
        T, slots = self.ids.shape
        single = self.single_rows().reshape(T, slots)
        C = np.zeros((T, slots, self.b_codes.shape[1]))
        bound = np.zeros_like(C)
        for e in np.unique(self.ids):
            for s in range(slots):
                rows = self.ids[:, s] == e
                if rows.any():
                    terms = self.expert_terms(int(e), single[:, s])[rows]
                    C[rows, s], bound[rows, s] = terms.sum(axis=2), np.abs(terms).sum(axis=2)
        return C.reshape(T * slots, -1), bound.reshape(T * slots, -1)

    def definition(self) -> np.ndarray:
        """What the kernels approximate: the dequantized product in float64 (A = a_scale * code, B = d * (q - z)),
        which the models above differ from by FP16 rounding only (for the 4-bit kernels)."""
        T, slots = self.ids.shape
        A = (self.a_codes.astype(np.float64) * self.a_scales.astype(np.float64)[:, :, None]).reshape(T, -1)
        z = (8 if self.bits == 4 else 16) if self.b_zps is None else self.b_zps.astype(np.float64)[..., None]
        B = self.b_d.astype(np.float64)[..., None] * (self.b_codes - z)          # (E, N, kb, 32)
        C = np.stack([A[t] @ B[self.ids[t, s]].reshape(B.shape[1], -1).T for t in range(T) for s in range(slots)])
        return C
