"""`imegen ort-model-check` on LLM graphs: onnxruntime-genai's decoder layout in Debian's riscv64 ORT 1.23
under QEMU, stock vs ORT + imegen's IME kernels.

The models are genai_layout's builds (structure checked node for node against real onnxruntime-genai
exports in tests/data/genai/, and those exports themselves when present). A decoder check runs a
prefill step (M = seq rows: the gemm kernel) and a decode step (M = 1: the gemv kernel) fed back the
prefill's KV cache; greedy decoding must give the same tokens on both sides; a model none of whose
MatMulNBits nodes the spec serves must fail (exit 1), not pass with nothing checked.
"""

import re
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
    code = main(["ort-model-check", *map(str, args)])
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


def test_an_output_beyond_tolerance_fails():
    bad = (mc.OutputAgreement("present.0.key", 0.5, 3.0, False, 10),)
    check = _check([mc.Step("prefill", bad, (1, 1))])
    assert not check.ok and "present.0.key" in check.report()


@pytest.mark.parametrize("args, message", [
    (["--dim", "sequence_length=3"], "--dim sequence_length: a decoder's sequence lengths come from --seq and --past"),
    (["--dim", "batch_size=2"], "--dim batch_size: a decoder is checked at batch 1"),
    (["--seq", "0"], "need seq >= 1"),
])
def test_user_errors(tmp_path, spec, capsys, args, message):
    model = gl.save_genai_model(tmp_path / "model.onnx")
    code, out = check_cli(capsys, spec, model, *args)
    assert code == 2 and f"error: {message}" in out


def test_generate_needs_a_decoder(tmp_path, spec, capsys):
    onnx.save(gl.nbits_model(), str(tmp_path / "m.onnx"))
    code, out = check_cli(capsys, spec, tmp_path / "m.onnx", "--generate", 2)
    assert code == 2 and "error: generating needs a decoder" in out
