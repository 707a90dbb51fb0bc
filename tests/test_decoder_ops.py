"""imegen's decoder operators (imegen/ort/decoder_ops.c) inside Debian's real riscv64 onnxruntime under QEMU.

Each operator runs as a single-node model (SiluMul: the Sigmoid, Mul, Mul it replaces, after two MatMulNBits) in
stock ORT and, moved by imegen/ort/decoder_ops.py, in ORT + imegen's library, in the same riscv64 ORT, at VLEN 128,
256 and 1024. Both must agree with an independent NumPy (float64) reference written here, and with each other,
within fp32 rounding; the library's counters must show the operator ran. Forms the operators do not serve must
stay in ORT with the reason. The end-to-end test greedy-decodes a real onnxruntime-genai export with every node
moved.
"""

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import imegen
from imegen import toolchain
from imegen.ort import ort_check as oc
from imegen.ir import attention_specs_from_text
from imegen.ort.customop import build_library, parse_decoder_stats
from imegen.ort.decoder_ops import rewrite_decoder_ops
from imegen.ort.riscv import RiscvSession

ROOT = Path(__file__).resolve().parents[1]
REAL_B32 = ROOT / "tests" / "data" / "genai" / "qwen2_tiny_int4_b32" / "model.onnx"
needs_qemu = pytest.mark.skipif(bool(toolchain.missing_tools()), reason="needs the cross toolchains and qemu-riscv64")
# A library needs one MatMulNBits kernel; the decoder operators come with every library, GroupQueryAttention's
# attention from the spec's attention kernels: the first one the hart supports (VLEN 256 and up, else 128).
SPEC = ("kernel rvv_gemv { op = gemv tile = 1x16 target = rvv vlen = 128 bits = 4 block = 32 "
        "zero_point = symmetric compute = fp32 }\n"
        "attention attn256 { target = rvv vlen = 256 tile = 4x16 }\n"
        "attention attn128 { target = rvv vlen = 128 tile = 3x8 }\n")
RTOL = 2e-5  # |got - want| <= RTOL * (1 + max |want|): fp32 rounding of sums over a few thousand terms
VLENS = (128, 256, 1024)


@pytest.fixture(scope="module")
def library():
    return build_library(imegen.load_spec(SPEC), "decoder.imegen", attention=attention_specs_from_text(SPEC))


def model_of(nodes, inputs, outputs, inits=(), opset=21):
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, t, None) for n, t in inputs],
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in outputs], list(inits))
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset), helper.make_opsetid("com.microsoft", 1)])
    m.ir_version = 10
    return m


def run_both(tmp_path, model, feeds, library, *, version="1.23", vlen=256, expect_moved=1):
    """Stock ORT's outputs and ORT + imegen's (model moved by rewrite_decoder_ops), and the library's counters."""
    stock = tmp_path / "stock.onnx"
    onnx.save(model, str(stock))
    moved = onnx.ModelProto()
    moved.CopyFrom(model)
    decisions = rewrite_decoder_ops(moved)
    assert sum(d.moved for d in decisions) == expect_moved, [str(d) for d in decisions]
    mine = tmp_path / "imegen.onnx"
    onnx.save(moved, str(mine))
    with RiscvSession(stock, version) as s:
        want = s.run(feeds)
    with RiscvSession(mine, version, custom_ops=library, vlen=vlen) as s:
        got = s.run(feeds)
        calls = parse_decoder_stats(s.stats())
    return want, got, calls


def close(got, want, what):
    want = np.asarray(want, np.float64)
    assert got.shape == want.shape, (what, got.shape, want.shape)
    err = float(np.abs(got - want).max()) if want.size else 0.0
    assert err <= RTOL * (1 + float(np.abs(want).max(initial=0))), f"{what}: max |diff| {err:.3g}"


# ------------------------------------------------------------------------------------------- references
def rms_norm(x, gamma, eps):
    x = x.astype(np.float64)
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * gamma


def rotate(x, pos, cos, sin, interleaved):
    """x [..., S, hd] at positions pos [S]; cos/sin [positions, rd/2]."""
    half = cos.shape[1]
    c, s = cos[pos].astype(np.float64), sin[pos].astype(np.float64)
    y = x.astype(np.float64).copy()
    if interleaved:
        a, b = x[..., 0:2 * half:2], x[..., 1:2 * half:2]
        y[..., 0:2 * half:2], y[..., 1:2 * half:2] = a * c - b * s, b * c + a * s
    else:
        a, b = x[..., :half], x[..., half:2 * half]
        y[..., :half], y[..., half:2 * half] = a * c - b * s, b * c + a * s
    return y


def gqa(qkv, past_k, past_v, seqlens, total, cos, sin, *, heads, kv_heads, scale, rotary, interleaved):
    """GroupQueryAttention (packed QKV, BNSH past) in float64: (output, present_key, present_value)."""
    B, S, D = qkv.shape
    hd = D // (heads + 2 * kv_heads)
    x = qkv.astype(np.float64).reshape(B, S, heads + 2 * kv_heads, hd).transpose(0, 2, 1, 3)
    q, k, v = x[:, :heads], x[:, heads:heads + kv_heads], x[:, heads + kv_heads:]
    T = max(total, past_k.shape[2])
    out = np.zeros((B, S, heads * hd))
    pk, pv = np.zeros((B, kv_heads, T, hd)), np.zeros((B, kv_heads, T, hd))
    scale = scale or 1 / np.sqrt(hd)
    for b in range(B):
        past = int(seqlens[b]) + 1 - S
        pos = past + np.arange(S)
        qb, kb = (rotate(q[b], pos, cos, sin, interleaved), rotate(k[b], pos, cos, sin, interleaved)) if rotary \
            else (q[b], k[b])
        pk[b, :, :past], pv[b, :, :past] = past_k[b, :, :past], past_v[b, :, :past]
        pk[b, :, past:past + S], pv[b, :, past:past + S] = kb, v[b]
        for h in range(heads):
            g = h // (heads // kv_heads)
            scores = scale * qb[h] @ pk[b, g, :past + S].T
            scores[np.arange(S)[:, None] + past < np.arange(past + S)[None, :]] = -np.inf
            p = np.exp(scores - scores.max(axis=1, keepdims=True))
            out[b, :, h * hd:(h + 1) * hd] = (p / p.sum(axis=1, keepdims=True)) @ pv[b, g, :past + S]
    return out, pk, pv


# ------------------------------------------------------------------------------------------ the norms
@needs_qemu
@pytest.mark.parametrize("vlen,version", [(v, "1.23") for v in VLENS] + [(256, "1.21")])
@pytest.mark.parametrize("width", [896, 77])
def test_simplified_layer_norm(tmp_path, library, vlen, version, width):
    rng = np.random.default_rng(width)
    gamma = rng.normal(1, 0.2, width).astype(np.float32)
    node = helper.make_node("SimplifiedLayerNormalization", ["X", "gamma"], ["Y"], name="norm", epsilon=1e-6, axis=-1,
                            stash_type=1)
    model = model_of([node], [("X", TensorProto.FLOAT)], ["Y"], [numpy_helper.from_array(gamma, "gamma")])
    x = rng.normal(0, 3, (2, 3, width)).astype(np.float32)
    want, got, calls = run_both(tmp_path, model, {"X": x}, library, version=version, vlen=vlen)
    close(got["Y"], rms_norm(x, gamma, 1e-6), "Y vs NumPy")
    close(got["Y"], want["Y"], "Y vs stock ORT")
    assert calls == {"SimplifiedLayerNormalization": (1, 1)}


@needs_qemu
@pytest.mark.parametrize("vlen", VLENS)
@pytest.mark.parametrize("bias,version", [(False, "1.23"), (True, "1.21")])
def test_skip_simplified_layer_norm(tmp_path, library, vlen, bias, version):
    rng = np.random.default_rng(vlen)
    width = 136
    gamma = rng.normal(1, 0.2, width).astype(np.float32)
    inits = [numpy_helper.from_array(gamma, "gamma")]
    ins = ["X", "skip", "gamma"]
    if bias:
        inits.append(numpy_helper.from_array(rng.normal(0, 1, width).astype(np.float32), "bias"))
        ins.append("bias")
    node = helper.make_node("SkipSimplifiedLayerNormalization", ins, ["Y", "", "", "sum"], name="skipnorm",
                            domain="com.microsoft", epsilon=1e-6)
    model = model_of([node], [("X", TensorProto.FLOAT), ("skip", TensorProto.FLOAT)], ["Y", "sum"], inits)
    x, skip = (rng.normal(0, 2, (1, 5, width)).astype(np.float32) for _ in range(2))
    want, got, calls = run_both(tmp_path, model, {"X": x, "skip": skip}, library, version=version, vlen=vlen)
    total = x.astype(np.float64) + skip + (numpy_helper.to_array(inits[1]) if bias else 0)
    close(got["sum"], total, "sum vs NumPy")
    close(got["Y"], rms_norm(total, gamma, 1e-6), "Y vs NumPy")
    for name in ("Y", "sum"):
        close(got[name], want[name], f"{name} vs stock ORT")
    assert calls == {"SkipSimplifiedLayerNormalization": (1, 1)}


# ----------------------------------------------------------------------------------------- the MLP
def mlp_model(rng, K=64, N=96):
    """gate and up MatMulNBits of one input, then genai's SiLU gate: Sigmoid(g), Mul(g, s), Mul(., up)."""
    nodes, inits = [], []
    for name in ("gate", "up"):
        qw = oc.ort_quantized_weights(rng.normal(0, 0.3, (K, N)).astype(np.float32), 4, 32, True)
        inits += [numpy_helper.from_array(qw.data, f"{name}_B"), numpy_helper.from_array(qw.scales, f"{name}_s")]
        nodes.append(helper.make_node("MatMulNBits", ["X", f"{name}_B", f"{name}_s"], [name], name=f"{name}_proj",
                                      domain="com.microsoft", K=K, N=N, bits=4, block_size=32))
    nodes += [helper.make_node("Sigmoid", ["gate"], ["sig"], name="act/Sigmoid"),
              helper.make_node("Mul", ["gate", "sig"], ["silu"], name="act/Mul"),
              helper.make_node("Mul", ["silu", "up"], ["Y"], name="mlp/Mul")]
    return model_of(nodes, [("X", TensorProto.FLOAT)], ["Y", "gate", "up"], inits)


@needs_qemu
@pytest.mark.parametrize("vlen,version", [(v, "1.23") for v in VLENS] + [(256, "1.21")])
def test_silu_mul(tmp_path, library, vlen, version):
    rng = np.random.default_rng(3)
    model = mlp_model(rng)
    x = rng.normal(0, 4, (3, 64)).astype(np.float32)
    want, got, calls = run_both(tmp_path, model, {"X": x}, library, version=version, vlen=vlen)
    g, u = want["gate"].astype(np.float64), want["up"].astype(np.float64)  # stock's own MatMulNBits outputs
    close(got["Y"], g / (1 + np.exp(-g)) * u, "Y vs NumPy")
    close(got["Y"], want["Y"], "Y vs stock ORT")
    assert calls == {"SiluMul": (1, 1)}
    assert [n.op_type for n in rewritten(model).graph.node].count("Sigmoid") == 0


@needs_qemu
@pytest.mark.parametrize("vlen,N", [(256, 8), (256, 16), (1024, 16)])
def test_silu_mul_on_rows_one_register_group_holds(tmp_path, library, vlen, N):
    """Rows that fit one register of m1 (8 floats at VLEN 256, 32 at 1024) or m2 take the smaller group's copy of
    the SiLU: the same formula, against NumPy."""
    rng = np.random.default_rng(4)
    model = mlp_model(rng, N=N)
    x = rng.normal(0, 4, (3, 64)).astype(np.float32)
    want, got, _ = run_both(tmp_path, model, {"X": x}, library, vlen=vlen)
    g, u = want["gate"].astype(np.float64), want["up"].astype(np.float64)
    close(got["Y"], g / (1 + np.exp(-g)) * u, "Y vs NumPy")


def rewritten(model):
    m = onnx.ModelProto()
    m.CopyFrom(model)
    rewrite_decoder_ops(m)
    return m


# ------------------------------------------------------------------------------------------ attention
def rotary_caches(positions, half, theta=1e4):
    inv = 1.0 / theta ** (np.arange(half) / half)
    angles = np.outer(np.arange(positions), inv)
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)


def gqa_model(*, heads, kv_heads, rotary=True, interleaved=False, scale=None, rotary_half=None, genai_form=False,
              head=64, positions=64):
    """A GroupQueryAttention node: ORT 1.21's 9-input form, or genai's 12-input one (three trailing empties)."""
    inits = []
    ins = ["qkv", "", "", "past_key", "past_value", "seqlens_k", "total_sequence_length"]
    if rotary:
        cos, sin = rotary_caches(positions, rotary_half or head // 2)
        inits += [numpy_helper.from_array(cos, "cos_cache"), numpy_helper.from_array(sin, "sin_cache")]
        ins += ["cos_cache", "sin_cache"]
    if genai_form:
        ins += [""] * (12 - len(ins))
    attrs = dict(num_heads=heads, kv_num_heads=kv_heads, do_rotary=int(rotary), rotary_interleaved=int(interleaved))
    if scale is not None:
        attrs["scale"] = scale
    if genai_form:
        attrs.update(local_window_size=-1, softcap=0.0)
    node = helper.make_node("GroupQueryAttention", ins, ["out", "present_key", "present_value"], name="attn",
                            domain="com.microsoft", **attrs)
    inputs = [("qkv", TensorProto.FLOAT), ("past_key", TensorProto.FLOAT), ("past_value", TensorProto.FLOAT),
              ("seqlens_k", TensorProto.INT32), ("total_sequence_length", TensorProto.INT32)]
    return model_of([node], inputs, ["out", "present_key", "present_value"], inits), inits


def gqa_feeds(rng, *, heads, kv_heads, head, seq, past):
    return {"qkv": rng.normal(0, 1, (1, seq, (heads + 2 * kv_heads) * head)).astype(np.float32),
            "past_key": rng.normal(0, 1, (1, kv_heads, past, head)).astype(np.float32),
            "past_value": rng.normal(0, 1, (1, kv_heads, past, head)).astype(np.float32),
            "seqlens_k": np.array([past + seq - 1], np.int32),
            "total_sequence_length": np.array([past + seq], np.int32)}


GQA_CASES = {  # name: (model options, seq, past, ORT version)
    "qwen_decode": (dict(heads=14, kv_heads=2, genai_form=True), 1, 37, "1.23"),
    "qwen_prefill": (dict(heads=14, kv_heads=2, genai_form=True), 9, 0, "1.23"),
    "prefill_after_past": (dict(heads=4, kv_heads=2, head=32, scale=0.3), 3, 5, "1.21"),
    "interleaved_partial": (dict(heads=2, kv_heads=1, head=32, interleaved=True, rotary_half=8), 4, 6, "1.21"),
    "no_rotary_mha": (dict(heads=3, kv_heads=3, head=16, rotary=False), 2, 7, "1.23"),
    "long_head": (dict(heads=2, kv_heads=1, head=128, genai_form=True), 1, 11, "1.23"),
}


# every case at VLEN 256; two (both rotary forms) at every VLEN: the kernels are vector-length agnostic
GQA_RUNS = [(case, 256) for case in GQA_CASES] + [(case, vlen) for case in ("qwen_decode", "interleaved_partial")
                                                  for vlen in VLENS if vlen != 256]


@needs_qemu
@pytest.mark.parametrize("case,vlen", GQA_RUNS)
def test_group_query_attention(tmp_path, library, case, vlen):
    options, seq, past, version = GQA_CASES[case]
    rng = np.random.default_rng(seq * 100 + past)
    model, inits = gqa_model(**options)
    head = options.get("head", 64)
    feeds = gqa_feeds(rng, heads=options["heads"], kv_heads=options["kv_heads"], head=head, seq=seq, past=past)
    want, got, calls = run_both(tmp_path, model, feeds, library, version=version, vlen=vlen)
    caches = [numpy_helper.to_array(t) for t in inits] or [None, None]
    ref = gqa(feeds["qkv"], feeds["past_key"], feeds["past_value"], feeds["seqlens_k"], past + seq, *caches,
              heads=options["heads"], kv_heads=options["kv_heads"], scale=options.get("scale"),
              rotary=options.get("rotary", True), interleaved=options.get("interleaved", False))
    for name, r in zip(("out", "present_key", "present_value"), ref):
        close(got[name], r, f"{name} vs NumPy")
        close(got[name], want[name], f"{name} vs stock ORT {version}")
    assert calls == {"GroupQueryAttention": (1, 1)}


# --------------------------------------------------------------------------------------- refusals
def decisions_of(model):
    return {d.op: d for d in rewrite_decoder_ops(model, apply=False)}


@pytest.mark.parametrize("change,reason", [
    (dict(local_window_size=8), "local_window_size = 8"),
    (dict(softcap=30.0), "softcap = 30.0"),
    (dict(smooth_softmax=1), "smooth_softmax = 1"),
])
def test_attention_forms_not_served_stay(change, reason):
    model, _ = gqa_model(heads=4, kv_heads=2, genai_form=True)
    node = model.graph.node[0]
    kept = [a for a in node.attribute if a.name not in change]
    del node.attribute[:]
    node.attribute.extend(kept + [helper.make_attribute(k, v) for k, v in change.items()])
    d = decisions_of(model)["GroupQueryAttention"]
    assert not d.moved and reason in d.detail


@pytest.mark.parametrize("slot,reason", [(1, "separate key and value"), (9, "position_ids input"),
                                         (10, "attention_bias input"), (3, "no past_key")])
def test_attention_inputs_not_served_stay(slot, reason):
    model, _ = gqa_model(heads=4, kv_heads=2, genai_form=True)
    node = model.graph.node[0]
    node.input[slot] = "" if slot == 3 else "extra"
    d = decisions_of(model)["GroupQueryAttention"]
    assert not d.moved and reason in d.detail


def test_attention_needs_an_attention_kernel_in_the_spec():
    model, _ = gqa_model(heads=4, kv_heads=2, genai_form=True)
    d = {x.op: x for x in rewrite_decoder_ops(model, attention=False, apply=False)}["GroupQueryAttention"]
    assert not d.moved and "no attention kernel" in d.detail


def test_float16_and_used_statistics_stay():
    gamma16 = numpy_helper.from_array(np.ones(8, np.float16), "gamma")
    norm = helper.make_node("SimplifiedLayerNormalization", ["X", "gamma"], ["Y"], name="n16")
    d = decisions_of(model_of([norm], [("X", TensorProto.FLOAT16)], ["Y"], [gamma16]))["SimplifiedLayerNormalization"]
    assert not d.moved and "not float32" in d.detail
    gamma = numpy_helper.from_array(np.ones(8, np.float32), "gamma")
    norm = helper.make_node("SimplifiedLayerNormalization", ["X", "gamma"], ["Y", "inv"], name="n")
    d = decisions_of(model_of([norm], [("X", TensorProto.FLOAT)], ["Y", "inv"], [gamma]))["SimplifiedLayerNormalization"]
    assert not d.moved and "inv_std_var" in d.detail
    norm = helper.make_node("SimplifiedLayerNormalization", ["X", "gamma"], ["Y"], name="n", axis=1)
    d = decisions_of(model_of([norm], [("X", TensorProto.FLOAT)], ["Y"], [gamma]))["SimplifiedLayerNormalization"]
    assert not d.moved and "axis 1" in d.detail


def test_silu_without_matmul_nbits_producers_stays():
    nodes = [helper.make_node("Sigmoid", ["g"], ["s"], name="sig"), helper.make_node("Mul", ["g", "s"], ["a"]),
             helper.make_node("Mul", ["a", "u"], ["Y"], name="mul")]
    model = model_of(nodes, [("g", TensorProto.FLOAT), ("u", TensorProto.FLOAT)], ["Y"])
    d = decisions_of(model)["SiluMul"]
    assert not d.moved and "could differ" in d.detail
    assert len(rewritten(model).graph.node) == 3


def test_real_export_every_decoder_node_moves():
    """onnxruntime-genai 0.18's export: every norm, SiLU gate and attention node is a served form."""
    model = onnx.load(str(REAL_B32))
    decisions = rewrite_decoder_ops(model)
    assert decisions and all(d.moved for d in decisions), [str(d) for d in decisions if not d.moved]
    ops = [n.op_type for n in model.graph.node if n.domain == "ai.imegen"]
    assert sorted(set(ops)) == ["GroupQueryAttention", "SiluMul", "SimplifiedLayerNormalization",
                                "SkipSimplifiedLayerNormalization"]
    assert not [n for n in model.graph.node if n.op_type == "Sigmoid"]
    onnx.checker.check_model(model)  # still a valid graph: every input produced before use


# ------------------------------------------------------------------------------------------ whole model
@needs_qemu
def test_greedy_tokens_identical_with_every_node_moved(tmp_path, capsys):
    """The 2-layer real genai export, every MatMulNBits (fp32 compute) and every decoder node on imegen: 8
    greedy tokens identical to stock ORT 1.23's, outputs within ORT's tolerance at every step."""
    from imegen.cli import main
    from imegen.ir import load_attention_specs, load_specs
    from imegen.ort.model_check import model_check

    out = tmp_path / "out"
    assert main(["ort-accelerate", str(REAL_B32), "-o", str(out), "--flavour", "qemu", "--compute", "fp32"]) == 0
    capsys.readouterr()
    spec = out / "model.imegen"
    check = model_check(load_specs(spec), REAL_B32, spec_file=str(spec), generate=8, compute="fp32",
                        attention=load_attention_specs(spec))
    assert check.ok, check.report()
    assert check.tokens_agree and len(check.generated[1]) == 8
    assert all(d.moved for d in check.decoder) and len(check.decoder) == 9
    # the SiLU gate rides in the up projection's MatMulNBits (ort-accelerate served it)
    assert {op for op, (_, calls) in check.decoder_calls.items() if calls} == {
        "GroupQueryAttention", "SiluGate", "SimplifiedLayerNormalization", "SkipSimplifiedLayerNormalization"}


# ------------------------------------------------------------------------------ genai's shared KV buffer
# onnxruntime-genai runs GroupQueryAttention with past_present_share_buffer: each present output is bound to its
# past input's own max-length buffer (RiscvSession.run(share=...)), valid up to seqlens_k + 1.
SHARED = {"present_key": "past_key", "present_value": "past_value"}
SENTINEL = 1000.0  # the buffer's rows beyond the valid length: any read of them would swamp the attention


def shared_steps(session, rng, *, heads, kv_heads, head, max_len, steps):
    """Prefill steps[0] tokens into a sentinel-filled max-length buffer, then one step per later entry, each
    Run's present bound to its past; per step (feeds, outputs) with the past as it was before the Run."""
    buf_k = np.full((1, kv_heads, max_len, head), SENTINEL, np.float32)
    buf_v = buf_k.copy()
    valid, out = 0, []
    for seq in steps:
        qkv = rng.normal(0, 1, (1, seq, (heads + 2 * kv_heads) * head)).astype(np.float32)
        feeds = {"qkv": qkv, "past_key": buf_k, "past_value": buf_v,
                 "seqlens_k": np.array([valid + seq - 1], np.int32),
                 "total_sequence_length": np.array([valid + seq], np.int32)}
        got = session.run(feeds, share=SHARED)
        out.append((feeds, got))
        buf_k, buf_v, valid = got["present_key"], got["present_value"], valid + seq
    return out


@needs_qemu
@pytest.mark.parametrize("version", ["1.21", "1.23"])
def test_group_query_attention_in_genai_shared_buffer(tmp_path, library, version):
    """Prefill then decode steps into one max-length buffer: imegen's operator and stock ORT's agree with the
    NumPy reference on the valid rows, and both leave the rows after them exactly as they were."""
    heads, kv_heads, head, max_len, steps = 14, 2, 64, 24, (5, 1, 1, 1)
    model, inits = gqa_model(heads=heads, kv_heads=kv_heads, genai_form=version != "1.21")  # 1.21: 9 inputs
    stock, mine = tmp_path / "stock.onnx", tmp_path / "imegen.onnx"
    onnx.save(model, str(stock))
    onnx.save(rewritten(model), str(mine))
    cos, sin = (numpy_helper.to_array(t) for t in inits)
    runs = {}
    for name, path, lib in (("stock", stock, None), ("imegen", mine, library)):
        with RiscvSession(path, version, custom_ops=lib) as s:
            runs[name] = shared_steps(s, np.random.default_rng(7), heads=heads, kv_heads=kv_heads, head=head,
                                      max_len=max_len, steps=steps)
            if lib:
                assert parse_decoder_stats(s.stats()) == {"GroupQueryAttention": (1, len(steps))}
    for step, ((feeds, want), (_, got)) in enumerate(zip(runs["stock"], runs["imegen"])):
        total = int(feeds["total_sequence_length"][0])
        past = total - feeds["qkv"].shape[1]
        ref = gqa(feeds["qkv"], feeds["past_key"][:, :, :past], feeds["past_value"][:, :, :past], feeds["seqlens_k"],
                  total, cos, sin, heads=heads, kv_heads=kv_heads, scale=None, rotary=True, interleaved=False)
        for engine, outputs in (("stock ORT", want), ("imegen", got)):
            what = f"step {step}, {engine} {version}"
            close(outputs["out"], ref[0], f"out vs NumPy, {what}")
            for name, r in zip(("present_key", "present_value"), ref[1:]):
                assert outputs[name].shape == (1, kv_heads, max_len, head), what
                close(outputs[name][:, :, :total], r, f"{name} vs NumPy, {what}")
                assert (outputs[name][:, :, total:] == SENTINEL).all(), f"{name}: rows after {total} touched, {what}"
        close(got["out"], want["out"], f"out vs stock ORT {version}, step {step}")


def greedy(session, c, prompt, tokens, max_len=None):
    """Greedy token ids and the last cache; max_len: genai's shared buffer (every present bound to its past,
    buffers of max_len positions first filled with SENTINEL), else the cache grows by each step's present."""
    share = {f"present.{i}.{kind}": f"past_key_values.{i}.{kind}" for i in range(c.layers) for kind in ("key", "value")}
    cache = {p: np.full((1, c.kv_heads, max_len or 0, c.head_size), SENTINEL, np.float32) for p in share.values()}
    ids, new, out_ids = list(prompt), list(prompt), []
    for _ in range(tokens):
        feeds = {"input_ids": np.array([new], np.int64), "attention_mask": np.ones((1, len(ids)), np.int64), **cache}
        out = session.run(feeds, outputs=["logits", *share], share=share if max_len else None)
        token = int(out["logits"][0, -1].argmax())
        out_ids.append(token)
        ids.append(token)
        new = [token]
        cache = {p: out[present] for present, p in share.items()}
    return out_ids, cache


@needs_qemu
def test_greedy_tokens_identical_in_genai_shared_buffer(tmp_path, library):
    """The 2-layer genai-form model (`imegen qwen-model`), every layer's present bound to its past as genai runs
    it: 10 greedy tokens of ORT + imegen's decoder operators equal stock ORT 1.23's, which equal stock's own
    with a growing cache; neither writes the buffers' rows after the valid ones."""
    from imegen.ort import genai_form as gf

    c = gf.GenaiConfig(layers=2, hidden=128, heads=4, kv_heads=2, intermediate=256, vocab=512, context=256)
    model = gf.genai_model(c)
    stock, mine = tmp_path / "stock.onnx", tmp_path / "imegen.onnx"
    onnx.save(model, str(stock))
    moved = rewritten(model)
    assert sum(n.domain == "ai.imegen" and n.op_type == "GroupQueryAttention" for n in moved.graph.node) == c.layers
    onnx.save(moved, str(mine))
    prompt, n = [17, 3, 250, 9, 77, 1], 10
    with RiscvSession(stock, "1.23") as s:
        want, stock_cache = greedy(s, c, prompt, n, max_len=32)
        grown, _ = greedy(s, c, prompt, n)
    with RiscvSession(mine, "1.23", custom_ops=library) as s:
        got, cache = greedy(s, c, prompt, n, max_len=32)
        calls = parse_decoder_stats(s.stats())
    assert want == grown, (want, grown)
    assert got == want, (got, want)
    valid = len(prompt) + n - 1  # the last token was not fed
    for name, buffer in (*stock_cache.items(), *cache.items()):
        assert (buffer[:, :, valid:] == SENTINEL).all(), f"{name}: rows after {valid} touched"
    assert calls["GroupQueryAttention"] == (c.layers, c.layers * n)
