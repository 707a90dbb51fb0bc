"""The `.hp` decode kernel (target ime2, hp_blocks = S): A's int8 codes split into 4-bit rows, B read signed,
block-scaled vmadot.hp into FP16 sums folded every S blocks (docs/ime2-isa.md §10.8). Checked under QEMU at VLEN
1024 with the IME2 emulator against the CompInt8 oracle within a bound from FP16's error model (verify.hp_bound);
the bound is tight enough that a wrong fold coefficient fails; its words are the assemblers'; its refusals name the
setting and the reason."""

from __future__ import annotations

import dataclasses
import shutil
import subprocess

import numpy as np
import pytest

from imegen import toolchain
from imegen import reference as ref
from imegen.check import check_kernel, make_cases
from imegen.errors import SpecError
from imegen.ir import specs_from_text
from imegen.plan import expected_vmadots, plan_kernel
from imegen.targets.ime.asm import AsmOp
from imegen.targets.ime2 import kernel
from imegen.verify import FP16_U, build, compare, hp_bound, run_cases

pytestmark = pytest.mark.skipif(bool(toolchain.missing_tools()), reason="needs the cross toolchains and qemu-riscv64")

VLEN = 1024
FILE = "hp.imegen"
HP = ("op = gemv  tile = 1x32  panel = 32  k_unroll = 2  unpack = interleaved  scale_type = fp16  "
      "zero_point = symmetric")
HP_GEMM = "op = gemm  tile = 8x32  panel = 32  k_unroll = 2  unpack = interleaved  scale_type = fp16  b_pack = hp"


def spec_of(settings: str):
    return specs_from_text(f"kernel k {{ target = ime2  compute = int8  {settings} }}", FILE)[0]


@pytest.mark.parametrize("S", [1, 2, 4])
def test_hp_kernel_checks_at_vlen_1024_and_refuses_elsewhere(S):
    rows = check_kernel(plan_kernel(spec_of(f"{HP}  hp_blocks = {S}")), FILE)
    assert rows and all(r.ok for r in rows), [(r.compiler, r.vlen, r.message) for r in rows if not r.ok]
    assert {r.vlen for r in rows if not r.refusal} == {str(VLEN)}
    assert {r.compiler for r in rows} == {"clang", "gcc"}
    assert all(r.vmadots > 0 for r in rows if not r.refusal)


def test_four_vmadots_per_block_where_the_int8_path_needs_eight():
    hp, int8 = plan_kernel(spec_of(f"{HP}  hp_blocks = 2")), plan_kernel(spec_of(HP))
    assert expected_vmadots(hp, 1, 896, 896) * 2 == expected_vmadots(int8, 1, 896, 896) == 6272


def _run(plan, shapes, seed=3):
    cases = make_cases(plan, np.random.default_rng(seed), shapes, exact=False)
    return cases, run_cases(build(plan, FILE), cases, vlen=VLEN)


def test_results_lie_within_the_fp16_bound_and_near_it_only_where_fp16_rounds():
    """Every element within hp_bound, and the bound is not vacuous: the worst error uses a fair part of it, and the
    bound itself is a few FP16 units of the terms, not of the result's scale."""
    plan = plan_kernel(spec_of(f"{HP}  hp_blocks = 2"))
    cases, results = _run(plan, [(1, 96, 896), (3, 64, 4864), (1, 40, 100)])
    used = []
    for case, r in zip(cases, results):
        cmp = compare(plan, case, r)
        assert cmp.ok, cmp.message
        Y, _ = ref.matmul_nbits_int8(case.A, dataclasses.replace(case.qw, scales=case.qw.scales.astype(np.float16).astype(np.float32)))
        bound = hp_bound(dataclasses.replace(case, qw=dataclasses.replace(
            case.qw, scales=case.qw.scales.astype(np.float16).astype(np.float32))), 2)
        used.append(float((np.abs(r.C - Y) / bound).max()))
    assert 0.01 < max(used) <= 1.0, used


def test_a_wrong_fold_coefficient_fails_check(monkeypatch):
    """The tile end weighs row 4 (the ones: 8 x sum(w)) by 8; weighing it by 4 must fail the bound."""
    real = kernel.hp_tile_end

    def wrong():
        return tuple(AsmOp(op.kind, op.text.replace("0x41000000", "0x40800000"), op.comment) for op in real())

    monkeypatch.setattr(kernel, "hp_tile_end", wrong)
    rows = check_kernel(plan_kernel(spec_of(f"{HP}  hp_blocks = 2")), FILE)
    failed = [r for r in rows if not r.ok and not r.refusal]
    assert len(failed) == 2 and all("elements off" in r.message for r in failed)


def test_a_nan_in_a_reaches_its_row_only():
    plan = plan_kernel(spec_of(f"{HP}  hp_blocks = 2"))
    [clean] = make_cases(plan, np.random.default_rng(2), [(3, 40, 2 * 32 + 7)], exact=False)
    A = clean.A.copy()
    A[2, 35] = np.nan
    ok, bad = run_cases(build(plan, FILE), [clean, dataclasses.replace(clean, A=A)], vlen=VLEN)
    assert compare(plan, clean, ok).ok
    assert bad.status == 0 and np.isnan(bad.C[2]).all() and np.array_equal(bad.C[:2], ok.C[:2])


def test_the_bound_is_fp16_sized():
    """hp_bound is (S + 3) units of FP16 per term plus FP16's subnormal absolute error: for integer-valued data it is
    a small multiple of u times the sum of |terms|."""
    plan = plan_kernel(spec_of(f"{HP}  hp_blocks = 4"))
    [case] = make_cases(plan, np.random.default_rng(5), [(2, 32, 256)], exact=False)
    b = hp_bound(case, 4)
    assert np.all(b > 0) and np.all(np.isfinite(b))
    Y, acc = ref.matmul_nbits_int8(case.A, case.qw)
    assert float(np.median(b / np.maximum(np.abs(Y), 1e-6))) < 100 * FP16_U


ASSEMBLER = shutil.which("riscv64-linux-gnu-as")


@pytest.mark.skipif(not ASSEMBLER, reason="needs riscv64-linux-gnu-as")
@pytest.mark.parametrize("text, march, word", [
    ("flh f0, 2(t3)", "rv64gc_zfh", kernel.encode_flh(0, kernel.HP_SCALE_BASE, 2)),
    ("vfncvt.f.f.w v16, v8", "rv64gcv", kernel.encode_vfncvt_f_f_w(16, 8)),
], ids=["flh", "vfncvt"])
def test_words_are_the_assemblers(tmp_path, text, march, word):
    src, obj = tmp_path / "w.s", tmp_path / "w.o"
    src.write_text(text + "\n")
    subprocess.run([ASSEMBLER, f"-march={march}", str(src), "-o", str(obj)], check=True)
    dump = subprocess.run(["riscv64-linux-gnu-objdump", "-d", str(obj)], capture_output=True, text=True, check=True)
    assert f"{word:08x}" in dump.stdout


@pytest.mark.parametrize("settings, words", [
    ("op = gemv  tile = 1x16  panel = 16  k_unroll = 2  unpack = interleaved  scale_type = fp16  hp_blocks = 2",
     "tile differs"),
    ("op = gemv  tile = 1x32  panel = 32  k_unroll = 2  unpack = interleaved  zero_point = asymmetric  hp_blocks = 2",
     "zero_point differs"),
    (f"{HP}  hp_blocks = 3", "must be one of"),
    (f"{HP_GEMM}  tile = 16x32", "set twice"),
    ("op = gemm  tile = 16x32  panel = 32  k_unroll = 2  unpack = interleaved  scale_type = fp16  b_pack = hp",
     "tile differs"),
    (f"{HP}  b_pack = hp", "set hp_blocks"),
])
def test_refusals_name_the_setting_and_the_reason(settings, words):
    with pytest.raises(SpecError, match=words):
        spec_of(settings)


def test_hp_blocks_needs_target_ime2():
    with pytest.raises(SpecError, match="needs target = ime2"):
        specs_from_text("kernel k { target = ime  compute = int8  op = gemv  tile = 1x16  hp_blocks = 2 }", FILE)


@pytest.mark.parametrize("kind, S, K", [("gaussian", 2, 896), ("outliers", 2, 896), ("outliers", 1, 928),
                                        ("gaussian", 4, 928), ("outliers", 8, 4864)])
def test_the_kernel_computes_what_the_accuracy_study_models(kind, S, K):
    """The kernel's results equal imegen.perf.hp_study's split3 model of its arithmetic to the bit (codes, FP16
    steps, fp32 folds, normalizers; K = 928: a super-block left short): so the study's accuracy figures against ORT's
    tolerance are the kernel's."""
    from imegen.perf import hp_study

    plan = plan_kernel(spec_of(f"{HP}  hp_blocks = {S}"))
    rng = np.random.default_rng(11)
    M, N = 3, 64
    A = rng.standard_normal((M, K)).astype(np.float32)
    if kind == "outliers":
        A[:, rng.choice(K, 9, replace=False)] *= 60
    W = (rng.standard_normal((K, N)) * 0.02).astype(np.float32)
    qw = ref.quantize_weights(W, 4, 32, symmetric=True)
    case = dataclasses.replace(make_cases(plan, rng, [(M, N, K)], exact=False)[0], A=A, qw=qw, bias=None,
                               lda_pad=0, ldc_pad=0, slices=1)
    [r] = run_cases(build(plan, FILE), [case], vlen=VLEN)
    assert r.status == 0
    codes, a_scale = ref.quantize_a_int8(A, 32)
    q, _ = ref.unpack_codes(qw)  # [K, N]
    d16 = np.clip(qw.scales, -65504, 65504).astype(np.float16)  # [N, kb], as the packer stores them
    y, _ = hp_study.split3_path(codes.astype(np.int64).reshape(M, -1, 32), a_scale,
                                q.T.reshape(N, -1, 32), d16, S)
    assert np.array_equal(r.C, y), float(np.abs(r.C - y).max())


@pytest.mark.parametrize("bias", ["no", "yes"])
def test_the_gemm_reading_the_hp_packing_checks(bias):
    """b_pack = hp: the in-register 8x32 gemm reads B as the .hp gemv packs it (signed codes, FP16 scales / D) and is
    exact on exactly representable data, as the plain gemm is."""
    rows = check_kernel(plan_kernel(spec_of(f"{HP_GEMM}  bias = {bias}")), FILE)
    assert rows and all(r.ok for r in rows), [(r.compiler, r.vlen, r.message) for r in rows if not r.ok]
    assert {r.compiler for r in rows} == {"clang", "gcc"}


def test_scales_far_below_the_largest_round_as_the_packing_says():
    """Column scales 2^20 apart, all FP16-normal: the small ones fall below FP16's normal range once divided by D and
    round; the oracle (hp_packed_scales) holds both kernels to that, and an oracle without it would not match."""
    rng = np.random.default_rng(4)
    for settings, slices in ((HP_GEMM, 1), (HP_GEMM, 2), (f"{HP}  hp_blocks = 2", 1), (f"{HP}  hp_blocks = 2", 2)):
        plan = plan_kernel(spec_of(settings))
        M = 9 if plan.spec.op == "gemm" else 1
        [case] = make_cases(plan, rng, [(M, 64, 256)], exact=False)
        scales = case.qw.scales.copy()
        scales[32:] *= 2.0 ** 20  # columns 32-63 ~1e3 (D = 2^10 or 2^11), 0-31 ~1e-3: divided by D, subnormal in FP16
        # slices = 2: each half of B packed alone, with its own D (columns 0-31 then exact)
        case = dataclasses.replace(case, qw=dataclasses.replace(case.qw, scales=scales), bias=None, slices=slices)
        [r] = run_cases(build(plan, FILE), [case], vlen=VLEN)
        assert compare(plan, case, r).ok, (settings, slices, compare(plan, case, r).message)


def test_a_node_decodes_and_prefills_from_one_packed_copy():
    """The .hp gemv and the b_pack = hp gemm pack B alike: the custom-op library keeps one copy for both."""
    from imegen.ort.customop import packing

    gemv, gemm = plan_kernel(spec_of(f"{HP}  hp_blocks = 2")), plan_kernel(spec_of(HP_GEMM))
    assert packing(gemv) == packing(gemm)
    assert packing(gemm) != packing(plan_kernel(spec_of(HP_GEMM.replace("  b_pack = hp", ""))))


def test_the_ones_row_survives_agnostic_tails(monkeypatch):
    """The A tile's row of ones (rows 4-7) is written once per tile and kept by the blocks' 64-byte loads only under
    a tail-undisturbed vtype. QEMU leaves agnostic tails alone unless told to fill them with ones: told so, the
    kernel still passes, and the same kernel with a tail-agnostic block vtype fails."""
    from imegen import toolchain as tc

    real = tc.qemu_cpu
    monkeypatch.setattr(tc, "qemu_cpu", lambda *a, **k: real(*a, **k) + ",rvv_ta_all_1s=true,rvv_ma_all_1s=true")
    plan = plan_kernel(spec_of(f"{HP}  hp_blocks = 2"))
    cases, results = _run(plan, [(1, 64, 256), (2, 40, 100)])
    assert all(compare(plan, c, r).ok for c, r in zip(cases, results))
    monkeypatch.setattr(kernel, "HP_LOOP_VTYPE", kernel.HP_LOOP_VTYPE.replace(" tu,", " ta,"))
    plan = plan_kernel(spec_of(f"{HP}  hp_blocks = 2"))
    cases, results = _run(plan, [(1, 64, 256), (2, 40, 100)])
    assert not any(compare(plan, c, r).ok for c, r in zip(cases, results))
