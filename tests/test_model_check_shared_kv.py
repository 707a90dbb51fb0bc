"""`imegen ort-model-check` holds a decoder's KV cache as onnxruntime-genai does on CPU: one buffer per past input,
as long as every position the check decodes, bound as both GroupQueryAttention's past input and its present output
(past_present_share_buffer), so the operator writes the new tokens' rows in place. The rows not yet written hold
NaN: an operator that reads one gives NaN outputs, one that writes a wrong row leaves NaN where a position should
be, and either fails the check. A decoder whose cache is not GroupQueryAttention's keeps the growing cache (each
step's present.* fed back as the next past_key_values.*), and the report says which way it decoded.

Real riscv64 onnxruntime 1.23 under QEMU, stock against ORT + imegen's library (ort-accelerate's spec: every
MatMulNBits and every decoder node, GroupQueryAttention included, on imegen).
"""

import threading
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from imegen import reference as ref
from imegen import toolchain
from imegen.cli import main
from imegen.ir import load_attention_specs, load_specs
from imegen.ort import model_check as mc
from imegen.ort.riscv import OrtError, RiscvSession

ROOT = Path(__file__).resolve().parents[1]
REAL_B32 = ROOT / "tests" / "data" / "genai" / "qwen2_tiny_int4_b32" / "model.onnx"
needs_qemu = pytest.mark.skipif(bool(toolchain.missing_tools()), reason="needs the cross toolchains and qemu-riscv64")
LAYERS = 2
SHARE = {f"present.{i}.{kv}": f"past_key_values.{i}.{kv}" for i in range(LAYERS) for kv in ("key", "value")}
SEQ, PAST, GENERATE = 5, 7, 8
POSITIONS = PAST + SEQ + GENERATE  # the prefill after the past, then one token per decode step


@pytest.fixture(scope="module")
def accelerated(tmp_path_factory):
    """compute -> ort-accelerate's spec for the real genai export, built once (--compute fp32: ORT's fp32
    tolerance; None: the export's own level 4, int8, judged beside the host ORT's level 4)."""
    built = {}

    def spec_for(compute: str | None):
        if compute not in built:
            out = tmp_path_factory.mktemp("accelerated") / "out"
            assert main(["ort-accelerate", str(REAL_B32), "-o", str(out), "--flavour", "qemu",
                         *(["--compute", compute] if compute else [])]) == 0
            spec = out / "model.imegen"
            built[compute] = load_specs(spec), load_attention_specs(spec), str(spec), compute
        return built[compute]

    return spec_for


def check_real(spec, **options):
    specs, attention, spec_file, compute = spec
    return mc.model_check(specs, REAL_B32, spec_file=spec_file, compute=compute, attention=attention, seq=SEQ,
                          past=PAST, **options)


class RunSpy:
    """Every RiscvSession.run's feeds and share (both sessions, from model_check's two threads)."""

    def __init__(self, monkeypatch):
        self.calls = []
        self._lock = threading.Lock()
        run = RiscvSession.run

        def spied(session, feeds, outputs=None, share=None):
            with self._lock:
                self.calls.append((dict(feeds), dict(share or {})))
            return run(session, feeds, outputs, share)

        monkeypatch.setattr(RiscvSession, "run", spied)


# ------------------------------------------------------------------------------------------ the genai way
# At level 4 imegen's int8 breaks a near-tie at the 7th token of this export the other way from stock's fp32 (as it
# did with the growing cache; the logits there are within 0.22 of the tolerance): 5 tokens.
@needs_qemu
@pytest.mark.parametrize("compute, generate", [("fp32", GENERATE), (None, 5)], ids=["fp32", "level4"])
def test_real_genai_export_decodes_in_one_shared_buffer(accelerated, monkeypatch, compute, generate):
    """Every run of both sessions binds each present.N.* to its past_key_values.N.* buffer, as long as every position
    decoded, whose rows before the step's past hold the cache and the rest NaN; both engines agree at every step
    (the valid rows of each buffer compared, the rows after them untouched) and the greedy tokens are identical;
    imegen's GroupQueryAttention ran on every layer at every step."""
    spy = RunSpy(monkeypatch)
    check = check_real(accelerated(compute), generate=generate)
    assert check.ok and check.tokens_agree and len(check.generated[1]) == generate, check.report()
    positions = PAST + SEQ + generate
    (line,) = [l for l in check.report().splitlines() if l.startswith("KV cache: ")]
    assert line.startswith(f"KV cache: shared past/present buffer of {positions} positions, as onnxruntime-genai "
                           "runs it")
    runs = generate + 1
    assert len(spy.calls) == 2 * runs
    for feeds, share in spy.calls:
        assert share == SHARE
        total = feeds["attention_mask"].shape[1]
        past = total - feeds["input_ids"].shape[1]
        for name in SHARE.values():
            buffer = feeds[name]
            assert buffer.shape == (1, 2, positions, 32), (name, buffer.shape)
            assert not np.isnan(buffer[:, :, :past]).any() and np.isnan(buffer[:, :, past:]).all(), (name, past)
    assert sorted({f["attention_mask"].shape[1] for f, _ in spy.calls}) == list(range(PAST + SEQ, positions + 1))
    assert check.decoder_calls["GroupQueryAttention"] == (LAYERS, LAYERS * runs)
    assert all(o.elements == 2 * 32 * (int(s.label.split("at past ")[1]) + (SEQ if i == 0 else 1))
               for i, s in enumerate(check.steps) for o in s.outputs if o.name.startswith("present"))


# ------------------------------------------------------------------------------------------ a defect is caught
def _write_one_late(mine: dict, shift_from: int, valid: int) -> None:
    """imegen's operator writing this step's new rows one position late: rows shift_from..valid-1 of each shared
    buffer moved to shift_from+1..valid, the row it should have written left as fed (NaN)."""
    for name in SHARE:
        buffer = mine[name]
        if valid < buffer.shape[2]:
            buffer[:, :, shift_from + 1:valid + 1] = buffer[:, :, shift_from:valid].copy()
            buffer[:, :, shift_from] = np.nan


def _late_writes(monkeypatch) -> None:
    run = mc._Sides.run

    def late(self, stock_feeds, mine_feeds, peer_feeds=None):
        stock, mine, theirs = run(self, stock_feeds, mine_feeds, peer_feeds)
        seq = mine_feeds["input_ids"].shape[1]
        past = mine_feeds["attention_mask"].shape[1] - seq
        _write_one_late(mine, past, past + seq)
        return stock, mine, theirs

    monkeypatch.setattr(mc._Sides, "run", late)


@needs_qemu
def test_a_row_written_one_late_fails(accelerated, monkeypatch):
    """imegen's GroupQueryAttention writing the new tokens' rows one position late in the shared buffer (simulated
    on its outputs, before they are compared and fed back): the prefill's present.* fail (the position it skipped
    is NaN, and it wrote a row past the valid ones, named), the next step reads that NaN row and its logits fail,
    and the greedy tokens part."""
    _late_writes(monkeypatch)
    check = check_real(accelerated("fp32"), generate=GENERATE)
    report = check.report()
    assert not check.ok and report.endswith("FAIL"), report
    prefill = {o.name: o for o in check.steps[0].outputs}
    for name in SHARE:
        o = prefill[name]
        assert not o.ok and o.max_abs == np.inf, (name, o)
        assert o.note == f"wrote row {PAST + SEQ} of the shared buffer, past the {PAST + SEQ} positions it holds"
    assert prefill["logits"].ok  # the logits read the rows before the write
    assert f"wrote row {PAST + SEQ} of the shared buffer" in report
    decode = {o.name: o for o in check.steps[1].outputs}
    assert not decode["logits"].ok and decode["logits"].max_abs == np.inf  # NaN: the skipped row read
    assert not check.tokens_agree and "DIFFER at token 2" in report


@needs_qemu
def test_a_row_written_one_late_stops_the_int8_kernels(accelerated, monkeypatch):
    """At level 4 the NaN the next step reads reaches imegen's int8 MatMulNBits, which refuse it: the check ends
    in onnxruntime's error (the command's `error: onnxruntime: ...`, exit 1), not a PASS."""
    _late_writes(monkeypatch)
    with pytest.raises(OrtError, match="A holds a NaN"):
        check_real(accelerated(None), generate=GENERATE)


@needs_qemu
def test_reading_a_row_not_yet_written_fails(accelerated, monkeypatch):
    """imegen's GroupQueryAttention counting one position more than the buffer holds (simulated by its side's
    attention mask one longer: total_sequence_length + 1, seqlens_k + 1): it attends over a row never written,
    which is NaN, and its logits fail at the first step."""
    run = mc._Sides.run

    def longer(self, stock_feeds, mine_feeds, peer_feeds=None):
        mask = mine_feeds["attention_mask"]
        mine_feeds = {**mine_feeds, "attention_mask": np.ones((1, mask.shape[1] + 1), mask.dtype)}
        return run(self, stock_feeds, mine_feeds, peer_feeds)

    monkeypatch.setattr(mc._Sides, "run", longer)
    check = check_real(accelerated("fp32"), generate=GENERATE)  # stops where the tokens part, inside the buffer
    assert not check.ok, check.report()
    logits = next(o for o in check.steps[0].outputs if o.name == "logits")
    assert not logits.ok and logits.max_abs == np.inf


def test_compare_shared_judges_the_valid_rows_and_the_rows_after():
    """compare_shared on known buffers: the valid rows within the tolerance and NaN after them pass; a valid row
    left NaN fails (inf); a row written after the valid ones fails with a note naming it, even with every valid
    row right; outputs not shared are compared whole."""
    rng = np.random.default_rng(0)
    valid, positions = 9, 12
    stock = np.full((1, 2, positions, 8), np.nan, np.float32)
    stock[:, :, :valid] = rng.normal(0, 1, (1, 2, valid, 8))
    logits = rng.normal(0, 1, (1, 1, 16)).astype(np.float32)

    def judge(mine):
        out = mc.compare_shared({"logits": logits, "present.0.key": stock}, {"logits": logits, "present.0.key": mine},
                                0, None, {"present.0.key"}, valid)
        assert out[0].ok and out[0].elements == logits.size
        return out[1]

    good = judge(stock + np.float32(1e-6))
    assert good.ok and not good.note and good.elements == 2 * valid * 8
    skipped = stock.copy()
    skipped[0, 1, valid - 1, 3] = np.nan
    assert not judge(skipped).ok and judge(skipped).max_abs == np.inf
    beyond = stock.copy()
    beyond[0, 0, valid + 1, 0] = 0.5
    o = judge(beyond)
    assert not o.ok and o.max_abs == 0 and o.note == f"wrote row {valid + 1} of the shared buffer, past the {valid} " \
                                                     "positions it holds"
    assert o.note in mc._agreement_line(o.name, o, False)
    beyond[0, 0, valid:] = 0.0
    assert judge(beyond).note.startswith(f"wrote rows {valid}, {valid + 1}, {valid + 2} of the shared buffer")


def test_shared_buffers_hold_the_cache_then_nan():
    m = onnx.load(str(REAL_B32), load_external_data=False)
    dec = mc.find_decoder(m)
    feeds = mc.prefill_feeds(m, dec, SEQ, PAST, 0, {})
    shared = mc.shared_buffers(dec, feeds, POSITIONS)
    for name in SHARE.values():
        assert shared[name].shape == (1, 2, POSITIONS, 32)
        np.testing.assert_array_equal(shared[name][:, :, :PAST], feeds[name])
        assert np.isnan(shared[name][:, :, PAST:]).all()
    assert all(shared[k] is feeds[k] for k in feeds if k not in SHARE.values())
    assert mc.kv_positions(dec, feeds, GENERATE) == POSITIONS and mc.kv_positions(dec, feeds, 0) == PAST + SEQ + 1


# ------------------------------------------------------------------------------------------ which way
def growing_decoder(hidden: int = 128, vocab: int = 128, seed: int = 0) -> onnx.ModelProto:
    """A decoder whose KV cache is no GroupQueryAttention's: token embeddings, a MatMulNBits key projection
    concatenated after the past (present.0.key), the cache's mean over positions added to the embeddings, and a
    MatMulNBits to the logits (so each step's logits read every cached position)."""
    rng = np.random.default_rng(seed)
    inits = [numpy_helper.from_array(rng.normal(0, 1, (vocab, hidden)).astype(np.float32), "embed"),
             numpy_helper.from_array(np.array([1], np.int64), "axis1"),
             numpy_helper.from_array(np.array([2], np.int64), "axis2")]
    nodes = [helper.make_node("Gather", ["embed", "input_ids"], ["x"])]
    for name, a, y, n in (("k_proj", "x", "k", hidden), ("lm_head", "h", "logits", vocab)):
        qw = ref.quantize_weights(rng.normal(0, 1 / np.sqrt(hidden), (hidden, n)).astype(np.float32), 4, 32, True)
        inits += [numpy_helper.from_array(qw.data, f"{name}.B"), numpy_helper.from_array(qw.scales, f"{name}.scales")]
        nodes.append(helper.make_node("MatMulNBits", [a, f"{name}.B", f"{name}.scales"], [y], name=name,
                                      domain="com.microsoft", K=hidden, N=n, bits=4, block_size=32, accuracy_level=4))
    nodes[2:2] = [helper.make_node("Unsqueeze", ["k", "axis1"], ["k4"]),
                  helper.make_node("Concat", ["past_key_values.0.key", "k4"], ["present.0.key"], axis=2),
                  helper.make_node("ReduceMean", ["present.0.key", "axis2"], ["mean4"], keepdims=1),
                  helper.make_node("Squeeze", ["mean4", "axis1"], ["mean"]),
                  helper.make_node("Add", ["x", "mean"], ["h"])]
    graph = helper.make_graph(
        nodes, "growing",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch_size", "sequence_length"]),
         helper.make_tensor_value_info("past_key_values.0.key", TensorProto.FLOAT,
                                       ["batch_size", 1, "past_sequence_length", hidden])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch_size", "sequence_length", vocab]),
         helper.make_tensor_value_info("present.0.key", TensorProto.FLOAT,
                                       ["batch_size", 1, "total_sequence_length", hidden])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21),
                                                    helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = 10
    onnx.checker.check_model(model)
    return model


def test_which_models_fit_the_shared_form():
    """The genai export fits; a past read by another node too, a present not the attention's, or a cache that is
    no GroupQueryAttention's do not, each with the reason."""
    genai = onnx.load(str(REAL_B32), load_external_data=False)
    assert mc.shared_kv_reason(genai, mc.find_decoder(genai)) == ""
    also_read = onnx.load(str(REAL_B32), load_external_data=False)
    also_read.graph.node.append(helper.make_node("Shape", ["past_key_values.1.value"], ["past_shape"]))
    assert mc.shared_kv_reason(also_read, mc.find_decoder(also_read)) == (
        "past_key_values.1.value is read by GroupQueryAttention and Shape, not by one GroupQueryAttention alone")
    renamed = onnx.load(str(REAL_B32), load_external_data=False)
    attention = next(n for n in renamed.graph.node if n.op_type == "GroupQueryAttention")
    attention.output[1] = "k_cache"
    renamed.graph.node.append(helper.make_node("Identity", ["k_cache"], ["present.0.key"]))
    assert mc.shared_kv_reason(renamed, mc.find_decoder(renamed)) == (
        "present.0.key is not the present output of the GroupQueryAttention reading past_key_values.0.key")
    growing = growing_decoder()
    assert mc.shared_kv_reason(growing, mc.find_decoder(growing)) == (
        "past_key_values.0.key is read by Concat, not by one GroupQueryAttention alone")


@needs_qemu
def test_a_decoder_without_group_query_attention_keeps_the_growing_cache(tmp_path, monkeypatch):
    """MatMulNBits nodes and a Concat-built cache: no run binds an output to an input, each step's past is the
    previous step's present (7, 12, 13, 14 positions), both engines agree and the greedy tokens are identical; the
    report says the cache grew, and why."""
    model = tmp_path / "growing.onnx"
    onnx.save(growing_decoder(), str(model))
    assert main(["ort-accelerate", str(model), "-o", str(tmp_path / "out"), "--flavour", "qemu"]) == 0
    spy = RunSpy(monkeypatch)
    check = mc.model_check(load_specs(tmp_path / "out" / "model.imegen"), model, seq=SEQ, past=PAST, generate=3)
    assert check.ok and check.tokens_agree and check.moved == 2, check.report()
    assert ("KV cache: growing, each step's present.* fed back as the next past_key_values.* (past_key_values.0.key "
            "is read by Concat, not by one GroupQueryAttention alone)") in check.report().splitlines()
    assert all(not share for _, share in spy.calls) and len(spy.calls) == 2 * 4
    assert sorted(f["past_key_values.0.key"].shape[2] for f, _ in spy.calls) == [7, 7, 12, 12, 13, 13, 14, 14]
    assert not any(np.isnan(f["past_key_values.0.key"]).any() for f, _ in spy.calls)


@needs_qemu
def test_a_model_that_is_no_decoder_has_no_kv_cache_line(tmp_path):
    import genai_layout as gl

    model = tmp_path / "nbits.onnx"
    onnx.save(gl.nbits_model(), str(model))
    assert main(["ort-accelerate", str(model), "-o", str(tmp_path / "out"), "--flavour", "qemu"]) == 0
    check = mc.model_check(load_specs(tmp_path / "out" / "model.imegen"), model)
    assert check.ok and not check.kv_cache and "KV cache" not in check.report(), check.report()
