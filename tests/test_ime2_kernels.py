"""target ime2: MatMulNBits kernels for the K3's A100 cores (IME2 int8 vmadot, 8x16x8 tiles at VLEN 1024),
built with clang and GCC, run under qemu-riscv64 at VLEN 1024 with imegen's IME2 emulator (runtime/ime2_emu.c)
and compared with the independent NumPy CompInt8 oracle (imegen/reference.py), as `imegen check` does.

What fails here: a kernel whose results are off (random data within the oracle's bound, exactly
representable data to the bit), one that computes (or dies) at a VLEN other than 1024 instead of returning
IMEGEN_ERR_VLEN, one whose vmadot count is not the plan's (counted by the emulator, against a count derived
here from the tile geometry), a validator that lets through what the A100 cannot run or refuses without a
position, and the harness itself when the vmadot words or the oracle are made wrong.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import assume, given, strategies as st

from imegen import reference as ref
from imegen import toolchain
from imegen.check import check_kernel, make_cases, refusal_row, refused_vlens, vlens_for
from imegen.cli import main
from imegen.errors import SpecError
from imegen.ir import specs_from_text
from imegen.plan import expected_vmadots, plan_kernel
from imegen.verify import build, compare, run_cases

pytestmark = pytest.mark.skipif(bool(toolchain.missing_tools()), reason="needs the cross toolchains and qemu-riscv64")

VLEN = 1024
FILE = "t.imegen"


def spec_of(settings: str, name: str = "k"):
    return specs_from_text(f"kernel {name} {{ target = ime2  compute = int8  {settings} }}", FILE)[0]


def assert_checked(rows) -> None:
    """Every row passed, the kernel ran at VLEN 1024 only (vmadots counted) and refused 128, 256 and 512."""
    assert rows and all(r.ok for r in rows), [(r.compiler, r.vlen, r.message) for r in rows if not r.ok]
    ran = {r.vlen for r in rows if not r.refusal}
    assert ran == {str(VLEN)}, ran
    assert {r.vlen.split()[0] for r in rows if r.refusal} == {"128", "256", "512"}
    assert {r.compiler for r in rows} == {"clang", "gcc"}
    assert all(r.vmadots > 0 for r in rows if not r.refusal) and all(r.vmadots == 0 for r in rows if r.refusal)


# --- imegen check passes ---------------------------------------------------------------------------------

CONFIGS = [
    "op = gemm  tile = 8x16  k_unroll = 2",  # 4-bit planar, symmetric: one B register -> two 16-k steps
    "op = gemm  tile = 16x8  panel = 8  k_unroll = 4  bits = 4  unpack = interleaved  zero_point = asymmetric  block = 64",
    "op = gemm  tile = 8x24  panel = 24  k_unroll = 1  bits = 8  block = 16  zero_point = asymmetric  bias = yes",
    "op = gemm  tile = 8x8  panel = 16  bits = 8  block = 256  k_unroll = 8  scales = separate  scale_type = fp16",
    "op = gemm  tile = 16x16  k_unroll = 4  block = 64  zero_point = asymmetric  scale_type = fp16",
    "op = gemv  tile = 1x16  k_unroll = 8  block = 128  scale_type = fp16",  # two A loads per iteration: slides 0..3 on each
    "op = gemv  tile = 1x8  panel = 8  k_unroll = 1  bits = 8  block = 16  zero_point = asymmetric  scale_type = fp16",
    "op = gemv  tile = 1x32  panel = 32  k_unroll = 4  block = 64  unpack = interleaved  zero_point = asymmetric  bias = yes",
    # the A pointer's advance per iteration (2048 bytes) past addi's 12-bit immediate
    "op = gemm  tile = 16x8  panel = 8  k_unroll = 8  block = 128  zero_point = symmetric  bias = yes",
    # the in-register folds: gemm 8x32 (4-bit interleaved, 8-bit at block 16, a k loop of 4 iterations with
    # 32-column tiles inside 64-column panels), gemv (separate scales, 16 of a panel's 32 columns)
    "op = gemm  tile = 8x32  panel = 32  k_unroll = 2  unpack = interleaved  zero_point = asymmetric",
    "op = gemm  tile = 8x32  panel = 32  k_unroll = 1  bits = 8  block = 16  zero_point = asymmetric  bias = yes",
    "op = gemm  tile = 8x32  panel = 64  k_unroll = 2  block = 128  zero_point = symmetric  bias = yes",
    "op = gemv  tile = 1x16  panel = 32  k_unroll = 2  zero_point = asymmetric  bias = yes  scales = separate",
    # 4-bit 8x32 in blocks of 32: zero points subtracted from B in the k loop (kernel.gemm_zp_in_loop), 8 rows of
    # A quantized at once where interleaved; the second 32 columns of a 64-column panel, the symmetric code - 8
    "op = gemm  tile = 8x32  panel = 64  k_unroll = 2  unpack = interleaved  zero_point = asymmetric  bias = yes",
    "op = gemm  tile = 8x32  panel = 32  k_unroll = 2  unpack = interleaved  zero_point = symmetric",
    "op = gemm  tile = 8x32  panel = 32  k_unroll = 2  zero_point = symmetric  bias = yes",
    # the gemv's signed-B form (symmetric 4-bit: nibbles unpacked to 16 (q - 8), no zero-point term) with fp16
    # scales widened in registers: Q4_0's format with separate scales and a bias, block 256 (16 x dots up to
    # 2^22), 24 columns; and the unsigned symmetric fold it leaves to 8-bit
    "op = gemv  tile = 1x32  panel = 32  k_unroll = 2  unpack = interleaved  scale_type = fp16  scales = separate  bias = yes",
    "op = gemv  tile = 1x24  panel = 24  k_unroll = 2  block = 256  scale_type = fp16",
    "op = gemv  tile = 1x32  panel = 32  k_unroll = 2  bits = 8  zero_point = symmetric",
]


@pytest.mark.parametrize("settings", CONFIGS)
def test_check_passes_at_vlen_1024_and_refuses_elsewhere(settings):
    plan = plan_kernel(spec_of(settings))
    assert vlens_for(plan) == [VLEN] and refused_vlens(plan) == [128, 256, 512]
    assert_checked(check_kernel(plan, FILE))


def test_the_example_spec_checks(capsys):
    code = main(["check", "examples/ime2_k3.imegen"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert out.count("PASS") == 6 * 2 * 4 and "FAIL" not in out  # 6 kernels x 2 compilers x (1024 + 3 refusals)
    assert {line.split()[1] for line in out.splitlines() if "PASS" in line} == {"ime2"}


def test_the_example_kernels_fold_in_registers_and_gather_nothing_from_memory():
    """The example's 4-bit kernels (ort-accelerate --target k3's) run each tile's blocks in one asm statement,
    their fp32 accumulators in vector registers; neither they nor their A quantizer use an indexed load or
    store, or copy codes one by one (what made them 2-14x llama.cpp's IME2 kernels: docs/ime2-isa.md §11)."""
    from pathlib import Path

    from imegen import render
    from imegen.ir import load_specs

    for spec in load_specs(Path(__file__).resolve().parents[1] / "examples" / "ime2_k3.imegen"):
        if spec.bits != 4:
            continue
        plan = plan_kernel(spec)
        assert plan.ime.facc_regs, spec.name
        c_source = render.render_kernel(plan, FILE)[f"{spec.name}.c"]
        assert "vluxei" not in c_source and "vsuxei" not in c_source, spec.name
        assert "quantize_block_to(" in c_source, spec.name


def test_the_example_prefill_subtracts_zero_points_in_the_k_loop():
    """The example's 4-bit gemm (ort-accelerate --target k3's prefill kernel) takes B's zero points off its codes
    in the k loop and multiplies signed x signed, so its fold has no zp x sum(a) term and reads no code sums, and
    its A quantizer does 8 rows of a block at once (docs/ime2-isa.md §10.3)."""
    from pathlib import Path

    from imegen import render
    from imegen.ir import load_specs

    [spec] = [s for s in load_specs(Path(__file__).resolve().parents[1] / "examples" / "ime2_k3.imegen")
              if s.name == "q4_prefill_k3"]
    plan = plan_kernel(spec)
    vmadots = [op for op in plan.ime.body if op.kind == "vmadot"]
    assert len(vmadots) == 8 and all(op.comment.startswith("smt.vmadot ") for op in vmadots)
    assert sum(op.kind == "vsub" for op in plan.ime.body) == 2
    assert not any("vfnmsac" in op.text or "%[as]" in op.text for op in plan.ime.fold)
    assert "quantize_tile_rows_to(" in render.render_kernel(plan, FILE)[f"{spec.name}.c"]


@st.composite
def ime2_specs(draw):
    """Valid ime2 specs: tiles in vmadot's 8x8 steps, the rest of the settings drawn freely (the validator
    refuses the few combinations an A100 tile cannot take; those are drawn again)."""
    op = draw(st.sampled_from(["gemm", "gemv"]))
    tm = 1 if op == "gemv" else draw(st.sampled_from([8, 16]))
    tn = draw(st.sampled_from([8, 16, 24, 32]))
    text = (f"op = {op}  tile = {tm}x{tn}  panel = {tn * draw(st.sampled_from([1, 2]))}"
            f"  bits = {draw(st.sampled_from([4, 8]))}  block = {draw(st.sampled_from([16, 32, 64, 128, 256]))}"
            f"  k_unroll = {draw(st.sampled_from([1, 2, 4, 8]))}  unpack = {draw(st.sampled_from(['planar', 'interleaved']))}"
            f"  zero_point = {draw(st.sampled_from(['symmetric', 'asymmetric']))}  bias = {draw(st.sampled_from(['yes', 'no']))}"
            f"  scales = {draw(st.sampled_from(['inline', 'separate']))}  scale_type = {draw(st.sampled_from(['fp32', 'fp16']))}")
    try:
        return spec_of(text, "fuzz")
    except SpecError:
        assume(False)


@given(data=st.data())
def test_random_valid_configs_match_numpy(data):
    spec = data.draw(ime2_specs())
    plan = plan_kernel(spec)
    M = 1 if spec.op == "gemv" and data.draw(st.booleans()) else data.draw(st.integers(1, 2 * spec.tile_m + 3))
    N = data.draw(st.integers(1, 2 * spec.panel + 3))
    K = data.draw(st.integers(1, 3 * spec.block + 5))
    exact = data.draw(st.booleans())
    case = make_cases(plan, np.random.default_rng(data.draw(st.integers(0, 2**32 - 1))), [(M, N, K)], exact=exact)[0]
    [result] = run_cases(build(plan, FILE, compiler=data.draw(st.sampled_from(["clang", "gcc"]))), [case], vlen=VLEN)
    c = compare(plan, case, result, exact=exact)
    assert c.ok, f"{spec.describe()} M,N,K={M},{N},{K} exact={exact}: {c.message}"


@pytest.mark.parametrize("settings, shape", [
    ("op = gemm  tile = 8x16  zero_point = asymmetric", (90, 9, 8192)),  # 40-row M blocks: two whole, one partial
    ("op = gemv  tile = 1x16  bits = 8  k_unroll = 4  block = 64", (3, 40, 8192)),
    ("op = gemm  tile = 8x32  panel = 32  zero_point = asymmetric  bias = yes", (90, 40, 8192)),
    ("op = gemv  tile = 1x32  panel = 32  zero_point = asymmetric  bias = yes", (1, 40, 8192)),
    ("op = gemm  tile = 8x32  panel = 32  unpack = interleaved  zero_point = asymmetric", (90, 40, 8192)),
    ("op = gemv  tile = 1x32  panel = 32  unpack = interleaved  scale_type = fp16  bias = yes", (1, 40, 8192)),
])
def test_several_m_blocks_and_k_chunks(settings, shape):
    """A's workspace holds the rows of one M block (3/4 of the L2) per K chunk; blocks after the first
    re-quantize into the same memory, and later K chunks add to C."""
    plan = plan_kernel(spec_of(settings))
    [case] = make_cases(plan, np.random.default_rng(6), [shape], exact=False)
    for compiler in ("clang", "gcc"):
        [result] = run_cases(build(plan, FILE, compiler=compiler), [case], vlen=VLEN)
        assert compare(plan, case, result).ok, compiler


NAN_KERNELS = {"gemm": ("op = gemm  tile = 8x8  panel = 8", 5), "gemv": ("op = gemv  tile = 1x16", 1),
               # 8 rows of A quantized at once (quantize_tile_rows_to): the bad row is the first tile's last
               "gemm 8x32": ("op = gemm  tile = 8x32  panel = 32  unpack = interleaved  zero_point = asymmetric", 8)}


@pytest.mark.parametrize("op", list(NAN_KERNELS))
def test_a_nan_or_inf_in_a_reaches_its_row_of_c(op):
    """Dequantize-then-matmul makes a row of C NaN (non-finite for an inf) when its row of A holds one; the
    other rows are untouched."""
    settings, M = NAN_KERNELS[op]
    plan = plan_kernel(spec_of(settings))
    [clean] = make_cases(plan, np.random.default_rng(2), [(M, 20, 2 * plan.spec.block + 7)], exact=False)
    bad = []
    for value in (np.nan, np.inf, -np.inf):
        A = clean.A.copy()
        A[M - 1, plan.spec.block + 3] = value
        bad.append(dataclasses.replace(clean, A=A))
    ok, *runs = run_cases(build(plan, FILE), [clean, *bad], vlen=VLEN)
    assert compare(plan, clean, ok).ok
    for value, r in zip(("nan", "inf", "-inf"), runs):
        row = r.C[M - 1]
        assert r.status == 0 and (np.isnan(row).all() if value == "nan" else not np.isfinite(row).any()), (value, row)
        assert np.array_equal(r.C[:M - 1], ok.C[:M - 1]), value


# --- the vmadot count is the plan's --------------------------------------------------------------------

def vmadots_by_geometry(spec, M: int, N: int, K: int) -> int:
    """One vmadot per (8-row A tile, 8-column B tile, 16 k) of each (tile, block) the kernel computes; a gemv
    row takes a whole 8-row A tile (row 0 of it counts)."""
    row_tiles, col_tiles, blocks = -(-M // spec.tile_m), -(-N // spec.tile_n), -(-K // spec.block)
    per_tile_block = (spec.block // 16) * max(1, spec.tile_m // 8) * (spec.tile_n // 8)
    return row_tiles * col_tiles * blocks * per_tile_block


@pytest.mark.parametrize("settings, shape", [
    ("op = gemm  tile = 16x16  k_unroll = 2  block = 64", (17, 33, 130)),
    ("op = gemv  tile = 1x24  panel = 24  k_unroll = 4  bits = 8  block = 64", (1, 50, 64)),
])
def test_emulated_vmadots_equal_the_plan(settings, shape):
    spec = spec_of(settings)
    plan = plan_kernel(spec)
    case = make_cases(plan, np.random.default_rng(4), [shape], exact=True)[0]
    [result] = run_cases(build(plan, FILE), [case], vlen=VLEN)
    assert compare(plan, case, result, exact=True).ok
    assert result.vmadots == expected_vmadots(plan, *shape) == vmadots_by_geometry(spec, *shape) > 0
    assert plan.ime.vmadots_per_tile_block == sum(op.kind == "vmadot" for op in plan.ime.body) * plan.ime.iterations_per_block


# --- the validator: what the A100 cannot run, refused with a position -------------------------------------

@pytest.mark.parametrize("settings, key, words", [
    ("compute = fp32", "compute", ["needs compute = int8"]),
    ("vlen = 256", "vlen", ["VLEN = 1024", "not 256"]),
    ("tile = 4x8  panel = 8", "tile", ["tile height 4", "8 rows"]),
    ("tile = 8x12  panel = 12", "tile", ["tile width 12", "8 output columns"]),
    ("tile = 8x8  panel = 8  k_unroll = 1", "k_unroll", ["even k_unroll"]),
    ("tile = 8x8  panel = 8  block = 16", "k_unroll", ["block 16", "16*k_unroll = 32"]),
    ("tile = 8x8  panel = 8  bits = 8  k_unroll = 4  block = 32", "k_unroll", ["block 32", "16*k_unroll = 64"]),
    ("tile = 16x64  panel = 64", "tile", ["vector registers", "> 32"]),
    ("abi = mlas  tile = 8x8  panel = 8  bits = 8", "bits", ["serves 4-bit weights", "abi = imegen"]),
    ("abi = mlas  tile = 8x32  panel = 16", "tile", ["spans two panels", "multiples of 16"]),
    ("fallback = yes  tile = 8x8  panel = 8", "fallback", ["rvv or scalar"]),
    ("tile = 8x8  panel = 8  stage_b = m_block", "stage_b", ["target ime"]),
    ("op = gemv  tile = 1x8  panel = 8  scale_type = fp16  a_scale_type = fp16", "a_scale_type", ["IME kernels"]),
])
def test_refusals_name_the_setting_and_the_reason(settings, key, words):
    lines = ["target = ime2", "compute = int8" if "compute" not in settings else "", *settings.split("  ")]
    text = "kernel k {\n" + "".join(f"  {s}\n" for s in lines if s) + "}\n"
    with pytest.raises(SpecError) as info:
        specs_from_text(text, FILE)
    e = info.value
    # at the setting, or at the kernel's block when the spec leaves the setting at its default
    line, col = next(((i, 3) for i, s in enumerate(text.splitlines(), 1) if s.strip().startswith(f"{key} ")), (1, 1))
    assert (e.span.line, e.span.column) == (line, col), (str(e), key)
    assert str(e) == f"{FILE}:{line}:{col}: error: {e.message}" and "\n" not in str(e)
    assert e.message.startswith("kernel 'k': ")
    for w in words:
        assert w in e.message, (w, e.message)


def test_check_refuses_a_bad_spec_in_one_line(tmp_path, capsys):
    spec = tmp_path / "bad.imegen"
    spec.write_text("kernel k {\n  target = ime2\n  compute = int8\n  vlen = 512\n}\n")
    assert main(["check", str(spec)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err == f"{spec}:4:3: error: kernel 'k': IME2's 8x16x8 int8 vmadot tile exists only at VLEN = 1024 (the K3's A100 cores), not 512\n"


# --- the harness can fail ------------------------------------------------------------------------------

EIGHT_BIT = "op = gemm  tile = 8x16  bits = 8  zero_point = asymmetric  k_unroll = 2"
GEMV_SLIDES = "op = gemv  tile = 1x16  k_unroll = 4  block = 64"


def _failing_rows(rows):
    return [r for r in rows if not r.ok and not r.refusal]


def test_wrong_signedness_fails_check(monkeypatch):
    """vmadot with B read signed: 8-bit codes from 128 up turn negative, and check fails."""
    from imegen.targets.ime2 import kernel

    monkeypatch.setattr(kernel, "SIGNEDNESS", "ss")
    rows = check_kernel(plan_kernel(spec_of(EIGHT_BIT)), FILE)
    assert len(_failing_rows(rows)) == 2 and all("elements off" in r.message for r in _failing_rows(rows))


Q40_GEMV = "op = gemv  tile = 1x32  panel = 32  k_unroll = 2  unpack = interleaved  scale_type = fp16"


def test_q40_gemv_reads_b_signed_without_a_zero_point_term():
    """Q4_0's format (symmetric 4-bit, fp16 scales): signed vmadot, no code sum or zero point read, the fp16
    scales widened by vfwcvt (whose word is LLVM's: llvm-mc -mattr=+zvfhmin gives 0x4b961dd7 for v27, v25)."""
    from imegen.targets.ime2 import kernel

    plan = plan_kernel(spec_of(Q40_GEMV))
    text = "\n".join(op.text + " " + op.comment for op in (*plan.ime.body, *plan.ime.fold))
    assert "smt.vmadot v" in text and "vmadotsu" not in text
    assert "%[as]" not in text and "%[zp]" not in text and "vfwcvt.f.f.v" in text
    assert kernel.encode_vfwcvt_f_f(27, 25) == 0x4b961dd7


@pytest.mark.parametrize("xor", [0x80, 0x08, 0x00])
def test_wrong_signed_unpack_fails_check(monkeypatch, xor):
    """The signed unpack must flip both nibbles' top bit (q ^ 8 read as signed 4-bit is q - 8): flipping one,
    or none, leaves codes off by 16 and check fails."""
    from imegen.targets.ime2 import kernel

    monkeypatch.setattr(kernel, "SIGNED_B_XOR", xor)
    rows = check_kernel(plan_kernel(spec_of(Q40_GEMV)), FILE)
    assert len(_failing_rows(rows)) == 2


def test_wrong_slide_fails_check(monkeypatch):
    """gemv's k-steps 1..3 read rows 1..3 of one A load through vmadot1..3; encoded as plain vmadot they
    multiply k-step 0 again, and check fails."""
    from imegen.targets.ime2 import kernel

    real = kernel.encode_vmadot
    monkeypatch.setattr(kernel, "encode_vmadot", lambda vd, vs1, vs2, **kw: real(vd, vs1, vs2, **{**kw, "slide": 0}))
    rows = check_kernel(plan_kernel(spec_of(GEMV_SLIDES)), FILE)
    assert len(_failing_rows(rows)) == 2


def test_zero_points_left_in_b_fail_check(monkeypatch):
    """The 4-bit 8x32 gemm in blocks of 32 subtracts B's zero points in its k loop; without the subtraction
    its dots keep zp x sum(a), and check fails."""
    from imegen.targets.ime2 import kernel

    real = kernel.zp_loop_body
    monkeypatch.setattr(kernel, "zp_loop_body", lambda spec, zp: tuple(op for op in real(spec, zp) if op.kind != "vsub"))
    rows = check_kernel(plan_kernel(spec_of("op = gemm  tile = 8x32  panel = 32  k_unroll = 2  unpack = interleaved"
                                            "  zero_point = asymmetric")), FILE)
    assert len(_failing_rows(rows)) == 2


def test_a_wrong_oracle_fails_check(monkeypatch):
    """The kernels are held to the oracle's zero points: an oracle that takes them all as 128 fails them."""
    real = ref.unpack_codes
    monkeypatch.setattr(ref, "unpack_codes", lambda qw: (real(qw)[0], np.full_like(real(qw)[1], 128)))
    rows = check_kernel(plan_kernel(spec_of(EIGHT_BIT)), FILE)
    assert len(_failing_rows(rows)) == 2


def test_a_kernel_that_does_not_refuse_fails_check(monkeypatch):
    """supported() made to accept any VLEN: at VLEN 256 the driver installs no emulator (it needs 1024) and the
    first vmadot dies by SIGILL; the refusal row fails."""
    from imegen import verify

    render = verify.render_kernel

    def lenient(plan, spec_file):
        sources = render(plan, spec_file)
        body = "return vlenb == 128; /* vmadot's 8x16x8 tile (the A100) */"
        assert body in sources["k.c"]
        return {**sources, "k.c": sources["k.c"].replace(body, "(void)vlenb; return 1;")}

    monkeypatch.setattr(verify, "render_kernel", lenient)
    plan = plan_kernel(spec_of("op = gemm  tile = 8x8  panel = 8"))
    row = refusal_row(verify.build(plan, FILE), 256, make_cases(plan, np.random.default_rng(0), [(3, 20, 64)], exact=False))
    assert not row.ok and "SIGILL" in row.message


def test_the_harness_sees_a_wrong_b_layout():
    """The packer's nibbles swapped (k-steps exchanged in B only): the same kernel must fail."""
    plan = plan_kernel(spec_of("op = gemm  tile = 8x8  panel = 8  zero_point = asymmetric"))
    wrong = dataclasses.replace(plan, pack=dataclasses.replace(plan.pack, shift="4 - (" + plan.pack.shift + ")"))
    case = make_cases(plan, np.random.default_rng(1), [(9, 9, 70)], exact=True)[0]
    [good] = run_cases(build(plan, FILE), [case], vlen=VLEN)
    [bad] = run_cases(build(wrong, FILE), [case], vlen=VLEN)
    assert compare(plan, case, good, exact=True).ok and not compare(plan, case, bad).ok


def test_explain_does_not_apply_the_k1_cost_model(capsys):
    from pathlib import Path

    assert main(["explain", str(Path(__file__).resolve().parents[1] / "examples" / "ime2_k3.imegen")]) == 0
    out = capsys.readouterr().out
    assert "X60 per (tile, block)" not in out and "no cost model for this kernel's core" in out
