"""Generated kernels, compiled and run (natively or under QEMU), against the NumPy reference.

Hypothesis draws kernel configs from the DSL's value sets, shapes around every edge (M=1, odd M,
K not a multiple of the block, N not a multiple of the panel) and data (random, or exactly
representable so results must match to the bit).
"""

from __future__ import annotations

import dataclasses
import re

import numpy as np
import pytest
from hypothesis import given, strategies as st

from imegen import targets
from imegen.check import refusal_row, check_kernel, make_cases, vlens_for
from imegen.errors import SpecError
from imegen.ir import specs_from_text
from imegen.plan import plan_kernel
from imegen.toolchain import ToolchainError
from imegen.verify import build, compare, compilers_for, run_cases


@st.composite
def kernel_specs(draw, target=None):
    """Valid specs of one target (any, by default): settings drawn from what the target accepts, steered
    towards its own tile rules and options (vmadot's 4-row and 4-column tiles; the options only it offers)."""
    target = target or draw(st.sampled_from(targets.NAMES))
    t = targets.get(target)
    compute = draw(st.sampled_from(t.computes))
    op = draw(st.sampled_from(["gemm", "gemv"]))
    rows, cols = t.tile_step
    if t.needs_ime:  # multiples of the vmadot tile (ime 4x4, ime2 8x8)
        tm = 1 if op == "gemv" else draw(st.sampled_from([rows, 2 * rows]))
        tn = draw(st.sampled_from([cols, 2 * cols, 4 * cols]))
    else:
        tm = 1 if op == "gemv" else draw(st.integers(1, 4))
        tn = draw(st.sampled_from([4, 8, 16]))
    settings = {
        "op": op, "target": target, "compute": compute, "tile": f"{tm}x{tn}",
        "bits": draw(st.sampled_from([4, 8])), "block": draw(st.sampled_from([16, 32, 64, 128, 256])),
        "zero_point": draw(st.sampled_from(["symmetric", "asymmetric"])),
        "bias": draw(st.sampled_from(["yes", "no"])), "k_unroll": draw(st.sampled_from([1, 2, 4])),
        "unpack": draw(st.sampled_from(["planar", "interleaved"])),
        "panel": tn * draw(st.sampled_from([1, 2])), "scales": draw(st.sampled_from(["inline", "separate"])),
        "scale_type": draw(st.sampled_from(["fp32", "fp16"])) if compute == "int8" else "fp32",
    }
    if t.vector and t.only_vlen is None:  # a minimum VLEN of the kernel's choosing
        settings["vlen"] = draw(st.sampled_from([128, 256]))
    if "a_scale_type" in t.options and op == "gemv" and settings["scale_type"] == "fp16":
        settings["a_scale_type"] = draw(st.sampled_from(["fp32", "fp16"]))
    if "stage_b" in t.options and tm in (4, 8) and tn == 8 and settings["k_unroll"] == 2 and settings["bits"] == 4:
        settings["stage_b"] = draw(st.sampled_from(["tile", "m_block"]))
        if op == "gemm" and settings["stage_b"] == "m_block" and settings["scale_type"] == "fp16" and draw(st.booleans()):
            settings["a_scale_type"] = "fp16"
        elif op == "gemm":
            settings["spread"] = draw(st.sampled_from(["group", "per_register"]))
    text = "kernel fuzz {\n" + "".join(f"  {k} = {v}\n" for k, v in settings.items()) + "}\n"
    try:
        return specs_from_text(text, "fuzz.imegen")[0]
    except SpecError:
        # Refusals are tested in test_dsl.py; here draw again with a valid config.
        from hypothesis import assume

        assume(False)


@st.composite
def shapes(draw, spec):
    M = 1 if spec.op == "gemv" and draw(st.booleans()) else draw(st.integers(1, 2 * spec.tile_m + 3))
    N = draw(st.integers(1, 2 * spec.panel + 3))
    K = draw(st.integers(1, 3 * spec.block + 5))
    return M, N, K


def _run_one(spec, data, vlen, *, host=False):
    plan = plan_kernel(spec)
    M, N, K = data.draw(shapes(spec))
    exact = data.draw(st.booleans())
    seed = data.draw(st.integers(0, 2**32 - 1))
    case = make_cases(plan, np.random.default_rng(seed), [(M, N, K)], exact=exact)[0]
    b = build(plan, "fuzz.imegen", host=host)
    [result] = run_cases(b, [case], vlen=vlen)
    c = compare(plan, case, result, exact=exact)
    assert c.ok, f"{spec.describe()} M,N,K={M},{N},{K} exact={exact} vlen={vlen}: {c.message}"


@pytest.mark.parametrize("target", targets.NAMES)
@given(data=st.data())
def test_kernels_match_numpy(target, data):
    """Every target's kernels against NumPy: portable C natively, vector kernels under QEMU at a VLEN they accept."""
    spec = data.draw(kernel_specs(target))
    if targets.get(target).host_build:
        _run_one(spec, data, None, host=True)
    else:
        _run_one(spec, data, data.draw(st.sampled_from(vlens_for(plan_kernel(spec)))))


def test_example_spec_checks_with_both_compilers():
    from imegen.ir import load_specs

    for spec in load_specs("examples/qwen_mlp.imegen"):
        rows = check_kernel(plan_kernel(spec), "examples/qwen_mlp.imegen")
        assert rows and all(r.ok for r in rows), [r.message for r in rows if not r.ok]


def test_rvv_kernel_refuses_too_small_vlen():
    spec = specs_from_text("kernel wide { target = rvv  vlen = 256  tile = 1x32  op = gemv  panel = 32 }")[0]
    plan = plan_kernel(spec)
    case = make_cases(plan, np.random.default_rng(0), [(1, 5, 40)], exact=False)[0]
    [small] = run_cases(build(plan), [case], vlen=128)
    assert small.status == 1  # IMEGEN_ERR_VLEN, nothing computed
    [ok] = run_cases(build(plan), [case], vlen=512)
    assert compare(plan, case, ok).ok


@pytest.mark.parametrize("op", ["gemm", "gemv"])
def test_ime_kernel_refuses_other_vlens_by_itself(op):
    """On a hart whose VLEN is not the K1's the driver installs no emulator, so the kernel must return
    IMEGEN_ERR_VLEN before its first vmadot (which would die by SIGILL) and leave C alone."""
    tile = "8x8" if op == "gemm" else "1x16"
    spec = specs_from_text(f"kernel k {{ op = {op}  target = ime  compute = int8  tile = {tile}  panel = {tile.split('x')[1]} }}")[0]
    plan = plan_kernel(spec)
    case = make_cases(plan, np.random.default_rng(0), [(3, 20, 64)], exact=False)[0]
    exe = build(plan)
    for vlen in (128, 512):
        [r] = run_cases(exe, [case], vlen=vlen)
        assert (r.status, r.vmadots) == (1, 0), vlen  # IMEGEN_ERR_VLEN
    [ok] = run_cases(exe, [case], vlen=256)
    assert ok.status == 0 and ok.vmadots > 0 and compare(plan, case, ok).ok


def test_check_shows_the_refusals_at_other_vlens():
    """`imegen check` runs a vector kernel at the VLENs of 128..512 it does not accept too: rows that pass
    only when every call returned IMEGEN_ERR_VLEN with no vmadot, C and the workspace untouched."""
    for text, refused in [("kernel k { op = gemm  target = ime  compute = int8  tile = 8x8  panel = 8 }", {"128", "512"}),
                          ("kernel w { op = gemv  target = rvv  vlen = 256  tile = 1x32  panel = 32 }", {"128"}),
                          # int8: its int32 accumulators (LMUL 2 for the 8 columns' int16 products at LMUL 1) would
                          # fit VLEN 128; spec vlen 256 is still the least it accepts
                          ("kernel v { op = gemm  target = rvv  compute = int8  vlen = 256  tile = 2x8  panel = 8 }", {"128"})]:
        rows = check_kernel(plan_kernel(specs_from_text(text)[0]), "t.imegen")
        assert all(r.ok for r in rows), [r.message for r in rows if not r.ok]
        assert {r.vlen.split()[0] for r in rows if r.vlen.endswith("(refuses)")} == refused
        assert {r.vlen for r in rows} - {f"{v} (refuses)" for v in refused} == {"256", "512"} - refused


def _patch_kernel(monkeypatch, function: str, inject: str = "", *, body: str | None = None):
    """Have verify build kernel `k` with `inject` put at the top of k_<function> (or its body replaced by
    `body`): a kernel made to misbehave, for tests that the checks catch it."""
    from imegen import verify

    render = verify.render_kernel
    head = rf"(\n\w+ k_{function}\([^)]*\)\n\{{\n)"

    def patched(plan, spec_file):
        sources = render(plan, spec_file)
        new = (re.sub(head + r".*?\n\}", lambda m: m.group(1) + body + "\n}", sources["k.c"], count=1, flags=re.S) if body is not None
               else re.sub(head, lambda m: m.group(1) + inject, sources["k.c"], count=1))
        assert new != sources["k.c"]
        return {**sources, "k.c": new}

    monkeypatch.setattr(verify, "render_kernel", patched)


def test_a_kernel_that_does_not_refuse_fails_check(monkeypatch):
    """The refusal rows can fail: an RVV kernel generated for VLEN 128 computes there (status 0), and an IME
    kernel whose supported() accepts any VLEN dies by SIGILL at its first vmadot (no emulator off VLEN 256)."""
    from imegen import verify

    rvv = plan_kernel(specs_from_text("kernel w { op = gemv  target = rvv  vlen = 256  tile = 1x8  panel = 8 }")[0])
    lenient = dataclasses.replace(build(plan_kernel(dataclasses.replace(rvv.spec, vlen=128))), plan=rvv)
    cases = make_cases(rvv, np.random.default_rng(0), [(1, 5, 40), (3, 9, 64)], exact=False)
    row = refusal_row(lenient, 128, cases)
    assert not row.ok and "returned status 0" in row.message

    _patch_kernel(monkeypatch, "supported", body="    return 1;")
    ime = plan_kernel(specs_from_text("kernel k { op = gemm  target = ime  compute = int8  tile = 8x8  panel = 8 }")[0])
    row = refusal_row(verify.build(ime), 128, make_cases(ime, np.random.default_rng(0), [(3, 20, 64)], exact=False))
    assert not row.ok and "SIGILL" in row.message


NON_FINITE_KERNELS = [
    "op = gemm  target = ime  compute = int8  tile = 8x8  panel = 8",  # block 32: one register group per block
    "op = gemm  target = ime  compute = int8  tile = 8x8  panel = 8  block = 128",  # two groups
    "op = gemv  target = ime  compute = int8  tile = 1x16  panel = 16  block = 256",  # a loop of groups
    "op = gemm  target = ime  compute = int8  tile = 8x12  panel = 12  block = 64  stage_b = m_block  scale_type = fp16  a_scale_type = fp16",
    "op = gemm  target = rvv  compute = int8  tile = 4x8  panel = 8",
    "op = gemm  target = rvv  compute = fp32  tile = 4x16  panel = 16",
    "op = gemm  target = scalar  compute = int8  tile = 4x8  panel = 8  block = 128",
]


@pytest.mark.parametrize("settings", NON_FINITE_KERNELS)
def test_a_nan_or_inf_in_a_reaches_its_row_of_c(settings):
    """Dequantize-then-matmul makes a row of C NaN when its row of A holds a NaN (non-finite for an inf). int8
    kernels took max |a| with vfredmax / fmaxf, which skip NaN: the row came out finite and wrong (as ORT's
    x86 level-4 path still does). a_scale_type = fp16 refuses it (IMEGEN_ERR_RANGE). Other rows are untouched."""
    plan = plan_kernel(specs_from_text(f"kernel k {{ {settings} }}")[0])
    M = 1 if plan.spec.op == "gemv" else 5
    clean = make_cases(plan, np.random.default_rng(2), [(M, 20, 2 * plan.spec.block + 7)], exact=False)[0]
    bad = []
    for value in (np.nan, np.inf, -np.inf):
        A = clean.A.copy()
        A[M - 1, plan.spec.block + 3] = value  # the last row, in its second block
        bad.append(dataclasses.replace(clean, A=A))
    for compiler in compilers_for(plan):
        ok, *runs = run_cases(build(plan, compiler=compiler), [clean, *bad])
        assert compare(plan, clean, ok).ok, compiler
        for value, r in zip(("nan", "inf", "-inf"), runs):
            if plan.spec.a_scale_type == "fp16":
                assert r.status == 3, (compiler, value)  # IMEGEN_ERR_RANGE
                continue
            assert r.status == 0
            row = r.C[M - 1]
            assert (np.isnan(row).all() if value == "nan" else not np.isfinite(row).any()), (compiler, value, row)
            assert np.array_equal(r.C[:M - 1], ok.C[:M - 1]), (compiler, value)


@pytest.mark.parametrize("target", targets.NAMES)
def test_a_wrong_layout_is_caught(target):
    """The harness can fail: a kernel whose packer puts nibbles in the wrong place must not pass."""
    compute = {"rvv": "fp32"}.get(target, "int8")  # one of the three computes in fp32
    t = targets.get(target)
    spec = specs_from_text(f"kernel broken {{ target = {target}  compute = {compute}  tile = {max(4, t.tile_step[0])}x8  panel = 8 }}")[0]
    plan = plan_kernel(spec)
    wrong = dataclasses.replace(plan, pack=dataclasses.replace(plan.pack, shift="4 - (" + plan.pack.shift + ")"))
    case = make_cases(plan, np.random.default_rng(1), [(5, 9, 70)], exact=True)[0]
    vlen = t.only_vlen or 256
    [good] = run_cases(build(plan), [case], vlen=vlen)
    [bad] = run_cases(build(wrong), [case], vlen=vlen)
    assert compare(plan, case, good, exact=True).ok
    assert not compare(plan, case, bad).ok


def test_regression_ime_loop_count_equal_to_b_stride():
    """Found by Hypothesis: with n == bstride == 32 the compiler gave both asm operands one
    register (outputs were not early-clobber), so the loop pointer stepped by the counter."""
    spec = specs_from_text("kernel r { target = ime  compute = int8  bits = 8  block = 256  tile = 4x4  panel = 4  k_unroll = 1 }")[0]
    plan = plan_kernel(spec)
    cases = make_cases(plan, np.random.default_rng(3), [(1, 1, 17), (5, 7, 256)], exact=True)
    for compiler in ("clang", "gcc"):
        for case, result in zip(cases, run_cases(build(plan, compiler=compiler), cases)):
            assert compare(plan, case, result, exact=True).ok


@pytest.mark.parametrize("text, shape, host", [
    ("kernel mb { target = scalar  compute = fp32  tile = 3x4  panel = 4 }", (40, 5, 4096), True),  # 16 KB rows: 24-row blocks
    ("kernel mb { target = ime  compute = int8  tile = 4x8  panel = 8 }", (90, 9, 8192), False),  # 10 KB rows: 36-row blocks, two whole and a partial one
])
def test_m_blocking_across_several_blocks(text, shape, host):
    """A's workspace rows per M block fit 3/4 of the L2; several blocks (and a partial one) must agree."""
    plan = plan_kernel(specs_from_text(text)[0])
    cases = make_cases(plan, np.random.default_rng(6), [shape], exact=False)
    [result] = run_cases(build(plan, host=host), cases, vlen=None if host else 256)
    assert compare(plan, cases[0], result).ok


def _kernel_with_main(tmp_path, plan, main_c: str, **compile_kw):
    """Build `main_c`, which #includes the plan's generated .c to call its static helpers directly."""
    from imegen import toolchain
    from imegen.render import render_kernel

    for name, text in render_kernel(plan, "test").items():
        (tmp_path / name).write_text(text)
    (tmp_path / "main.c").write_text(main_c)
    return toolchain.compile_c([tmp_path / "main.c"], tmp_path / "main", include_dirs=[tmp_path], **compile_kw)


def test_fp16_scale_conversion_matches_numpy(tmp_path):
    """The generated binary16 conversions (no _Float16) against numpy's, over normal, subnormal,
    tie, overflow (saturated) and special values: the oracle rounds scales with numpy."""
    from imegen import toolchain

    plan = plan_kernel(specs_from_text("kernel h { target = scalar  compute = int8  scale_type = fp16 }")[0])
    exe = _kernel_with_main(tmp_path, plan,
                            '#include "h.c"\n#include <stdio.h>\n'
                            "int main(void) { uint32_t x; while (fread(&x, 4, 1, stdin) == 1) { float f; memcpy(&f, &x, 4);\n"
                            "  uint16_t h = h_half_from_float(f); float g = h_float_from_half(h); fwrite(&h, 2, 1, stdout); fwrite(&g, 4, 1, stdout); }\n"
                            "  return 0; }\n", host=True, extra_flags=["-Wno-unused-function"])
    rng = np.random.default_rng(7)
    specials = np.array([0.0, -0.0, 1.0, 65504.0, 65519.99, 65520.0, 1e9, np.inf, -np.inf, 2.0**-24, 2.0**-25,
                         1.5 * 2.0**-25, 2.0**-14, 2.0**-14 * (1 - 2.0**-11), 1.0 + 2.0**-11, 1.0 + 3 * 2.0**-11], np.float32)
    values = np.concatenate([specials, rng.standard_normal(4000).astype(np.float32) * np.float32(0.1),
                             (rng.integers(0, 2**32, 4000, dtype=np.uint64).astype(np.uint32)).view(np.float32)])
    values = values[~np.isnan(values)]
    out = toolchain.run(exe, host=True, input=values.tobytes()).stdout
    rec = np.frombuffer(out, dtype=np.dtype([("h", "<u2"), ("f", "<f4")]))
    want = np.clip(values, -65504, 65504).astype(np.float16)  # the packer saturates: stored scales are finite
    np.testing.assert_array_equal(rec["h"], want.view(np.uint16))
    np.testing.assert_array_equal(rec["f"], want.astype(np.float32))


@pytest.mark.parametrize("settings", [
    "tile = 8x8  k_unroll = 2  panel = 16  zero_point = asymmetric  scale_type = fp16  scales = inline  block = 32",
    "tile = 4x16  k_unroll = 2  panel = 32  zero_point = symmetric  scale_type = fp32  scales = separate  block = 64  bias = yes",
    "tile = 4x8  k_unroll = 4  panel = 8  zero_point = asymmetric  scale_type = fp32  scales = separate  block = 128  unpack = interleaved",
])
def test_fp32_accumulators_in_registers_over_many_blocks(settings):
    """Tiles whose fp32 accumulators stay in registers run one asm statement over all K blocks
    (pointers stepped by the layout's strides): many blocks, a partial last one and a partial
    last panel must match the reference, with both compilers."""
    from imegen.targets.ime.rules import fp32_acc_in_registers

    spec = specs_from_text(f"kernel inreg {{ target = ime  compute = int8  bits = 4  {settings} }}")[0]
    plan = plan_kernel(spec)
    assert fp32_acc_in_registers(spec) and plan.ime.whole_k
    cases = make_cases(plan, np.random.default_rng(11), [(9, 21, 13 * spec.block + 7), (8, 40, spec.block)], exact=True)
    for compiler in ("clang", "gcc"):
        for case, result in zip(cases, run_cases(build(plan, compiler=compiler), cases, vlen=256)):
            assert compare(plan, case, result, exact=True).ok, compiler


def test_large_tiles_keep_fp32_accumulators_in_memory():
    from imegen.targets.ime.rules import fp32_acc_in_registers

    for text in ("tile = 8x16  k_unroll = 2  panel = 16", "tile = 8x8  k_unroll = 4  panel = 8  zero_point = asymmetric", "tile = 8x8  bits = 8  k_unroll = 2  panel = 8"):
        spec = specs_from_text(f"kernel mem {{ target = ime  compute = int8  {text} }}")[0]
        assert not fp32_acc_in_registers(spec) and not plan_kernel(spec).ime.whole_k


@pytest.mark.parametrize("settings", [
    "tile = 8x8  panel = 16  zero_point = asymmetric  scale_type = fp32  scales = inline  block = 32",
    "tile = 4x8  panel = 8  zero_point = symmetric  scale_type = fp16  scales = separate  block = 64  unpack = interleaved  bias = yes",
    "tile = 8x8  panel = 32  zero_point = asymmetric  scale_type = fp16  scales = inline  block = 128",
    "tile = 8x8  panel = 16  zero_point = asymmetric  scale_type = fp16  scales = inline  block = 32  spread = per_register",
    "tile = 4x8  panel = 8  zero_point = symmetric  scale_type = fp32  scales = separate  block = 64  spread = per_register",
    "tile = 8x12  panel = 48  zero_point = asymmetric  scale_type = fp16  a_scale_type = fp16  scales = inline  block = 128",
])
def test_staged_b_over_several_m_blocks(settings):
    """stage_b = m_block unpacks an N tile's B once per M block into the workspace: with the A budget
    cut to two tiles of rows (plus the staged B), M = 57 runs several M blocks, each re-staging every N
    tile, with a partial last block, M tile, N tile and K block; both compilers, exact reference."""
    from imegen.perf.model import x60

    spec = specs_from_text(f"kernel staged {{ target = ime  compute = int8  bits = 4  k_unroll = 2  stage_b = m_block  {settings} }}")[0]
    plan = plan_kernel(spec)
    assert plan.ime.staged and plan.ime.whole_k
    K, tm = 13 * spec.block + 7, spec.tile_m
    row_bytes = x60.workspace_bytes(plan, tm, K) // tm
    plan = dataclasses.replace(plan, a_block_bytes=x60.staged_bytes(plan, K) + 2 * tm * row_bytes)
    assert x60.m_block_rows(plan, K) == 2 * tm
    cases = make_cases(plan, np.random.default_rng(12), [(57, 21, K), (8, 16, spec.block)], exact=True)
    assert x60.a_workspace_dram(plan, 57, K, 1) < x60.workspace_bytes(plan, 57, K)  # one M block's buffer, not all of A
    for compiler in ("clang", "gcc"):
        for case, result in zip(cases, run_cases(build(plan, compiler=compiler), cases, vlen=256)):
            assert compare(plan, case, result, exact=True).ok, compiler
            assert_writes_the_modeled_workspace(plan, case, result)


@pytest.mark.parametrize("settings", [
    "tile = 8x8  panel = 16  zero_point = asymmetric  scale_type = fp16  block = 32",
    "tile = 8x12  panel = 24  zero_point = symmetric  scale_type = fp16  a_scale_type = fp16  block = 64  stage_b = m_block",
])
def test_direct_c_store_for_every_row_stride(settings):
    """Whole tiles leave the asm by 8-byte indexed stores when C is 8-byte aligned (an even ldc, an even
    slice start), else through facc like an edge tile: both ways, and a later K chunk's, exact."""
    from imegen.verify import Case

    spec = specs_from_text(f"kernel direct {{ target = ime  compute = int8  bits = 4  k_unroll = 2  scales = inline  {settings} }}")[0]
    plan = plan_kernel(spec)
    assert plan.ime.direct_store and plan.ime.uses("full")
    # one 8-element store per accumulator pair (the X60 model charges indexed stores by the element)
    stores = [op for op in plan.ime.tile_end if op.kind.startswith("vsuxei")]
    assert len(stores) == plan.ime.ma * plan.ime.na and all(op.kind == "vsuxei64" for op in stores)
    assert plan.ime.tile_end[1].text == "vsetivli zero, 8, e64, m2, ta, ma"  # after the edge-tile branch
    base = make_cases(plan, np.random.default_rng(13), [(16, 50, 5 * spec.block)] * 4, exact=True)
    cases = [dataclasses.replace(c, lda_pad=0, ldc_pad=pad, slices=slices)
             for c, (pad, slices) in zip(base, [(0, 1), (1, 1), (2, 1), (0, 3)])]  # ldc 50, 51, 52; slices at 0, 17, 34
    assert [c.ldc_pad % 2 for c in cases] == [0, 1, 0, 0] and isinstance(cases[0], Case)
    forced = dataclasses.replace(plan, forced_k_chunks=2)
    for p in (plan, forced):
        for compiler in ("clang", "gcc"):
            for case, result in zip(cases, run_cases(build(p, compiler=compiler), cases, vlen=256)):
                assert compare(p, case, result, exact=True).ok, (compiler, case.ldc_pad, case.slices, p.forced_k_chunks)


def assert_writes_the_modeled_workspace(plan, case, result) -> None:
    """matmul writes no more of its workspace than the X60 model charges to DRAM for it (one reused M block
    buffer of quantized A: x60.a_workspace_dram) plus a staged B's scratch: the driver poisons the
    workspace and counts the bytes that changed."""
    from imegen.perf.model import x60

    M, N, K = case.shape
    allowed = x60.a_workspace_dram(plan, M, K, x60.k_chunks(plan, M, N, K)) + x60.staged_bytes(plan, K)
    assert 0 < result.workspace_touched <= allowed, (result.workspace_touched, allowed)


@pytest.mark.parametrize("settings", [
    "tile = 8x8  k_unroll = 2  panel = 16  zero_point = asymmetric  scale_type = fp32  scales = inline  block = 32",
    "tile = 8x8  k_unroll = 2  panel = 8  zero_point = symmetric  scale_type = fp16  scales = separate  block = 64  bias = yes",
    "tile = 4x8  k_unroll = 4  panel = 16  zero_point = asymmetric  scale_type = fp16  scales = inline  block = 32  unpack = interleaved",
    "tile = 8x16  k_unroll = 2  panel = 16  zero_point = asymmetric  scale_type = fp16  scales = inline  block = 64",  # fp32 acc in memory
    "tile = 8x12  k_unroll = 2  panel = 24  zero_point = symmetric  scale_type = fp32  scales = separate  block = 32  bias = yes",
    "tile = 4x12  k_unroll = 2  panel = 12  zero_point = asymmetric  scale_type = fp16  scales = inline  block = 32",  # grouped fold
    "tile = 12x4  k_unroll = 2  panel = 8  zero_point = symmetric  scale_type = fp32  scales = separate  block = 64",
])
def test_spread_per_register_over_many_blocks(settings):
    """spread = per_register spreads the fold's scales by LMUL-1 vrgathers (and whole-register copies):
    exact reference over many blocks, a partial last block, M tile and N tile, both compilers; where
    the fold reads e16 tables, the group form's would put every scale in the wrong lanes and must fail."""
    from imegen.targets.ime.asm import gathers_per_register

    spec = specs_from_text(f"kernel pr {{ target = ime  compute = int8  bits = 4  spread = per_register  {settings} }}")[0]
    plan = plan_kernel(spec)
    assert gathers_per_register(plan.ime.fold) and sum(op.kind == "vrgather" for op in plan.ime.fold) >= 4
    cases = make_cases(plan, np.random.default_rng(13), [(11, 21, 9 * spec.block + 5), (8, 16, spec.block)], exact=True)
    for compiler in ("clang", "gcc"):
        for case, result in zip(cases, run_cases(build(plan, compiler=compiler), cases, vlen=256)):
            assert compare(plan, case, result, exact=True).ok, compiler
    from imegen.targets.ime.folds import PAIRED_FOLD_INDEX

    if not plan.ime.index16:
        return
    wrong = dataclasses.replace(plan, ime=dataclasses.replace(plan.ime, index16=PAIRED_FOLD_INDEX))
    [bad] = run_cases(build(wrong), cases[:1], vlen=256)
    assert not compare(plan, cases[0], bad).ok


def test_spread_per_register_is_validated_where_it_is_generated():
    """Every IME gemm config the validator admits with spread = per_register plans a fold whose vrgathers
    all run at LMUL 1 (plan_kernel asserts it), over tiles, k_unroll and the layout settings."""
    import itertools

    admitted = 0
    for tm, tn, ku, zp, stype, sc in itertools.product((4, 8, 12, 16), (4, 8, 12, 16), (1, 2, 4), ("symmetric", "asymmetric"),
                                                    ("fp32", "fp16"), ("inline", "separate")):
        try:
            spec = specs_from_text(f"kernel k {{ target = ime  compute = int8  bits = 4  tile = {tm}x{tn}  panel = {tn}  "
                                   f"k_unroll = {ku}  zero_point = {zp}  scale_type = {stype}  scales = {sc}  spread = per_register }}")[0]
        except SpecError:
            continue
        plan_kernel(spec)
        admitted += 1
    assert admitted >= 90


def test_spread_per_register_refuses_what_it_is_not_written_for():
    for text, what in (("tile = 4x16  k_unroll = 2", "4x16 at k_unroll 2"), ("tile = 16x8  k_unroll = 2", "16x8 at k_unroll 2"),
                       ("tile = 1x8  op = gemv", "op gemm"), ("tile = 8x8  abi = mlas", "abi imegen")):
        with pytest.raises(SpecError, match=what):
            specs_from_text(f"kernel s {{ target = ime  compute = int8  bits = 4  {text}  spread = per_register }}")


@pytest.mark.parametrize("settings", [
    "tile = 8x8  panel = 16  zero_point = asymmetric  scales = inline  block = 32",
    "tile = 4x8  panel = 8  zero_point = symmetric  scales = separate  block = 64  unpack = interleaved  bias = yes",
    "tile = 8x8  panel = 32  zero_point = asymmetric  scales = inline  block = 128  bias = yes",
    "tile = 8x12  panel = 24  zero_point = asymmetric  scales = inline  block = 64",  # the table-free 8x12 fold
    "tile = 8x12  panel = 12  zero_point = symmetric  scales = separate  block = 32  unpack = interleaved  bias = yes",
])
def test_fp16_a_scales(settings):
    """a_scale_type = fp16: A's block scales rounded up to fp16, the fold's vfwmul of the two fp16
    scales. Exact reference over several M blocks (as test_staged_b_over_several_m_blocks); on random
    data within the bound of the fp16-A reference and outside that of MLAS's fp32-A one (the test
    tells the two apart); an A block above 127 x 65504 returns IMEGEN_ERR_RANGE, not a result."""
    from imegen import reference as ref
    from imegen.perf.model import x60
    from imegen.verify import Case

    spec = specs_from_text(f"kernel a16 {{ target = ime  compute = int8  bits = 4  k_unroll = 2  stage_b = m_block  "
                           f"scale_type = fp16  a_scale_type = fp16  {settings} }}")[0]
    plan = plan_kernel(spec)
    assert any(op.kind == "vfwmul" for op in plan.ime.fold) and not any(op.kind == "vfwcvt" for op in plan.ime.fold)
    K, tm = 13 * spec.block + 7, spec.tile_m
    row_bytes = x60.workspace_bytes(plan, tm, K) // tm
    plan = dataclasses.replace(plan, a_block_bytes=x60.staged_bytes(plan, K) + 2 * tm * row_bytes)
    rng = np.random.default_rng(14)
    huge = _check_fp16_a_kernel(plan, make_cases(plan, rng, [(57, 21, K), (8, 16, spec.block)], exact=True),
                                make_cases(plan, rng, [(21, 19, 5 * spec.block + 3)], exact=False)[0], (3, 5))
    assert isinstance(huge, Case) and np.isinf(ref.quantize_a_int8(huge.A, spec.block, "fp16")[1]).any()


def _check_fp16_a_kernel(plan, exact: list, random, huge_at: tuple[int, int]):
    """Both compilers: the exact cases to the bit, `random` within the fp16-A bound and outside MLAS's
    fp32-A one, and `random` with A[huge_at] = +-1.01 x 127 x 65504 (negative in an even column, so the
    two tests check both signs) refused with IMEGEN_ERR_RANGE (3), by matmul and by matmul_prepared on
    column slices, also with the huge value in A's last element. Returns that out-of-range case."""
    huge = dataclasses.replace(random, A=random.A.copy())
    huge.A[huge_at] = -127 * 65504 * 1.01 if huge_at[1] % 2 == 0 else 127 * 65504 * 1.01
    # matmul_prepared checks the prepared scales itself (a vector scan): the same case, and one whose
    # only huge value sits in the last row's last block (the scan's last vector), as column slices
    last = dataclasses.replace(random, A=random.A.copy(), slices=2)
    last.A[-1, -1] = 127 * 65504 * 1.01
    refused = [huge, dataclasses.replace(huge, slices=2), last]
    fp32_a = dataclasses.replace(plan, spec=dataclasses.replace(plan.spec, a_scale_type="fp32"))
    for compiler in ("clang", "gcc"):
        results = run_cases(build(plan, compiler=compiler), exact + [random] + refused, vlen=256)
        for case, result in zip(exact, results):
            assert compare(plan, case, result, exact=True).ok, compiler
        assert compare(plan, random, results[len(exact)]).ok, compiler
        assert not compare(fp32_a, random, results[len(exact)]).ok, compiler
        assert [r.status for r in results[-3:]] == [3] * 3, compiler  # IMEGEN_ERR_RANGE
    return huge


@pytest.mark.parametrize("settings", [
    "tile = 1x16  panel = 16  k_unroll = 4  zero_point = asymmetric  block = 32",
    "tile = 1x8  panel = 8  k_unroll = 2  zero_point = symmetric  block = 64  scales = separate  unpack = interleaved  bias = yes",
    "tile = 1x16  panel = 32  k_unroll = 4  zero_point = asymmetric  block = 32  bits = 8",
])
def test_fp16_a_scales_gemv(settings):
    """a_scale_type = fp16 in the gemv fold: the row's scale stored NaN-boxed (0xffff0000 | bits), read
    by flw, times the fp16 B scales in one vfwmul.vf; exact data to the bit, random data inside the
    fp16-A bound and outside MLAS's fp32-A one, IMEGEN_ERR_RANGE past 127 x 65504; at TN 16 and 32 as
    many fold instructions as the same kernel with fp32 scales (fp16 costs no more)."""
    spec = specs_from_text(f"kernel g16 {{ target = ime  op = gemv  compute = int8  scale_type = fp16  a_scale_type = fp16  {settings} }}")[0]
    plan = plan_kernel(spec)
    fp32 = plan_kernel(dataclasses.replace(spec, scale_type="fp32", a_scale_type="fp32"))
    fp16 = plan_kernel(dataclasses.replace(spec, a_scale_type="fp32"))
    assert any(op.kind == "vfwmul" for op in plan.ime.fold) and not any(op.kind == "vfwcvt" for op in plan.ime.fold)
    # TN 16 and 32 fold in one SEW-16 phase: at most fp32's instructions; narrower tiles need one vset for it
    assert len(plan.ime.fold) <= len(fp32.ime.fold) + (spec.tile_n not in (16, 32)) and len(plan.ime.fold) < len(fp16.ime.fold)
    rng = np.random.default_rng(15)
    _check_fp16_a_kernel(plan, make_cases(plan, rng, [(1, 2 * spec.panel + 5, 3 * spec.block + 9), (1, 8, spec.block)], exact=True),
                         make_cases(plan, rng, [(1, 37, 6 * spec.block + 1)], exact=False)[0], (0, 2))


def test_fp16_a_scales_refuse_what_they_are_not_written_for():
    for text, what in (("tile = 8x8  k_unroll = 2  scale_type = fp16", "stage_b = m_block"), ("tile = 1x16  op = gemv", "scale_type = fp16"),
                       ("tile = 8x8  k_unroll = 2  stage_b = m_block  scale_type = fp32", "scale_type = fp16"),
                       ("tile = 8x8  k_unroll = 2  stage_b = m_block  scale_type = fp16  spread = per_register", "remove 'spread'")):
        with pytest.raises(SpecError, match=what):
            specs_from_text(f"kernel s {{ target = ime  compute = int8  bits = 4  {text}  a_scale_type = fp16 }}")


@pytest.mark.parametrize("compiler", ["clang", "gcc"])
def test_fp16_a_scale_rounding_is_numpys_fp16_ceil(tmp_path, compiler):
    """The generated A-scale rounding (Zfh fcvt.h.s, static round-up) against NumPy's fp16_ceil, bit
    for bit, at the edges exact kernel data rarely reaches: zero, fp16 subnormals, every fp16 binade's
    bounds and one fp32 ulp either side, 65504 and past it (+inf), NaN; its NaN-boxed image too."""
    from imegen import toolchain
    from imegen.reference import fp16_ceil

    plan = plan_kernel(specs_from_text("kernel hc { target = ime  op = gemv  compute = int8  scale_type = fp16  a_scale_type = fp16 }")[0])
    exe = _kernel_with_main(tmp_path, plan,
                            '#include <stdio.h>\n#include "hc.c"\nint main(void) {\n    float x;\n    uint32_t h;\n'
                            '    while (fread(&x, sizeof x, 1, stdin) == 1) {\n        const float y = hc_half_ceil(x, &h);\n'
                            '        fwrite(&y, sizeof y, 1, stdout);\n        fwrite(&h, sizeof h, 1, stdout);\n    }\n    return 0;\n}\n',
                            compiler=compiler)
    halves = np.arange(0, 0x7c00, 37, dtype=np.uint16).view(np.float16).astype(np.float32)
    edges = np.concatenate([halves, np.nextafter(halves, np.float32(np.inf)), np.nextafter(halves, np.float32(0)),
                            np.float32([0, 2**-25, 2**-24, 2**-14, 65504, 65504.01, 65519.99, 65520, 1e30, np.inf])])
    spread = np.exp2(np.random.default_rng(16).uniform(-30, 17, 4000)).astype(np.float32)
    x = np.concatenate([edges, spread, np.float32([np.nan])])
    out = np.frombuffer(toolchain.run(exe, input=x.tobytes()).stdout, np.uint32).reshape(-1, 2)
    y, h = out[:-1, 0].view(np.float32), out[:-1, 1]
    want = fp16_ceil(x[:-1])
    assert np.array_equal(y.view(np.uint32), want.view(np.uint32))
    assert np.array_equal(h, np.uint32(0xffff0000) | want.astype(np.float16).view(np.uint16))
    assert np.isnan(out[-1:, 0].view(np.float32)).all() and out[-1, 1] & 0x7c00 == 0x7c00  # NaN: out of range


def test_fp16_ceil_is_the_least_fp16_at_or_above():
    from imegen.reference import fp16_ceil

    x = np.array([0, 1, 1 + 2**-12, 65504, 65504.5, 6e-8, 1e-9, 0.1], np.float32)
    got = fp16_ceil(x)
    assert got.tolist()[:4] == [0, 1, 1 + 2**-10, 65504] and np.isinf(got[4])
    assert got[5] == np.float32(np.float16(2**-24) * 2) and got[6] == np.float32(np.float16(2**-24))
    assert got[7] >= x[7] and np.float32(np.nextafter(np.float16(got[7]), np.float16(0))) < x[7]


def test_staged_8x12_over_forced_k_chunks():
    """The 8x12 staged kernel stages each K chunk's blocks (blk0..blk1) and adds the later chunks into C:
    forced to 3 chunks over several M blocks, with partial tiles and K block; exact reference, both compilers."""
    from imegen.perf.model import x60

    spec = specs_from_text("kernel w { target = ime  compute = int8  bits = 4  tile = 8x12  k_unroll = 2  panel = 24  "
                           "stage_b = m_block  scale_type = fp16  a_scale_type = fp16  block = 32 }")[0]
    K = 13 * spec.block + 7
    plan = dataclasses.replace(plan_kernel(spec), forced_k_chunks=3,
                               a_block_bytes=x60.staged_bytes(plan_kernel(spec), K) + x60.workspace_bytes(plan_kernel(spec), 8, K))
    cases = make_cases(plan, np.random.default_rng(33), [(41, 29, K), (9, 13, 2 * spec.block + 3)], exact=True)
    for compiler in ("clang", "gcc"):
        for case, result in zip(cases, run_cases(build(plan, compiler=compiler), cases, vlen=256)):
            assert compare(plan, case, result, exact=True).ok, (compiler, case.M, case.N, case.K)
            assert_writes_the_modeled_workspace(plan, case, result)


def test_staged_b_refuses_what_it_is_not_written_for():
    for text, what in (("tile = 8x16  k_unroll = 2", "4x8, 8x8 and 8x12 at k_unroll 2"), ("tile = 8x8  k_unroll = 4", "k_unroll 2"),
                       ("tile = 8x12  k_unroll = 2  scale_type = fp16", "a_scale_type = fp16"),
                       ("tile = 1x8  op = gemv", "op gemm"), ("tile = 8x8  bits = 8", "bits 4")):
        with pytest.raises(SpecError, match=what):
            specs_from_text(f"kernel s {{ target = ime  compute = int8  {text}  stage_b = m_block }}")


@pytest.mark.parametrize("settings", ["tile = 1x16  panel = 32  k_unroll = 4  scale_type = fp16",
                                      "tile = 1x8  panel = 8  k_unroll = 2  scales = separate  unpack = interleaved",
                                      "tile = 1x12  panel = 24  k_unroll = 4  scale_type = fp32",
                                      "tile = 1x16  panel = 16  k_unroll = 4  scales = separate  scale_type = fp32"])
def test_gemv_nibble_zero_points(settings):
    """4-bit IME gemv packs zero points two per byte (tile t's byte j: columns t*TN + j low, + TN/2
    high): half the bytes, the second tile of a panel and a partial N tile included; exact reference,
    both compilers, and a packer that swaps the two nibbles must fail."""
    spec = specs_from_text(f"kernel nz {{ target = ime  op = gemv  compute = int8  bits = 4  zero_point = asymmetric  {settings} }}")[0]
    plan = plan_kernel(spec)
    assert plan.pack.zp_nibbles and plan.pack.zp_bytes == -(-spec.panel // 2 // 4) * 4
    cases = make_cases(plan, np.random.default_rng(21), [(1, 2 * spec.panel + 5, 3 * spec.block + 9)], exact=True)
    for compiler in ("clang", "gcc"):
        [result] = run_cases(build(plan, compiler=compiler), cases, vlen=256)
        assert compare(plan, cases[0], result, exact=True).ok, compiler
    from imegen.plan import PackLayout

    class Swapped(PackLayout):
        def zp_shift(self, c: str) -> str:
            return f"4 - ({super().zp_shift(c)})"

    swapped = Swapped(**dataclasses.asdict(plan.pack))
    [bad] = run_cases(build(dataclasses.replace(plan, pack=swapped)), cases, vlen=256)
    assert not compare(plan, cases[0], bad).ok


@pytest.mark.parametrize("settings", [
    "target = ime  tile = 8x8  k_unroll = 2  panel = 16  zero_point = asymmetric  block = 32",  # accumulators in registers
    "target = ime  tile = 8x16  k_unroll = 2  panel = 16  scale_type = fp16  bias = yes  block = 64",  # in memory
    "target = ime  tile = 8x8  k_unroll = 2  panel = 16  stage_b = m_block  zero_point = asymmetric  block = 32",
    "target = ime  op = gemv  tile = 1x16  k_unroll = 4  panel = 16  zero_point = asymmetric  block = 32",
    "target = rvv  tile = 2x16  k_unroll = 2  panel = 16  bias = yes  block = 32",
    "target = rvv  compute = fp32  tile = 4x16  k_unroll = 2  panel = 16  zero_point = asymmetric  block = 64",
    "target = scalar  tile = 4x4  k_unroll = 2  panel = 4  bias = yes  block = 32",
])
def test_k_chunks(settings):
    """A call may split K into chunks (the first stores C, the later ones add to it) so that an M
    block holds more rows and B streams fewer times. With the A budget cut to one tile of rows over
    the whole K, M = 40 splits K in the call's own choice (x60.k_chunks mirrors it) over several M
    blocks; forced to 3 chunks, small M split too; partial tiles and K block; exact reference."""
    from imegen.perf.model import x60

    text = settings if "compute" in settings else f"compute = int8  {settings}"
    spec = specs_from_text(f"kernel kc {{ bits = 4  {text} }}")[0]
    plan = plan_kernel(spec)
    K, tm = 13 * spec.block + 7, spec.tile_m
    plan = dataclasses.replace(plan, a_block_bytes=x60.staged_bytes(plan, K) + x60.workspace_bytes(plan, tm, K))
    M, N = (40, 21) if tm > 1 else (1, 21)
    if tm > 1:
        assert x60.k_chunks(plan, M, N, K) > 1 and x60.dram_traffic(plan, M, N, K).b_passes > 1
    forced = dataclasses.replace(plan, forced_k_chunks=3)
    rng = np.random.default_rng(31)
    for p, shapes in ((plan, [(M, N, K)]), (forced, [(tm + 1, N, K), (1, 5, 2 * spec.block + 3)])):
        cases = make_cases(p, rng, shapes, exact=True)
        for compiler in ("clang",) if spec.target == "rvv" else ("clang", "gcc"):  # GCC 12: no riscv_vector.h
            for case, result in zip(cases, run_cases(build(p, compiler=compiler), cases, vlen=256)):
                assert compare(p, case, result, exact=True).ok, (compiler, case.M, case.N, case.K)
                if spec.compute == "int8":
                    assert_writes_the_modeled_workspace(p, case, result)


@pytest.mark.parametrize("where, injected, says", [
    ("matmul", "if (ldc > N) C[N] = 1.0f;", "wrote C outside its M x N"),
    ("matmul", "C[(M - 1) * ldc + N] = 1.0f;", "wrote C outside its M x N"),
    ("matmul", "((unsigned char *)workspace)[k_workspace_size(M, K)] = 0;", "wrote past workspace_size()"),
    ("pack_b", "((unsigned char *)packed_b)[k_packed_b_size(N, K) + 63] = 0;", "pack_b wrote past packed_b_size()"),
])
def test_the_driver_catches_writes_outside_what_a_call_owns(monkeypatch, where, injected, says):
    """The check driver poisons 64 bytes past every buffer a call writes and C's ldc padding: a kernel
    that writes there fails its run (here one made to, through its generated source)."""
    from imegen import verify

    _patch_kernel(monkeypatch, where, f"    {injected}\n")
    plan = plan_kernel(specs_from_text("kernel k { op = gemm  target = scalar  tile = 2x8  panel = 8 }")[0])
    case = dataclasses.replace(make_cases(plan, np.random.default_rng(0), [(3, 5, 40)], exact=False)[0], ldc_pad=2, slices=1)
    with pytest.raises(ToolchainError, match=re.escape(says)):
        run_cases(verify.build(plan), [case], vlen=256)


def test_check_reports_a_run_that_dies_as_a_failed_row(monkeypatch):
    """A build whose driver dies (here: its kernel writes into C's ldc padding) is a FAIL row with the
    driver's reason, and check goes on to the next compiler."""
    _patch_kernel(monkeypatch, "matmul", "    if (ldc > N) C[N] = 1.0f;\n")
    rows = check_kernel(plan_kernel(specs_from_text("kernel k { op = gemm  target = scalar  tile = 2x8  panel = 8 }")[0]), "t.imegen")
    assert {r.compiler for r in rows} == {"clang", "gcc", "host cc"} and not any(r.ok for r in rows)
    assert all("wrote C outside its M x N elements" in r.message and "exit status 2" in r.message for r in rows), rows


def test_a_slice_writing_into_its_neighbour_is_caught(monkeypatch):
    """The driver runs column slices last first, so a matmul_prepared_then (what it calls per slice) that writes
    one column past its slice lands on a finished slice and the comparison fails (run first to last, the next slice
    hid it). Here the middle one of three slices does (the second call either way)."""
    from imegen import verify

    _patch_kernel(monkeypatch, "matmul_prepared_then", "    static int calls;\n    if (++calls == 2)\n        C[N] = 12345.0f;\n")
    plan = plan_kernel(specs_from_text("kernel k { op = gemm  target = scalar  tile = 2x8  panel = 8 }")[0])
    case = dataclasses.replace(make_cases(plan, np.random.default_rng(0), [(3, 30, 40)], exact=False)[0], ldc_pad=0, slices=3)
    [result] = run_cases(verify.build(plan), [case], vlen=256)
    assert result.status == 0 and not compare(plan, case, result).ok
