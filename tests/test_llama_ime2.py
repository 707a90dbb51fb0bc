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


def test_vnpack4_encoding_matches_binutils_and_llvm():
    assert ime2.encode_vnpack4(2, 3, 4, 0) == 0x4241812B   # smt.vnpack4.vv v2,v3,v4,0 (binutils x-smt-vdot-ii.d)
    assert ime2.encode_vnpack4(1, 3, 5, 1) == 0x425190AB   # smt.vnpack4.vv v1, v3, v5, 1 (LLVM MC test)
    with pytest.raises(ValueError):
        ime2.encode_vnpack4(2, 3, 4, 4)


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
            '"vsetvli      t0, x0, e8, mf2         \\n\\t"\n"vsetivli t0, 4, e16, m1, ta, ma\\n\\t"\n'
            '"vsetvli        t0, x0, e64, mf2        \\n\\t"\n')
    tr = ime2.translate(text)
    words = [int(w, 16) for w in re.findall(r"\.word 0x([0-9a-f]{8})", tr.text)]
    assert decode(words[0])["mnemonic"] == "smt.vmadotsu" and decode(words[0])["dtype"] == "i8"
    assert (decode(words[0])["vd"], decode(words[0])["vs1"], decode(words[0])["vs2"]) == (20, 2, 8)
    assert decode(words[1])["mnemonic"] == "smt.vmadotu" and decode(words[1])["dtype"] == "i4"
    assert words[2:4] == [ime2.encode_pack(24, 4, 5, 1, unpack=True), ime2.encode_pack(16, 24, 26, 3, unpack=False)]
    hp = decode(words[4])
    assert (hp["mnemonic"], hp["dtype"], hp["vd"], hp["vs1"], hp["vs2"], hp["scale"], hp["imm3"]) == \
        ("smt.vmadotsu.hp", "i4", 16, 2, 8, 0, 3)
    assert words[5] == ime2.encode_vnpack4(1, 2, 3, 3)
    assert (tr.vmadot, tr.hp, tr.pack, tr.npack4, tr.vsetvli, tr.e64_mf2) == (2, 1, 2, 1, 2, 1)
    assert "mf2, tu, mu" in tr.text and "m1, ta, ma" in tr.text
    assert "e64, m1, tu, mu" in tr.text and "e64, mf2" not in tr.text


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
    # Counted in the sdist's file (live and #if 0 code): 176 vmadot i8/i4, 96 .hp, 223 vpack/vupack, 19 vnpack4,
    # 7 `vsetvli t0, x0, e64, mf2` (i8i2k_m1 and i8i3k_m1).
    assert (tr.vmadot, tr.hp, tr.pack, tr.npack4, tr.e64_mf2) == (176, 96, 223, 19, 7)


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


# ---------------------------------------------------------------- K-quants: gemm_kernel_i8i2k, gemm_kernel_i8i3k

def _mrow_ref_b_reads_q2k(b: np.ndarray, kb_total: int, group: int, kb: int, ci: int, kii: int, bi: int):
    """(scale, zp, code) as gemm_kernel_i8i2k_mrow_ref indexes nrow_block_q2_k<32> (2688 bytes)."""
    blk = b[(group * kb_total + kb) * 2688:][:2688]
    scales, qs = blk[:512], blk[512:2560]
    code = qs[(kii // 4) * 32 * 16 + ci * 16 + bi] >> ((kii % 4) * 2) & 3
    return scales[kii * 32 + ci] & 0xF, scales[ci * 16 + kii] >> 4, code


def test_q2k_layout_puts_each_value_where_mrow_ref_reads_it():
    case = ime2.Q2KCase.random(np.random.default_rng(5), 5, 64, 2)
    b = np.frombuffer(case.b_bytes(), np.uint8)
    assert b.size == 64 * 2 * 84
    rng = np.random.default_rng(0)
    for _ in range(200):
        n, kb, kii, bi = rng.integers(0, 64), rng.integers(0, 2), rng.integers(0, 16), rng.integers(0, 16)
        got = _mrow_ref_b_reads_q2k(b, 2, n // 32, kb, n % 32, kii, bi)
        assert got == (case.b_sub_scales[n, kb, kii], case.b_zps[n, kb, kii], case.b_codes[n, kb, kii * 16 + bi])
    blk = b[(1 * 2 + 1) * 2688:][:2688]  # columns 32-63, super-block 1: d, dmin
    assert (blk[2560:2624].view(np.float16) == case.b_d[32:, 1]).all()
    assert (blk[2624:2688].view(np.float16) == case.b_dmin[32:, 1]).all()
    a = np.frombuffer(case.a_bytes(), np.uint8)
    # rows 0-3 (one m4 group), super-block 1: 4 fp32 scales, 4 x 16 int16 sums, 4 x 256 codes
    off = 292 * 4
    assert (a[off:off + 16].view(np.float32) == case.a_scales[:4, 1]).all()
    assert (a[off + 16:off + 144].view(np.int16).reshape(4, 16) == case.a_sums[:4, 1]).all()
    assert (a[off + 144 + 256 * 2:off + 144 + 256 * 3].view(np.int8) == case.a_codes[2, 1]).all()
    off = 292 * 8 + 292  # row 4 (m1), super-block 1
    assert a[off:off + 4].view(np.float32)[0] == case.a_scales[4, 1]
    assert (a[off + 36:off + 292].view(np.int8) == case.a_codes[4, 1]).all()


def test_q3k_layout_puts_each_value_where_mrow_ref_reads_it():
    case = ime2.Q3KCase.random(np.random.default_rng(6), 1, 64, 2)
    b = np.frombuffer(case.b_bytes(), np.uint8)
    assert b.size == 64 * 2 * 114
    values = case.b_values()
    rng = np.random.default_rng(1)
    for _ in range(200):
        n, kb, kii, bi = rng.integers(0, 64), rng.integers(0, 2), rng.integers(0, 16), rng.integers(0, 16)
        blk = b[((n // 32) * 2 + kb) * 3648:][:3648]
        ci = n % 32
        scale = blk[:512].view(np.int8)[kii * 32 + ci]
        mask = blk[512:1536].view("<u2")[kii * 32 + ci]
        code = int(blk[1536:3584][(kii // 4) * 512 + ci * 16 + bi] >> ((kii % 4) * 2) & 3)
        code -= 0 if mask >> bi & 1 else 4
        assert (scale, code) == (case.b_sub_scales[n, kb, kii], values[n, kb, kii * 16 + bi])
    assert (b[3584:3648].view(np.float16) == case.b_d[:32, 0]).all()


def test_kquant_references_are_the_definitions():
    """Without FP16 rounding the models are the dequantized matrices' product, B dequantized as ggml does
    (Q2_K d * scale * q - dmin * zp, Q3_K d * scale * q, Q5_0 d * (q - 16), Q5_1 d * (q - zp)), given A's
    stored sums as llama.cpp's quantizer writes them: minus the codes' sum."""
    rng = np.random.default_rng(8)
    case = ime2.Q2KCase.random(rng, 5, 32, 2)
    A = (case.a_codes.astype(np.float64) * case.a_scales[:, :, None]).reshape(5, -1)
    d, dmin = case.b_d.astype(np.float64)[:, :, None], case.b_dmin.astype(np.float64)[:, :, None]
    B = (d * np.repeat(case.b_sub_scales, 16, axis=2) * case.b_codes
         - dmin * np.repeat(case.b_zps, 16, axis=2)).reshape(32, -1)
    np.testing.assert_allclose(case.reference(fp16=False)[0], A @ B.T, rtol=1e-12, atol=1e-12)
    case3 = ime2.Q3KCase.random(rng, 5, 32, 2)
    A = (case3.a_codes.astype(np.float64) * case3.a_scales[:, :, None]).reshape(5, -1)
    B = (case3.b_d.astype(np.float64)[:, :, None] * np.repeat(case3.b_sub_scales, 16, axis=2)
         * case3.b_values()).reshape(32, -1)
    np.testing.assert_allclose(case3.reference(fp16=False)[0], A @ B.T, rtol=1e-12, atol=1e-12)
    for zero_points in (False, True):
        case5 = ime2.Q5Case.random(rng, 5, 32, 2, zero_points=zero_points)
        A = (case5.a_codes.astype(np.float64) * case5.a_scales[:, :, None]).reshape(5, -1)
        z = 16 if case5.b_zps is None else case5.b_zps.astype(np.float64)[:, :, None]
        B = (case5.b_d.astype(np.float64)[:, :, None] * (case5.b_codes - z)).reshape(32, -1)
        np.testing.assert_allclose(case5.reference()[0], A @ B.T, rtol=1e-12, atol=1e-12)


def test_fp16_block_sum_rounds_each_step():
    dots = np.zeros((1, 1, 1, 16), np.int64)
    scales = np.ones((1, 1, 16), np.float16)
    dots[..., 1], scales[..., 1] = 3, np.float16(1 + 2**-10)
    assert float(ime2.fp16_block_sum(dots, scales)[0, 0, 0]) == 3 + 2**-8  # tie at the product, to even
    dots[..., 0] = 2049                                                      # 2049 -> 2048 at the conversion
    assert float(ime2.fp16_block_sum(dots, scales)[0, 0, 0]) == 2052.0     # 2051.0039 -> 2052 at the sum


def _extreme(rng, shape, lo, hi):
    return np.where(rng.random(shape) < 0.5, lo, hi)


# Emulated instructions per call, 32 columns and super-block, read off the kernels:
# i2k m4: 4 x (16 vmadotsu.hp + 5 vpack) + 1 vpack (scales16) + 8 vmadotsu/vmadotu + 7 vpack (zero points, C);
# i2k m1: 4 x (16 vmadotsu + 4 vpack) + 8 vmadotsu/vmadotu + 3 vpack;
# i3k m4: 4 x (3 vpack (A) + 4 x (4 vmadot + 4 vpack)); i3k m1: 64 vmadot.hp + 3 vpack (C) + 1 vpack (scales16).
PER_GROUP_BLOCK = {"i8i2k": {4: 100, 1: 91}, "i8i3k": {4: 140, 1: 68}}
KQUANT_CASES = {"i8i2k": ime2.Q2KCase, "i8i3k": ime2.Q3KCase}


def _check_kquant(tmp_path, kernel, case):
    M, N, kb = case.shape
    run = ime2.run(ime2.build(), kernel, case, tmp_path)
    groups = ime2.row_groups(M)
    assert run.rows == tuple(groups) * (N // 32)
    assert run.emulated == (N // 32) * kb * sum(PER_GROUP_BLOCK[kernel][g] for g in groups)
    assert np.isfinite(run.C).all()
    assert ime2.max_error(run, case) <= 1.0
    return run


@NEEDS_TOOLS
@pytest.mark.parametrize("kernel", ["i8i2k", "i8i3k"])
@pytest.mark.parametrize("M, N, kb", [(1, 32, 1), (3, 64, 2), (4, 32, 3), (9, 64, 2), (6, 32, 1)])
def test_gemm_kernel_kquants_agree_with_numpy(tmp_path, kernel, M, N, kb):
    """m4 and m1 paths. Tolerance 1e-5 x the sum of the fp32 terms' magnitudes: the integer parts are exact
    and the FP16 parts are modelled step by step, so what is left is a few fp32 roundings per term."""
    case = KQUANT_CASES[kernel].random(np.random.default_rng(M * 1000 + N * 10 + kb), M, N, kb)
    run = _check_kquant(tmp_path, kernel, case)
    # The FP16 rows (i2k m4, i3k m1) are off by far more than the tolerance once FP16 rounding is left out
    # of the model: the check sees the .hp rounding, not just the tile.
    hp_rows = ime2.m4_rows(M) if kernel == "i8i2k" else ~ime2.m4_rows(M)
    if hp_rows.any():
        exact, bound = case.reference(fp16=False)
        assert (np.abs(run.C - exact) / (1e-5 * bound))[hp_rows].max() > 10


@NEEDS_TOOLS
def test_gemm_kernel_i8i2k_extreme_values(tmp_path):
    """A codes -128/127, B codes 0/3, scales and zero points 0/15, A sums -32768/32767 (the kernel splits them
    into a signed high and an unsigned low byte: vmadotsu and vmadotu), d up to 0.5: FP16 block sums reach
    ~46000 (quantum 32) with conversions of |dots| up to 6144 that round; still finite."""
    rng = np.random.default_rng(11)
    M, N, kb = 5, 64, 2
    base = ime2.Q2KCase.random(rng, M, N, kb)
    case = ime2.Q2KCase(_extreme(rng, base.a_codes.shape, -128, 127).astype(np.int8), base.a_scales,
                        _extreme(rng, base.a_sums.shape, -32768, 32767).astype(np.int16),
                        _extreme(rng, base.b_codes.shape, 0, 3), _extreme(rng, base.b_sub_scales.shape, 0, 15),
                        _extreme(rng, base.b_zps.shape, 0, 15),
                        (rng.choice([-1, 1], (N, kb)) * rng.uniform(0.25, 0.5, (N, kb))).astype(np.float16),
                        rng.uniform(0.25, 0.5, (N, kb)).astype(np.float16))
    _check_kquant(tmp_path, "i8i2k", case)


@NEEDS_TOOLS
def test_gemm_kernel_i8i3k_extreme_values(tmp_path):
    """A codes -128/127, B codes -4/3, scales -32/31, |d| up to 0.2: FP16 block sums up to ~52000."""
    rng = np.random.default_rng(12)
    M, N, kb = 6, 32, 2
    base = ime2.Q3KCase.random(rng, M, N, kb)
    high = _extreme(rng, base.b_high.shape, 0, 1)
    case = ime2.Q3KCase(_extreme(rng, base.a_codes.shape, -128, 127).astype(np.int8), base.a_scales,
                        np.where(high == 1, 3, 0), high, _extreme(rng, base.b_sub_scales.shape, -32, 31),
                        (rng.choice([-1, 1], (N, kb)) * rng.uniform(0.1, 0.2, (N, kb))).astype(np.float16))
    _check_kquant(tmp_path, "i8i3k", case)


# ---------------------------------------------------------------- gemm_kernel_i8i5 (Q5_0, Q5_1)

@pytest.mark.parametrize("zero_points", [False, True])
def test_q5_layout_puts_each_value_where_mrow_ref_reads_it(zero_points):
    case = ime2.Q5Case.random(np.random.default_rng(9), 5, 64, 2, zero_points=zero_points)
    size = 32 * (23 if zero_points else 22)
    b = np.frombuffer(case.b_bytes(), np.uint8)
    assert b.size == 2 * 2 * size
    rng = np.random.default_rng(2)
    for _ in range(200):
        n, kb, k = rng.integers(0, 64), rng.integers(0, 2), rng.integers(0, 32)
        blk, ci = b[((n // 32) * 2 + kb) * size:][:size], n % 32
        assert blk[:64].view(np.float16)[ci] == case.b_d[n, kb]
        qh, qs = blk[size - 640:size - 512], blk[size - 512:]
        code = (qs[ci * 16 + k // 2] >> (4 * (k % 2)) & 15) | (qh[ci * 4 + k // 8] >> (k % 8) & 1) << 4
        assert code == case.b_codes[n, kb, k]
        if zero_points:
            assert blk[64 + ci] == case.b_zps[n, kb]
    a = np.frombuffer(case.a_bytes(), np.uint8)
    off = 4 * 38  # rows 0-3, block 1: 4 scales, 4 sums, 4 x 32 codes
    assert (a[off:off + 16].view(np.float32) == case.a_scales[:4, 1]).all()
    assert (a[off + 16:off + 24].view(np.int16) == case.a_sums[:4, 1]).all()
    assert (a[off + 24 + 64:off + 24 + 96].view(np.int8) == case.a_codes[2, 1]).all()


@NEEDS_TOOLS
@pytest.mark.parametrize("zero_points", [False, True])
@pytest.mark.parametrize("M, N, kb", [(1, 32, 1), (3, 64, 2), (4, 32, 3), (9, 64, 4), (6, 32, 5)])
def test_gemm_kernel_i8i5_agrees_with_numpy(tmp_path, zero_points, M, N, kb):
    """Q5_0 (quant_b_zp null) and Q5_1 (non-null: zero points inside B), m4 and m1: vmadot i8, vpack at
    pack_len SEW 8 (the nibble interleave), vupack (at SEW 64 in the Q5_1 m4 A layout). Integer block sums
    exact in int32 and fp32; tolerance 1e-5 x the sum of the fp32 terms' magnitudes, as for i8i8."""
    case = ime2.Q5Case.random(np.random.default_rng(M * 100 + N + kb), M, N, kb, zero_points=zero_points)
    run = ime2.run(ime2.build(), case.kernel, case, tmp_path)
    groups = ime2.row_groups(M)
    assert run.rows == tuple(groups) * (N // 32)
    # Per 32 columns and block: m1 4 vpack + 4 vupack + 8 vmadot + 3 vpack; m4 one vupack more (A) and
    # 4 vpack for C.
    assert run.emulated == (N // 32) * kb * sum(21 if g == 4 else 19 for g in groups)
    assert np.isfinite(run.C).all()
    assert ime2.max_error(run, case) <= 1.0


@NEEDS_TOOLS
@pytest.mark.parametrize("zero_points", [False, True])
def test_gemm_kernel_i8i5_extreme_values(tmp_path, zero_points):
    """A codes -128/127, B codes 0/31 (the high bit set or clear everywhere), zero points 0/255, A sums
    -32768/32767: block sums up to 32 x 128 x 31 + 255 x 32768."""
    rng = np.random.default_rng(13)
    base = ime2.Q5Case.random(rng, 5, 64, 3, zero_points=zero_points)
    zps = None if base.b_zps is None else _extreme(rng, base.b_zps.shape, 0, 255).astype(np.uint8)
    case = ime2.Q5Case(_extreme(rng, base.a_codes.shape, -128, 127).astype(np.int8), base.a_scales,
                       _extreme(rng, base.a_sums.shape, -32768, 32767).astype(np.int16),
                       _extreme(rng, base.b_codes.shape, 0, 31), base.b_d, zps)
    run = ime2.run(ime2.build(), case.kernel, case, tmp_path)
    assert ime2.max_error(run, case) <= 1.0


# ---------------------------------------------------------------- Q4_0: gemm_kernel_i8i4 and gemm_kernel_i8i4_hp (vnpack4)

def test_q40_layouts_put_each_value_where_mrow_ref_reads_it():
    case = ime2.Q40Case.random(np.random.default_rng(21), 5, 64, 2)
    b = np.frombuffer(case.b_bytes(), np.uint8)
    assert b.size == 64 * 2 * 18
    rng = np.random.default_rng(3)
    for _ in range(200):  # mrow_ref: b_data[ci * blk_len / 2 + bi], code 2bi in bits 3:0, 2bi+1 in bits 7:4
        n, kb, k = rng.integers(0, 64), rng.integers(0, 2), rng.integers(0, 32)
        blk, ci = b[((n // 32) * 2 + kb) * 576:][:576], n % 32
        assert blk[:64].view(np.float16)[ci] == case.b_d[n, kb]
        assert blk[64 + ci * 16 + k // 2] >> (4 * (k % 2)) & 15 == case.b_codes[n, kb, k]
    hp = ime2.Q40HPCase.random(np.random.default_rng(22), 5, 32, 2)
    a = np.frombuffer(hp.a_bytes(), np.uint8)
    assert a.size == 5 * 2 * 290
    blk = a[1160:2320]  # rows 0-3, super-block 1: 8 x (4 scales, 4 x 32 codes), sums [row][8], 4 scale_avg
    assert (blk[136 * 3:136 * 3 + 8].view(np.float16) == hp.a_sub_scales[:4, 1, 3]).all()
    assert (blk[136 * 3 + 8 + 64:136 * 3 + 8 + 96].view(np.int8) == hp.a_codes[2, 1, 96:128]).all()
    assert (blk[1088:1152].view(np.float16).reshape(4, 8) == hp.a_sums[:4, 1]).all()
    assert (blk[1152:1160].view(np.float16) == hp.a_avg[:4, 1]).all()
    bb = np.frombuffer(hp.b_bytes(), np.uint8)
    sub = bb[4608 + 576 * 5:][:576]  # columns 0-31, super-block 1, sub-block 5
    assert (sub[:64].view(np.float16) == hp.b_d[:, 1, 5]).all()
    assert sub[64 + 7 * 16 + 3] == hp.b_codes[7, 1, 160 + 6] | hp.b_codes[7, 1, 160 + 7] << 4


# Emulated instructions per call, 32 columns and K block, read off the kernels: i8i4 m1 2 vnpack4 + 8 .hp + 3 vpack
# (C); m4 1 vnpack4 + 1 vupack + 8 .hp + 3 vpack (C) + 1 vpack (B scales) + 3 vpack (the zero-point tile);
# i8i4_hp (per super-block) m1 8 x (2 vnpack4 + 1 vpack + 8 .hp) + 3 vpack, m4 8 x (vnpack4 + vpack + vupack
# + 8 .hp) + 3 vpack.
Q40_PER_GROUP_BLOCK = {"i8i4": {1: 13, 4: 17}, "i8i4hp": {1: 91, 4: 91}}
Q40_CASES = {"i8i4": ime2.Q40Case, "i8i4hp": ime2.Q40HPCase}


def _check_q40(tmp_path, case, exe=None):
    M, N, kb = case.shape
    run = ime2.run(exe or ime2.build(), case.kernel, case, tmp_path)
    groups = ime2.row_groups(M)
    assert run.rows == tuple(groups) * (N // 32)
    assert run.emulated == (N // 32) * kb * sum(Q40_PER_GROUP_BLOCK[case.kernel][g] for g in groups)
    assert np.isfinite(run.C).all()
    return run


@NEEDS_TOOLS
@pytest.mark.parametrize("kernel", ["i8i4", "i8i4hp"])
@pytest.mark.parametrize("extreme", [False, True], ids=["random", "extreme"])
@pytest.mark.parametrize("M, N, kb", [(1, 32, 1), (4, 32, 2), (5, 64, 3), (9, 96, 2), (6, 32, 4)])
def test_gemm_kernel_q40_agrees_with_numpy(tmp_path, kernel, extreme, M, N, kb):
    """llama.cpp's Q4_0 path on the K3 (K a multiple of 256: gemm_kernel_i8i4_hp, else gemm_kernel_i8i4), m4 and
    m1: vnpack4 splits A into nibbles, vmadotsu.hp / vmadotu.hp i4 multiply them with B's, vpack/vupack lay
    out. Within 1 unit of 1e-5 x the sum of the fp32 terms' magnitudes of the model (FP16 modelled step by
    step), while the same run misses the FP16-free product of the dequantized matrices by more than 10 units:
    the check sees the .hp rounding."""
    case = Q40_CASES[kernel].random(np.random.default_rng(M * 1000 + N * 10 + kb), M, N, kb, extreme=extreme)
    run = _check_q40(tmp_path, case)
    want, bound = case.reference()
    assert ime2.error_units(run, (want, bound)) <= 1.0
    assert ime2.error_units(run, (ime2.q40_definition(case), bound)) > 10


# Readings of imm2 2 alone: the bytes of vd each chunk fills (shipped: 16, pack_len 128 bits).
IMM2_2_CHUNK = {"imm2 2 is 64 bits": 8, "imm2 2 is 256 bits": 32}


def _emulator_reading(text: str, reading: str) -> str:
    """runtime/ime2_emu.c with vnpack4 read another way (the tests' alternatives; none of them is shipped)."""
    line_in = "const uint8_t *in = src + (c & 1) * VLENB + c / 2 * 2 * out_chunk;"
    line_out = "dst[c * out_chunk + j] = (uint8_t)((in[2 * j] & 15) | (in[2 * j + 1] & 15) << 4);"
    assert line_in in text and line_out in text and "unsigned out_chunk = 4u << d->imm2;" in text, \
        "vnpack4_execute changed: update the alternative readings"
    if reading == "nibble order swapped":
        return text.replace(line_out, "dst[c * out_chunk + j] = (uint8_t)((in[2 * j] & 15) << 4 | (in[2 * j + 1] & 15));")
    if reading == "pack_len counts source bits":
        return text.replace("unsigned out_chunk = 4u << d->imm2;", "unsigned out_chunk = 2u << d->imm2;")
    if reading == "vs1 then vs2, not interleaved":
        return text.replace(line_in, "const uint8_t *in = src + c * 2 * out_chunk;")
    if reading == "SEW-wide source elements":
        return text.replace(line_in, "const uint8_t *in = src + (c & 1) * VLENB; "
                            "unsigned eb = pack_bytes(0), base = c / 2 * 2 * out_chunk * eb;").replace(
            line_out, "{ unsigned i0 = base + 2 * j * eb, i1 = i0 + eb; dst[c * out_chunk + j] = (uint8_t)("
                      "(i0 < VLENB ? in[i0] & 15 : 0) | (i1 < VLENB ? in[i1] & 15 : 0) << 4); }")
    if reading in IMM2_2_CHUNK:  # every other imm2 as shipped: only the MoE kernel issues imm2 2
        line_chunk = "unsigned out_chunk = 4u << d->imm2;"
        chunk = f"unsigned out_chunk = d->imm2 == 2 ? {IMM2_2_CHUNK[reading]}u : 4u << d->imm2;"
        return text.replace(line_chunk, chunk)
    if reading == "saturate to signed 4 bits":
        sat = "(uint8_t)((int8_t)in[{i}] < -8 ? 8 : (int8_t)in[{i}] > 7 ? 7 : in[{i}] & 15)"
        return text.replace(line_out, f"dst[c * out_chunk + j] = (uint8_t)({sat.format(i='2 * j')} | "
                                      f"{sat.format(i='2 * j + 1')} << 4);")
    raise ValueError(reading)


# Which paths each wrong reading breaks (the others it leaves right): m1 issues vnpack4 under e16 with vs1 = vs2
# and uses row 0 only; m4 under e8 with two sources and all four chunks at imm2 3; the MoE pair kernel
# (moe_m2_gemm_kernel_i8i4, without and with zero points) under e8 with two sources at imm2 2, using tile rows
# 0 and 1 (the first chunk of each source).
MOE_I8I4 = {"moe_i8i4 m2", "moe_i8i4zp m2"}
WRONG_READINGS = {
    "nibble order swapped": {"i8i4 m1", "i8i4 m4", "i8i4hp m1", "i8i4hp m4", *MOE_I8I4},
    "pack_len counts source bits": {"i8i4 m4", "i8i4hp m4", *MOE_I8I4},
    "vs1 then vs2, not interleaved": {"i8i4 m4", "i8i4hp m4", *MOE_I8I4},
    "SEW-wide source elements": {"i8i4 m1", "i8i4hp m1"},
    "saturate to signed 4 bits": {"i8i4 m1", "i8i4 m4", "i8i4hp m1", "i8i4hp m4", *MOE_I8I4},
    "imm2 2 is 64 bits": MOE_I8I4,
    "imm2 2 is 256 bits": MOE_I8I4,
}


@NEEDS_TOOLS
@pytest.mark.parametrize("reading", list(WRONG_READINGS))
def test_other_vnpack4_readings_break_the_kernels(tmp_path, reading):
    """The kernels pin vnpack4 (docs/ime2-isa.md §9.1): the emulator built with each other plausible reading
    makes exactly the listed paths miss their model by far (the shipped reading passes all six:
    test_gemm_kernel_q40_agrees_with_numpy, test_moe_kernels_agree_with_numpy)."""
    text = (toolchain.RUNTIME_DIR / "ime2_emu.c").read_text()
    exe = ime2.build(emulator=_emulator_reading(text, reading))
    cases = {f"{kernel} m{M}": Q40_CASES[kernel].random(np.random.default_rng(31), M, 32, 2)
             for kernel, M in [("i8i4", 1), ("i8i4", 4), ("i8i4hp", 1), ("i8i4hp", 4)]}
    for zp in (False, True):  # two tokens on one expert: one pair call
        moe = ime2.MoECase.random(np.random.default_rng(32), 2, 32, 2, 1, 1, bits=4, zero_points=zp)
        assert [len(c.tokens) for c in moe.calls()] == [2]
        cases[f"{moe.kernel} m2"] = moe
    broken = set()
    for path, case in cases.items():
        run = ime2.run(exe, case.kernel, case, tmp_path / path.replace(" ", "_"))
        err = ime2.error_units(run, case.reference())
        if not err <= 1.0:  # NaN counts as broken
            assert not err <= 1000, f"{reading}, {path}: off by {err} units, neither right nor clearly wrong"
            broken.add(path)
    assert broken == WRONG_READINGS[reading]


# ---------------------------------------------------------------- MoE: moe_m2_gemm_kernel_i8i4 and _i8i5

def test_moe_walk_pairs_rows_per_expert_as_ime_cpp():
    # tokens 0-3, two slots each; C row = token * 2 + slot
    ids = np.array([[2, 0], [0, 1], [2, 1], [0, 2]])
    calls = ime2.moe_walk(ids)
    assert [(c.expert, c.tokens, c.outs) for c in calls] == [
        (0, (0, 1), (1, 2)), (0, (3,), (6,)),      # expert 0: three rows, a pair and one left over
        (1, (1, 2), (3, 5)),                        # expert 1: one pair
        (2, (0, 2), (0, 4)), (2, (3,), (7,)),       # expert 2
    ]


@pytest.mark.parametrize("zero_points", [False, True])
def test_moe_layouts_put_each_value_where_mrow_ref_reads_it(zero_points):
    """As moe_gemm_kernel_i8i4_mrow_ref reads them: token rows of 38-byte blocks (scale, sum, codes); per expert,
    group of 32 columns and block, 32 fp16 scales, [32 zero points], column ci's nibbles at ci * 16."""
    case = ime2.MoECase.random(np.random.default_rng(41), 3, 64, 2, 3, 2, bits=4, zero_points=zero_points)
    a = np.frombuffer(case.a_bytes(), np.uint8)
    assert a.size == 3 * 2 * 38
    row = a[2 * 76 + 38:][:38]  # token 2, block 1
    assert row[:4].view(np.float32)[0] == case.a_scales[2, 1] and row[4:6].view(np.int16)[0] == case.a_sums[2, 1]
    assert (row[6:].view(np.int8) == case.a_codes[2, 1]).all()
    col = 18 + zero_points
    b = np.frombuffer(case.b_bytes(), np.uint8)
    assert b.size == 3 * 64 * 2 * col
    rng = np.random.default_rng(4)
    for _ in range(200):
        e, n, kb, k = rng.integers(0, 3), rng.integers(0, 64), rng.integers(0, 2), rng.integers(0, 32)
        blk = b[e * 64 * 2 * col + (n // 32) * 2 * 32 * col + kb * 32 * col:][:32 * col]
        ci = n % 32
        assert blk[2 * ci:2 * ci + 2].view(np.float16)[0] == case.b_d[e, n, kb]
        if zero_points:
            assert blk[64 + ci] == case.b_zps[e, n, kb]
        nib = blk[32 * (col - 16):]
        assert nib[ci * 16 + k // 2] >> (4 * (k % 2)) & 15 == case.b_codes[e, n, kb, k]
    q5 = ime2.MoECase.random(np.random.default_rng(42), 3, 64, 2, 3, 2, bits=5, zero_points=zero_points)
    per_expert = 64 * 2 * (22 + zero_points)
    for e in range(3):
        one = ime2.Q5Case(q5.a_codes, q5.a_scales, q5.a_sums, q5.b_codes[e], q5.b_d[e],
                          None if q5.b_zps is None else q5.b_zps[e])
        assert q5.b_bytes()[e * per_expert:(e + 1) * per_expert] == one.b_bytes()


def test_moe_reference_is_the_dequantized_product_for_q5():
    # The 5-bit model against a plain float computation (the 4-bit one differs by its FP16 steps only).
    for zp in (False, True):
        case = ime2.MoECase.random(np.random.default_rng(43), 4, 32, 2, 3, 2, bits=5, zero_points=zp)
        np.testing.assert_allclose(case.reference()[0], case.definition(), rtol=1e-12, atol=1e-12)


# Emulated instructions per call, 32 columns and K block, read off the kernels. Pair (moe_m2): i8i4 2 vpack (B
# scales, the zero-point tile) + 2 vnpack4 + 8 .hp + 3 vpack (C); with zero points 1 vpack fewer (no tile);
# i8i5 4 vpack + 4 vupack (B) + 1 vpack + 1 vupack (A) + 8 vmadot + 3 vpack (C). Left over (gemm_kernel m1):
# i8i4 13 with or without zero points, i8i5 19.
MOE_PER_CALL_BLOCK = {"moe_i8i4": (15, 13), "moe_i8i4zp": (14, 13), "moe_i8i5": (21, 19), "moe_i8i5zp": (21, 19)}
MOE_VARIANTS = [(4, False), (4, True), (5, False), (5, True)]


def _check_moe(tmp_path, case, exe=None):
    """Runs ime.cpp's walk; asserts what each call reported, the emulated count and at least one pair call."""
    rows, N, kb = case.shape
    run = ime2.run(exe or ime2.build(), case.kernel, case, tmp_path)
    calls = case.calls()
    assert any(len(c.tokens) == 2 for c in calls), "no pair call: the MoE kernel would not be checked"
    want_rows = [r for c in calls for r in ([2] if len(c.tokens) == 2 else [1] * (N // 32))]
    assert list(run.rows) == want_rows
    pair, single = MOE_PER_CALL_BLOCK[case.kernel]
    assert run.emulated == (N // 32) * kb * sum(pair if len(c.tokens) == 2 else single for c in calls)
    assert np.isfinite(run.C).all()
    return run


@NEEDS_TOOLS
@pytest.mark.parametrize("bits, zero_points", MOE_VARIANTS, ids=["q4_0", "q4_1", "q5_0", "q5_1"])
@pytest.mark.parametrize("tokens, N, kb, experts, slots", [(2, 32, 1, 1, 1), (5, 64, 3, 4, 2), (7, 96, 2, 8, 2),
                                                           (6, 32, 4, 3, 3), (3, 64, 5, 2, 1)])
def test_moe_kernels_agree_with_numpy(tmp_path, bits, zero_points, tokens, N, kb, experts, slots):
    """moe_m2_gemm_kernel_i8i4 (vnpack4 at imm2 2, vmadotsu.hp / vmadotu.hp i4) and moe_m2_gemm_kernel_i8i5
    (vmadot i8, vpack, vupack), without and with zero points, driven by ime.cpp's walk over routed tokens
    (rows left over go through gemm_kernel's m1 path). Within 1 unit of 1e-5 x the sum of the fp32 terms'
    magnitudes; the 4-bit runs miss the FP16-free dequantized product by more than 10 units (the check sees
    the .hp rounding)."""
    rng = np.random.default_rng(tokens * 1000 + N * 10 + kb + 7 * bits + zero_points)
    case = ime2.MoECase.random(rng, tokens, N, kb, experts, slots, bits=bits, zero_points=zero_points)
    run = _check_moe(tmp_path, case)
    want, bound = case.reference()
    assert ime2.error_units(run, (want, bound)) <= 1.0
    if bits == 4:
        assert ime2.error_units(run, (case.definition(), bound)) > 10


@NEEDS_TOOLS
@pytest.mark.parametrize("bits, zero_points", MOE_VARIANTS, ids=["q4_0", "q4_1", "q5_0", "q5_1"])
def test_moe_kernels_extreme_values(tmp_path, bits, zero_points):
    """A codes -127/127, B codes at both ends, zero points at both ends (Q4_1 0/15, Q5_1 0/255): the 4-bit FP16
    tiles reach ~60000 with conversions that round; the 5-bit integer sums up to 32 x 127 x 31 + 255 x 4064."""
    case = ime2.MoECase.random(np.random.default_rng(44 + bits + zero_points), 6, 64, 3, 3, 2, bits=bits,
                               zero_points=zero_points, extreme=True)
    run = _check_moe(tmp_path, case)
    assert ime2.error_units(run, case.reference()) <= 1.0


@NEEDS_TOOLS
def test_q4_1_zero_point_sum_wraps_in_int16_on_the_m1_path_only(tmp_path):
    """A block of 32 equal activations (codes 127, a_sum -4064) against zero points 15: the pair kernel forms
    z * a_sum = -60960 in int32, gemm_kernel_i8i4_m1 (the row left over) in int16, where it wraps to 4576: that
    row misses the dequantized product by far, and the model, which wraps there too, holds."""
    base = ime2.MoECase.random(np.random.default_rng(45), 3, 32, 2, 2, 1, bits=4, zero_points=True)
    a = base.a_codes.copy()
    a[:, 0] = 127
    case = ime2.MoECase(a, base.a_scales, -a.astype(np.int16).sum(axis=2, dtype=np.int16), base.b_codes,
                        base.b_d, np.full_like(base.b_zps, 15), np.array([[0], [0], [1]]), 4)
    run = _check_moe(tmp_path, case)
    want, bound = case.reference()
    assert ime2.error_units(run, (want, bound)) <= 1.0
    off = np.abs(run.C - case.definition()) / (1e-5 * bound)
    assert off[:2].max() < 100 and off[2].max() > 10_000  # rows 0, 1: the pair; row 2: left over


def _emulator_mutation(text: str, mutation: str) -> str:
    """runtime/ime2_emu.c with one plausible mistake in what the MoE i8i5 kernel uses (none is shipped)."""
    edits = {
        "vpack takes vs2 first": ("+ (c & 1) * VLENB + c / 2 * chunk;",
                                  "+ ((c & 1) ^ !d->unpack) * VLENB + c / 2 * chunk;"),
        "vpack imm2 0 takes 16-bit chunks": ("return imm2 ? 16u << (imm2 - 1) : 1u << (vtype >> 3 & 7);",
                                             "return imm2 ? 16u << (imm2 - 1) : 2u << (vtype >> 3 & 7);"),
        "vmadot reads A unsigned": ("d->a_signed = w >> 13 & 1; /* sg: ", "d->a_signed = 0; /* sg: "),
    }
    old, new = edits[mutation]
    assert text.count(old) == 1, "ime2_emu.c changed: update the mutations"
    return text.replace(old, new)


@NEEDS_TOOLS
@pytest.mark.parametrize("mutation", ["vpack takes vs2 first", "vpack imm2 0 takes 16-bit chunks",
                                      "vmadot reads A unsigned"])
def test_moe_i8i5_check_fails_on_a_wrong_emulator(tmp_path, mutation):
    """moe_m2_gemm_kernel_i8i5 sees vpack's chunk order, its imm2 0 chunk and vmadot's A signedness: each
    mistake makes both variants miss their model by far. (It does not see vupack's even and odd chunks
    swapped: the kernel splits A and B with the same vupack, so the swap pairs k 16-31 with k 16-31 and the
    dot is unchanged; gemm_kernel_i8i8 pins that order.)"""
    exe = ime2.build(emulator=_emulator_mutation((toolchain.RUNTIME_DIR / "ime2_emu.c").read_text(), mutation))
    for zp in (False, True):
        case = ime2.MoECase.random(np.random.default_rng(46), 2, 32, 2, 1, 1, bits=5, zero_points=zp)
        run = ime2.run(exe, case.kernel, case, tmp_path / str(zp))
        assert not ime2.error_units(run, case.reference()) <= 1000
