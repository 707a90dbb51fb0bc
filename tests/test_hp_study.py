"""The `.hp` decode accuracy study (imegen/perf/hp_study.py): its FP16 step is docs/ime2-isa.md §6.2's (three
roundings, not fused), its overflow headroom is tight and sufficient, its quantizers are ORT's and CompInt8's,
and its findings (FP16 products of the scales go subnormal in small layers unless normalized; FP16 accumulation
error grows with the super-block) come out of the model, not of the test."""

from __future__ import annotations

import numpy as np
import pytest

from imegen.perf import hp_study as hp


def _step(h: float, t: int, s: float) -> float:
    return float(hp.fp16_step(np.array([h], np.float16), np.array([t]), np.array([s], np.float16))[0])


def test_fp16_step_rounds_three_times_as_the_spec():
    # docs/ime2-isa.md §6.2's hand-worked cells: the conversion's tie to even, the product's, and no fusion
    assert _step(0.0, 2049, 1.0) == 2048.0 and _step(0.0, 2051, 1.0) == 2052.0
    assert _step(0.0, 3, 1 + 2 ** -10) == 3 + 2 ** -8
    assert _step(1024.0, 3, 1.8330078125) == 1030.0  # a fused multiply-add would give 1029
    assert _step(0.0, 70000, 1.0) == np.inf  # 65520 and beyond convert to infinity


@pytest.mark.parametrize("S", [1, 2, 4, 8, 28, 152])
def test_headroom_keeps_the_worst_codes_finite_and_is_tight(S):
    h = hp.headroom(S)
    assert S * hp.BLOCK_H_BOUND * 2.0 ** -h <= hp.FP16_MAX
    assert h == 0 or S * hp.BLOCK_H_BOUND * 2.0 ** -(h - 1) > hp.FP16_MAX
    # the worst codes at the largest normalized scales: every block adds the bound, and H stays finite
    t_hi = np.full((1, 1, S), 32 * 8 * 8)
    t_lo = np.full((1, 1, S), 32 * 15 * 8)
    y, events = hp.hp_path(t_hi, t_lo, np.ones((1, S), np.float32), np.ones((1, S), np.float16), S, "normalized")
    assert events["infinite H"] == 0 and np.isfinite(y).all()
    assert y[0, 0] == pytest.approx(S * hp.BLOCK_H_BOUND, rel=1e-2)


def test_b_quantizer_is_orts_symmetric_one():
    rng = np.random.default_rng(0)
    w = rng.normal(0, 0.02, (8, 64)).astype(np.float32)
    q, d = hp.quantize_b_symmetric(w)
    blocks = w.reshape(8, 2, 32)
    big = np.abs(blocks).argmax(axis=2)
    # the value of largest magnitude m sets scale = m / -8 and takes code 0
    assert (np.take_along_axis(q, big[..., None], axis=2)[..., 0] == 0).all()
    err = np.abs((q.astype(np.float64) - 8) * d.astype(np.float64)[..., None] - blocks)
    assert (err <= np.abs(d.astype(np.float64))[..., None] * 0.51 + 1e-6).all()


def test_a_quantizer_groups_blocks():
    a = np.arange(1, 129, dtype=np.float32)[None, :]
    codes, scale = hp.quantize_a(a)
    assert scale[0].tolist() == pytest.approx([32 / 127, 64 / 127, 96 / 127, 128 / 127])
    _, grouped = hp.quantize_a(a, 2)
    assert grouped[0].tolist() == pytest.approx([64 / 127, 64 / 127, 128 / 127, 128 / 127])
    assert np.abs(codes).max() == 127


def test_the_study_finds_subnormal_scales_and_accumulation_error():
    """Small layers: the plain FP16 product a_scale x d goes subnormal and loses ~10-30% of the outputs' scale,
    hidden by ORT's absolute 0.1; normalized scales keep it under 1%. FP16 accumulation over all of K adds
    more error than over one block. The exact-integer path adds nothing to itself."""
    small = next(d for d in hp.DATA if d.name.startswith("small (subnormal"))
    r = {x.path: x for x in hp.study_shape("q/o", 896, 896, small, columns=64, rows=2, seed=3)}
    assert r["int32 (exact dots, fp32 fold)"].added == 0.0
    assert r[".hp absolute S=1"].relative > 0.1 and r[".hp absolute S=1"].events
    assert r[".hp normalized S=1"].relative < 0.01
    gauss = next(d for d in hp.DATA if d.name == "gaussian")
    g = {x.path: x for x in hp.study_shape("down", 896, 4864, gauss, columns=64, rows=2, seed=4)}
    assert g[".hp normalized S=whole K"].added > g[".hp normalized S=1"].added > 0
    assert g[".hp normalized S=1"].added < 0.1 and g["int32 (exact dots, fp32 fold)"].total < 1


# ---------------------------------------------------------------- split3: the `.hp` gemv kernel's arithmetic


def _split3_y(a_codes, a_scale, q, d, S):
    y, events = hp.split3_path(np.asarray(a_codes, np.int64), np.asarray(a_scale, np.float32),
                               np.asarray(q, np.uint8), np.asarray(d, np.float16), S)
    return y, events


def test_split3_with_exact_steps_is_the_exact_integer_path_bit_for_bit():
    """S = 1, every int8 code, power-of-two scales: each dot (|t| <= 2048) times a power of two is exact in fp16,
    each per-row / per-tensor normalization is exact, and the fp32 sums stay within 24 bits, so nothing rounds and
    split3 must equal the exact-integer path (int32 dots, fp32 fold per block) exactly."""
    rng = np.random.default_rng(7)
    rows, cols, kb = 3, 5, 4
    a_codes = rng.integers(-128, 128, (rows, kb, 32))
    q = rng.integers(0, 16, (cols, kb, 32))
    a_scale = np.exp2(rng.integers(-3, 1, (rows, kb))).astype(np.float32)  # F differs per row
    d = np.exp2(rng.integers(-2, 1, (cols, kb))).astype(np.float16)
    dot = np.einsum("rjk,cjk->rcj", a_codes, q - 8)  # independent of split3's nibble dots
    y, events = _split3_y(a_codes, a_scale, q, d, 1)
    assert not any(events.values())
    np.testing.assert_array_equal(y, hp.int_path(dot, a_scale, d))
    # and the value itself, in float64 (exact here)
    np.testing.assert_array_equal(y, np.einsum("rcj,rj,cj->rc", dot.astype(np.float64), a_scale.astype(np.float64),
                                               d.astype(np.float64)))


def test_split3_decomposes_every_int8_code():
    """16 hi + lp + 8 = c with hi, lp in -8..7, for every code -128..127: one code per row in lane 0 against
    w = 1 there and w = 0 elsewhere, so the three dots are hi(c), lp(c) and 1, and the whole path returns c."""
    codes = np.arange(-128, 128)
    a_codes = np.zeros((256, 1, 32), np.int64)
    a_codes[:, 0, 0] = codes
    q = np.full((1, 1, 32), 8)
    q[0, 0, 0] = 9
    t0, t1, t2 = (t[:, 0, 0] for t in hp.split3_dots(a_codes, q.astype(np.uint8)))
    assert t0.min() == -8 and t0.max() == 7 and t1.min() == -8 and t1.max() == 7 and (t2 == 1).all()
    np.testing.assert_array_equal(16 * t0 + t1 + 8 * t2, codes)
    y, _ = _split3_y(a_codes, np.ones((256, 1)), q, np.ones((1, 1)), 1)
    np.testing.assert_array_equal(y[:, 0], codes)


def test_split3_folds_with_16_1_and_8_and_a_hand_worked_cell():
    """The fold coefficients one at a time, then a cell worked by hand: 32 codes 37 (hi 2, lp 5 - 8 = -3) against
    w = 1, A scale 1 and B scale 1: F = D = 2, s = 0.5 x 0.5 = 0.25, dots (64, -96, 32), H = (16, -24, 8),
    y = ((-24 + 16 x 16) + 8 x 8) x 4 = 1184 = 37 x 32 (with 8 for G0 it would be 672)."""
    one, zero, f32 = np.ones((1, 1), np.float32), np.zeros((1, 1), np.float32), np.float32(1)
    assert hp.split3_fold(one, zero, zero, f32)[0, 0] == 16
    assert hp.split3_fold(zero, one, zero, f32)[0, 0] == 1
    assert hp.split3_fold(zero, zero, one, f32)[0, 0] == 8
    a_codes, q = np.full((1, 1, 32), 37), np.full((1, 1, 32), 9)
    F, D = hp.split3_normalizers(np.ones((1, 1), np.float32), np.ones((1, 1), np.float16))
    assert F.tolist() == [2.0] and D == 2.0
    s = hp.split3_scales(np.ones((1, 1), np.float32), np.ones((1, 1), np.float16), F, D)
    assert s.tolist() == [[[0.25]]]
    assert [int(t[0, 0, 0]) for t in hp.split3_dots(a_codes, q.astype(np.uint8))] == [64, -96, 32]
    y, _ = _split3_y(a_codes, np.ones((1, 1)), q, np.ones((1, 1)), 1)
    assert y[0, 0] == 1184


def test_split3_normalizers_put_the_largest_scales_in_half_to_one():
    """F per row from its largest A scale, D per tensor from the largest |B scale|, both exact powers of two;
    a zero / subnormal A row and an all-zero B take 1."""
    a_scale = np.array([[0.75, 0.1], [3.0, 4.0], [0.0, 0.0], [1e-40, 0.0]], np.float32)
    F, D = hp.split3_normalizers(a_scale, np.array([[0.01, -0.3], [0.2, 0.05]], np.float16))
    assert F.tolist() == [1.0, 8.0, 1.0, 1.0] and D == 0.5
    assert hp.split3_normalizers(a_scale, np.zeros((1, 2), np.float16))[1] == 1.0


@pytest.mark.parametrize("S, finite", [(8, True), (32, True), (33, False)])
def test_split3_needs_no_headroom_up_to_32_blocks(S, finite):
    """The worst codes (c = -128: hi = lp = -8, against w = -8: t0 = t1 = 2048) at the largest scale split3 can
    form (fp16(1) x (1 - 2^-11)): each block adds 2047 to H, 32 blocks reach 65504 = FP16's largest finite value,
    33 overflow. So a super-block of all of K = 4864 (152 blocks) has no such guarantee."""
    y, events = _split3_y(np.full((1, S, 32), -128), np.full((1, S), 0.99999), np.zeros((1, S, 32)),
                          np.full((1, S), 1 - 2 ** -11), S)
    assert (events["infinite H"] == 0) == finite and bool(np.isfinite(y).all()) == finite


def test_study_includes_split3_at_every_super_block():
    gauss = next(d for d in hp.DATA if d.name == "gaussian")
    r = {x.path: x for x in hp.study_shape("q/o", 896, 896, gauss, columns=32, rows=2, seed=5)}
    for S in ("1", "2", "4", "8", "whole K"):
        assert 0 < r[f".hp split3 S={S}"].added < 0.1
