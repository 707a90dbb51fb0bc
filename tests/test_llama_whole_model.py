"""llama.cpp's whole program (the llama-cpp-python sdist's libllama and ggml with the SpacemiT IME1 backend,
built at test time, statically linked with imegen's driver and IME emulator) under QEMU: on a small Qwen2
its logits agree with an independent NumPy forward of the same Q4_0 weights, and a counted llama_decode
gives the regions the whole-model baseline is made of (bench/results/llama_whole_model.json).

Tolerances, per position, as relative RMS of the logits (|got - ref| / |ref|):
- against the NumPy model that rounds where llama.cpp rounds (8-bit activations per 32, float16 flash
  attention; whole_reference.py), llama.cpp agrees to float32 noise (measured 1e-7 on every position of
  this model and prompt); float32 differences upstream can move one float16 or 8-bit rounding, and one
  8-bit code moved changes the logits by up to 2e-3 (measured), a few of them and what follows by up to
  1e-2 (measured on other seeds): 3e-2 is the bound, and most positions must be within 1e-5;
- against the exact float64 model (no activation quantization, float32 softmax), 1-3% (measured): that
  is what 8-bit activations and float16 attention cost; the bound is 5e-2.
Planted errors in the reference (GPT-J rotary pairs, swapped nibbles, another GQA grouping) reach 0.9-1.6
at their worst position (the rotary one is invisible at position 0 only): the comparison can fail."""

import json
from pathlib import Path

import numpy as np
import pytest

from imegen import toolchain
from imegen.perf.baselines.llama_cpp import whole_gguf, whole_model, whole_reference
from imegen.perf.model import x60

NEEDS_TOOLS = pytest.mark.skipif(bool(toolchain.missing_tools()), reason="needs the cross toolchains and qemu-riscv64")
RESULTS = Path(__file__).resolve().parents[1] / "bench" / "results" / "llama_whole_model.json"
PREFILL, DECODE = 9, 3  # 9 rows: two of the IME1 kernel's 4-row groups and a 1-row rest; decode: its 1-row path


def relative_rms(got: np.ndarray, ref: np.ndarray) -> np.ndarray:
    return np.sqrt(((got - ref) ** 2).mean(axis=1) / (ref ** 2).mean(axis=1))


def test_q4_0_dequantization_is_the_format_definition():
    block = np.zeros((1, 18), np.uint8)
    block[0, :2] = np.array([0.5], np.float16).view(np.uint8)
    block[0, 2:] = np.arange(16, dtype=np.uint8) | (np.arange(16, dtype=np.uint8)[::-1] << 4)
    w = whole_reference.dequantize_q4_0(block, 32)[0]
    assert list(w[:16]) == [0.5 * (j - 8) for j in range(16)]  # element j: low nibble of byte j
    assert list(w[16:]) == [0.5 * (15 - j - 8) for j in range(16)]  # element j + 16: its high nibble


def test_rope_rotates_pairs_half_a_head_apart():
    x = np.zeros((2, 1, 8))
    x[:, 0, 1] = 1.0  # pair (1, 5) at frequency theta^(-2/8)
    out = whole_reference.rope_rotate_half(x, np.array([0, 3]), 100.0)
    assert np.allclose(out[0, 0], x[0, 0])
    angle = 3 * 100.0 ** (-2 / 8)
    assert np.allclose(out[1, 0, [1, 5]], [np.cos(angle), np.sin(angle)])
    assert np.allclose(np.delete(out[1, 0], [1, 5]), 0)


def test_float16_flash_attention_model_is_near_the_exact_softmax():
    rng = np.random.default_rng(0)
    q, k, v = rng.standard_normal((7, 4, 16)), rng.standard_normal((7, 2, 16)), rng.standard_normal((7, 2, 16))
    exact = whole_reference.causal_gqa_attention(q, k, v)
    assert np.abs(whole_reference.flash_attention_f16(q, k, v) - exact).max() < 5e-3
    assert np.allclose(exact.reshape(7, 4, 16)[0, :2], v[0, 0]) and np.allclose(exact.reshape(7, 4, 16)[0, 2:], v[0, 1])


def test_extrapolation_is_exact_for_additive_counters():
    one, two = {"kernel.int": 10, "callee.mem": 3}, {"kernel.int": 15, "callee.mem": 4, "callee.fp": 2}
    assert whole_model.extrapolate(one, two, 24) == {"callee.fp": 46, "callee.mem": 26, "kernel.int": 125}
    assert whole_model.extrapolate(one, two, 1) == {"callee.fp": 0, "callee.mem": 3, "kernel.int": 10}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """The small Qwen2 run by llama.cpp (IME1 and the backend's path without IME), with every position's logits."""
    d = tmp_path_factory.mktemp("whole")
    exe = whole_model.build()
    cfg, w = whole_gguf.TINY, whole_gguf.weights(whole_gguf.TINY)
    whole_gguf.write_gguf(cfg, d / "tiny.gguf", whole_model.tree() / "gguf-py", w)
    runs = {}
    for arch in (whole_model.IME1_ARCH, whole_model.GENERIC_ARCH):
        calls = whole_model.run(exe, d / "tiny.gguf", PREFILL, DECODE, logits=d / f"{arch}.bin", arch=arch)
        runs[arch] = calls, np.fromfile(d / f"{arch}.bin", np.float32).reshape(-1, cfg.vocab)
    # The tokens the driver fed: its fixed prompt, then each call's argmax (greedy decoding).
    calls = runs[whole_model.IME1_ARCH][0]
    tokens = [(13 + 7919 * i) % cfg.vocab for i in range(PREFILL)] + [c.argmax[-1] for c in calls[:-1]]
    return {"exe": exe, "cfg": cfg, "w": w, "gguf": d / "tiny.gguf", "runs": runs, "tokens": np.array(tokens)}


@NEEDS_TOOLS
def test_ime1_logits_agree_with_numpy(tiny):
    calls, got = tiny["runs"][whole_model.IME1_ARCH]
    assert [(c.tokens, c.start) for c in calls] == [(PREFILL, 0)] + [(1, PREFILL + i) for i in range(DECODE)]
    assert all(c.emulated > 0 for c in calls)  # IME1 really ran: every call's matmuls trapped vmadot
    assert got.shape == (PREFILL + DECODE, tiny["cfg"].vocab) and np.isfinite(got).all()
    like = whole_reference.forward(tiny["cfg"], tiny["w"], tiny["tokens"], llama_like=True)
    err = relative_rms(got, like)
    assert err.max() < 3e-2 and np.median(err) < 1e-5, err
    assert (got.argmax(axis=1) == like.argmax(axis=1)).all()
    assert [c.argmax[-1] for c in calls] == list(got.argmax(axis=1)[PREFILL - 1:])  # the driver's argmax is the logits'
    exact = whole_reference.forward(tiny["cfg"], tiny["w"], tiny["tokens"])
    assert relative_rms(got, exact).max() < 5e-2


@NEEDS_TOOLS
@pytest.mark.parametrize("plant", ["gptj_rope", "swapped_nibbles", "gqa_interleaved"])
def test_a_wrong_reference_disagrees(tiny, monkeypatch, plant):
    """The comparison above can fail: each planted error in the NumPy model is far outside its bounds."""
    if plant == "gptj_rope":  # rotary on adjacent pairs (2i, 2i + 1): not what qwen2 uses
        monkeypatch.setattr(whole_reference, "rope_rotate_half", _gptj(whole_reference.rope_rotate_half))
    elif plant == "swapped_nibbles":
        plain = whole_reference.dequantize_q4_0

        def swapped(raw, cols):  # element j read from the high nibble, j + 16 from the low one
            return plain(raw, cols).reshape(raw.shape[0], -1, 2, 16)[:, :, ::-1].reshape(raw.shape[0], cols)
        monkeypatch.setattr(whole_reference, "dequantize_q4_0", swapped)
    else:
        def attention(q, k, v):  # query head h on KV head h % G instead of h // (H / G)
            order = np.argsort(np.arange(q.shape[1]) % k.shape[1], kind="stable")
            out = np.empty_like(q)
            out[:, order] = whole_reference.causal_gqa_attention(q[:, order], k, v).reshape(q.shape)
            return out.reshape(q.shape[0], -1)
        monkeypatch.setattr(whole_reference, "flash_attention_f16", attention)
    got = tiny["runs"][whole_model.IME1_ARCH][1]
    wrong = whole_reference.forward(tiny["cfg"], tiny["w"], tiny["tokens"], llama_like=True)
    assert relative_rms(got, wrong).max() > 0.2


def _gptj(rope_half):
    """rope_half applied to adjacent pairs (2i, 2i + 1) instead of (i, i + D/2)."""
    def rope(x, positions, theta):
        d = x.shape[-1]
        perm = np.concatenate([np.arange(0, d, 2), np.arange(1, d, 2)])
        out = np.empty_like(x)
        out[..., perm] = rope_half(x[..., perm], positions, theta)
        return out
    return rope


@NEEDS_TOOLS
def test_path_without_ime_agrees_too(tiny):
    calls, got = tiny["runs"][whole_model.GENERIC_ARCH]
    assert all(c.emulated == 0 for c in calls)  # SPACEMIT_CORE_ARCH of an X60 core: no vmadot
    exact = whole_reference.forward(tiny["cfg"], tiny["w"], tiny["tokens"])
    assert relative_rms(got, exact).max() < 5e-2
    assert relative_rms(got, tiny["runs"][whole_model.IME1_ARCH][1]).max() < 5e-2


@NEEDS_TOOLS
def test_counted_llama_decode_calls(tiny):
    regions, calls = whole_model.run_regions(tiny["exe"], tiny["gguf"], PREFILL, 2)
    assert len(regions) == 3 and [c.tokens for c in calls] == [PREFILL, 1, 1]
    prefill, first, later = (whole_model.split(r) for r in regions)
    assert min(prefill["spacemit"], prefill["rest"], later["spacemit"], later["rest"]) > 0
    assert [r["kernel.vmadot"] for r in regions] == [c.emulated for c in calls]
    assert calls[0].emulated > calls[1].emulated == calls[2].emulated > 0
    assert all(r.get("callee.vmadot", 0) == 0 for r in regions)  # every vmadot lies in the SpacemiT objects
    assert x60.total_instructions(regions[0]) > x60.total_instructions(regions[1])
    # The first call after the prefill rebuilds llama.cpp's graph; the next reuses it (what 'decode' counts).
    assert first["rest"] > 2 * later["rest"]
    assert x60.core_seconds(regions[2]) > 0


def test_committed_results_are_consistent():
    res = json.loads(RESULTS.read_text())
    assert "MODELED" in res["method"] and "TCM" in res["method"]
    assert res["model"] == whole_model.asdict(whole_gguf.QWEN25_05B)
    rows = {(r["phase"], r["context"]): r for r in res["rows"]}
    assert set(rows) == {(p, c) for p in whole_model.PHASES for c in whole_model.CONTEXTS}
    for (phase, context), r in rows.items():
        assert r["layers"] == 24 and r["threads"] == 1 and r["tokens"] == (context if phase == "prefill" else 1)
        assert r["cached"] == (0 if phase == "prefill" else context + 1)
        assert r["instructions"] == sum(r["split"].values()) == sum(r["classes"].values())
        assert r["per_layer"]["instructions"] == sum(r["per_layer"]["split"].values()) > 0
    # more context costs more; a prefill of 512 tokens costs more than 4 of 128; the call after a
    # prefill rebuilds llama.cpp's graph, a later decode call reuses it
    assert rows["decode", 512]["instructions"] > rows["decode", 128]["instructions"]
    assert rows["prefill", 512]["instructions"] > 4 * rows["prefill", 128]["instructions"]
    for context in whole_model.CONTEXTS:
        first = rows["decode", context]["first_after_prefill"]
        assert first["cached"] == context and first["split"]["rest"] > rows["decode", context]["split"]["rest"]
        assert first["instructions"] == sum(first["split"].values())
