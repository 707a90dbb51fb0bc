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
from imegen.perf.baselines.llama_cpp import whole_gguf, whole_model, whole_nodes, whole_reference
from imegen.perf.model import x60
from imegen.perf.report import whole_model as report

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
    for arch in (whole_model.IME1_ARCH, whole_model.GENERIC_ARCH, "per-node"):
        per_node = arch == "per-node"
        calls = whole_model.run(exe, d / "tiny.gguf", PREFILL, DECODE, logits=d / f"{arch}.bin",
                                arch=whole_model.IME1_ARCH if per_node else arch, per_node=per_node)
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
    regions, calls, labels = whole_model.run_regions(tiny["exe"], tiny["gguf"], PREFILL, 2)
    assert len(regions) == 3 and [label.split()[0] for label in labels] == ["call"] * 3 and [c.tokens for c in calls] == [PREFILL, 1, 1]
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


def test_committed_results_are_accounted_node_by_node():
    """Each llama.cpp row has its per-node account, whose instructions are the whole call's (the observation's
    cost taken off), its ops' times adding up to its time; the whole-model report's llama.cpp rows are those."""
    res = json.loads(RESULTS.read_text())
    csv_rows = {(r.phase, r.context): r for r in report.read_csv((RESULTS.parent / report.CSV_NAME).read_text())
                if r.engine == report.LLAMA}
    for r in res["rows"]:
        p = r["per_node"]
        assert p["instructions"] == pytest.approx(r["instructions"], rel=1e-6)
        assert sum(o["ms"] for o in p["by_op"]) == pytest.approx(p["ms_modeled"], abs=1e-3)
        assert sum(o["dram_bytes"] for o in p["by_op"]) == pytest.approx(p["dram_bytes"], abs=len(p["by_op"]))
        assert p["dram_bytes"] > whole_gguf.matrix_bytes(whole_gguf.QWEN25_05B) and p["ms_modeled"] >= p["core_ms_modeled"]
        assert 0 < p["observation_per_node"]["layers 2"] < 20_000
        assert "max" in r["whole_call_modeled_x60_ms"]
        row = csv_rows[(r["phase"], r["context"])]
        assert row.ms_modeled == pytest.approx(p["ms_modeled"], abs=1e-3)
        assert row.dram_bytes == pytest.approx(p["dram_bytes"], rel=1e-5)


# ------------------------------------------------------------------------------------------ node by node
@NEEDS_TOOLS
def test_observing_every_node_computes_the_same(tiny):
    """With the graph-eval callback cutting every node into a graph of its own (RMS_NORM kept with its MUL, which
    ggml-cpu fuses), llama.cpp computes bit for bit what it computes unobserved, and the NumPy check holds."""
    calls, got = tiny["runs"]["per-node"]
    plain_calls, plain = tiny["runs"][whole_model.IME1_ARCH]
    assert np.array_equal(got.view(np.uint32), plain.view(np.uint32))
    assert [c.emulated for c in calls] == [c.emulated for c in plain_calls]
    like = whole_reference.forward(tiny["cfg"], tiny["w"], tiny["tokens"], llama_like=True)
    assert relative_rms(got, like).max() < 3e-2


@pytest.fixture(scope="module")
def node_counts(tiny):
    """The tiny model's prefill and two decode calls counted node by node and as one region each."""
    regions, calls, labels = whole_model.run_regions(tiny["exe"], tiny["gguf"], PREFILL, 2, per_node=True)
    whole, _, _ = whole_model.run_regions(tiny["exe"], tiny["gguf"], PREFILL, 2)
    per_call = [whole_nodes.call_regions(r, lab) for r, lab in
                zip(whole_model.call_groups(regions, labels), whole_model.call_groups(labels, labels))]
    return per_call, whole, calls


VECTOR = ("vload", "vstore", "valu", "vfpu", "vmadot", "vset")


@NEEDS_TOOLS
def test_node_regions_cover_the_whole_call(node_counts):
    """The per-node regions (nodes, the gaps between them, the call's head and tail) add up to the call counted as
    one region, plus what observing costs: a graph launch per node in ggml's own scalar code (the driver's callback
    is not counted), nothing in the vector units; the SpacemiT code's vector and vmadot counts are equal exactly.
    Taking the mean cost off each node leaves the whole-call count, counter by counter."""
    per_call, whole, calls = node_counts
    assert len(per_call) == len(whole) == 3
    for call, one in zip(per_call, whole):
        ops = [n.op for n, _ in call.nodes]
        assert len(ops) == 2 * 20 + 2 + 3 and ops.count("MUL_MAT") == 2 * 7 + 1 and ops.count("RMS_NORM+MUL") == 2 * 2 + 1
        assert ops.count("FLASH_ATTN_EXT") == 2 and ops.count("GET_ROWS") == 1 + 2  # embedding; the output rows
        total = call.total()
        for k in set(total) | set(one):
            if k.startswith("kernel.") and any(v in k for v in VECTOR):
                assert total.get(k, 0) == one.get(k, 0), k
        extra = x60.total_instructions(total) - x60.total_instructions(one)
        assert 1_000 * len(ops) < extra < 20_000 * len(ops)  # measured ~7,500 per node
        kernel_extra = x60.total_instructions(total, ("kernel",)) - x60.total_instructions(one, ("kernel",))
        assert 0 <= kernel_extra <= 60 * len(ops)  # the SpacemiT thread-affinity hook, once per graph launch
        taken, cost = whole_nodes.without_observation(call, one)
        assert x60.total_instructions(cost) == pytest.approx(extra / len(ops))
        back = taken.total()
        assert all(back.get(k, 0) == pytest.approx(one.get(k, 0), abs=1e-6) for k in set(back) | set(one))


def _expected_node_bytes(cfg: whole_gguf.QwenConfig, node: whole_nodes.Node, tokens: int, cells: int) -> int | None:
    """DRAM bytes of a node of the tiny model's call, from the configuration alone (None: not one checked here):
    Q4_0 matrices 18 bytes per 32, f32 activations, f16 KV rows, i32/i64 indices."""
    h, D, H, G = cfg.hidden, cfg.head_dim, cfg.heads, cfg.kv_heads
    q4 = lambda n, k: n * k // 32 * 18  # noqa: E731
    matrices = {"attn_q": (h, h), "attn_k": (G * D, h), "attn_v": (G * D, h), "attn_output": (h, h),
                "ffn_gate": (cfg.intermediate, h), "ffn_up": (cfg.intermediate, h), "ffn_down": (h, cfg.intermediate)}
    if node.op == "MUL_MAT":
        weight = next(t.name for t in node.srcs if t.name.endswith(".weight"))
        n, k = (cfg.vocab, h) if weight == "token_embd.weight" else matrices[weight.split(".")[2]]
        m = node.dst.ne[1]  # the last layer's FFN and the lm_head run on the output row only
        return q4(n, k) + 4 * m * (n + k)
    if node.op == "FLASH_ATTN_EXT":
        kv_cache = 256  # llama.cpp pads the KV cache (and so the mask's row) to 256 cells
        return 4 * tokens * H * D * 2 + 2 * 2 * cells * G * D + 2 * kv_cache * tokens
    if node.op == "SET_ROWS":
        return tokens * G * D * (4 + 2) + 8 * tokens
    if node.op == "GET_ROWS" and node.srcs[0].name == "token_embd.weight":
        return tokens * (h // 32 * 18 + 4 + 4 * h)
    if node.op == "RMS_NORM+MUL":
        m = node.dst.ne[1]
        return 4 * (2 * m * h + h)
    return None


@NEEDS_TOOLS
@pytest.mark.parametrize("index,tokens,cells", [(0, PREFILL, PREFILL), (2, 1, PREFILL + 2)])
def test_per_node_dram_bytes_against_the_configuration(node_counts, index, tokens, cells):
    """Prefill (9 tokens, 9 cells attended) and the third call (1 token, 11 cells): each checked node's DRAM bytes
    as whole_nodes.dram_bytes makes them from the driver's tensor lines, against bytes from the model's sizes."""
    cfg = whole_gguf.TINY
    checked = 0
    for node, _ in node_counts[0][index].nodes:
        want = _expected_node_bytes(cfg, node, tokens, cells)
        if want is not None:
            assert whole_nodes.dram_bytes(node) == want, node
            checked += 1
    assert checked == 2 * 7 + 1 + 2 + 2 * 2 + 1 + 2 * 2 + 1  # matmuls, attention, KV writes, embedding, norms
    weights = sum(t.element_bytes for n, _ in node_counts[0][index].nodes if n.op == "MUL_MAT" for t in n.srcs
                  if t.weight)
    assert weights == whole_gguf.matrix_bytes(cfg)


def _node(op: str, dst: tuple, *srcs: tuple, kv=None) -> whole_nodes.Node:
    def tensor(spec):
        name, type_, size, block, ne, flags = spec
        return whole_nodes.Tensor(name, type_, size, block, ne, 0, flags)
    return whole_nodes.Node(op, tensor(dst), tuple(tensor(s) for s in srcs), kv)


def test_node_line_parsing_and_threads():
    line = ("node FLASH_ATTN_EXT node_24:f32:4:1:32,4,9,1:4608:- Q_(view):f32:4:1:32,9,4,1:4608:v "
            "cache_k_l0_(view):f16:2:1:32,256,2,1:32768:v cache_v_l0:f16:2:1:32,256,2,1:32768:v "
            "attn_inp_kq_mask:f16:2:1:256,9,1,1:4608:- kv 9")
    n = whole_nodes.parse_node(line)
    assert n.op == "FLASH_ATTN_EXT" and n.kv == 9 and n.srcs[1].ne == (32, 256, 2, 1) and n.srcs[0].flags == "v"
    assert whole_nodes.dram_bytes(n) == 4608 + 2 * 32 * 9 * 2 * 2 + 4608 + 4608
    add = _node("ADD", ("x", "f32", 4, 1, (896, 1, 1, 1), "-"), ("a", "f32", 4, 1, (896, 1, 1, 1), "-"),
                ("b", "f32", 4, 1, (896, 1, 1, 1), "w"))
    assert whole_nodes.threads(add) == 1 and add.category == "ADD (bias)"
    rope = _node("ROPE", ("q", "f32", 4, 1, (64, 14, 1, 1), "-"), ("q", "f32", 4, 1, (64, 14, 1, 1), "v"))
    assert whole_nodes.threads(rope) == 4


def _call(*nodes) -> whole_nodes.CallRegions:
    return whole_nodes.CallRegions(tuple(nodes), {"callee.int": 100}, {"callee.int": 10})


def test_layer_extrapolation_is_exact_in_sum():
    """The 2-layer graph is the 1-layer one with a layer inserted after the embedding: that layer x (L - 1), every
    other node on the line through its 1- and 2-layer counts; summed, C1 + (L - 1)(C2 - C1)."""
    emb = _node("GET_ROWS", ("e", "f32", 4, 1, (8, 1, 1, 1), "-"), ("t", "q4_0", 18, 32, (32, 9, 1, 1), "w"))
    mm = _node("MUL_MAT", ("y", "f32", 4, 1, (8, 1, 1, 1), "-"), ("w", "q4_0", 18, 32, (32, 8, 1, 1), "w"))
    add = _node("ADD", ("z", "f32", 4, 1, (8, 1, 1, 1), "-"), ("y", "f32", 4, 1, (8, 1, 1, 1), "-"))
    one = _call((emb, {"kernel.int": 5}), (mm, {"kernel.int": 50}), (add, {"callee.int": 7}))
    two = _call((emb, {"kernel.int": 5}), (mm, {"kernel.int": 50}), (add, {"callee.int": 9}),
                (mm, {"kernel.int": 51}), (add, {"callee.int": 7}))
    two = whole_nodes.CallRegions(two.nodes, {"callee.int": 130}, {"callee.int": 10})
    assert whole_nodes.layer_block(one, two) == (1, 3)
    nodes, call = whole_nodes.extrapolate(one, two, 24)
    total = whole_nodes.add(call, *({k: v * n.multiplicity for k, v in n.counts.items()} for n in nodes))
    assert total == whole_model.extrapolate(one.total(), two.total(), 24)
    assert [n.multiplicity for n in nodes] == [1, 1, 1, 23, 23]
    with pytest.raises(ValueError):
        whole_nodes.layer_block(two, one)


def test_report_uses_the_per_node_rows():
    """A llama.cpp row with its per-node account is reported by it (time, DRAM, shares by op), not by the
    whole-call formula beside it."""
    by_op = [{"op": "MUL_MAT", "nodes": 169, "instructions": 90e6, "dram_bytes": 280e6, "ms": 53.0, "core_ms": 8.0},
             {"op": "ADD", "nodes": 72, "instructions": 3e6, "dram_bytes": 1e6, "ms": 1.0, "core_ms": 1.0},
             {"op": "llama.cpp call", "nodes": 1, "instructions": 2e6, "dram_bytes": 0, "ms": 1.0, "core_ms": 1.0}]
    row = {"phase": "decode", "context": 512, "instructions": 95e6, "split": {"spacemit": 80e6, "rest": 15e6},
           "whole_call_modeled_x60_ms": {"core": 40.0}, "counts": {"kernel.int": 95e6},
           "per_node": {"ms_modeled": 55.0, "core_ms_modeled": 10.0, "dram_bytes": 281e6, "instructions": 95e6,
                        "nodes": 241, "by_op": by_op}}
    r = report.llama_row(row)
    assert r.ms_modeled == 55.0 and r.core_ms == 10.0 and r.dram_bytes == 281e6
    assert r.time_shares == {"MUL_MAT": 53 / 55, "ADD": 1 / 55, "llama.cpp call": 1 / 55}
    assert r.non_matmul_share == pytest.approx(2 / 55)
    whole = report.whole_call_row(row)
    assert whole.ms_modeled != r.ms_modeled and whole.core_ms == pytest.approx(10.0)
    text = report.report_text([r], llama_json=[row])
    assert "llama.cpp by op, decode 512" in text and "llama.cpp call" in text
