"""The Qwen2.5-0.5B-architecture model (imegen/ort/qwen.py), validated on the x86 host's onnxruntime:
against an independent float64 NumPy forward pass on the model's own dequantized weights
(reference.dequantize, bit-exact with ORT), prefill vs KV-cache decode, and greedy decoding."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("onnxruntime")
pytest.importorskip("onnx_ir")  # onnxruntime's MatMulNBitsQuantizer imports it

import onnx  # noqa: E402
import onnxruntime as ort  # noqa: E402
from onnx import numpy_helper  # noqa: E402

from imegen import reference as R  # noqa: E402
from imegen.ir import load_specs  # noqa: E402
from imegen.ort import qwen  # noqa: E402

REAL = dict(layers=2, vocab=512)  # Qwen2.5-0.5B's widths, shrunk depth and vocabulary
TINY = dict(layers=3, vocab=96, hidden=128, heads=4, kv_heads=2, head_dim=32, intermediate=192)
PROMPT = [17, 3, 250, 9, 77, 1]

_built: dict = {}


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    """model(**build_model kwargs) -> (path, config), built once per module."""
    def get(**kw):
        kw = {"bits": 4, "symmetric": False, "accuracy_level": 4, **kw}  # build_model's defaults
        key = tuple(sorted(kw.items()))
        if key not in _built:
            path = tmp_path_factory.mktemp("qwen") / "model.onnx"
            _built[key] = (path, qwen.build_model(path, **kw))
        return _built[key]
    yield get
    _built.clear()
    _stock_runs.clear()


def session(path):
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


# ---- independent NumPy forward pass (float64), reading the weights from the ONNX file by name ----

def model_weights(path) -> dict[str, np.ndarray]:
    """Initializers by name, and each MatMulNBits node's dequantized [K, N] weight under its output name."""
    m = onnx.load(str(path))
    init = {t.name: numpy_helper.to_array(t) for t in m.graph.initializer}
    w = dict(init)
    for node in m.graph.node:
        if node.op_type != "MatMulNBits":
            continue
        a = {x.name: onnx.helper.get_attribute_value(x) for x in node.attribute}
        K, N = a["K"], a["N"]
        zp = init[node.input[3]].reshape(N, -1) if len(node.input) > 3 and node.input[3] else None
        qw = R.QuantizedWeights(init[node.input[1]].reshape(N, -1, a["block_size"] * a["bits"] // 8),
                                init[node.input[2]].reshape(N, -1), zp, K, N, a["bits"], a["block_size"])
        w[node.output[0]] = R.dequantize(qw)
    return w


def reference_logits(w, c: qwen.QwenConfig, ids, rope=True, kv_head=None) -> np.ndarray:
    """float64 logits [S, vocab] of the whole sequence from position 0 (causal, no cache).

    rope / kv_head (query head -> KV head) exist to show the comparison notices a wrong choice."""
    f = np.float64
    kv_head = kv_head or (lambda h: h // (c.heads // c.kv_heads))
    S, hd = len(ids), c.head_dim

    def rms(x, weight):
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + c.rms_eps) * weight.astype(f)

    def rotate(x):  # [n, S, hd], rotate-half form
        if not rope:
            return x
        ang = np.arange(S, dtype=f)[:, None] * (1.0 / c.rope_theta ** (np.arange(0, hd, 2, dtype=f) / hd))
        x1, x2 = x[..., : hd // 2], x[..., hd // 2:]
        return np.concatenate([x1 * np.cos(ang) - x2 * np.sin(ang), x2 * np.cos(ang) + x1 * np.sin(ang)], -1)

    x = w["embed"].astype(f)[np.asarray(ids)]
    causal = np.tril(np.ones((S, S), bool))
    for i in range(c.layers):
        p = f"layers.{i}"
        h = rms(x, w[f"{p}.input_norm"])
        proj = {n: (h @ w[f"{p}.{n}_proj"].astype(f) + w[f"{p}.{n}_bias"]).reshape(S, -1, hd).transpose(1, 0, 2)
                for n in ("q", "k", "v")}
        q, k, v = rotate(proj["q"]), rotate(proj["k"]), proj["v"]
        ctx = np.empty((c.heads, S, hd))
        for j in range(c.heads):
            s = np.where(causal, q[j] @ k[kv_head(j)].T / np.sqrt(hd), -np.inf)
            e = np.exp(s - s.max(-1, keepdims=True))
            ctx[j] = (e / e.sum(-1, keepdims=True)) @ v[kv_head(j)]
        x = x + ctx.transpose(1, 0, 2).reshape(S, -1) @ w[f"{p}.o_proj"].astype(f)
        h = rms(x, w[f"{p}.post_norm"])
        g, u = h @ w[f"{p}.gate_proj"].astype(f), h @ w[f"{p}.up_proj"].astype(f)
        x = x + (g / (1 + np.exp(-g)) * u) @ w[f"{p}.down_proj"].astype(f)
    return rms(x, w["final_norm"]) @ w["logits"].astype(f)


def level4_tolerance(y):
    return 0.1 + 0.02 * np.abs(y)  # ORT's MatMulNBits accuracy_level 4 operator-test tolerance


# ---- tests ----

def test_graph_structure(model):
    path, c = model(**REAL)
    onnx.checker.check_model(str(path))
    m = onnx.load(str(path))
    assert qwen.QwenConfig.from_model(path) == c
    ops = {(n.domain or "ai.onnx", n.op_type) for n in m.graph.node}
    assert {d for d, _ in ops} == {"ai.onnx", "com.microsoft"}
    assert {o for d, o in ops if d == "com.microsoft"} == {"MatMulNBits"}
    nb = {n.output[0]: {a.name: onnx.helper.get_attribute_value(a) for a in n.attribute}
          for n in m.graph.node if n.op_type == "MatMulNBits"}
    assert len(nb) == 7 * c.layers + 1
    kn = {o: (a["K"], a["N"]) for o, a in nb.items()}
    assert kn["layers.1.q_proj"] == (896, 896) and kn["layers.1.k_proj"] == (896, 128)
    assert kn["layers.0.gate_proj"] == (896, 4864) and kn["layers.0.down_proj"] == (4864, 896)
    assert kn["logits"] == (896, c.vocab)
    assert all((a["bits"], a["block_size"], a["accuracy_level"]) == (4, 32, 4) for a in nb.values())
    assert not any(n.op_type == "MatMul" and n.input[1] in {t.name for t in m.graph.initializer}
                   for n in m.graph.node), "a constant-weight MatMul was left unquantized"
    names = [i.name for i in m.graph.input]
    assert names[:2] == ["input_ids", "position_ids"] and "past_key_values.1.value" in names
    assert [o.name for o in m.graph.output][:2] == ["logits", "present.0.key"]


@pytest.mark.parametrize("cfg,bits,symmetric", [(TINY, 4, False), (TINY, 8, True), (REAL, 4, False), (REAL, 8, False)],
                         ids=["tiny-4bit", "tiny-8bit-sym", "qwen2-4bit", "qwen2-8bit"])
def test_matches_numpy_reference(model, cfg, bits, symmetric):
    """accuracy_level 0 (fp32 compute on dequantized weights): ORT's logits = the float64 forward pass."""
    path, c = model(**cfg, bits=bits, symmetric=symmetric, accuracy_level=0)
    ids = PROMPT if c.vocab > max(PROMPT) else [t % c.vocab for t in PROMPT]
    got = qwen.host_runner(session(path))(qwen.step_feeds(c, ids, None, 0))["logits"][0]
    w = model_weights(path)
    ref = reference_logits(w, c, ids)
    err = np.abs(got - ref).max()
    assert err < 1e-4, err
    assert ref.std() > 0.1  # logits are informative, not collapsed
    # The comparison can fail: a model without rotary, or with the wrong query -> KV head map, is far off.
    assert np.abs(reference_logits(w, c, ids, rope=False) - ref).max() > 100 * 1e-4
    assert np.abs(reference_logits(w, c, ids, kv_head=lambda h: h % c.kv_heads) - ref).max() > 100 * 1e-4


def test_level4_model_within_ort_tolerance_of_reference(model):
    path, c = model(**REAL)
    got = qwen.host_runner(session(path))(qwen.step_feeds(c, PROMPT, None, 0))["logits"][0]
    ref = reference_logits(model_weights(path), c, PROMPT)
    assert np.all(np.abs(got - ref) <= level4_tolerance(ref))


@pytest.mark.parametrize("level", [0, 4])
def test_kv_cache_decode_equals_prefill(model, level):
    """Prefill logits (M = 6) = token-by-token decode (M = 1) = two chunks of 3 over the cache.

    Exact up to fp32 rounding with fp32 compute (level 0). At level 4 ORT quantizes each A row per
    block to int8, so an fp32-rounding difference between the M = 6 and M = 1 attention can flip one
    code of a block (seen: layer 0's down_proj input, 1.6e-4 at the output), and flips cascade through
    later layers' quantization to ~0.02 in the logits: within ORT's level-4 tolerance, not 1e-5."""
    path, c = model(**REAL, accuracy_level=level)
    run = qwen.host_runner(session(path))
    full = run(qwen.step_feeds(c, PROMPT, None, 0))
    steps, past = [], None
    for t, tok in enumerate(PROMPT):
        out = run(qwen.step_feeds(c, [tok], past, t))
        steps.append(out["logits"][0, 0])
        past = qwen.presents_as_past(c, out)
    first = run(qwen.step_feeds(c, PROMPT[:3], None, 0))
    second = run(qwen.step_feeds(c, PROMPT[3:], qwen.presents_as_past(c, first), 3))
    want = full["logits"][0]
    tol = 2e-5 if level == 0 else level4_tolerance(want)
    assert np.all(np.abs(np.stack(steps) - want) <= tol)
    assert np.all(np.abs(second["logits"][0] - want[3:]) <= tol[3:] if level else tol)
    if level == 0:
        for i in range(c.layers):
            for kv in ("key", "value"):
                np.testing.assert_allclose(past[f"past_key_values.{i}.{kv}"], full[f"present.{i}.{kv}"], atol=1e-5, rtol=0)
    assert full["present.1.key"].shape == (1, c.kv_heads, len(PROMPT), c.head_dim)


def test_greedy_decode_is_not_degenerate(model):
    path, c = model(**REAL)
    run = qwen.host_runner(session(path))
    tokens, logits = qwen.greedy_decode(run, PROMPT, 10, c)
    assert len(tokens) == 10 and logits.shape == (10, c.vocab)
    assert tokens == [int(np.argmax(row)) for row in logits]
    assert len(set(tokens)) >= 2, tokens
    assert np.all(logits.std(axis=1) > 0.1)
    # Decoding is a function of the prompt: another prompt decodes differently.
    assert qwen.greedy_decode(run, [400, 2, 99], 10, c)[0] != tokens


def test_cli_writes_model_and_refuses_bad_block(tmp_path):
    out = tmp_path / "m.onnx"
    r = subprocess.run([sys.executable, "-m", "imegen", "qwen-model", str(out), "--form", "plain", "--layers", "1",
                        "--vocab", "64", "--bits", "8"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "1 layers, vocab 64, 8-bit block 32" in r.stdout and "layer 1/1" in r.stderr
    assert qwen.QwenConfig.from_model(out).layers == 1
    r = subprocess.run([sys.executable, "-m", "imegen", "qwen-model", str(out), "--block", "48"],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "argument --block: expected one of 16, 32, 64, 128, 256, got '48'" in r.stderr and "Traceback" not in r.stderr


# ---- end to end in real riscv64 ONNX Runtime under QEMU: stock ORT vs ORT + imegen's custom-op library ----

# M = 5: one full 4-row IME tile and a remainder row.  Chosen so every step's top-2 logit margin is >= 0.08:
# int8 compute (imegen, level 4) and fp32 compute differ by up to ~0.05 on these logits (std 0.6), so on
# 3 of 30 random prompts the two would legitimately pick different tokens at a near-tie.
E2E_PROMPT = [63, 232, 500, 68, 196]
MIN_MARGIN = 0.06
E2E_STEPS = 8
IME_SPEC = str(Path(__file__).resolve().parents[1] / "examples" / "qwen_mlp.imegen")  # q4_prefill_ime (gemm, M > 1) and q4_decode_ime (gemv, M = 1)


IME_KERNELS = {"gemm": "q4_prefill_ime", "gemv": "q4_decode_ime"}


def imegen_session(riscv, model_path, version, tmp_path):
    """RiscvSession on the model rewritten into imegen's domain, with the library of the spec's two IME kernels."""
    from imegen.ort import customop, rewrite

    specs = [s for s in load_specs(IME_SPEC) if s.name in IME_KERNELS.values()]
    m = onnx.load(str(model_path))
    decisions = rewrite.rewrite(m, specs)
    assert len(decisions) == sum(n.op_type == "MatMulNBits" for n in m.graph.node)
    assert all(d.moved and d.detail == "M=1 q4_decode_ime, M=2+ q4_prefill_ime" for d in decisions), decisions
    rewritten = tmp_path / "qwen-imegen.onnx"
    onnx.save(m, str(rewritten))
    return riscv.RiscvSession(rewritten, version=version, custom_ops=customop.build_library(specs, IME_SPEC))


_stock_runs: dict = {}


def stock_decode(riscv, path, c, version):
    """Greedy decode in stock riscv64 ORT (cached: both tests below use it)."""
    key = (str(path), version)
    if key not in _stock_runs:
        with riscv.RiscvSession(path, version=version) as stock:
            _stock_runs[key] = qwen.greedy_decode(stock.run, E2E_PROMPT, E2E_STEPS, c)
    return _stock_runs[key]


# ORT 1.21's MatMulNBits refuses 8 bits at session creation ("Only 4b quantization is supported"); 1.23 runs it.
@pytest.mark.parametrize("version,bits", [("1.21", 4), ("1.23", 4), ("1.23", 8)])
def test_riscv_stock_ort_runs_the_model(model, version, bits):
    """Stock riscv64 ORT runs the model (zero-length past, KV cache, every op) and agrees with the float64
    forward pass of prompt + generated tokens (row t of the per-step logits is its row len(prompt) - 1 + t)."""
    riscv = pytest.importorskip("imegen.ort.riscv", reason="needs the ort-customop branch (riscv64 ORT runner)")
    path, c = model(**REAL, bits=bits)
    ids, logits = stock_decode(riscv, path, c, version)
    ref = reference_logits(model_weights(path), c, E2E_PROMPT + ids[:-1])[len(E2E_PROMPT) - 1:]
    assert np.all(np.abs(logits - ref) <= level4_tolerance(ref))
    assert ids == [int(np.argmax(r)) for r in ref]
    assert len(set(ids)) >= 2
    if bits == 4:  # the model the stock-vs-imegen test decodes
        top2 = np.sort(logits, axis=1)[:, -2:]
        assert np.all(top2[:, 1] - top2[:, 0] >= MIN_MARGIN), "prompt has a near-tie: token identity is not a fair test"


@pytest.mark.parametrize("version", ["1.21", "1.23"])
def test_riscv_greedy_decode_stock_vs_imegen(model, tmp_path, version):
    """Greedy decode of 8 tokens: identical ids in stock riscv64 ORT and in ORT + imegen (IME kernels under
    the trap emulator), logits within ORT's level-4 tolerance of stock ORT's and of the float64 reference;
    the prefill (M = 5) and every decode step (M = 1) ran imegen's kernels."""
    riscv = pytest.importorskip("imegen.ort.riscv", reason="needs the ort-customop branch (riscv64 ORT runner)")
    path, c = model(**REAL)
    stock_ids, stock_logits = stock_decode(riscv, path, c, version)
    from imegen.ort.customop import parse_stats

    with imegen_session(riscv, path, version, tmp_path) as ime:
        seen = []  # per run: (M, kernel calls and vmadots it added)

        def run(feeds):
            before = parse_stats(ime.stats())
            out = ime.run(feeds)
            after = parse_stats(ime.stats())
            seen.append((feeds["input_ids"].shape[1], {k: after[k] - before.get(k, 0) for k in after}))
            return out

        ids, logits = qwen.greedy_decode(run, E2E_PROMPT, E2E_STEPS, c)
    assert ids == stock_ids
    assert np.all(np.abs(logits - stock_logits) <= level4_tolerance(stock_logits))
    ref = reference_logits(model_weights(path), c, E2E_PROMPT + ids[:-1])[len(E2E_PROMPT) - 1:]
    assert np.all(np.abs(logits - ref) <= level4_tolerance(ref))
    assert [m for m, _ in seen] == [len(E2E_PROMPT)] + [1] * (E2E_STEPS - 1)
    nodes = 7 * c.layers + 1  # every MatMulNBits node, once per run (threads = 1)
    gemm, gemv = IME_KERNELS["gemm"], IME_KERNELS["gemv"]
    assert seen[0][1][gemm] == nodes and seen[0][1][gemv] == 0, seen[0]  # prefill: M = 5 on the gemm kernel
    assert all(d[gemv] == nodes and d[gemm] == 0 for _, d in seen[1:]), seen  # decode: M = 1 on the gemv kernel
    assert all(d["vmadots"] > 0 for _, d in seen), seen  # and their IME instructions ran (emulated)
