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
