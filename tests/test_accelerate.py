"""`imegen ort-accelerate`: a model in, a rewritten model and a library with kernels chosen per node shape out.

Models are built here with onnx.helper from imegen.reference's port of ORT's blockwise quantizer. The derived
kernels are checked through the library's own rule (serving.serve) against what the node needs, and their
tuned settings against bench/results/tune.json read directly (not the packaged copy the command uses). One
end-to-end test runs the output in Debian's real riscv64 onnxruntime 1.23 under QEMU against stock ORT on the
original model, with the library's counters showing each node's shape-chosen kernels ran.
"""

import json
import os
import re
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from imegen import reference as ref
from imegen.cli import main
from imegen.ir import load_specs
from imegen.plan import plan_kernel
from imegen.ort import accelerate as acc
from imegen.ort import customop
from imegen.ort.serving import NodeNeeds, serve

ROOT = Path(__file__).resolve().parents[1]
TUNE_JSON = ROOT / "bench" / "results" / "tune.json"
GENAI = ROOT / "tests" / "data" / "genai"
MS = "com.microsoft"


# ----------------------------------------------------------------------------- model builders
def mm(name, x, y, *, N, K, bits=4, block=32, symmetric=True, bias=False, level=4, seed=0, float16=False,
       g_idx=False, b_input=False):
    """One MatMulNBits node x[.., K] -> y[.., N] and its initializers (and B as a graph input with b_input)."""
    rng = np.random.default_rng(seed)
    qw = ref.quantize_weights(rng.normal(0, 1 / np.sqrt(K), (K, N)).astype(np.float32), bits, block, symmetric)
    ft = np.float16 if float16 else np.float32
    names = [x, f"{name}.B", f"{name}.scales", "", "", ""]
    inits = [numpy_helper.from_array(qw.scales.astype(ft), names[2])]
    inputs = []
    if b_input:
        inputs.append(helper.make_tensor_value_info(names[1], TensorProto.UINT8, list(qw.data.shape)))
    else:
        inits.append(numpy_helper.from_array(qw.data, names[1]))
    if qw.zero_points is not None:
        names[3] = f"{name}.zero_points"
        inits.append(numpy_helper.from_array(qw.zero_points, names[3]))
    if g_idx:
        names[4] = f"{name}.g_idx"
        inits.append(numpy_helper.from_array((np.arange(K) // block).astype(np.int32), names[4]))
    if bias:
        names[5] = f"{name}.bias"
        inits.append(numpy_helper.from_array(rng.normal(0, 0.5, N).astype(ft), names[5]))
    while names[-1] == "":
        names.pop()
    node = helper.make_node("MatMulNBits", names, [y], name=name, domain=MS, K=K, N=N, bits=bits, block_size=block,
                            accuracy_level=level)
    return node, inits, inputs


def chain(*layers, float16=False):
    """Nodes mm0, mm1, ... in a chain: A [batch, seq, K0] -> Y; each layer a dict of mm() keywords."""
    t = TensorProto.FLOAT16 if float16 else TensorProto.FLOAT
    nodes, inits, extra, x = [], [], [], "A"
    for i, kw in enumerate(layers):
        y = "Y" if i == len(layers) - 1 else f"mm{i}/Y"
        node, ins, inputs = mm(f"mm{i}", x, y, seed=i, float16=float16, **kw)
        nodes.append(node)
        inits += ins
        extra += inputs
        x = y
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("A", t, ["batch", "seq", layers[0]["K"]])]
                              + extra, [helper.make_tensor_value_info("Y", t, ["batch", "seq", layers[-1]["N"]])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid(MS, 1)])
    model.ir_version = 10
    return model


def saved(model, folder: Path, name="model.onnx") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(folder / name))
    return folder / name


def accelerate(capsys, *args):
    code = main(["ort-accelerate", *map(str, args)])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def built(monkeypatch, tmp_path):
    """build_library stubbed out (the real build runs in the end-to-end and genai tests): records its specs."""
    calls = []

    def fake(specs, spec_file="<spec>", *, flavour="qemu", ort_include=None, attention=None):
        calls.append((specs, flavour))
        lib = tmp_path / "fake-lib.so"
        lib.write_bytes(b"library")
        return lib

    monkeypatch.setattr(customop, "build_library", fake)
    return calls


def tuned(shape: str, M: int, block: int) -> dict:
    """The committed tuning result for a Qwen shape, straight from bench/results/tune.json."""
    cases = json.loads(TUNE_JSON.read_text())["cases"]
    return next(c["best"] for c in cases if c["case"] == f"{shape} M={M} block={block}")


def need(N, K, bits=4, block=32, symmetric=True, bias=False, level=4) -> NodeNeeds:
    return NodeNeeds(bits=bits, block=block, accuracy_level=level, asymmetric=not symmetric, bias=bias, N=N, K=K)


def settings_of(spec) -> dict:
    """A kernel's settings in bench/results/tune.json's words (the keys a tuned config sets)."""
    words = {"bias": "yes" if spec.bias else "no", "tile": f"{spec.tile_m}x{spec.tile_n}"}
    keys = ("op", "bits", "block", "zero_point", "bias", "compute", "target", "tile", "k_unroll", "unpack", "panel",
            "scales", "scale_type") + tuple(k for k, default in (("stage_b", "tile"), ("spread", "group"),
                                                                  ("a_scale_type", "fp32")) if getattr(spec, k) != default)
    return {k: words[k] if k in words else getattr(spec, k) for k in keys}


def by_name(specs):
    return {s.name: s for s in specs}


def comments(spec: Path) -> str:
    """A spec's comments as one line (they are wrapped at word boundaries)."""
    return " ".join(line.lstrip("#").strip() for line in spec.read_text().splitlines() if line.startswith("#"))


# ----------------------------------------------------------------------------- the packaged table
def test_packaged_tuning_table_is_bench_results_tune_json():
    """imegen/ort/tuning.json must be bench/results/tune.json's winners: refresh it with
    `python3 -c "from imegen.ort.accelerate import write_tuning_table; write_tuning_table()"` after `imegen tune`."""
    assert json.loads(acc.TUNING_TABLE.read_text()) == acc.compact_tuning_table(json.loads(TUNE_JSON.read_text()))
    table = acc.tuning_table()
    assert {(c.M, dict(c.settings)["op"]) for c in table} == {(1, "gemv"), (128, "gemm"), (512, "gemm")}
    tomllib = pytest.importorskip("tomllib")  # and wheels carry it
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    assert acc.TUNING_TABLE.name in data["imegen.ort"]


# ----------------------------------------------------------------------------- one node of every flavour
# (bits, symmetric, block, bias, level, N, K): a CI selection of 4/8-bit x zero points x blocks 16..256 x bias
# x levels 0-4, the first at a tuned shape (896x896: q/o), the others at shapes the table lacks.
FLAVOURS = [
    (4, True, 32, False, 4, 896, 896), (4, False, 64, True, 4, 200, 96), (4, True, 128, False, 0, 64, 256),
    (8, False, 32, False, 4, 96, 64), (8, True, 16, True, 1, 48, 80), (4, False, 256, False, 2, 40, 512),
    (4, True, 16, False, 4, 72, 48), (8, True, 256, False, 4, 32, 256), (4, False, 128, True, 3, 100, 128),
]


@pytest.mark.parametrize("flavour", FLAVOURS, ids=lambda f: "q{}{}_b{}{}_l{}".format(
    f[0], "s" if f[1] else "a", f[2], "_bias" if f[3] else "", f[4]))
def test_every_flavour_is_served_by_kernels_chosen_for_it(tmp_path, capsys, built, flavour):
    bits, symmetric, block, bias, level, N, K = flavour
    model = saved(chain(dict(N=N, K=K, bits=bits, block=block, symmetric=symmetric, bias=bias, level=level)), tmp_path)
    code, out, _ = accelerate(capsys, model, "-o", tmp_path / "out")
    assert code == 0, out
    specs = load_specs(tmp_path / "out" / "model.imegen")
    assert built and built[-1][1] == "hardware" and [s.name for s in built[-1][0]] == [s.name for s in specs]
    s = serve(specs, need(N, K, bits, block, symmetric, bias, level))
    kernels = by_name(specs)
    gemv, (gemm,) = kernels[s.gemv], [kernels[name] for _, name in s.gemm]
    for k in (gemv, gemm):
        assert (k.bits, k.block, k.zero_point, k.bias) == (bits, block, "symmetric" if symmetric else "asymmetric", bias)
        assert k.shapes == ((N, K),) and not k.fallback
    assert (gemv.op, gemm.op) == ("gemv", "gemm")
    if level == 4:  # int8 on IME, an rvv int8 fallback at the K1's VLEN
        assert gemv.target == gemm.target == "ime" and gemv.compute == gemm.compute == "int8"
        fb = kernels[s.fallback]
        assert (fb.target, fb.compute, fb.vlen, fb.fallback, fb.shapes) == ("rvv", "int8", 256, True, ())
        assert (fb.bits, fb.block, fb.zero_point, fb.bias) == (gemv.bits, gemv.block, gemv.zero_point, gemv.bias)
    else:  # fp32, as bench's rvv-fp32 baseline
        assert s.fallback is None
        assert [(k.target, k.compute, k.vlen, f"{k.tile_m}x{k.tile_n}") for k in (gemv, gemm)] == \
            [("rvv", "fp32", 256, "1x16"), ("rvv", "fp32", 256, "4x16")]
    zp = "symmetric" if symmetric else "asymmetric"
    first = out.splitlines()[0]
    assert first == (f"served mm0 (N={N}, K={K}, {bits}-bit block {block} {zp}{' with bias' if bias else ''}, "
                     f"level {level}): M=1 {s.gemv}, M=2+ {s.gemm[0][1]}"
                     + (f", no IME hart: {s.fallback}" if level == 4 else ""))
    assert out.splitlines()[-1] == "1 of 1 MatMulNBits nodes served by " + f"{len(s.names())} kernels (hardware flavour library)"
    assert (tmp_path / "out" / "report.txt").read_text() == out
    umask = os.umask(0o22)
    os.umask(umask)
    assert {p.name: p.stat().st_mode & 0o777 for p in (tmp_path / "out").iterdir()} == {
        name: 0o666 & ~umask for name in ("model.onnx", "libimegen_ort.so", "model.imegen", "report.txt")}
    rewritten = onnx.load(str(tmp_path / "out" / "model.onnx"))
    (node,) = rewritten.graph.node
    assert node.domain == customop.DOMAIN
    assert helper.get_attribute_value(next(a for a in node.attribute if a.name == "accuracy_level")) == level
    assert (tmp_path / "out" / "libimegen_ort.so").read_bytes() == b"library"


def test_a_tuned_shape_takes_the_tuned_configs_with_its_zero_points(tmp_path, capsys, built):
    """896x896 at block 32 is q/o in the table: gemv = the M=1 winner, gemm = the M=128 winner (the M=512 one
    is the same), symmetric zero points swapped in."""
    model = saved(chain(dict(N=896, K=896, block=32, symmetric=True)), tmp_path)
    assert accelerate(capsys, model, "-o", tmp_path / "out")[0] == 0
    specs = load_specs(tmp_path / "out" / "model.imegen")
    s = serve(specs, need(896, 896))
    kernels = by_name(specs)
    assert settings_of(kernels[s.gemv]) == {**tuned("q/o", 1, 32), "zero_point": "symmetric"}
    # the M=128 winner packs B in panels of 8; the tuner tied it with panels of 16 (staged B: the panel does
    # not change what runs), which pack B as the gemv does, so one copy of B serves both kernels
    assert settings_of(kernels[s.gemm[0][1]]) == {**tuned("q/o", 128, 32), "zero_point": "symmetric", "panel": 16}
    assert tuned("q/o", 128, 32)["panel"] == 8
    assert tuned("q/o", 128, 32) == tuned("q/o", 512, 32) and len(s.gemm) == 1
    text = comments(tmp_path / "out" / "model.imegen")
    assert "tuned q/o 896x896 M=1 block=32, exact; with zero_point = symmetric" in text
    assert "tied with it within 1% under the model: panel = 16, which packs B as the M = 1 kernel does" in text
    plans = [plan_kernel(kernels[s.gemv]), plan_kernel(kernels[s.gemm[0][1]])]
    assert len(set(customop.layouts(plans).values())) == 1


def test_asymmetric_gemv_and_gemm_keep_the_winners_when_no_tie_packs_alike(tmp_path, capsys, built):
    """Asymmetric gemv kernels keep zero points two per byte and gemm kernels one: no tie can share their packed
    B, so the gemm kernel stays the tuner's winner (two copies of B)."""
    model = saved(chain(dict(N=896, K=896, block=32, symmetric=False)), tmp_path)
    assert accelerate(capsys, model, "-o", tmp_path / "out")[0] == 0
    specs = load_specs(tmp_path / "out" / "model.imegen")
    s = serve(specs, need(896, 896, symmetric=False))
    assert settings_of(by_name(specs)[s.gemm[0][1]]) == tuned("q/o", 128, 32)


def test_config_names_read_back_into_the_settings_they_name():
    """The tuner records its ties by config name only; ort-accelerate reads them back (round trip over every
    name tune.json holds)."""
    from imegen.perf.search.tune import config_name

    for case in json.loads(TUNE_JSON.read_text())["cases"]:
        base = {k: case["best"][k] for k in ("bits", "zero_point", "bias")}
        for top in case["top"]:
            assert config_name(acc.settings_from_config_name(top["config"], base)) == top["config"]
        assert acc.settings_from_config_name(case["top"][0]["config"], base) == {"scale_type": "fp32", **case["best"]}


def test_each_shape_gets_its_nearest_tuned_config(tmp_path, capsys, built):
    """At block 64 the table's prefill winners differ between k/v (128x896) and q/o (896x896): a 128x128 node
    (nearest k/v) and a 1024x128 node (nearest q/o) run different gemm kernels, each listing only its shape,
    while their identical decode configs are one gemv kernel listing both."""
    kv, qo = tuned("k/v", 128, 64), tuned("q/o", 128, 64)
    assert kv != qo  # else this test shows nothing
    model = saved(chain(dict(N=128, K=128, block=64), dict(N=1024, K=128, block=64)), tmp_path)
    code, out, _ = accelerate(capsys, model, "-o", tmp_path / "out")
    assert code == 0, out
    specs = load_specs(tmp_path / "out" / "model.imegen")
    kernels = by_name(specs)
    s0, s1 = serve(specs, need(128, 128, block=64)), serve(specs, need(1024, 128, block=64))
    g0, g1 = kernels[s0.gemm[0][1]], kernels[s1.gemm[0][1]]
    # k/v's 8x8 winner packs in panels of 8, and its tie in panels of 16 packs as the gemv does (taken);
    # q/o's 8x12 winner has no such tie (12-column panels)
    assert kv["panel"] == 8 and settings_of(g0) == {**kv, "zero_point": "symmetric", "panel": 16}
    assert g0.shapes == ((128, 128),)
    assert settings_of(g1) == {**qo, "zero_point": "symmetric"} and g1.shapes == ((1024, 128),)
    assert s0.gemv == s1.gemv and kernels[s0.gemv].shapes == ((128, 128), (1024, 128))
    assert s0.fallback == s1.fallback
    assert len(specs) == 4
    assert [line.split(":")[0] for line in out.splitlines()[:2]] == [
        "served mm0 (N=128, K=128, 4-bit block 64 symmetric, level 4)", "served mm1 (N=1024, K=128, 4-bit block 64 symmetric, level 4)"]
    text = comments(tmp_path / "out" / "model.imegen")
    assert "tuned k/v 128x896 M=128 block=64, the nearest tuned shape" in text
    assert "tuned q/o 896x896 M=128 block=64, the nearest tuned shape" in text


def test_configs_the_validator_refuses_fall_back_to_builtin_ones(tmp_path, capsys, built):
    """8-bit: the tuned 4-bit staged gemm is refused (stage_b needs bits 4); block 16: the tuned gemv's
    k_unroll 4 is refused (K step 32). Both take ort-check's built-in IME settings, the message recorded."""
    model = saved(chain(dict(N=64, K=64, bits=8, block=32), dict(N=64, K=64, bits=4, block=16)), tmp_path)
    assert accelerate(capsys, model, "-o", tmp_path / "out")[0] == 0
    text = comments(tmp_path / "out" / "model.imegen")
    specs = by_name(load_specs(tmp_path / "out" / "model.imegen"))
    s8 = serve(list(specs.values()), need(64, 64, bits=8))
    s16 = serve(list(specs.values()), need(64, 64, block=16))
    g8 = specs[s8.gemm[0][1]]
    assert (g8.target, g8.tile_m, g8.tile_n, g8.stage_b, g8.bits) == ("ime", 4, 16, "tile", 8)
    assert "stage_b = m_block stages unpacked int4 B" in text
    v16 = specs[s16.gemv]
    assert (v16.target, v16.block, v16.block % (8 * v16.k_unroll)) == ("ime", 16, 0)
    assert "block 16 is not a multiple of the K step 8*k_unroll = 32" in text
    assert text.count("ort-check's built-in ime int8") >= 2


def test_a_differing_long_prompt_winner_adds_a_min_rows_kernel():
    """The committed table's M=512 winners equal its M=128 ones; a table where one differs gives that shape a
    second gemm kernel from 256 rows on, and serve() routes M by it."""
    table = acc.tuning_table()
    other = {**tuned("k/v", 128, 32), "stage_b": "tile", "tile": "4x16", "panel": 16, "scale_type": "fp32"}
    other.pop("a_scale_type")
    changed = [acc.TunedCase(c.shape, c.N, c.K, c.M, c.block, tuple(sorted(other.items())))
               if (c.shape, c.M, c.block) == ("k/v", 512, 32) else c for c in table]
    nodes = [acc.InspectedNode("kv", need(128, 896)), acc.InspectedNode("qo", need(896, 896))]
    d = acc.derive(nodes, table=changed)
    kernels = by_name(d.specs)
    s_kv, s_qo = serve(d.specs, nodes[0].need), serve(d.specs, nodes[1].need)
    assert [rows for rows, _ in s_kv.gemm] == [2, 256] and len(s_qo.gemm) == 1
    long = kernels[s_kv.gemm[1][1]]
    assert (long.min_rows, long.tile_m, long.tile_n, long.shapes) == (256, 4, 16, ((128, 896),))
    assert s_kv.kernel_for(255) == s_kv.gemm[0][1] == s_qo.gemm[0][1] and s_kv.kernel_for(256) == long.name
    assert "M=2..255" in s_kv.describe() and "M=256+" in s_kv.describe()


def test_derived_kernels_generate(tmp_path):
    """Every kernel a mixed model derives plans and renders into the library's sources (the validator's
    promise, checked without compiling)."""
    layers = [dict(N=64, K=64, bits=bits, block=block, symmetric=sym, bias=bias, level=level)
              for bits, block, sym, bias, level in [(4, 32, False, True, 4), (8, 64, True, True, 4), (4, 128, True, False, 4),
                                                    (4, 256, False, True, 0), (8, 16, False, False, 4)]]
    d = acc.derive(acc.inspect_model(chain(*layers)))
    assert len(d.intended) == 5
    files = customop.render_library(customop.library_plans(d.specs), "model.imegen")
    assert all(f"{s.name}.c" in files for s in d.specs)


# ----------------------------------------------------------------------------- nodes kept in ORT
@pytest.mark.parametrize("case, reason", [
    (dict(float16=True), "T is float16: imegen's kernels take and return float32 (keep the node in ORT)"),
    (dict(g_idx=True), "g_idx (act-order) is not supported"),
    (dict(b_input=True), "B (mm0.B) is not a constant initializer"),
], ids=["float16", "g_idx", "non_constant_B"])
def test_unservable_nodes_are_kept_with_their_reason(tmp_path, capsys, built, case, reason):
    float16 = case.pop("float16", False)
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    (out_dir / "libimegen_ort.so").write_bytes(b"stale")  # an earlier run's: must not survive to be loaded
    (out_dir / "report.txt").write_text("served mm0 ...\n")  # (a folder an earlier run wrote holds its report)
    model = saved(chain(dict(N=64, K=64, **case), float16=float16), tmp_path)
    code, out, err = accelerate(capsys, model, "-o", out_dir)
    assert code == 3
    assert out.splitlines() == [f"kept mm0: {reason}",
                                f"0 of 1 MatMulNBits nodes served; 1 kept (1 {reason}); no library built"]
    assert not built and sorted(p.name for p in out_dir.iterdir()) == ["report.txt"]


def test_partly_served_model_exits_3_and_keeps_the_rest(tmp_path, capsys, built):
    model = saved(chain(dict(N=64, K=64), dict(N=64, K=64, g_idx=True), dict(N=32, K=64, b_input=True)), tmp_path)
    code, out, _ = accelerate(capsys, model, "-o", tmp_path / "out")
    assert code == 3
    lines = out.splitlines()
    assert lines[0].startswith("served mm0 ") and lines[1:3] == [
        "kept mm1: g_idx (act-order) is not supported", "kept mm2: B (mm2.B) is not a constant initializer"]
    assert lines[-1] == ("1 of 3 MatMulNBits nodes served; 2 kept (1 g_idx (act-order) is not supported; "
                         "1 B (mm2.B) is not a constant initializer)")
    domains = [n.domain for n in onnx.load(str(tmp_path / "out" / "model.onnx")).graph.node]
    assert domains == [customop.DOMAIN, MS, MS]


def test_a_model_without_matmulnbits_says_so(tmp_path, capsys, built):
    graph = helper.make_graph([helper.make_node("Relu", ["X"], ["Y"])], "g",
                              [helper.make_tensor_value_info("X", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [2])])
    model = saved(helper.make_model(graph), tmp_path)
    code, out, _ = accelerate(capsys, model, "-o", tmp_path / "out")
    assert code == 3 and not built
    assert out.splitlines() == ["0 of 0 MatMulNBits nodes served: the model has no com.microsoft MatMulNBits node, "
                                "so there is nothing to accelerate (nothing written but this report)"]


# ----------------------------------------------------------------------------- options and errors
def test_compute_int8_moves_fp32_nodes_to_ime_and_says_numerics_change(tmp_path, capsys, built):
    model = saved(chain(dict(N=64, K=64, level=0)), tmp_path)
    code, out, _ = accelerate(capsys, model, "-o", tmp_path / "out", "--compute", "int8")
    assert code == 0
    assert "level 0 -> 4)" in out.splitlines()[0]
    assert any(line.startswith("note: --compute int8") and "fp32 contract" in line for line in out.splitlines())
    specs = load_specs(tmp_path / "out" / "model.imegen")
    s = serve(specs, need(64, 64, level=4))
    assert by_name(specs)[s.gemv].target == "ime" and s.fallback
    (node,) = onnx.load(str(tmp_path / "out" / "model.onnx")).graph.node
    assert helper.get_attribute_value(next(a for a in node.attribute if a.name == "accuracy_level")) == 4


def test_compute_fp32_runs_level_4_nodes_on_rvv_fp32(tmp_path, capsys, built):
    model = saved(chain(dict(N=64, K=64, level=4)), tmp_path)
    code, out, _ = accelerate(capsys, model, "-o", tmp_path / "out", "--compute", "fp32")
    assert code == 0 and "level 4 -> 0)" in out.splitlines()[0]
    specs = load_specs(tmp_path / "out" / "model.imegen")
    assert {(s.target, s.compute) for s in specs} == {("rvv", "fp32")}
    (node,) = onnx.load(str(tmp_path / "out" / "model.onnx")).graph.node
    assert helper.get_attribute_value(next(a for a in node.attribute if a.name == "accuracy_level")) == 0


def test_a_given_spec_is_used_as_is(tmp_path, capsys, built):
    spec = tmp_path / "mine.imegen"
    spec.write_text("kernel any_gemm { op = gemm bits = 4 block = 32 compute = int8 target = ime tile = 4x16 }\n")
    model = saved(chain(dict(N=64, K=64)), tmp_path)
    code, out, _ = accelerate(capsys, model, "-o", tmp_path / "out", "--spec", spec)
    assert code == 0 and out.splitlines()[0].endswith("): M=1+ any_gemm")
    assert (tmp_path / "out" / "model.imegen").read_text() == spec.read_text()
    assert [s.name for s in built[-1][0]] == ["any_gemm"]


@pytest.mark.parametrize("args, message", [
    (["--spec", "SPEC"], "TMP/mine.imegen:1:17: error: 'op' must be one of"),
], ids=["bad_spec"])
def test_user_errors_are_one_line_exit_2(tmp_path, capsys, built, args, message):
    (tmp_path / "mine.imegen").write_text("kernel k { op = nonsense }\n")
    model = saved(chain(dict(N=64, K=64)), tmp_path)
    args = [str(tmp_path / "mine.imegen") if a == "SPEC" else a for a in args]
    code, out, err = accelerate(capsys, model, "-o", tmp_path / "out", *args)
    assert code == 2 and err.startswith(message.replace("TMP", str(tmp_path))) and len(err.strip().splitlines()) == 1 and not out


def test_a_file_that_is_not_a_model_is_a_one_line_error(tmp_path, capsys):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"\xff\x00 not protobuf at all" * 10)
    code, out, err = accelerate(capsys, bad, "-o", tmp_path / "out")
    assert code == 2 and err.startswith(f"error: {bad}: not an ONNX model") and len(err.splitlines()) == 1
    code, _, err = accelerate(capsys, tmp_path / "missing.onnx", "-o", tmp_path / "out")
    assert code == 2 and err == f"error: {tmp_path / 'missing.onnx'}: no such model file\n"


def test_external_data_is_placed_once_next_to_the_new_model(tmp_path, capsys, built):
    model = chain(dict(N=64, K=64, block=32), dict(N=48, K=64, block=32))
    original = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    src = tmp_path / "src"
    (src / "weights").mkdir(parents=True)
    onnx.save(model, str(src / "m.onnx"), save_as_external_data=True, location="weights/w.bin", size_threshold=0)
    code, _, err = accelerate(capsys, src / "m.onnx", "-o", tmp_path / "out")
    assert code == 0 and "external data weights/w.bin" in err
    placed = tmp_path / "out" / "weights" / "w.bin"
    assert placed.read_bytes() == (src / "weights" / "w.bin").read_bytes()
    assert placed.stat().st_nlink == 1  # onnx.load refuses hard-linked external data
    before = placed.stat()
    code, _, err = accelerate(capsys, src / "m.onnx", "-o", tmp_path / "out")
    assert code == 0 and "external data" not in err  # identical: not placed again
    assert (placed.stat().st_ino, placed.stat().st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    loaded = onnx.load(str(tmp_path / "out" / "model.onnx"))  # with its external data, from out/
    for t in loaded.graph.initializer:
        np.testing.assert_array_equal(numpy_helper.to_array(t), original[t.name])


# ----------------------------------------------------------------------------- the real thing
def test_end_to_end_in_riscv64_onnxruntime(tmp_path, capsys):
    """A mixed model through `ort-accelerate --flavour qemu`, run in Debian's riscv64 ORT 1.23 under QEMU with
    the library, against stock ORT on the original model: within ORT's level-4 tolerance, every node routed to
    the kernels the report names, and every chosen kernel called once per node and Run that needs it."""
    from imegen.ort.customop import parse_routes, parse_stats
    from imegen.ort.model_check import compare_outputs
    from imegen.ort.riscv import RiscvSession

    layers = [dict(N=128, K=128, block=64, symmetric=True, level=4),  # nearest k/v: its prefill tile
              dict(N=1024, K=128, block=64, symmetric=True, bias=True, level=4),  # nearest q/o: another tile
              dict(N=96, K=1024, bits=8, block=32, symmetric=False, bias=True, level=4),  # built-in IME gemm
              dict(N=64, K=96, block=16, symmetric=False, level=0)]  # rvv fp32
    model = saved(chain(*layers), tmp_path)
    code, out, _ = accelerate(capsys, model, "-o", tmp_path / "out", "--flavour", "qemu")
    assert code == 0, out
    routes = {m.group(1): m.group(2) for m in re.finditer(r"^served (\S+) \([^)]*\): (.*)$", out, re.M)}
    assert len(routes) == 4 and len({r.split(",")[1] for r in routes.values()}) == 4  # four different gemm kernels
    lib, rewritten = tmp_path / "out" / "libimegen_ort.so", tmp_path / "out" / "model.onnx"
    rng = np.random.default_rng(7)
    feeds = [rng.normal(0, 1, (1, M, 128)).astype(np.float32) for M in (1, 5)]
    with RiscvSession(model, "1.23") as s:
        stock = [s.run({"A": a}) for a in feeds]
    with RiscvSession(rewritten, "1.23", custom_ops=lib, threads=2) as s:
        mine = [s.run({"A": a}) for a in feeds]
        text = s.stats()
    for y0, y1 in zip(stock, mine):
        (agreement,) = compare_outputs(y0, y1, 4)
        assert agreement.ok, agreement
    assert parse_routes(text) == routes
    stats = parse_stats(text)
    specs = load_specs(tmp_path / "out" / "model.imegen")
    expected = {s.name: 0 for s in specs}
    for i, layer in enumerate(layers):
        s = serve(specs, need(layer["N"], layer["K"], layer.get("bits", 4), layer["block"], layer["symmetric"],
                              layer.get("bias", False), layer["level"]))
        expected[s.kernel_for(1)] += 1
        expected[s.kernel_for(5)] += 1
    assert {name: stats[name] for name in expected} == expected
    assert stats["vmadots"] > 0 and stats["slices_fallback"] == 0


@pytest.mark.skipif(not GENAI.is_dir(), reason="no committed onnxruntime-genai exports")
def test_genai_exports_are_served_whole(tmp_path, capsys):
    """Every committed onnxruntime-genai export: every MatMulNBits node served (exit 0), with the real build."""
    folders = sorted(p.parent for p in GENAI.glob("*/model.onnx"))
    assert folders
    for folder in folders:
        code, out, _ = accelerate(capsys, folder / "model.onnx", "-o", tmp_path / folder.name)
        nodes = acc.matmul_nbits_nodes(onnx.load(str(folder / "model.onnx"), load_external_data=False))
        assert code == 0, (folder.name, out)
        assert sum(line.startswith("served ") and "(N=" in line for line in out.splitlines()) == len(nodes) > 0
        assert "other decoder nodes on imegen's RVV operators" in out.splitlines()[-1]  # and every other node
        assert (tmp_path / folder.name / "libimegen_ort.so").stat().st_size > 0
        assert os.path.exists(tmp_path / folder.name / "model.onnx.data")


@pytest.mark.skipif(not (GENAI / "qwen2_tiny_int4_b32").is_dir(), reason="no committed onnxruntime-genai export")
def test_genai_export_runs_in_riscv64_onnxruntime(tmp_path, capsys):
    """A genai int4 export (symmetric, block 32, level 4) accelerated, prefill then a decode step, against stock
    ORT: within level-4 tolerance, with the gemm kernel on the prefill and the gemv kernel on the decode step."""
    from imegen.ort.customop import parse_stats
    from imegen.ort.model_check import compare_outputs, random_inputs
    from imegen.ort.riscv import RiscvSession

    src = GENAI / "qwen2_tiny_int4_b32" / "model.onnx"
    code, out, _ = accelerate(capsys, src, "-o", tmp_path / "out", "--flavour", "qemu")
    assert code == 0, out
    model = onnx.load(str(src), load_external_data=False)
    nodes = len(acc.matmul_nbits_nodes(model))
    specs = load_specs(tmp_path / "out" / "model.imegen")
    head_size = json.loads((src.parent / "genai_config.json").read_text())["model"]["decoder"]["head_size"]
    calls = {}
    for seq in (5, 1):
        dims = {"batch_size": 1, "sequence_length": seq, "past_sequence_length": 3, "total_sequence_length": 3 + seq,
                "kv_cache_dim": head_size}
        feeds = random_inputs(model, seq, dims)
        with RiscvSession(src, "1.23") as s:
            stock = s.run(feeds)
        with RiscvSession(tmp_path / "out" / "model.onnx", "1.23", custom_ops=tmp_path / "out" / "libimegen_ort.so",
                          threads=2) as s:
            mine = s.run(feeds)
            calls[seq] = parse_stats(s.stats())
        assert all(o.ok for o in compare_outputs(stock, mine, 4)), compare_outputs(stock, mine, 4)
    gemv = [s.name for s in specs if s.op == "gemv"]
    gemm = [s.name for s in specs if s.op == "gemm" and not s.fallback]
    assert len(gemv) == len(gemm) == 2  # the q/k/v nodes took their bias Add (folded): kernels with bias
    total = lambda seq, names: sum(calls[seq][n] for n in names)  # noqa: E731
    assert (total(5, gemm), total(5, gemv), total(1, gemv), total(1, gemm)) == (nodes, 0, nodes, 0)


def test_a_folder_imegen_did_not_write_is_not_overwritten(tmp_path, capsys, built):
    """-o naming a folder that holds someone's model.onnx (not MODEL) must neither replace nor delete it."""
    theirs = tmp_path / "models"
    theirs.mkdir()
    (theirs / "model.onnx").write_bytes(b"the user's other model")
    model = saved(chain(dict(N=64, K=64, block=32)), theirs, name="qwen.onnx")
    code, _, err = accelerate(capsys, model, "-o", theirs)
    assert code == 2 and "which imegen ort-accelerate did not write" in err
    assert (theirs / "model.onnx").read_bytes() == b"the user's other model"


def test_an_empty_file_is_not_a_model(tmp_path, capsys):
    (tmp_path / "empty.onnx").write_bytes(b"")
    code, _, err = accelerate(capsys, tmp_path / "empty.onnx", "-o", tmp_path / "out")
    assert code == 2 and "not an ONNX model (it holds no graph)" in err
