"""llama.cpp's real SpacemiT IME1 Q4_0 kernels (downloaded sdist, built at test time): outputs against
an independent NumPy model, reproducible counts, and the extrapolation against direct runs."""

import numpy as np
import pytest

from imegen import toolchain
from imegen.targets.ime.encoding import decode_vmadot
from imegen.perf.baselines.llama_cpp import build, check, counts, rows, source
from imegen.perf.model import x60

NEEDS_TOOLS = pytest.mark.skipif(bool(toolchain.missing_tools()), reason="needs the cross toolchains and qemu-riscv64")


def test_translation_encodes_vmadot_and_adds_policies():
    text = '"vmadot       v16, v14, v0            \\n\\t"\n"vsetvli      t0, %[NBLKS], e32, mf2  \\n\\t"\n' \
           '"vsetvli t0, zero, e8, m1, ta, ma \\n\\t"\n'
    out, nv, ns = source.translate(text)
    word = int(out.split(".word ")[1].split()[0], 16)
    assert decode_vmadot(word) == {"vd": 16, "vs1": 14, "vs2": 0, "signedness": "ss", "slide": 0, "mnemonic": "vmadot"}
    assert (nv, ns) == (1, 1) and "mf2, tu, mu" in out and "ta, ma" in out


def test_reference_model_is_the_q4_0_definition():
    rng = np.random.default_rng(0)
    N, K = 3, 64
    raw = np.zeros((N, K // 32, 18), np.uint8)
    raw[:, :, :2] = np.array([0.5], np.float16).view(np.uint8)[None, None, :]
    raw[:, :, 2:] = rng.integers(0, 256, (N, K // 32, 16))
    A = (rng.integers(-127, 128, (2, K)) / 127).astype(np.float32)  # block amax may be < 1: codes rescale
    got, _ = check.reference(raw.tobytes(), A, N, K)
    qs = raw[:, :, 2:].astype(int)
    w = 0.5 * (np.concatenate([qs & 15, qs >> 4], axis=2).reshape(N, K) - 8)
    np.testing.assert_allclose(got, A.astype(np.float64) @ w.T, rtol=2e-2, atol=2e-2)


def test_task_split_matches_ime_cpp_cases():
    assert counts.split(1, 1, 896)[:2] == (1, 896)
    assert counts.split(4, 1, 896)[:2] == (1, 224)
    assert counts.split(4, 128, 4864) == (16, 4864, 8, 8)
    assert sum(len(counts.thread_tasks(4, i, 128, 4864)) for i in range(4)) == 8


@NEEDS_TOOLS
def test_llama_real_validates_and_counts_reproducibly(tmp_path):
    counter = counts.Counter()
    for M, nth in ((1, 1), (8, 4), (5, 1)):
        assert check.validate(counter.b, M, 64, 128, nth, tmp_path / f"v{M}_{nth}") <= 1.0
    regions, emulated, checksum = build.run_driver(counter.b, ["full", "1", "896", "896", "1"])
    again = build.run_driver(counter.b, ["full", "1", "896", "896", "1"])
    assert (regions, emulated, checksum) == again
    assert emulated == [0, 896 // 16 * 896 // 32 * 16]  # M1 kernel: 16 vmadot per 16 columns and block
    assert 0.185e6 < x60.total_instructions(regions[0]) + x60.total_instructions(regions[1]) < 0.200e6  # issue 10: 0.192 M
    for M, N, K, nth in ((1, 256, 896, 4), (32, 64, 256, 4), (8, 48, 128, 1)):
        q_d, g_d = counter.direct(M, N, K, nth)
        q_x, g_x = counter.per_thread(M, N, K, nth)
        assert q_d == q_x
        for d, x in zip(g_d, g_x):  # the task costs miss only the per-thread loop over tasks
            assert abs(x60.total_instructions(d) - x60.total_instructions(x)) <= 80 + 2 * len(counts.thread_tasks(nth, 0, M, N))
    one = counter.per_core(1, 896, 896, 1)
    assert x60.core_seconds(one) < rows.modeled_s(one, 1, 896, 896)[0]  # decode is DRAM-bound: the core side has headroom
