"""imegen's IME2 emulator against SpacemiT's own IME2 kernels: llama.cpp's ime2_kernels.cpp (sdist, built at
test time, mnemonics translated to .word by imegen's encoders) run under QEMU at VLEN 1024 with
runtime/ime2_emu.c, compared with a NumPy model of what the kernel computes (its mrow_ref), built from the
input bytes alone. docs/ime2-isa.md §9."""

import re

import numpy as np
import pytest

from imegen import toolchain
from imegen.perf.baselines.llama_cpp import ime2, source
from imegen.targets.ime2.encoding import decode

NEEDS_TOOLS = pytest.mark.skipif(bool(toolchain.missing_tools()), reason="needs the cross toolchains and qemu-riscv64")


def test_pack_encoding_matches_llvm():
    # smt.vpack.vv v2, v4, v5, 1 and smt.vupack.vv v2, v4, v5, 1 (LLVM's xsmtvdotii-valid.s)
    assert ime2.encode_pack(2, 4, 5, 1, unpack=False) == 0x6652112B
    assert ime2.encode_pack(2, 4, 5, 1, unpack=True) == 0x6652512B
    with pytest.raises(ValueError):
        ime2.encode_pack(3, 4, 5, 1, unpack=False)  # vd is a pair: even


def test_translation():
    text = ('"vmadotsu       v20, v2, v8, i8         \\n\\t"\n"vmadotu v4, v12, v9, i4\\n\\t"\n'
            '"vupack.vv      v24, v4, v5, 1          \\n\\t"\n"vpack.vv v16, v24, v26,3\\n\\t"\n'
            '"vmadotsu.hp    v16, v2, v8, v0, 3, i4  \\n\\t"\n"vnpack4.vv v1, v2, v3, 3\\n\\t"\n'
            '"vsetvli      t0, x0, e8, mf2         \\n\\t"\n"vsetivli t0, 4, e16, m1, ta, ma\\n\\t"\n')
    tr = ime2.translate(text)
    words = [int(w, 16) for w in re.findall(r"\.word 0x([0-9a-f]{8})", tr.text)]
    assert decode(words[0])["mnemonic"] == "smt.vmadotsu" and decode(words[0])["dtype"] == "i8"
    assert (decode(words[0])["vd"], decode(words[0])["vs1"], decode(words[0])["vs2"]) == (20, 2, 8)
    assert decode(words[1])["mnemonic"] == "smt.vmadotu" and decode(words[1])["dtype"] == "i4"
    assert words[2:4] == [ime2.encode_pack(24, 4, 5, 1, unpack=True), ime2.encode_pack(16, 24, 26, 3, unpack=False)]
    hp = decode(words[4])
    assert (hp["mnemonic"], hp["dtype"], hp["vd"], hp["vs1"], hp["vs2"], hp["scale"], hp["imm3"]) == \
        ("smt.vmadotsu.hp", "i4", 16, 2, 8, 0, 3)
    assert (tr.vmadot, tr.hp, tr.pack, tr.unimp, tr.vsetvli) == (2, 1, 2, 1, 1)
    assert tr.text.count("unimp") == 1 and "mf2, tu, mu" in tr.text and "m1, ta, ma" in tr.text


def test_reference_is_the_q8_definition():
    # The model against a plain float computation of the same dequantized matrices.
    case = ime2.I8I8Case.random(np.random.default_rng(3), 2, 32, 2)
    A = (case.a_codes.astype(np.float64) * case.a_scales[:, :, None]).reshape(2, -1)
    B = (case.b_codes.astype(np.float64) * case.b_scales.astype(np.float64)[:, :, None]).reshape(32, -1)
    np.testing.assert_allclose(case.reference()[0], A @ B.T, rtol=1e-12, atol=1e-12)


def test_layouts_put_each_value_where_mrow_ref_reads_it():
    case = ime2.I8I8Case.random(np.random.default_rng(4), 5, 64, 2)
    a = np.frombuffer(case.a_bytes(), np.uint8)
    # second row group (1 row, offset 4 rows x 2 blocks x 38 bytes), block 1: scale, sum, codes
    off = 4 * 2 * 38 + 38
    assert a[off:off + 4].view(np.float32)[0] == case.a_scales[4, 1]
    assert (a[off + 6:off + 38].view(np.int8) == case.a_codes[4, 1]).all()
    b = np.frombuffer(case.b_bytes(), np.uint8)
    off = 32 * 2 * 34 + 64 + 1024  # column group 1, block 1
    assert (b[off:off + 64].view(np.float16) == case.b_scales[32:, 1]).all()
    assert (b[off + 64 + 32 * 5:off + 64 + 32 * 6].view(np.int8) == case.b_codes[37, 1]).all()


@NEEDS_TOOLS
def test_translation_of_the_real_file():
    tr = ime2.translate((source.sources() / source.SPACEMIT / "ime2_kernels.cpp").read_text())
    # Counted in the sdist's file (live and #if 0 code): 176 vmadot i8/i4, 96 .hp, 223 vpack/vupack, 19 vnpack4.
    assert (tr.vmadot, tr.hp, tr.pack, tr.unimp) == (176, 96, 223, 19)


@NEEDS_TOOLS
@pytest.mark.parametrize("M, N, k_blks", [(1, 32, 1), (4, 32, 3), (9, 96, 4), (3, 64, 2), (6, 32, 5)])
def test_gemm_kernel_i8i8_agrees_with_numpy(tmp_path, M, N, k_blks):
    """m4 (groups of 4 rows) and m1 (the rest): vmadot i8 + vupack (B and A layout) + vpack (C layout)."""
    exe = ime2.build()
    case = ime2.I8I8Case.random(np.random.default_rng(M * 100 + N + k_blks), M, N, k_blks)
    run = ime2.run_i8i8(exe, case, tmp_path)
    groups = ime2.row_groups(M)
    assert run.rows == tuple(groups) * (N // 32)
    # Per 32 columns and k block: m1 runs 8 vmadot + 4 vupack + 3 vpack, m4 8 vmadot + 5 vupack + 4 vpack.
    assert run.emulated == (N // 32) * k_blks * sum(17 if g == 4 else 15 for g in groups)
    assert np.isfinite(run.C).all()
    assert ime2.max_error(run, case) <= 1.0


@NEEDS_TOOLS
def test_gemm_kernel_i8i8_extreme_codes(tmp_path):
    """All codes -128 or 127: the int32 block dots reach +-2^19, exact in the fp32 the kernel converts to."""
    rng = np.random.default_rng(7)
    base = ime2.I8I8Case.random(rng, 5, 64, 3)
    extreme = ime2.I8I8Case(np.where(rng.random(base.a_codes.shape) < 0.5, -128, 127).astype(np.int8), base.a_scales,
                            np.where(rng.random(base.b_codes.shape) < 0.5, -128, 127).astype(np.int8), base.b_scales)
    run = ime2.run_i8i8(ime2.build(), extreme, tmp_path)
    assert ime2.max_error(run, extreme) <= 1.0
