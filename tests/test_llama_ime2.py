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


def _emulator_reading(text: str, reading: str) -> str:
    """runtime/ime2_emu.c with vnpack4 read another way (the tests' alternatives; none of them is shipped)."""
    line_in = "const uint8_t *in = src + (c & 1) * VLENB + c / 2 * 2 * out_chunk;"
    line_out = "dst[c * out_chunk + j] = (uint8_t)((in[2 * j] & 15) | (in[2 * j + 1] & 15) << 4);"
    assert line_in in text and line_out in text, "vnpack4_execute changed: update the alternative readings"
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
    if reading == "saturate to signed 4 bits":
        sat = "(uint8_t)((int8_t)in[{i}] < -8 ? 8 : (int8_t)in[{i}] > 7 ? 7 : in[{i}] & 15)"
        return text.replace(line_out, f"dst[c * out_chunk + j] = (uint8_t)({sat.format(i='2 * j')} | "
                                      f"{sat.format(i='2 * j + 1')} << 4);")
    raise ValueError(reading)


# Which paths each wrong reading breaks (the others it leaves right): m1 issues vnpack4 under e16 with vs1 = vs2
# and uses row 0 only; m4 under e8 with two sources and all four chunks.
WRONG_READINGS = {
    "nibble order swapped": {"i8i4 m1", "i8i4 m4", "i8i4hp m1", "i8i4hp m4"},
    "pack_len counts source bits": {"i8i4 m4", "i8i4hp m4"},
    "vs1 then vs2, not interleaved": {"i8i4 m4", "i8i4hp m4"},
    "SEW-wide source elements": {"i8i4 m1", "i8i4hp m1"},
    "saturate to signed 4 bits": {"i8i4 m1", "i8i4 m4", "i8i4hp m1", "i8i4hp m4"},
}


@NEEDS_TOOLS
@pytest.mark.parametrize("reading", list(WRONG_READINGS))
def test_other_vnpack4_readings_break_the_kernels(tmp_path, reading):
    """The kernels pin vnpack4 (docs/ime2-isa.md §9.1): the emulator built with each other plausible reading
    makes exactly the listed paths miss their model by far (the shipped reading passes all four:
    test_gemm_kernel_q40_agrees_with_numpy)."""
    text = (toolchain.RUNTIME_DIR / "ime2_emu.c").read_text()
    exe = ime2.build(emulator=_emulator_reading(text, reading))
    broken = set()
    for kernel, M in [("i8i4", 1), ("i8i4", 4), ("i8i4hp", 1), ("i8i4hp", 4)]:
        case = Q40_CASES[kernel].random(np.random.default_rng(31), M, 32, 2)
        run = ime2.run(exe, kernel, case, tmp_path / f"{kernel}{M}")
        err = ime2.error_units(run, case.reference())
        if not err <= 1.0:  # NaN counts as broken
            assert not err <= 1000, f"{reading}, {kernel} M={M}: off by {err} units, neither right nor clearly wrong"
            broken.add(f"{kernel} m{M}")
    assert broken == WRONG_READINGS[reading]
