"""The per-node whole-model account (imegen/perf/baselines/onnxruntime/per_node.py, report/whole_model.py).

Enumeration: every node of a genai-form model is in exactly one unit, a unit is what ORT's own optimizer runs as one
node (checked against the x86 onnxruntime wheel's optimized graph: the fusions are the same rules as Debian's 1.23),
and a 2-layer enumeration scaled to N layers equals the N-layer model's own. Counting (QEMU): each decoder operator's
single-node model runs in stock riscv64 ORT and in ORT + imegen's library and agrees; the Run overhead subtracted is
positive and below every node's count. The time model and the CSV are checked on hand-computed cases.
"""

import json
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import pytest

from genai_layout import GenaiConfig, genai_model
from imegen import toolchain
from imegen.perf.baselines.onnxruntime import per_node as pn
from imegen.perf.model import x60
from imegen.perf.report import whole_model as wm

ROOT = Path(__file__).resolve().parents[1]
needs_qemu = pytest.mark.skipif(bool(toolchain.missing_tools()), reason="needs the cross toolchains and qemu-riscv64")


@pytest.fixture(scope="module")
def tiny():
    return genai_model(layers=2)


@pytest.fixture(scope="module")
def tiny_engines(tiny):
    return pn.engine_models(tiny, pn.imegen_specs(tiny))


# ------------------------------------------------------------------------------------------ enumeration
@pytest.mark.parametrize("engine", pn.ENGINES)
def test_every_node_in_exactly_one_unit(tiny, tiny_engines, engine):
    units = pn.partition(tiny, tiny_engines[engine])
    members = Counter(name for u in units for name in u.nodes)
    assert sorted(members) == sorted(n.name for n in tiny.graph.node)
    assert set(members.values()) == {1}
    folded = {n for u in units if u.folded for n in u.nodes}
    assert {n.name for n in tiny.graph.node if n.op_type in ("Constant", "Reshape")} == folded


def _by_category(nodes) -> dict[str, float]:
    out: Counter = Counter()
    for d in nodes:
        out[d.category] += d.multiplicity
    return dict(out)


@pytest.mark.parametrize("engine", pn.ENGINES)
def test_multiplicities_at_24_layers(tiny, tiny_engines, engine):
    got = _by_category(pn.distinct_nodes(tiny, tiny_engines, engine, pn.Phase("decode", 16)))
    want = {"attention mask": 6, "GatherBlockQuantized": 1, "SimplifiedLayerNormalization": 1,
            "MatMulNBits": 5 * 24 + 1, "GroupQueryAttention": 24, "SkipSimplifiedLayerNormalization": 2 * 24,
            "SiLU gate": 24}
    if engine != pn.STOCK:
        want["Add"] = 24  # the qkv bias: ORT fuses it into a com.microsoft MatMulNBits only
    if engine == pn.DECODER:
        del want["SiLU gate"]  # in the up projection's MatMulNBits (its gate input)
    assert got == want


def test_the_decoder_engine_runs_the_silu_gate_inside_the_up_projection(tiny, tiny_engines):
    """Its unit is the up MatMulNBits with Sigmoid, Mul, Mul (stock runs the four; imegen one node), and its DRAM
    bytes are the kernel's own traffic plus the gate's M x N floats read once."""
    phase = pn.Phase("prefill", 16)
    units = [u for u in pn.partition(tiny, tiny_engines[pn.DECODER]) if len(u.nodes) == 4]
    assert len(units) == 2 and all(u.category == "MatMulNBits" for u in units)
    gated = [d for d in pn.distinct_nodes(tiny, tiny_engines, pn.DECODER, phase) if len(d.unit.nodes) == 4]
    assert len(gated) == 1 and gated[0].multiplicity == 24 and gated[0].moved
    (node,) = gated[0].mine.model.graph.node
    assert [n.op_type for n in gated[0].stock.model.graph.node] == ["MatMulNBits", "Sigmoid", "Mul", "Mul"]
    assert node.domain == pn.IMEGEN and node.input[pn.GATE_INPUT]
    plain = onnx.helper.make_node("MatMulNBits", list(node.input[:pn.GATE_INPUT]), list(node.output),
                                  domain=pn.IMEGEN, **{a.name: onnx.helper.get_attribute_value(a) for a in node.attribute})
    n = onnx.helper.get_attribute_value(next(a for a in node.attribute if a.name == "N"))
    specs = pn.imegen_specs(tiny)
    assert pn.imegen_matmul_bytes(node, 16, specs) == pn.imegen_matmul_bytes(plain, 16, specs) + 16 * n * 4


@pytest.mark.parametrize("engine", pn.ENGINES)
@pytest.mark.parametrize("phase", [pn.Phase("decode", 16), pn.Phase("prefill", 16)])
def test_two_layers_scaled_equal_a_deeper_model(tiny, tiny_engines, engine, phase):
    """Distinct nodes and multiplicities of the 2-layer model scaled to 4 layers are the 4-layer model's own."""
    deep = genai_model(layers=4)
    deep_engines = pn.engine_models(deep, pn.imegen_specs(deep))

    def table(model, engines):
        return sorted((d.signature, d.category, d.multiplicity, d.rows)
                      for d in pn.distinct_nodes(model, engines, engine, phase, target_layers=4))

    assert table(tiny, tiny_engines) == table(deep, deep_engines)


def test_prefill_lm_head_is_one_row(tiny, tiny_engines):
    nodes = pn.distinct_nodes(tiny, tiny_engines, pn.STOCK, pn.Phase("prefill", 16))
    head = [d for d in nodes if "logits" in d.stock.wanted]
    assert len(head) == 1 and head[0].rows == 1
    assert [v.shape for v in head[0].stock.feeds.values()] == [(1, 1, 128)]
    assert all(d.rows == 16 for d in nodes if d.category in ("GroupQueryAttention", "SiLU gate"))


def test_units_are_what_ort_runs(tmp_path, tiny):
    """The stock partition against onnxruntime's own optimizer (the x86 wheel, ORT_ENABLE_ALL as the runner):
    the nodes it keeps under their names are exactly one per unit (a bias pair's MatMulNBits, a SiLU gate's last
    Mul), the ones it removes are folded or fused into a unit."""
    ort = pytest.importorskip("onnxruntime")
    onnx.save(tiny, str(tmp_path / "m.onnx"))
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    so.optimized_model_filepath = str(tmp_path / "opt.onnx")
    ort.InferenceSession(str(tmp_path / "m.onnx"), so, providers=["CPUExecutionProvider"])
    kept = {n.name for n in onnx.load(str(tmp_path / "opt.onnx")).graph.node} & {n.name for n in tiny.graph.node}
    units = pn.partition(tiny, tiny)
    by_name = {n.name: n for n in tiny.graph.node}

    def survivor(u):
        ops = [by_name[n].op_type for n in u.nodes]
        return u.nodes[ops.index("MatMulNBits")] if "MatMulNBits" in ops else u.nodes[-1]

    assert kept == {survivor(u) for u in units if not u.folded}
    assert any(len(u.nodes) == 2 for u in units) and any(len(u.nodes) == 3 for u in units)


# ------------------------------------------------------------------------------------------ counting (QEMU)
@pytest.fixture(scope="module")
def tiny_setup():
    with pn.setup(GenaiConfig(layers=2)) as s:
        yield s


DECODER_OPS = {"SimplifiedLayerNormalization", "SkipSimplifiedLayerNormalization", "GroupQueryAttention"}


@needs_qemu
@pytest.mark.parametrize("phase", [pn.Phase("decode", 16), pn.Phase("prefill", 16)])
def test_decoder_nodes_agree_with_stock_and_exceed_the_overhead(tiny_setup, phase):
    s = tiny_setup
    nodes = [d for d in pn.distinct_nodes(s.model, s.engines, pn.DECODER, phase)
             if {n.op_type for n in d.mine.model.graph.node} & DECODER_OPS]
    assert {n.op_type for d in nodes for n in d.mine.model.graph.node} == DECODER_OPS
    if phase.kind == "prefill":  # prefill: attention only (the norms and SiLU take rows alike at decode)
        nodes = [d for d in nodes if d.category == "GroupQueryAttention"]
    overhead = pn.count_overhead(s.libraries[pn.DECODER])
    # run_counts excludes the IME emulator by the object beside the library: the built one, not ort-accelerate's copy
    assert all((lib.parent / "ime_emu.o").exists() for lib in s.libraries.values())
    assert 1000 < overhead.instructions < 100_000
    for d in nodes:
        assert d.moved and all(n.domain == pn.IMEGEN for n in d.mine.model.graph.node)
        library = s.library_for(pn.DECODER, d)
        mine, stock = pn.count_distinct(d, library)
        assert stock is not None
        assert pn.agreement(stock.outputs, mine.outputs, matmul=False) <= 1.0
        for counted in (mine, stock):
            assert overhead.instructions < counted.instructions, d.category
            work = pn.own_work(counted.counts, overhead.counts)
            assert 0 < x60.total_instructions(work) < counted.instructions
        # the check can fail: a 1e-4 relative error in one output element is over the tolerance
        name = next(iter(stock.outputs))
        bad = {k: v.copy() for k, v in mine.outputs.items()}
        flat = bad[name].reshape(-1)
        flat[0] += 1e-4 * (1 + float(np.abs(stock.outputs[name]).max()))
        assert pn.agreement(stock.outputs, bad, matmul=False) > 1.0


@needs_qemu
def test_the_gated_up_projection_agrees_with_stock_and_is_counted(tiny_setup):
    """The fused unit (imegen's up MatMulNBits with its gate) against stock's MatMulNBits, Sigmoid, Mul, Mul on the
    same feeds, within ORT's level-4 tolerance (count_distinct raises otherwise), at prefill: the gemm's epilogue."""
    s = tiny_setup
    (d,) = [d for d in pn.distinct_nodes(s.model, s.engines, pn.DECODER, pn.Phase("prefill", 16)) if len(d.unit.nodes) == 4]
    mine, stock = pn.count_distinct(d, s.library_for(pn.DECODER, d))
    assert stock is not None and 0 < mine.check["worst"] <= 1.0
    assert x60.total_instructions(mine.counts) < x60.total_instructions(stock.counts)


def test_agreement_uses_level4_tolerance_for_matmul():
    want = {"Y": np.array([1.0, -2.0], np.float32)}
    assert pn.agreement(want, {"Y": np.array([1.1, -2.0], np.float32)}, matmul=True) <= 1.0  # 0.1 + 0.02
    assert pn.agreement(want, {"Y": np.array([1.2, -2.0], np.float32)}, matmul=True) > 1.0
    assert pn.agreement(want, {"Y": np.array([1.0, -2.0, 0.0], np.float32)}, matmul=True) == float("inf")


def test_own_work_subtracts_class_by_class():
    assert pn.own_work({"kernel.int": 100, "callee.mem": 5}, {"kernel.int": 30, "callee.mem": 9}) == \
        {"kernel.int": 70, "callee.mem": 0}


# ------------------------------------------------------------------------------------------ time model and CSV
def hand_account(engine: str = pn.STOCK, phase: pn.Phase = pn.Phase("decode", 128)) -> pn.Account:
    """A MatMulNBits node of 8e6 integer instructions on 4 cores (1e6 issue cycles = 0.5 ms at 2 GHz; its 1 MB
    of DRAM is 0.19 ms) and 3 x a norm of 2e5 on 1 core (0.05 ms) moving 5.24 MB (1 ms: DRAM-bound)."""
    return pn.Account(engine, phase, (
        pn.NodeFigure("MatMulNBits", "a", 1.0, {"kernel.int": 8e6}, 4, 1e6),
        pn.NodeFigure("SkipSimplifiedLayerNormalization", "b", 3.0, {"kernel.int": 2e5}, 1, 5.24e6)))


def test_time_model_sums_nodes():
    a = hand_account()
    assert x60.X60.dram_effective == pytest.approx(5.24e9)
    assert a.nodes[0].seconds == pytest.approx(0.5e-3) and a.nodes[0].bound != "dram"
    assert a.nodes[1].seconds == pytest.approx(1e-3) and a.nodes[1].bound == "dram"
    assert a.seconds == pytest.approx(3.5e-3)
    assert a.instructions == pytest.approx(8.6e6)
    assert a.non_matmul_share == pytest.approx(3 / 3.5)
    assert a.time_shares() == pytest.approx({"SkipSimplifiedLayerNormalization": 3 / 3.5, "MatMulNBits": 0.5 / 3.5})


def test_threads_follow_the_parallel_tasks(tiny, tiny_engines):
    phase = pn.Phase("decode", 16)
    for engine in pn.ENGINES:
        for d in pn.distinct_nodes(tiny, tiny_engines, engine, phase):
            t = pn.threads_for(d.mine.model, d.rows)
            # the tiny model's 4 heads over 2 KV heads: ORT splits heads (4); imegen's tiles of R >= 2 rows of one
            # KV head's group of 2 at decode: one tile per KV head (2)
            attention = 2 if engine == pn.DECODER else 4
            assert t == {"MatMulNBits": 4, "GroupQueryAttention": attention}.get(d.category, 1), (engine, d.category)
    prefill = pn.distinct_nodes(tiny, tiny_engines, pn.STOCK, pn.Phase("prefill", 3))
    assert {d.category: pn.threads_for(d.mine.model, d.rows) for d in prefill}["SiLU gate"] == 3


def _attention(tiny, tiny_engines, engine, phase):
    return next(d for d in pn.distinct_nodes(tiny, tiny_engines, engine, phase) if d.category == "GroupQueryAttention")


@pytest.mark.parametrize("engine", pn.ENGINES)
@pytest.mark.parametrize("phase", [pn.Phase("decode", 16), pn.Phase("prefill", 16)])
def test_attention_writes_present_into_its_past_buffer(tiny, tiny_engines, engine, phase):
    """As genai runs GQA (past_present_share_buffer): each present written into its past input's buffer of
    past + new positions, whose rows for the new tokens are NaN until written."""
    for um in (lambda d: d.stock, lambda d: d.mine):
        u = um(_attention(tiny, tiny_engines, engine, phase))
        layer = u.share[0][0].split(".")[1]
        assert u.share == tuple((f"present.{layer}.{k}", f"past_key_values.{layer}.{k}") for k in ("key", "value"))
        for _, past in u.share:
            buffer = u.feeds[past]
            assert buffer.shape == (1, 2, phase.past + phase.new, 32)
            assert np.isfinite(buffer[:, :, :phase.past]).all() and np.isnan(buffer[:, :, phase.past:]).all()


def test_dram_bytes_of_attention_without_a_copy_of_the_past(tiny, tiny_engines):
    """GQA at decode 16 in genai's shared buffer: qkv in, the 16 past K and V rows read, output, the new token's
    K and V row written (a copy of the past into a present, 17 rows written, is not charged), the rotary rows."""
    d = _attention(tiny, tiny_engines, pn.STOCK, pn.Phase("decode", 16))
    hd, kv, heads = 32, 2, 4
    outputs = {d.stock.wanted[0]: np.zeros((1, 1, heads * hd), np.float32)}
    outputs.update({present: np.zeros((1, kv, 17, hd), np.float32) for present, _ in d.stock.share})
    assert set(outputs) == set(d.stock.wanted)
    want = 4 * ((heads + 2 * kv) * hd + 2 * kv * 16 * hd + 2 + heads * hd + 2 * kv * 1 * hd + 2 * 17 * hd // 2)
    assert pn.dram_bytes(d.stock, outputs, d.rows, 17, []) == want


@needs_qemu
def test_attention_is_counted_without_a_copy_of_the_past(tiny_setup):
    """Stock GQA at decode 64 counted as the account counts it (present pre-allocated in past) against the same
    model and feeds run with a fresh present (ORT zero-fills it and copies the past in): fewer instructions, by
    at least one per 16 bytes of that copy, and the same attention output."""
    from imegen.perf.baselines.onnxruntime import run_counts

    s = tiny_setup
    d = _attention(s.model, s.engines, pn.STOCK, pn.Phase("decode", 64))
    shared = pn.count_unit(d.stock)
    fresh = run_counts.cached_count_runs(("test-per-node-fresh-present", d.stock.digest),
                                         lambda tmp: d.stock.make(tmp, pn.finite_check), threads=1, runs=1)
    out = d.stock.wanted[0]  # the attention output (the presents: the same rows, in buffers of other history)
    np.testing.assert_allclose(shared.outputs[out], fresh.outputs[out], rtol=1e-6, atol=1e-6)
    copy_bytes = 2 * 2 * 64 * 32 * 4 + 2 * 2 * 65 * 32 * 4  # the past copied, the present zero-filled first
    saved = x60.total_instructions(pn.mean_counts(fresh.runs)) - shared.instructions
    assert saved > copy_bytes / 16, saved


def test_csv_has_every_engine_phase_and_context():
    rows = [wm.row_of(hand_account(e, p)) for p in pn.PHASES for e in pn.ENGINES]
    text = wm.write_csv(rows)
    head = text.splitlines()[0].split(",")
    for column in ("engine", "phase", "context", "instructions", "ms_modeled", "non_matmul_share", "op_time_shares"):
        assert column in head
    back = wm.read_csv(text)
    assert {(r.engine, r.phase, r.context) for r in back} == {(e, p.kind, p.context) for e in pn.ENGINES
                                                              for p in pn.PHASES}
    assert all(r.ms_modeled == pytest.approx(3.5, abs=1e-4) for r in back)
    assert back[0].time_shares == pytest.approx({"SkipSimplifiedLayerNormalization": 0.8571,
                                                 "MatMulNBits": 0.1429}, abs=1e-4)
    assert "Headline" in wm.report_text(back)


def test_headline_ratios():
    def row(engine, ms, phase="decode", context=512):
        return wm.Row(engine, phase, context, 1e9, ms, 0.25 if engine != wm.LLAMA else None, 1e8, core_ms=ms / 2)

    text = wm.headline([row(pn.STOCK, 1000.0), row(pn.MATMUL, 60.0), row(pn.DECODER, 50.0), row(wm.LLAMA, 80.0)])
    assert "decode 512: ort-imegen-decoder 50.00 ms, 20.0x faster than stock-ort, 1.20x vs ort-imegen-matmul, " \
           "0.62x llama.cpp's time (0.62x its core-side time" in text
    assert "at decode 512: stock-ort 25.0%, ort-imegen-matmul 25.0%, ort-imegen-decoder 25.0%" in text


def test_results_text_is_the_written_report(tmp_path):
    assert wm.text_from_results(tmp_path) == ""
    accounts = [hand_account(e, p) for p in pn.PHASES for e in pn.ENGINES]
    wm.write_outputs([wm.row_of(a) for a in accounts], tmp_path, accounts=accounts)
    text = wm.text_from_results(tmp_path)
    assert text.startswith("WHOLE MODEL") and "By node, decode 512" in text and "By node, prefill 512" in text
    assert wm.read_csv((tmp_path / wm.CSV_NAME).read_text())[0].engine == pn.STOCK


def test_committed_results_are_complete():
    path = ROOT / "bench" / "results" / wm.CSV_NAME
    rows = wm.read_csv(path.read_text())
    keys = {(r.engine, r.phase, r.context) for r in rows}
    assert {(e, p.kind, p.context) for e in pn.ENGINES for p in pn.PHASES} <= keys
    for r in rows:
        assert r.ms_modeled > 0 and r.instructions > 0
        if r.engine in pn.ENGINES:
            assert 0 <= r.non_matmul_share <= 1 and r.check <= 1
            assert sum(r.time_shares.values()) == pytest.approx(1, abs=1e-3)


def test_llama_rows_modeled_like_the_engines(tmp_path):
    path = tmp_path / wm.LLAMA_JSON
    assert wm.llama_rows(path) == []
    path.write_text(json.dumps({"rows": [{"phase": "decode", "context": 512, "instructions": 4e9,
                                          "modeled_core_ms_x60": 800.0, "split": {"spacemit": 3e9, "rest": 1e9}}]}))
    (r,) = wm.llama_rows(path)
    weights = 24 * 896 * (1152 + 896 + 2 * 4864 + 4864) + 896 * 151936  # per layer qkv, o, gate, up, down; lm_head
    kv = 24 * 2 * 2 * 64 * 2 * (512 + 2)
    assert r.dram_bytes == weights * 18 / 32 + kv
    assert r.ms_modeled == pytest.approx(max(800.0 / 4, r.dram_bytes / 5.24e9 * 1e3))
    assert r.instruction_shares == {"SpacemiT code": 0.75, "rest": 0.25}
