"""Generated imegen-ABI entry points under hostile arguments (tests/c/hostile_args.c): documented
status codes, sizes that never wrap, K = 0 defined as C = bias (or 0), matmul_prepared_then's epilogue handed
each element of C once, after its final value. The scalar kernels run
natively under ASan + UBSan (any out-of-bounds access or overflow aborts); the RVV and IME kernels,
which share the entry templates, run the same calls under QEMU."""

import shutil

import pytest

from imegen import toolchain
from imegen.ir import specs_from_text
from imegen.plan import plan_kernel
from imegen.render import render_kernel

HARNESS = toolchain.RUNTIME_DIR.parent.parent / "tests" / "c" / "hostile_args.c"
SPEC = """
kernel s_int8_bias { target = scalar  compute = int8  tile = 4x4  bias = yes  zero_point = asymmetric }
kernel s_fp32_sym  { target = scalar  compute = fp32  tile = 4x4  zero_point = symmetric }
kernel r_fp32      { target = rvv  compute = fp32  tile = 4x16 }
kernel i_int8_bias { target = ime  compute = int8  tile = 4x8  bias = yes  zero_point = asymmetric }
kernel i_staged    { target = ime  compute = int8  tile = 8x8  stage_b = m_block  zero_point = asymmetric }
"""
OK, ERR_ARG = 0, 2
# One line per call in hostile_args.c, in order.
EXPECTED = ["1", "1", "1", "1",  # size functions
            str(OK), *[str(ERR_ARG)] * 11, str(OK), str(OK), f"{OK} 1", f"{OK} {OK} 1",
            f"{OK} 1", *[str(ERR_ARG)] * 3, "1", "1",  # matmul_prepared
            f"{OK} 1 1", f"{OK} 1 1", f"{ERR_ARG} 1",  # matmul_prepared_then: its epilogue, K = 0, a refusal
            *[str(ERR_ARG)] * 4, str(OK), str(ERR_ARG), str(OK), *[str(ERR_ARG)] * 3]  # C overlapping its inputs


def _build(tmp_path, name, host):
    (spec,) = [s for s in specs_from_text(SPEC, "hostile.imegen") if s.name == name]
    plan = plan_kernel(spec)
    for fname, text in render_kernel(plan, "hostile.imegen").items():
        (tmp_path / fname).write_text(text)
    flags = [f'-DKERNEL_HEADER="{name}.h"', f"-DP(f)={name}_##f", f"-DHAS_BIAS={int(spec.bias)}"]
    exe = tmp_path / name
    if host:
        san = ["-fsanitize=address,undefined", "-fno-sanitize-recover=all", "-g"]
        return toolchain.compile_c([tmp_path / f"{name}.c", HARNESS], exe, host=True, include_dirs=[tmp_path],
                                   extra_flags=san + flags)
    sources = [tmp_path / f"{name}.c", HARNESS]
    if spec.target == "ime":
        sources.append(toolchain.compile_ime_emu(tmp_path / "ime_emu.o"))
        flags.append("-DIME_EMU")
    return toolchain.compile_c(sources, exe, march="rv64gcv", include_dirs=[tmp_path, toolchain.RUNTIME_DIR],
                               extra_flags=flags)


@pytest.mark.skipif(shutil.which(toolchain.HOST_CC) is None, reason="no host cc")
@pytest.mark.parametrize("name", ["s_int8_bias", "s_fp32_sym"])
def test_scalar_entry_points_under_sanitizers(tmp_path, name):
    proc = toolchain.run(_build(tmp_path, name, host=True), host=True)
    assert proc.stdout.decode().splitlines() == EXPECTED
    assert b"runtime error" not in proc.stderr and b"AddressSanitizer" not in proc.stderr


@pytest.mark.parametrize("name", ["r_fp32", "i_int8_bias", "i_staged"])
def test_vector_entry_points_return_the_same_codes(tmp_path, name):
    proc = toolchain.run(_build(tmp_path, name, host=False))
    assert proc.stdout.decode().splitlines() == EXPECTED
