"""A K3 user's path: `imegen ort-accelerate --target k3` and a custom-op library of IME2 kernels (target ime2,
the A100 cores, VLEN 1024) in Debian's real riscv64 onnxruntime 1.23 under QEMU at VLEN 1024, against stock ORT
on the original model (ORT's own MatMulNBits: the independent reference), with imegen's IME2 emulator.

- The library runs IME2 only on a thread confined to the harts IMEGEN_IME_HARTS names (on a K3: the A100 harts
  its /proc/cpuinfo marchid names, tests/test_serving.py); the IME2 emulator kills an IME2 instruction
  elsewhere, as a stand-in for an X100 core (which, unlike the emulator, would give wrong numbers silently).
- ort-accelerate --target k3 derives IME2 gemv/gemm kernels and the fallback for the model's groups, keeps what
  IME2 cannot serve with the reason, and the real onnxruntime-genai export greedy-decodes the same tokens.
"""

import os
import subprocess

import numpy as np
import onnx
import pytest

import imegen
from imegen import targets, toolchain
from imegen.cli import main
from imegen.ir import load_specs
from imegen.ort import accelerate as acc
from imegen.ort import ort_check as oc
from imegen.ort.customop import CustomOpError, build_library, parse_routes, parse_stats
from imegen.ort.model_check import compare_outputs, model_check
from imegen.ort.riscv import RiscvSession
from imegen.ort.serving import NodeNeeds

import ort_two_nodes
from test_accelerate import GENAI, ROOT, chain, saved

VLEN = 1024
K = 256
SPEC = """
defaults { bits = 4 block = 32 zero_point = asymmetric compute = int8 }
kernel k3_gemv { op = gemv target = ime2 tile = 1x32 k_unroll = 2 unpack = interleaved panel = 32 }
kernel k3_gemm { op = gemm target = ime2 tile = 16x32 k_unroll = 2 unpack = interleaved panel = 32 }
kernel fb      { op = gemm target = rvv vlen = 256 tile = 2x16 fallback = yes }
"""
NODES = {"n_a": 96, "n_b": 160}  # name -> N


def two_node_model(rng):
    return ort_two_nodes.two_node_model(rng, NODES, K, symmetric=False)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("k3")
    specs = imegen.load_spec(SPEC)
    model = two_node_model(np.random.default_rng(3))
    onnx.save(model, tmp / "stock.onnx")
    assert all(d.moved for d in imegen.rewrite_model(model, specs))
    onnx.save(model, tmp / "imegen.onnx")
    rng = np.random.default_rng(4)
    feeds = [{"A": rng.normal(0, 0.5, (M, K)).astype(np.float32)} for M in (1, 7, 19)]
    with RiscvSession(tmp / "stock.onnx", "1.23", vlen=VLEN) as s:
        stock = [s.run(f) for f in feeds]
    return tmp / "imegen.onnx", build_library(specs), feeds, stock


def run_imegen(setup, monkeypatch, harts, *, cpus=None):
    """Every feed through ORT + imegen at VLEN 1024 on the harts named, checked within ORT's level-4 tolerance of
    stock ORT; returns the library's stats text."""
    model, lib, feeds, stock = setup
    text, outs = ort_two_nodes.run_with_harts(model, lib, feeds, monkeypatch, harts, cpus=cpus, vlen=VLEN)
    for y0, y1 in zip(stock, outs):
        assert all(o.ok for o in compare_outputs(y0, y1, 4)), compare_outputs(y0, y1, 4)
    return text


def test_ime2_kernels_serve_matmulnbits_in_real_ort(setup, monkeypatch):
    text = run_imegen(setup, monkeypatch, None)
    stats = parse_stats(text)
    # M = 1 on the gemv, 7 and 19 on the gemm, for both nodes; nothing on the fallback
    assert (stats["k3_gemv"], stats["k3_gemm"], stats["fb"]) == (2, 4, 0)
    assert stats["vmadots"] > 0 and stats["slices_fallback"] == 0
    assert parse_routes(text)["n_a"] == "M=1 k3_gemv, M=2+ k3_gemm, no IME hart: fb"
    # a K3 has 8 A100 cores: B is cut into up to 8 column slices (N = 160: five of 32 columns)
    assert stats["slices_on_ime"] == 3 * (96 // 32 + 160 // 32)
    # A quantized on an A100 hart too (its quantizer is written for VLEN 1024; an X100 has 256): once per node and feed
    assert stats["prepares_on_ime"] + stats["prepares_pinned"] == 2 * 3


def test_no_ime2_hart_runs_every_slice_on_the_fallback(setup, monkeypatch):
    stats = parse_stats(run_imegen(setup, monkeypatch, ""))
    assert stats["vmadots"] == 0 and stats["fb"] == 6 and stats["slices_on_ime"] == stats["slices_pinned"] == 0
    assert stats["prepares_on_ime"] == stats["prepares_pinned"] == 0


def test_threads_elsewhere_are_moved_to_an_ime2_hart(setup, monkeypatch):
    """The QEMU process starts on host CPU 1 and only hart 0 has IME2: every IME2 slice must move there (under
    QEMU there is no /proc/set_ai_thread, so the library pins), or the emulator kills the process."""
    if len(os.sched_getaffinity(0)) < 2:
        pytest.fail("this test needs two CPUs (CI has two): one with IME2, one without")
    stats = parse_stats(run_imegen(setup, monkeypatch, "0", cpus={1}))
    assert stats["vmadots"] > 0 and stats["slices_fallback"] == 0 and stats["slices_pinned"] > 0
    assert stats["slices_on_ime"] == 0
    # the calling thread (on hart 1) quantizes A on hart 0, where the kernels' VLEN is, and comes back
    assert stats["prepares_pinned"] == 2 * 3 and stats["prepares_on_ime"] == 0


def test_an_ime2_instruction_on_a_hart_without_ime2_dies(monkeypatch):
    """The counter-test of the one above: an IME2 kernel's own test driver, which nothing pins, started on host
    CPU 1 with only hart 0 named, dies at its first IME2 instruction; named, it runs."""
    if len(os.sched_getaffinity(0)) < 2:
        pytest.fail("this test needs two CPUs (CI has two): one with IME2, one without")
    kernel = imegen.build_kernel(imegen.load_spec(SPEC), "k3_gemv")
    qw = oc.ort_quantized_weights(np.random.default_rng(0).normal(0, 0.25, (K, 32)).astype(np.float32), 4, 32, False)
    A = np.ones((1, K), np.float32)
    monkeypatch.setattr(toolchain, "_on_named_ime_harts", lambda ime: [])
    with ort_two_nodes.on_cpus({1}):
        monkeypatch.setenv("IMEGEN_IME_HARTS", "1")
        assert kernel.run(A, qw.data, qw.scales, qw.zero_points, K=K, vlen=VLEN).shape == (1, 32)
        monkeypatch.setenv("IMEGEN_IME_HARTS", "0")
        with pytest.raises(toolchain.ToolchainError, match="IME2 emulator: an IME2 .* on hart 1, which "
                                                           "IMEGEN_IME_HARTS does not name"):
            kernel.run(A, qw.data, qw.scales, qw.zero_points, K=K, vlen=VLEN)


def test_the_hardware_library_routes_threads_to_the_a100_cores():
    """What a K3 loads: no emulator, the A100 marchid and the kernel's routing file compiled in."""
    lib = build_library(imegen.load_spec(SPEC), flavour="hardware")
    data = lib.read_bytes()
    assert b"/proc/set_ai_thread" in data and b"SpacemiT K3" in data and b"emu" not in data.replace(b"emulat", b"")
    nm = subprocess.run(["llvm-nm-19", "-D", "--defined-only", str(lib)], capture_output=True, text=True)
    if nm.returncode == 0:
        assert {line.split()[-1] for line in nm.stdout.splitlines()} == {"RegisterCustomOps", "imegen_ort_stats"}


def test_one_library_serves_one_board():
    specs = imegen.load_spec(SPEC + "kernel k1_gemv { op = gemv target = ime tile = 1x16 }\n")
    with pytest.raises(CustomOpError, match="'k3_gemv' \\(target ime2\\) and 'k1_gemv' \\(target ime\\): one "
                                            "custom-op library serves one board"):
        build_library(specs)


# ----------------------------------------------------------------------------- ort-accelerate --target k3
def derived(*needs: NodeNeeds, compute=None):
    nodes = acc.for_board([acc.InspectedNode(f"n{i}", n) for i, n in enumerate(needs)], acc.BOARDS["k3"], compute)
    return nodes, acc.derive(nodes, compute=compute, board=acc.BOARDS["k3"])


def test_k3_derives_ime2_kernels_sharing_one_packed_b():
    from imegen.ort.customop import packing
    from imegen.plan import plan_kernel

    nodes, d = derived(NodeNeeds(4, 32, 4, False, False, N=896, K=896), NodeNeeds(8, 64, 4, True, True, N=128, K=896))
    assert not any(n.why_not for n in nodes)
    ime2 = [s for s in d.specs if s.target == "ime2"]
    assert sorted((s.bits, s.op) for s in ime2) == [(4, "gemm"), (4, "gemv"), (8, "gemm"), (8, "gemv")]
    assert all(s.fallback and s.target == "rvv" and s.vlen == 256 for s in d.specs if s not in ime2)
    for bits in (4, 8):  # a group's gemv and gemm pack B alike: one copy of B per node
        assert len({packing(plan_kernel(s)) for s in ime2 if s.bits == bits}) == 1
    assert "on a SpacemiT K3" in d.text and "not tuned per shape" in d.text


def test_k3_configs_are_the_example_spec_imegen_check_passes():
    """ort-accelerate --target k3's kernels are examples/ime2_k3.imegen's 4-bit ones (test_ime2_kernels checks it)."""
    example = {s.op: s for s in load_specs(ROOT / "examples" / "ime2_k3.imegen") if s.bits == 4}
    target = targets.get(acc.BOARDS["k3"].ime_target)
    for op in ("gemv", "gemm"):
        spec, settings = example[op], target.serving_settings(op, example[op].block)
        assert {"tile": f"{spec.tile_m}x{spec.tile_n}", "unpack": spec.unpack, "panel": spec.panel} == \
            {k: v for k, v in settings.items() if k != "k_unroll"}
        assert spec.k_unroll == 2 == settings["k_unroll"]


def test_k3_keeps_what_ime2_cannot_serve_with_the_reason():
    nodes, d = derived(NodeNeeds(4, 16, 4, False, False, N=896, K=896), NodeNeeds(8, 16, 4, False, False, N=64, K=64))
    assert nodes[0].why_not.startswith("no SpacemiT K3 kernel (target = ime2) for 4-bit block 16: 4-bit IME2 needs an even "
                                       "k_unroll")
    assert not nodes[1].why_not  # 8-bit block 16: k_unroll 1
    assert [(s.bits, s.block, s.k_unroll) for s in d.specs if s.target == "ime2"] == [(8, 16, 1), (8, 16, 1)]


def test_k3_fp32_compute_runs_on_rvv(tmp_path, capsys):
    model = saved(chain(dict(N=64, K=64, level=0)), tmp_path)
    assert main(["ort-accelerate", str(model), "-o", str(tmp_path / "out"), "--target", "k3"]) == 0
    specs = load_specs(tmp_path / "out" / "model.imegen")
    assert {s.target for s in specs} == {"rvv"}


@pytest.mark.skipif(not (GENAI / "qwen2_tiny_int4_b32").is_dir(), reason="no committed onnxruntime-genai export")
def test_a_genai_export_on_the_k3_decodes_the_same_tokens(tmp_path, capsys):
    """onnxruntime-genai's own int4 export, accelerated for the K3 (every MatMulNBits on IME2 kernels, the decoder
    ops on RVV at VLEN 1024): prefill, then 8 greedy tokens identical to stock ORT's, each step within ORT's
    level-4 tolerance, every IME2 kernel and decoder operator called."""
    src = GENAI / "qwen2_tiny_int4_b32" / "model.onnx"
    # exit 0: every MatMulNBits and every other decoder node served
    assert main(["ort-accelerate", str(src), "-o", str(tmp_path / "out"), "--target", "k3", "--flavour", "qemu"]) == 0
    specs = load_specs(tmp_path / "out" / "model.imegen")
    attention = imegen.load_attention(tmp_path / "out" / "model.imegen")
    check = model_check(specs, src, spec_file="model.imegen", generate=8, attention=attention)
    assert check.ok, check.report()
    assert check.tokens_agree and len(check.generated[0]) == 8, check.generated
    assert check.stats["vmadots"] > 0 and not check.idle_decoder_ops
    ran = {k for k in (s.name for s in specs) if check.stats.get(k, 0) > 0}
    assert ran == {s.name for s in specs if s.target == "ime2"}


def test_qwen_shapes_on_the_k3_decode_the_same_tokens(tmp_path, capsys):
    """imegen's model in onnxruntime-genai's form at Qwen2.5-0.5B's widths (q/k/v 896x1152, o 896x896, gate/up
    896x4864, down 4864x896; 2 layers, an untied lm_head of 2048 so greedy tokens move), accelerated for the K3:
    prefill of 5 tokens after 7 cached, then 8 greedy tokens identical to stock ORT's, every step within ORT's
    level-4 tolerance, on IME2 kernels only (no slice on the fallback)."""
    model = tmp_path / "qwen.onnx"
    assert main(["qwen-model", str(model), "--layers", "2", "--vocab", "2048", "--untied"]) == 0
    assert main(["ort-accelerate", str(model), "-o", str(tmp_path / "out"), "--target", "k3", "--flavour", "qemu"]) == 0
    capsys.readouterr()
    specs = load_specs(tmp_path / "out" / "model.imegen")
    check = model_check(specs, model, spec_file="model.imegen", generate=8,
                        attention=imegen.load_attention(tmp_path / "out" / "model.imegen"))
    assert check.ok and check.tokens_agree, check.report()
    assert len(set(check.generated[0])) > 1, check.generated  # tokens that move: the agreement says something
    assert check.stats["vmadots"] > 0 and check.stats["slices_fallback"] == 0 and not check.idle_decoder_ops
    assert {s.name for s in specs if check.stats.get(s.name, 0) > 0} == {s.name for s in specs if s.target == "ime2"}


# --- --decode hp: the .hp gemv (hp_blocks) for decode --------------------------------------------------------

def test_decode_hp_derives_the_hp_gemv_where_the_group_is_in_its_format():
    """By default on the K3, 4-bit symmetric block 32 (Q4_0's format) decodes through the .hp gemv and prefills on
    the gemm reading the same packed B; a group the .hp gemv does not take (asymmetric, block 64) keeps the int8
    gemv and gemm; --decode int8 keeps them everywhere."""
    from imegen.ort.customop import packing
    from imegen.plan import plan_kernel

    board = acc.BOARDS["k3"]
    assert board.hp_decode  # the K3's default
    needs = [NodeNeeds(4, 32, 4, False, False, N=896, K=896), NodeNeeds(4, 32, 4, True, False, N=128, K=896),
             NodeNeeds(4, 64, 4, False, False, N=896, K=896)]
    nodes = acc.for_board([acc.InspectedNode(f"n{i}", n) for i, n in enumerate(needs)], board, None)
    d = acc.derive(nodes, board=board)
    gemvs = {(s.zero_point, s.block): s for s in d.specs if s.target == "ime2" and s.op == "gemv"}
    assert (gemvs[("symmetric", 32)].hp_blocks, gemvs[("symmetric", 32)].scale_type) == (2, "fp16")
    assert gemvs[("asymmetric", 32)].hp_blocks == 0 == gemvs[("symmetric", 64)].hp_blocks
    gemms = {(s.zero_point, s.block): s for s in d.specs if s.target == "ime2" and s.op == "gemm"}
    assert gemms[("symmetric", 32)].b_pack == "hp" and gemms[("symmetric", 32)].hp_blocks == 0
    assert gemms[("asymmetric", 32)].b_pack == "plain" == gemms[("symmetric", 64)].b_pack
    for group in gemvs:  # one packed copy of B per node: its gemv and gemm pack alike
        assert packing(plan_kernel(gemvs[group])) == packing(plan_kernel(gemms[group]))
    assert "block-scaled FP16 vmadots" in d.text
    plain = acc.derive(nodes, board=acc.replace(board, hp_decode=False))  # --decode int8
    assert not any(s.hp_blocks or s.b_pack == "hp" for s in plain.specs)


def test_decode_hp_is_refused_where_it_means_nothing(tmp_path, capsys):
    model = saved(chain(dict(N=64, K=64, level=4)), tmp_path)
    assert main(["ort-accelerate", str(model), "-o", str(tmp_path / "a"), "--decode", "hp"]) == 2
    assert "the SpacemiT K1's ime has no block-scaled FP16 vmadot" in capsys.readouterr().err
    spec = tmp_path / "s.imegen"
    spec.write_text(SPEC)
    assert main(["ort-accelerate", str(model), "-o", str(tmp_path / "b"), "--target", "k3", "--decode", "hp",
                 "--spec", str(spec)]) == 2
    assert "with --spec the spec's are used" in capsys.readouterr().err


@pytest.mark.skipif(not (GENAI / "qwen2_tiny_int4_b32").is_dir(), reason="no committed onnxruntime-genai export")
def test_a_genai_export_decodes_the_same_tokens_through_the_hp_gemv(tmp_path, capsys):
    """onnxruntime-genai's own int4 export (symmetric, block 32) with --decode hp: 8 greedy tokens identical to stock
    ORT's, every step within ORT's level-4 tolerance, decode on the .hp gemv (it ran), prefill on the int8 gemm."""
    src = GENAI / "qwen2_tiny_int4_b32" / "model.onnx"
    assert main(["ort-accelerate", str(src), "-o", str(tmp_path / "out"), "--target", "k3", "--flavour", "qemu",
                 "--decode", "hp"]) == 0
    specs = load_specs(tmp_path / "out" / "model.imegen")
    hp = {s.name for s in specs if s.hp_blocks}
    assert hp and all(s.op == "gemv" for s in specs if s.hp_blocks)
    check = model_check(specs, src, spec_file="model.imegen", generate=8,
                        attention=imegen.load_attention(tmp_path / "out" / "model.imegen"))
    assert check.ok and check.tokens_agree and len(check.generated[0]) == 8, check.report()
    assert all(check.stats.get(name, 0) > 0 for name in hp), check.stats
    assert any(check.stats.get(s.name, 0) > 0 for s in specs if s.target == "ime2" and s.op == "gemm")


def test_qwen_shapes_decode_the_same_tokens_through_the_hp_gemv(tmp_path, capsys):
    """Qwen2.5-0.5B's widths with symmetric block-32 weights (genai's form) and --decode hp: down's K = 4864 is the
    accuracy study's worst case. 8 greedy tokens identical to stock ORT's, every step within ORT's level-4
    tolerance, every .hp gemv called, nothing on the fallback."""
    model = tmp_path / "qwen.onnx"
    assert main(["qwen-model", str(model), "--layers", "2", "--vocab", "2048", "--untied", "--symmetric"]) == 0
    assert main(["ort-accelerate", str(model), "-o", str(tmp_path / "out"), "--target", "k3", "--flavour", "qemu",
                 "--decode", "hp"]) == 0
    capsys.readouterr()
    specs = load_specs(tmp_path / "out" / "model.imegen")
    hp = {s.name for s in specs if s.hp_blocks}
    check = model_check(specs, model, spec_file="model.imegen", generate=8,
                        attention=imegen.load_attention(tmp_path / "out" / "model.imegen"))
    assert check.ok and check.tokens_agree, check.report()
    assert len(set(check.generated[0])) > 1, check.generated
    assert hp and all(check.stats.get(name, 0) > 0 for name in hp) and check.stats["slices_fallback"] == 0


def test_k3_hp_configs_are_the_example_spec_imegen_check_passes():
    """--decode hp's pair, on a Q4_0-format group, is examples/ime2_k3.imegen's q40_decode_hp_k3 and q40_prefill_hp_k3
    (test_ime2_kernels checks them)."""
    example = {s.name: s for s in load_specs(ROOT / "examples" / "ime2_k3.imegen")}
    board = acc.BOARDS["k3"]
    group = acc.Group.of(NodeNeeds(4, 32, 4, False, False, N=896, K=896))
    keys = ("op", "tile_m", "tile_n", "panel", "k_unroll", "unpack", "scale_type", "hp_blocks", "b_pack", "zero_point")
    for op, name in (("gemv", "q40_decode_hp_k3"), ("gemm", "q40_prefill_hp_k3")):
        derived = acc._validate(dict(acc.target_config(board, group, op).settings))
        assert {k: getattr(derived, k) for k in keys} == {k: getattr(example[name], k) for k in keys}


def test_an_explicit_decode_hp_that_no_node_takes_says_so(tmp_path, capsys):
    """--decode hp on a model with no node in the .hp gemv's format (asymmetric) is not a silent no-op."""
    model = saved(chain(dict(N=64, K=64, level=4, symmetric=False)), tmp_path)
    code = main(["ort-accelerate", str(model), "-o", str(tmp_path / "o"), "--target", "k3", "--flavour", "qemu",
                 "--decode", "hp"])
    out = capsys.readouterr().out
    assert code == 0 and "no served node is in the .hp gemv's format" in out
