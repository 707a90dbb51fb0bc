"""`imegen ort-model-check` on LLM graphs: onnxruntime-genai's decoder layout in Debian's riscv64 ORT 1.23
under QEMU, stock vs ORT + imegen's IME kernels.

The models are genai_layout's builds (structure checked node for node against real onnxruntime-genai
exports in tests/data/genai/, and those exports themselves when present). A decoder check runs a
prefill step (M = seq rows: the gemm kernel) and a decode step (M = 1: the gemv kernel) fed back the
prefill's KV cache; greedy decoding must give the same tokens on both sides; a model none of whose
MatMulNBits nodes the spec serves must fail (exit 1), not pass with nothing checked.

At level 4 the host's onnxruntime (x86_64, whose level 4 computes in int8 as imegen does) runs the same
steps as the peer: an output beyond ORT's per-operator tolerance passes when it is no further from stock
than the peer's own, and an imegen output made wrong on purpose must still fail.
"""

import re
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper

import genai_layout as gl
import imegen
from imegen import reference as ref
from imegen.cli import main
from imegen.ort import model_check as mc

GENAI = Path(__file__).parent / "data" / "genai"
REAL = sorted(p.parent.name for p in GENAI.glob("*/model.onnx"))
# The kernels a genai `-p int4 -e cpu` export asks for: 4-bit, block 32, symmetric, accuracy_level 4 (int8).
SPEC = """
defaults { bits = 4 block = 32 zero_point = symmetric bias = no compute = int8 target = ime }
kernel q4_gemm { op = gemm tile = 4x16 k_unroll = 2 unpack = planar panel = 16 }
kernel q4_gemv { op = gemv tile = 1x16 k_unroll = 4 unpack = interleaved panel = 32 }
"""
NODES = 11  # 2 layers x (qkv, o, gate, up, down) + lm_head


@pytest.fixture(scope="module")
def spec(tmp_path_factory):
    path = tmp_path_factory.mktemp("spec") / "genai_q4.imegen"
    path.write_text(SPEC)
    return str(path)


def check_cli(capsys, *args) -> tuple[int, str]:
    try:
        code = main(["ort-model-check", *map(str, args)])
    except SystemExit as e:  # argparse refusing an argument
        code = e.code
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def calls(out: str) -> dict[str, int]:
    line = next(l for l in out.splitlines() if l.startswith("imegen kernel calls:"))
    return {k: int(v) for k, v in re.findall(r"(\w+) (\d+)", line.split(":", 1)[1].split(";")[0])}


def real(name: str) -> Path:
    if name not in REAL:
        pytest.skip(f"no real onnxruntime-genai export {name} in {GENAI}")
    return GENAI / name / "model.onnx"


# ------------------------------------------------------------------------------------------ the builder
@pytest.mark.parametrize("name", REAL or ["(none)"])
def test_builder_writes_the_real_genai_layout(name):
    """Built from the config read off a real export, the builder's graph is wired identically: the same
    inputs, outputs, initializer names/types/shapes, and nodes (names, ops, domains, inputs, outputs,
    attributes)."""
    exported = onnx.load(str(real(name)), load_external_data=False)
    config = gl.config_of(exported)
    assert gl.layout(gl.genai_model(config)) == gl.layout(exported)


def test_default_build_is_the_int4_b32_export_at_its_size():
    exported = onnx.load(str(real("qwen2_tiny_int4_b32")), load_external_data=False)
    assert gl.config_of(exported) == gl.GenaiConfig()


def _embedding_rows(model, ids):
    """The embedding node's output for `ids`, run in the host's onnxruntime (its GatherBlockQuantized)."""
    import onnxruntime as ort

    out = next(n.input[0] for n in model.graph.node if n.name == "/model/layers.0/input_layernorm/LayerNorm")
    model.graph.output.append(helper.make_tensor_value_info(out, onnx.TensorProto.FLOAT, None))
    so = ort.SessionOptions()
    so.log_severity_level = 3
    s = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    dec = mc.find_decoder(model)
    feeds = mc.prefill_feeds(model, dec, len(ids), 0, 0, {})
    feeds["input_ids"] = np.array([ids], np.int64)
    return s.run([out], feeds)[0][0]


@pytest.mark.parametrize("symmetric", [True, False])
def test_tied_embedding_reads_the_lm_head_weights(symmetric):
    """GatherBlockQuantized over the lm_head's packed B, scales (and zero points) gives the rows the lm_head
    multiplies by: NumPy's dequantization of the same initializers."""
    # hidden 96 at block 64: rows padded to 2 blocks, then sliced (3 heads of 32: GQA wants multiples of 16)
    model = gl.genai_model(symmetric=symmetric, hidden=96, heads=3, kv_heads=1, block=64)
    inits = {t.name: onnx.numpy_helper.to_array(t) for t in model.graph.initializer}
    zp = inits.get("lm_head.MatMul.weight_zero_points")
    assert (zp is None) == symmetric
    qw = ref.QuantizedWeights(inits["lm_head.MatMul.weight_Q4"], inits["lm_head.MatMul.weight_scales"], zp,
                              K=96, N=512, bits=4, block_size=64)
    ids = [0, 7, 511, 300]
    np.testing.assert_array_equal(_embedding_rows(model, ids), ref.dequantize(qw).T[ids])


def test_small_models_are_what_their_docstrings_say():
    def attrs(model):
        return [{a.name: helper.get_attribute_value(a) for a in n.attribute} for n in model.graph.node]

    q = gl.ort_quantizer_model()
    assert [n.op_type for n in q.graph.node] == ["MatMulNBits"] * 2
    assert all(a["block_size"] == 128 and a["bits"] == 4 and "accuracy_level" not in a for a in attrs(q))
    assert all(len(n.input) == 4 for n in q.graph.node)  # asymmetric: zero points
    assert all(a["bits"] == 8 for a in attrs(gl.eight_bit_model()))
    f16 = gl.float16_model()
    assert f16.graph.input[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT16
    assert all(t.data_type == onnx.TensorProto.FLOAT16 for t in f16.graph.initializer if t.name.endswith("scales"))


# ------------------------------------------------------------------------------------------ reading a decoder
@pytest.mark.parametrize("model", ["builder", "qwen2_tiny_int4_b32", "qwen2_tiny_int4_b32_untied"])
def test_decoder_feeds(model):
    """The KV cache is sized from the model (genai leaves the head size symbolic: kv_cache_dim; it comes
    from the packed q/k/v projection's N over num_heads + 2 kv_num_heads), the vocabulary from the logits,
    the attention mask is all ones over past + seq, and a decode step feeds back the present outputs."""
    m = gl.genai_model() if model == "builder" else onnx.load(str(real(model)), load_external_data=False)
    dec = mc.find_decoder(m)
    assert dec.vocab == 512
    assert dict(dec.past) == {f"past_key_values.{i}.{kv}": (1, 2, "P", 32) for i in range(2) for kv in ("key", "value")}
    feeds = mc.prefill_feeds(m, dec, 5, 7, 0, {})
    assert feeds["input_ids"].shape == (1, 5) and feeds["input_ids"].max() < 512
    assert feeds["attention_mask"].tolist() == [[1] * 12]
    assert feeds["past_key_values.1.value"].shape == (1, 2, 7, 32)
    present = {f"present.{i}.{kv}": np.full((1, 2, 12, 32), i, np.float32) for i in range(2) for kv in ("key", "value")}
    nxt = mc.decode_feeds(dec, feeds, present, 42)
    assert nxt["input_ids"].tolist() == [[42]] and nxt["attention_mask"].shape == (1, 13)
    assert nxt["past_key_values.1.key"] is present["present.1.key"]


def test_position_ids_follow_the_cache():
    m = gl.genai_model()
    m.graph.input.append(helper.make_tensor_value_info("position_ids", onnx.TensorProto.INT64,
                                                       ["batch_size", "sequence_length"]))
    dec = mc.find_decoder(m)
    feeds = mc.prefill_feeds(m, dec, 3, 4, 0, {})
    assert feeds["position_ids"].tolist() == [[4, 5, 6]]
    present = {name: None for _, name in dec.present}
    assert mc.decode_feeds(dec, feeds, present, 1)["position_ids"].tolist() == [[7]]


# ------------------------------------------------------------------------------------------ under QEMU
def test_genai_layout_prefill_and_decode(tmp_path, spec, capsys):
    model = gl.save_genai_model(tmp_path / "model.onnx")
    code, out = check_cli(capsys, spec, model, "--seq", 5, "--past", 7)
    assert code == 0, out
    assert f"MatMulNBits nodes: {NODES} of {NODES} rewritten" in out
    assert "prefill: 5 tokens at past 7" in out and "decode 1: 1 token at past 12" in out
    assert "compared 10 outputs in 2 steps" in out and out.rstrip().endswith("PASS")
    ran = calls(out)
    assert (ran["q4_gemm"], ran["q4_gemv"]) == (NODES, NODES)  # every node: once at M = 5, once at M = 1


def _host_run(model: Path, feeds: dict, level: int) -> np.ndarray:
    """The model's logits in the host's onnxruntime, its MatMulNBits at accuracy `level`."""
    import onnxruntime as ort

    m = onnx.load(str(model))
    for node in m.graph.node:
        for a in node.attribute:
            if a.name == "accuracy_level":
                a.i = level
    so = ort.SessionOptions()
    so.log_severity_level = 3
    return ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(["logits"], feeds)[0]


def test_the_peer_is_the_hosts_int8_level_4(tmp_path, spec):
    """The three numbers per output are imegen vs stock, the peer vs stock and their ratio, where the peer is
    the host onnxruntime's level 4 on the same feeds: its prefill logits, recomputed here, give the reported
    max |diff| exactly; it is int8 (its fp32 level 0 is 1000x closer to stock); imegen, int8 too, deviates
    like it."""
    from imegen.ort.riscv import RiscvSession

    model = gl.save_genai_model(tmp_path / "model.onnx")
    check = mc.model_check(imegen.load_spec(SPEC), model, spec_file=spec, seq=5, past=7)
    assert check.ok, check.report()
    assert check.peer.startswith("onnxruntime ") and not check.peer_note
    logits = next(o for o in check.steps[0].outputs if o.name == "logits")
    m = onnx.load(str(model))
    feeds = mc.prefill_feeds(m, mc.find_decoder(m), 5, 7, 0, {})
    with RiscvSession(model) as stock_session:
        stock = stock_session.run(feeds)["logits"].astype(np.float64)
    int8, fp32 = (np.abs(_host_run(model, feeds, level) - stock).max() for level in (4, 0))
    assert logits.peer.max_abs == pytest.approx(int8, rel=1e-6)
    assert int8 > 1000 * fp32 and int8 > 0.01
    assert logits.ratios[0] == pytest.approx(logits.max_abs / int8, rel=1e-6)
    assert 0.5 < logits.ratios[0] < 1.5 and 0.5 < logits.ratios[1] < 1.5
    line = next(l for l in check.report().splitlines() if l.lstrip().startswith("logits"))
    assert f"{logits.max_abs:.3g} ({logits.worst:.3f})" in line and f"{int8:.3g} ({logits.peer.worst:.3f})" in line
    assert f"{logits.ratios[0]:.2f}" in line and line.endswith("PASS")
    assert "ORT's own level-4 deviation" in check.report()


def large_logits_model(monkeypatch, path: Path) -> Path:
    """The builder's model with every weight scale near 1 (logits up to ~100): int8 rounding then takes the
    peer's own logits to ~4x ORT's per-operator tolerance from fp32 stock."""
    with monkeypatch.context() as m:
        m.setattr(gl, "EMBED_STD", 1.0)
        m.setattr(gl, "PROJ_GAIN", 1.0)
        return gl.save_genai_model(path)


@pytest.fixture
def large_logits(monkeypatch, tmp_path):
    return large_logits_model(monkeypatch, tmp_path / "large.onnx")


def test_beyond_tolerance_as_the_peer_passes(spec, capsys, large_logits):
    code, out = check_cli(capsys, spec, large_logits)
    assert code == 0, out
    line = next(l for l in out.splitlines() if l.lstrip().startswith("logits"))
    worst, theirs = map(float, re.findall(r"\((\d+\.\d+)\)", line))
    assert worst > 2 and theirs > 2  # both sides well beyond the per-operator tolerance
    assert line.endswith("PASS (beyond tolerance, as the peer's level 4)")


def test_without_the_host_onnxruntime_the_tolerance_alone_decides(spec, capsys, large_logits, monkeypatch):
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # `import onnxruntime` raises ImportError
    code, out = check_cli(capsys, spec, large_logits)
    assert code == 1, out
    assert "no peer: the host's onnxruntime is not importable" in out and "judged by the tolerance alone" in out
    assert "peer vs stock" not in out and out.rstrip().endswith("FAIL")


def _spoil_imegen(monkeypatch, change):
    """Make the imegen side's logits wrong after every run: `change` edits them in place."""
    run = mc._Sides.run

    def spoiled(self, *feeds):
        stock, mine, theirs = run(self, *feeds)
        change(mine["logits"])
        return stock, mine, theirs

    monkeypatch.setattr(mc._Sides, "run", spoiled)


@pytest.mark.parametrize("model, error", [("default", 0.5), ("large logits", 2.0)])
def test_one_wrong_element_fails(spec, capsys, monkeypatch, tmp_path, model, error):
    """One logit off by `error`: beyond the tolerance, and several times the peer's largest deviation (the
    default model's ~0.04, the large one's ~0.5, where the tolerance lets more through)."""
    path = tmp_path / "model.onnx"
    large_logits_model(monkeypatch, path) if model == "large logits" else gl.save_genai_model(path)
    _spoil_imegen(monkeypatch, lambda y: y.reshape(-1).__setitem__(3, y.reshape(-1)[3] + error))
    code, out = check_cli(capsys, spec, path)
    assert code == 1, out
    line = next(l for l in out.splitlines() if l.lstrip().startswith("logits"))
    assert line.endswith("FAIL (beyond tolerance and further from stock than the peer)")
    assert float(line.split()[5]) > mc.PEER_MAX_FACTOR  # imegen/peer max |diff|


def test_a_small_error_everywhere_fails(spec, capsys, monkeypatch, large_logits):
    """Every logit off by 0.4, below the peer's largest deviation: the max |diff| stays within the factor, the
    RMS diff does not."""
    _spoil_imegen(monkeypatch, lambda y: y.__iadd__(np.float32(0.4)))
    code, out = check_cli(capsys, spec, large_logits)
    assert code == 1, out
    line = next(l for l in out.splitlines() if l.lstrip().startswith("logits"))
    ratio_max, ratio_rms = map(float, line.split()[5:7])
    assert ratio_max <= mc.PEER_MAX_FACTOR < ratio_rms
    assert "FAIL (beyond tolerance and further from stock than the peer)" in line


@pytest.mark.parametrize("name", ["qwen2_tiny_int4_b32", "qwen2_tiny_int4_b32_untied"])
def test_real_genai_export_prefill_and_decode(spec, capsys, name):
    code, out = check_cli(capsys, spec, real(name))
    assert code == 0, out
    assert f"{NODES} of {NODES} rewritten" in out and "compared 10 outputs in 2 steps" in out
    assert calls(out)["q4_gemm"] == NODES and calls(out)["q4_gemv"] == NODES


def test_greedy_decoding_gives_identical_tokens(tmp_path, spec, capsys):
    """Untied, the builder's model counts up (token t -> t + 1), each step with a clear winner: stock ORT
    must count (the test's own premise), and ORT + imegen must give the same tokens."""
    model = gl.save_genai_model(tmp_path / "model.onnx", tied=False)
    check = mc.model_check(imegen.load_spec(SPEC), model, spec_file=spec, generate=8)
    stock, mine = check.generated
    assert check.ok, check.report()
    assert len(stock) == 8 and stock == mine
    assert np.diff(stock).tolist() == [1] * 7
    assert len(check.steps) == 9  # prefill + 8 decode steps: the 8th token is fed and compared too
    assert check.stats["q4_gemv"] == 8 * NODES and check.stats["q4_gemm"] == NODES
    assert "greedy tokens (8)" in check.report() and "identical" in check.report()
    assert check.peer_generated == stock  # a clear winner at every step: the peer's level 4 picks it too


# ------------------------------------------------------------------------------------------ nothing to check
NOT_SERVED = {
    "block 128": lambda: gl.genai_model(block=128),
    "float16": gl.float16_model,
    "8-bit": gl.eight_bit_model,
    "ORT quantizer defaults": gl.ort_quantizer_model,
}


@pytest.mark.parametrize("what", [*NOT_SERVED, "qwen2_tiny_int4_b128", "qwen2_tiny_int8_b32"])
def test_nothing_servable_is_a_failure(tmp_path, spec, capsys, what):
    path = real(what) if what.startswith("qwen2") else tmp_path / "m.onnx"
    if what in NOT_SERVED:
        onnx.save(NOT_SERVED[what](), str(path))
    nodes = sum(n.op_type == "MatMulNBits" for n in onnx.load(str(path), load_external_data=False).graph.node)
    code, out = check_cli(capsys, spec, path)
    assert code == 1, out
    assert f"nothing was checked: 0 of {nodes} MatMulNBits nodes rewritten" in out
    assert "PASS" not in out


# ------------------------------------------------------------------------------------------ verdicts, errors
def _check(steps, generate=0, moved=True):
    decisions = [mc.NodeDecision("n", moved, "")]
    return mc.ModelCheck("1.23", decisions, 4, steps, {"k": 1}, generate, ("k",))


def test_a_token_mismatch_fails_the_generation():
    ok = (mc.OutputAgreement("logits", 0.01, 0.1, True, 10),)
    same = _check([mc.Step("prefill", ok, (3, 3)), mc.Step("decode 1", ok, (4, 4)), mc.Step("decode 2", ok, (5, 5))], 2)
    assert same.ok and same.generated == ([3, 4], [3, 4])
    differ = _check([mc.Step("prefill", ok, (3, 3)), mc.Step("decode 1", ok, (4, 9))], 2)
    assert not differ.ok and "DIFFER at token 2" in differ.report() and differ.report().endswith("FAIL")
    short = _check([mc.Step("prefill", ok, (3, 3))], 2)  # stopped early: fewer tokens than asked for
    assert not short.ok


def test_moved_nodes_that_never_called_a_kernel_fail():
    ok = (mc.OutputAgreement("logits", 0.01, 0.1, True, 10),)
    check = mc.ModelCheck("1.23", [mc.NodeDecision("n", True, "")], 4, [mc.Step("run", ok)],
                          {"k": 0, "slices_on_ime": 4}, 0, ("k",))
    assert not check.ok and "never called an imegen kernel" in check.report()


def test_a_near_tie_is_reported():
    ok = (mc.OutputAgreement("logits", 0.01, 0.1, True, 10),)
    # imegen and the peer both leave stock's token 2: a failure still, named a near-tie
    tie = _check([mc.Step("prefill", ok, (3, 3), 3), mc.Step("decode 1", ok, (4, 9), 9)], 2)
    assert not tie.ok
    assert "DIFFER at token 2 (a near-tie: the peer's level 4 leaves stock's token there too)" in tie.report()
    # only the peer leaves it: imegen agrees with stock, and the report says where the peer differs
    peer_only = _check([mc.Step("prefill", ok, (3, 3), 3), mc.Step("decode 1", ok, (4, 4), 7),
                        mc.Step("decode 2", ok, (5, 5), 5)], 2)
    assert peer_only.ok and "peer [3, 7]  differs from stock at token 2" in peer_only.report()
    # imegen alone differs
    alone = _check([mc.Step("prefill", ok, (3, 3), 3), mc.Step("decode 1", ok, (4, 9), 4)], 2)
    assert not alone.ok and "near-tie" not in alone.report()


def _deviations(seed=0, n=20000):
    """Stock logits of size ~30, and two int8-like sides: independent noise of the same size on each."""
    rng = np.random.default_rng(seed)
    stock = rng.normal(0, 30, n).astype(np.float32)
    return stock, stock + rng.normal(0, 0.1, n).astype(np.float32), stock + rng.normal(0, 0.1, n).astype(np.float32)


def test_the_peer_criterion_on_known_deviations():
    """compare_outputs on arrays with known deviations: noise like the peer's passes beyond the tolerance;
    one element 3x the peer's largest deviation fails (max |diff|); a deviation everywhere just below the
    peer's largest fails (RMS); without the peer only the tolerance counts; a NaN fails."""
    stock, mine, theirs = _deviations()

    def judge(y, peer=theirs):
        return mc.compare_outputs({"y": stock}, {"y": y}, 4, None if peer is None else {"y": peer})[0]

    like = judge(mine)
    assert not like.within_tolerance and like.ok and 0.8 < like.ratios[0] < 1.25 and 0.95 < like.ratios[1] < 1.05
    assert not judge(mine, peer=None).ok
    one = mine.copy()
    one[123] = stock[123] + 3 * np.abs(theirs - stock).max()
    assert not judge(one).ok and judge(one).ratios[0] > mc.PEER_MAX_FACTOR
    everywhere = judge(stock + 0.9 * np.abs(theirs - stock).max() * np.sign(mine - stock))
    assert not everywhere.ok and everywhere.ratios[0] < 1 and everywhere.ratios[1] > 2 * mc.PEER_RMS_FACTOR
    nan = mine.copy()
    nan[7] = np.nan
    assert not judge(nan).ok
    # a peer output with a NaN vouches for nothing (its deviation is infinite, every ratio to it 0)
    peer_nan = theirs.copy()
    peer_nan[7] = np.nan
    assert not judge(mine, peer=peer_nan).ok
    # within the tolerance: a pass, whatever the peer did
    assert judge(stock + np.float32(0.05), peer=stock).ok


def test_an_output_beyond_tolerance_fails():
    bad = (mc.OutputAgreement("present.0.key", 0.5, 3.0, False, 10),)
    check = _check([mc.Step("prefill", bad, (1, 1))])
    assert not check.ok and "present.0.key" in check.report()


@pytest.mark.parametrize("args, message", [
    (["--dim", "sequence_length=3"], "--dim sequence_length: a decoder's sequence lengths come from --seq and --past"),
    (["--dim", "batch_size=2"], "--dim batch_size: a decoder is checked at batch 1"),
])
def test_user_errors(tmp_path, spec, capsys, args, message):
    model = gl.save_genai_model(tmp_path / "model.onnx")
    code, out = check_cli(capsys, spec, model, *args)
    assert code == 2 and f"error: {message}" in out


@pytest.mark.parametrize("option", [dict(seq=0), dict(past=-1), dict(generate=-1)])
def test_step_counts_are_checked(tmp_path, spec, option):
    """The API checks what the command line's argument types check too."""
    model = gl.save_genai_model(tmp_path / "model.onnx")
    with pytest.raises(mc.ModelCheckError, match="need seq >= 1, past >= 0, generate >= 0"):
        mc.model_check(imegen.load_spec(SPEC), model, spec_file=spec, **option)


def test_generate_needs_a_decoder(tmp_path, spec, capsys):
    onnx.save(gl.nbits_model(), str(tmp_path / "m.onnx"))
    code, out = check_cli(capsys, spec, tmp_path / "m.onnx", "--generate", 2)
    assert code == 2 and "error: generating needs a decoder" in out
