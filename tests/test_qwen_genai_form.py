"""imegen's Qwen model in onnxruntime-genai's export form (imegen/ort/genai_form.py, `imegen qwen-model`),
run in the host's onnxruntime and held to an independent float64 NumPy forward pass that reads the model's
stored weights (int4/int8 MatMulNBits dequantized by reference.dequantize, bit-exact with ORT) and does the
rest itself (RMSNorm, rotary from theta, causal grouped-query attention, SiLU MLP). The same reference
matches a real onnxruntime-genai export (tests/data/genai/), so it computes what genai's graphs mean, not
what this builder happens to do. The written files are held to the real export's (graph layout,
genai_config.json), and greedy decoding through the KV cache to the reference's tokens."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("onnxruntime")

import onnx  # noqa: E402
import onnxruntime as ort  # noqa: E402
from onnx import helper, numpy_helper  # noqa: E402

import genai_layout as gl  # noqa: E402
from imegen import reference as R  # noqa: E402
from imegen.cli import main  # noqa: E402
from imegen.ort import genai_form as gf  # noqa: E402
from imegen.ort import qwen  # noqa: E402

GENAI = Path(__file__).parent / "data" / "genai"
TINY = gl.GenaiConfig()  # the real exports' size: 2 layers, hidden 128, 4/2 heads of 32, vocab 512
PROMPT = [17, 3, 250, 9, 77, 1]


def session(model) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.log_severity_level = 3
    data = model.SerializeToString() if isinstance(model, onnx.ModelProto) else str(model)
    return ort.InferenceSession(data, so, providers=["CPUExecutionProvider"])


def level4_tolerance(y):
    return 0.1 + 0.02 * np.abs(y)  # ORT's MatMulNBits accuracy_level 4 operator-test tolerance


def at_level(model: onnx.ModelProto, level: int) -> onnx.ModelProto:
    """A copy whose MatMulNBits all compute at `level` (0: fp32 on the dequantized weights)."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    for n in m.graph.node:
        if n.op_type == "MatMulNBits":
            kept = [a for a in n.attribute if a.name != "accuracy_level"]
            del n.attribute[:]
            n.attribute.extend(kept + [helper.make_attribute("accuracy_level", level)])
    return m


# ---- independent NumPy forward pass (float64) over the weights the model stores ----

def model_weights(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    """Initializers by name, and each MatMulNBits node's dequantized [K, N] weight under the node's name."""
    init = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    w = dict(init)
    for node in model.graph.node:
        if node.op_type != "MatMulNBits":
            continue
        a = {x.name: helper.get_attribute_value(x) for x in node.attribute}
        K, N, bits, block = a["K"], a["N"], a["bits"], a["block_size"]
        zp = init[node.input[3]].reshape(N, -1) if len(node.input) > 3 and node.input[3] else None
        qw = R.QuantizedWeights(init[node.input[1]].reshape(N, -1, block * bits // 8), init[node.input[2]].reshape(N, -1),
                                zp, K, N, bits, block)
        w[node.name] = R.dequantize(qw)
    return w


def reference_logits(w: dict, c: gf.GenaiConfig, ids, rope=True, kv_head=None) -> np.ndarray:
    """float64 logits [S, vocab] of the whole sequence from position 0 (causal, no cache). The embedding is
    model.embed_tokens.weight, or (shared) the lm_head's dequantized weights transposed.

    rope / kv_head (query head -> KV head) exist to show the comparison notices a wrong choice."""
    f, hd, S = np.float64, c.head_size, len(ids)
    kv_head = kv_head or (lambda h: h // (c.heads // c.kv_heads))
    q4 = lambda name: w[f"{name}/MatMul_Q{c.bits}"].astype(f)  # noqa: E731

    def rms(x, weight):
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + c.rms_eps) * weight.astype(f)

    def rotate(x):  # [n, S, hd], rotate-half form
        if not rope:
            return x
        ang = np.arange(S, dtype=f)[:, None] * (1.0 / c.rope_theta ** (np.arange(0, hd, 2, dtype=f) / hd))
        x1, x2 = x[..., : hd // 2], x[..., hd // 2:]
        return np.concatenate([x1 * np.cos(ang) - x2 * np.sin(ang), x2 * np.cos(ang) + x1 * np.sin(ang)], -1)

    table = w["model.embed_tokens.weight"] if "model.embed_tokens.weight" in w else q4("/lm_head").T
    x = table.astype(f)[np.asarray(ids)]
    causal = np.tril(np.ones((S, S), bool))
    for i in range(c.layers):
        p = f"/model/layers.{i}"
        h = rms(x, w[f"model.layers.{i}.input_layernorm.weight"])
        qkv = h @ q4(f"{p}/attn/qkv_proj") + w.get(f"model.layers.{i}.attn.qkv_proj.Add.bias", 0)
        split = np.split(qkv, [c.heads * hd, (c.heads + c.kv_heads) * hd], axis=-1)
        q, k, v = (s.reshape(S, -1, hd).transpose(1, 0, 2) for s in split)
        q, k = rotate(q), rotate(k)
        ctx = np.empty((c.heads, S, hd))
        for j in range(c.heads):
            s = np.where(causal, q[j] @ k[kv_head(j)].T / np.sqrt(hd), -np.inf)
            e = np.exp(s - s.max(-1, keepdims=True))
            ctx[j] = (e / e.sum(-1, keepdims=True)) @ v[kv_head(j)]
        x = x + ctx.transpose(1, 0, 2).reshape(S, -1) @ q4(f"{p}/attn/o_proj")
        h = rms(x, w[f"model.layers.{i}.post_attention_layernorm.weight"])
        g, u = h @ q4(f"{p}/mlp/gate_proj"), h @ q4(f"{p}/mlp/up_proj")
        x = x + (g / (1 + np.exp(-g)) * u) @ q4(f"{p}/mlp/down_proj")
    return rms(x, w[f"model.layers.{c.layers}.final_norm_layernorm.weight"]) @ q4("/lm_head")


def prefill_logits(model: onnx.ModelProto, c: gf.GenaiConfig, ids) -> np.ndarray:
    return qwen.host_runner(session(model))(gf.step_feeds(c, ids))["logits"][0]


# ---- the model's numbers ----

@pytest.mark.parametrize("overrides", [{}, dict(tied=False), dict(symmetric=False, tied=False),
                                       dict(bits=8, tied=False), dict(block=128)],
                         ids=["int4-shared", "int4-untied", "int4-asym", "int8", "int4-b128"])
def test_logits_match_numpy_reference(overrides):
    """Computing in fp32 (accuracy_level 0), ORT's logits are the float64 forward pass on the stored weights."""
    c = replace(TINY, **overrides)
    model = gf.genai_model(c)
    w = model_weights(model)
    ref = reference_logits(w, c, PROMPT)
    got = prefill_logits(at_level(model, 0), c, PROMPT)
    assert np.abs(got - ref).max() < 1e-4
    assert ref.std() > 0.5  # informative logits, not collapsed
    # The comparison can fail: a model without rotary, or with the wrong query -> KV head map, is far off.
    assert np.abs(reference_logits(w, c, PROMPT, rope=False) - ref).max() > 1e-2
    assert np.abs(reference_logits(w, c, PROMPT, kv_head=lambda h: h % c.kv_heads) - ref).max() > 1e-2
    # As built (level 4: x86 ORT quantizes activations to int8), within ORT's level-4 tolerance.
    assert np.all(np.abs(prefill_logits(model, c, PROMPT) - ref) <= level4_tolerance(ref))


@pytest.mark.parametrize("name", ["qwen2_tiny_int4_b32", "qwen2_tiny_int4_b32_untied"])
def test_reference_matches_real_genai_export(name):
    """The reference's reading of the graph is genai's: on a real export it matches ORT as closely."""
    path = GENAI / name / "model.onnx"
    if not path.exists():
        pytest.skip(f"no real onnxruntime-genai export {path}")
    model = onnx.load(str(path))  # with its external data
    c = gf.config_of(model)
    ref = reference_logits(model_weights(model), c, PROMPT)
    assert np.abs(prefill_logits(at_level(model, 0), c, PROMPT) - ref).max() < 1e-4


def test_qwen_widths_run_and_match_reference():
    """Qwen2.5-0.5B's widths (hidden 896, 14/2 heads of 64, intermediate 4864), one layer, a small vocabulary:
    the nodes carry those sizes and the logits match the reference."""
    c = gf.GenaiConfig(layers=1, vocab=256, context=64)
    model = gf.genai_model(c)
    nb = {n.name: {a.name: helper.get_attribute_value(a) for a in n.attribute}
          for n in model.graph.node if n.op_type == "MatMulNBits"}
    kn = {name.rsplit("/", 2)[-2] if name.startswith("/model") else "lm_head": (a["K"], a["N"]) for name, a in nb.items()}
    assert kn == {"qkv_proj": (896, 1152), "o_proj": (896, 896), "gate_proj": (896, 4864), "up_proj": (896, 4864),
                  "down_proj": (4864, 896), "lm_head": (896, 256)}
    assert all((a["bits"], a["block_size"], a["accuracy_level"]) == (4, 32, 4) for a in nb.values())
    gqa = next(n for n in model.graph.node if n.op_type == "GroupQueryAttention")
    attrs = {a.name: helper.get_attribute_value(a) for a in gqa.attribute}
    assert (attrs["num_heads"], attrs["kv_num_heads"], attrs["scale"]) == (14, 2, 0.125)
    assert [n.op_type for n in model.graph.node].count("GatherBlockQuantized") == 1
    assert gf.config_of(model) == c
    ref = reference_logits(model_weights(model), c, PROMPT)
    assert np.abs(prefill_logits(at_level(model, 0), c, PROMPT) - ref).max() < 1e-4


def test_default_config_is_qwen25_05b():
    c = gf.GenaiConfig()
    assert (c.layers, c.vocab, c.hidden, c.heads, c.kv_heads, c.head_size, c.intermediate) == \
        (24, 151936, 896, 14, 2, 64, 4864)
    assert (c.bits, c.block, c.symmetric, c.accuracy_level, c.tied, c.context) == (4, 32, True, 4, True, 32768)
    assert c.matmuls == 121


# ---- decoding ----

def test_step_feeds_are_genai_inputs():
    c = TINY
    first = gf.step_feeds(c, [5, 6, 7])
    assert first["input_ids"].dtype == np.int64 and first["input_ids"].tolist() == [[5, 6, 7]]
    assert first["attention_mask"].dtype == np.int64 and first["attention_mask"].tolist() == [[1, 1, 1]]
    names = [i.name for i in gf.genai_model(c).graph.input]
    assert sorted(first) == sorted(names)
    assert all(first[n].shape == (1, 2, 0, 32) and first[n].dtype == np.float32 for n in names[2:])
    past = {n: np.zeros((1, 2, 3, 32), np.float32) for n in names[2:]}
    nxt = gf.step_feeds(c, [9], past)
    assert nxt["attention_mask"].tolist() == [[1, 1, 1, 1]] and nxt["past_key_values.1.value"] is past["past_key_values.1.value"]
    present = {n.replace("past_key_values", "present"): a for n, a in past.items()}
    assert gf.presents_as_past(c, present) == past


@pytest.mark.parametrize("tied", [True, False], ids=["shared", "untied"])
def test_greedy_decode_equals_reference(tied):
    """8 greedy tokens through the KV cache (prefill M = 6, then M = 1 steps) are the reference's, each
    step's logits the reference's for the whole sequence so far; at level 4 (int8 activations) the tokens
    are the same and the logits within ORT's tolerance. The weights make the winner clear: a shared
    embedding repeats the last token, an untied model (lm_head = embedding shifted by a row) counts up."""
    c = replace(TINY, tied=tied)
    model = gf.genai_model(c)
    steps = 8
    ids, logits = gf.greedy_decode_genai(qwen.host_runner(session(at_level(model, 0))), PROMPT, steps, c)
    ref = reference_logits(model_weights(model), c, PROMPT + ids[:-1])[len(PROMPT) - 1:]
    assert ids == [int(np.argmax(r)) for r in ref]
    assert np.abs(logits - ref).max() < 1e-4
    assert ids == ([PROMPT[-1]] * steps if tied else [PROMPT[-1] + 1 + t for t in range(steps)])
    ids4, logits4 = gf.greedy_decode_genai(qwen.host_runner(session(model)), PROMPT, steps, c)
    assert ids4 == ids and np.all(np.abs(logits4 - ref) <= level4_tolerance(ref))


def test_greedy_decode_in_riscv64_ort(tmp_path):
    """The same loop over a RiscvSession's run: Debian's riscv64 onnxruntime 1.23 under QEMU (its level 4
    computes in fp32) decodes the reference's tokens, its logits the reference's."""
    riscv = pytest.importorskip("imegen.ort.riscv")
    c = replace(TINY, tied=False)
    path = gl.save_genai_model(tmp_path / "model.onnx", c)
    with riscv.RiscvSession(path, version="1.23") as s:
        ids, logits = gf.greedy_decode_genai(s.run, PROMPT, 8, c)
    ref = reference_logits(model_weights(onnx.load(str(path))), c, PROMPT + ids[:-1])[len(PROMPT) - 1:]
    assert ids == [int(np.argmax(r)) for r in ref] == [PROMPT[-1] + 1 + t for t in range(8)]
    assert np.abs(logits - ref).max() < 1e-4


def test_greedy_decode_feeds_the_cache_back():
    """Each run after the prefill gets one token, a mask one longer, and the previous run's presents."""
    c = TINY
    s = session(at_level(gf.genai_model(c), 0))
    seen, outs = [], []

    def run(feeds):
        seen.append(feeds)
        outs.append(qwen.host_runner(s)(feeds))
        return outs[-1]

    ids, _ = gf.greedy_decode_genai(run, PROMPT, 3, c)
    assert [f["input_ids"].tolist() for f in seen] == [[PROMPT], [[ids[0]]], [[ids[1]]]]
    assert [f["attention_mask"].shape[1] for f in seen] == [6, 7, 8]
    assert all(seen[t + 1][f"past_key_values.{i}.{kv}"] is outs[t][f"present.{i}.{kv}"]
               for t in range(2) for i in range(c.layers) for kv in ("key", "value"))
    with pytest.raises(ValueError, match="at least one step"):
        gf.greedy_decode_genai(run, PROMPT, 0, c)


# ---- files ----

def test_written_files_are_the_real_exports(tmp_path):
    """At the real export's config the files are genai's: model.onnx wired as its model.onnx, weights in
    model.onnx.data, genai_config.json equal to the one genai's builder wrote. ORT loads them."""
    real = GENAI / "qwen2_tiny_int4_b32"
    if not real.exists():
        pytest.skip(f"no real onnxruntime-genai export {real}")
    exported = onnx.load(str(real / "model.onnx"), load_external_data=False)
    c, files = gf.write_genai_model(tmp_path / "model.onnx", gf.config_of(exported), external=True)
    assert files == [tmp_path / "model.onnx", tmp_path / "model.onnx.data", tmp_path / "genai_config.json"]
    written = onnx.load(str(files[0]), load_external_data=False)
    assert gf.layout(written) == gf.layout(exported)
    assert all(t.data_location == onnx.TensorProto.EXTERNAL for t in written.graph.initializer)
    assert json.loads(files[2].read_text()) == json.loads((real / "genai_config.json").read_text())
    ref = reference_logits(model_weights(gf.genai_model(c)), c, PROMPT)
    assert np.all(np.abs(prefill_logits(files[0], c, PROMPT) - ref) <= level4_tolerance(ref))
    # Written again, the data file holds one copy of the weights (onnx appends to an existing one).
    size = files[1].stat().st_size
    gf.write_genai_model(tmp_path / "model.onnx", c, external=True)
    assert files[1].stat().st_size == size


def test_small_models_are_one_file(tmp_path):
    files = gf.save(gf.genai_model(TINY), tmp_path / "m.onnx")
    assert files == [tmp_path / "m.onnx"] and not (tmp_path / "m.onnx.data").exists()


# ---- the command ----

def run_cli(capsys, *args) -> tuple[int, str, str]:
    try:
        code = main(["qwen-model", *map(str, args)])
    except SystemExit as e:  # argparse refusing an argument
        code = e.code
    out = capsys.readouterr()
    return code, out.out, out.err


def test_cli_writes_the_genai_form(tmp_path, capsys):
    out = tmp_path / "q.onnx"
    code, stdout, stderr = run_cli(capsys, out, "--layers", "1", "--vocab", "64", "--context", "128", "--seed", "3")
    assert code == 0, stderr
    assert "genai form, 1 layers, vocab 64, 4-bit block 32 symmetric, accuracy_level 4, embedding shared" in stdout
    model = onnx.load(str(out))
    assert gf.config_of(model) == gf.GenaiConfig(layers=1, vocab=64, context=128)
    assert json.loads(model.metadata_props[0].value)["seed"] == 3
    config = json.loads((tmp_path / "genai_config.json").read_text())
    assert config["model"]["decoder"]["filename"] == "q.onnx" and config["model"]["vocab_size"] == 64
    # 8-bit weights: the embedding is its own fp32 Gather, as genai exports int8.
    code, stdout, _ = run_cli(capsys, out, "--layers", "1", "--vocab", "64", "--context", "16", "--bits", "8")
    assert code == 0 and "8-bit block 32 symmetric" in stdout and "own fp32 embedding" in stdout
    m8 = gf.config_of(onnx.load(str(out)))
    assert (m8.bits, m8.tied) == (8, False)


def test_cli_defaults_are_qwen25_05b(tmp_path, capsys, monkeypatch):
    built = []

    def record(path, config, **kw):
        built.append(config)
        Path(path).write_bytes(b"")
        return config, [Path(path)]

    monkeypatch.setattr(gf, "write_genai_model", record)
    assert run_cli(capsys, tmp_path / "m.onnx")[0] == 0
    assert run_cli(capsys, tmp_path / "m.onnx", "--asymmetric")[0] == 0
    assert run_cli(capsys, tmp_path / "m.onnx", "--untied", "--block", "128")[0] == 0
    assert built[0] == gf.GenaiConfig()
    assert built[1] == gf.GenaiConfig(symmetric=False, tied=False)  # genai's working asymmetric export
    assert built[2] == gf.GenaiConfig(tied=False, block=128)


def test_cli_errors_are_one_line(tmp_path, capsys):
    code, stdout, stderr = run_cli(capsys, tmp_path / "m.onnx", "--form", "plain", "--untied")
    assert code == 2 and stderr == "error: --untied applies to --form genai only\n" and not (tmp_path / "m.onnx").exists()
    code, _, stderr = run_cli(capsys, tmp_path / "m.onnx", "--symmetric", "--asymmetric")
    assert code == 2 and "not allowed with argument --symmetric" in stderr
    code, _, stderr = run_cli(capsys, tmp_path / "m.onnx", "--form", "onnx")
    assert code == 2 and "invalid choice: 'onnx'" in stderr and "Traceback" not in stderr
