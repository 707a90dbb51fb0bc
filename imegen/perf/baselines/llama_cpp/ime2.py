"""The peer check of imegen's IME2 emulator (runtime/ime2_emu.c) against SpacemiT's own IME2 kernels:
llama.cpp's `ime2_kernels.cpp` from the llama-cpp-python sdist (source.py; nothing of it enters the
repository), built at test time by clang-19 with ime2_driver.cpp, run under qemu-riscv64 at VLEN 1024 with
the emulator installed, its results compared with a NumPy model of what the kernel computes (its scalar
reference `gemm_kernel_*_mrow_ref` in the same file states it), computed from the input bytes alone.

Build-time translation (translate): the vendor mnemonics become `.word`s from imegen's IME2 encoders:
`vmadot{,u,su,us} ..., i8|i4` and `vmadot{,u,su,us}.hp ..., v0|v1, imm3, i8|i4` (targets/ime2/encoding.py)
and `vpack.vv` / `vupack.vv` (encode_pack, spec §8.6.1). The one form the emulator does not run,
`vnpack4.vv` (its semantics are not fixed by the spec: docs/ime2-isa.md §9), becomes `unimp`: the kernels
that use it are compiled but never called (OUT_OF_SCOPE), and would die by SIGILL if they were. Policy-less
`vsetvli` lines get `, tu, mu` (clang-19 requires a policy), as for IME1.

Which kernel needs what (the live code of ime2_kernels.cpp; docs/ime2-isa.md §9): every one of them lays
out operands or results with vpack/vupack, so the emulator runs those two as well. Checked here: i8i8
(`gemm_kernel_i8i8`: Q8 weights, vmadot i8 + vpack + vupack; its m4 and m1 paths)."""

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

# Entry points that need an instruction the emulator does not run (the dispatcher's live paths).
OUT_OF_SCOPE = {
    "gemm_kernel_i8i4": "vnpack4.vv (m1, m4)",
    "gemm_kernel_i8i4_hp": "vnpack4.vv",
    "moe_m2_gemm_kernel_i8i4": "vnpack4.vv",
}

_PACK_SIGN = {"": "ss", "u": "uu", "su": "su", "us": "us"}


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
    unimp: int    # the form the emulator does not run (vnpack4.vv), made `unimp`
    vsetvli: int  # policies added


def translate(text: str) -> Translation:
    """ime2_kernels.cpp with its IME2 mnemonics as `.word` (or `unimp`) and every vsetvli with a policy."""
    def vmadot(m: re.Match) -> str:
        word = encode_vmadot(int(m[2]), int(m[3]), int(m[4]), signedness=_PACK_SIGN[m[1]], dtype=m[5])
        return f".word 0x{word:08x}"

    def vmadot_hp(m: re.Match) -> str:
        word = encode_vmadot_hp(int(m[2]), int(m[3]), int(m[4]), scale=int(m[5]), imm3=int(m[6]),
                                signedness=_PACK_SIGN[m[1]], dtype=m[7])
        return f".word 0x{word:08x}"

    def pack(m: re.Match) -> str:
        return f".word 0x{encode_pack(int(m[2]), int(m[3]), int(m[4]), int(m[5]), unpack=m[1] == 'u'):08x}"

    text, n_unimp = re.subn(r"\bvnpack4\.vv\s+v\d+(?:\s*,\s*(?:v\d+|\d+))+", "unimp", text)
    text, n_hp = re.subn(r"\bvmadot(u|su|us|)\.hp\s+v(\d+),\s*v(\d+),\s*v(\d+),\s*v([01]),\s*(\d),\s*(i8|i4)\b",
                         vmadot_hp, text)
    text, n_vmadot = re.subn(r"\bvmadot(u|su|us|)\s+v(\d+),\s*v(\d+),\s*v(\d+),\s*(i8|i4)\b", vmadot, text)
    text, n_pack = re.subn(r"\bv(u?)pack\.vv\s+v(\d+),\s*v(\d+),\s*v(\d+),\s*(\d)\b", pack, text)
    left = re.search(r"\b(?:v\w*madot|v\w*pack)\w*(?:\.\w+)?\s+v\d+", text)
    if left:
        raise ToolchainError(f"ime2_kernels.cpp: an IME2 instruction the translation does not handle: {left[0]!r}", [])
    text, n_vset = re.subn(r"(vseti?vli\s+[\w%\[\]]+,\s*[\w%\[\]]+,\s*e\d+,\s*m?f?\d+)(\s*\\n)", r"\1, tu, mu\2", text)
    return Translation(text, n_vmadot, n_hp, n_pack, n_unimp, n_vset)


def build(log=None) -> Path:
    """The driver linked with the translated ime2_kernels.cpp and the IME2 emulator (cached)."""
    ggml = sources(log)
    spacemit = ggml / SPACEMIT
    tr = translate((spacemit / "ime2_kernels.cpp").read_text())
    inputs = cache.Inputs(files=(DRIVER, *toolchain.runtime_files()),
                          strings=(SDIST_SHA256, tr.text, MARCH), tools=(toolchain.CLANG,))

    def fill(d: Path) -> None:
        if log:
            log("llama.cpp: building ime2_kernels.cpp and the IME2 driver (clang-19)")
        (d / "ime2_kernels.cpp").write_text(tr.text)
        cxx = [toolchain.CLANG.replace("clang", "clang++"), "--target=riscv64-linux-gnu", "--gcc-toolchain=/usr",
               f"-march={MARCH}", "-O2", "-std=c++20", "-DRISCV64_SPACEMIT_IME2",
               *[f"-isystem{p}" for p in (spacemit, ggml / "include", ggml / "src", ggml / "src/ggml-cpu")],
               f"-I{toolchain.RUNTIME_DIR}"]
        objs = [d / "ime2_kernels.o", d / "driver.o", d / "ime2_emu.o"]
        _run([*cxx, "-c", str(d / "ime2_kernels.cpp"), "-o", str(objs[0])], "compiling ime2_kernels.cpp")
        _run([*cxx, "-Wall", "-Wextra", "-Werror", "-c", str(DRIVER), "-o", str(objs[1])], "compiling the driver")
        # rv64gc: the emulator's C code must not touch the live vector registers.
        toolchain.compile_c([toolchain.RUNTIME_DIR / "ime2_emu.c"], objs[2], march="rv64gc")
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


def run_i8i8(exe: Path, case: I8I8Case, work: Path) -> PeerRun:
    """Run llama.cpp's gemm_kernel_i8i8 on `case` under QEMU at VLEN 1024 with the IME2 emulator."""
    M, k_blks, _ = case.a_codes.shape
    N = case.b_codes.shape[0]
    if N % NB_COLS:
        raise ValueError(f"N = {N}: gemm_kernel_i8i8_m4 stores whole groups of {NB_COLS} columns")
    work.mkdir(parents=True, exist_ok=True)
    (work / "a.bin").write_bytes(case.a_bytes())
    (work / "b.bin").write_bytes(case.b_bytes())
    cmd = [toolchain.QEMU, "-L", str(toolchain.SYSROOT), "-cpu", toolchain.qemu_cpu(VLEN), str(exe),
           "i8i8", str(M), str(N), str(k_blks), str(BLK_LEN), str(work)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        raise ToolchainError("llama.cpp IME2 driver failed", cmd, proc.returncode, proc.stdout, proc.stderr)
    lines = proc.stdout.split("\n")
    rows = tuple(int(x.split()[1]) for x in lines if x.startswith("rows "))
    emulated = int(next(x for x in lines if x.startswith("emulated ")).split()[1])
    C = np.fromfile(work / "c.bin", dtype=np.float32).reshape(M, N)
    return PeerRun(C, rows, emulated)


def max_error(run: PeerRun, case: I8I8Case) -> float:
    """max |C - reference| in units of 1e-5 x sum|terms| (fp32 accumulation of fp32-converted block dots)."""
    want, bound = case.reference()
    return float((np.abs(run.C.astype(np.float64) - want) / (1e-5 * bound + 1e-30)).max())
