"""A K1 user's path end to end, on the models people have: `imegen ort-accelerate MODEL -o OUT`, then
`imegen ort-model-check OUT/model.imegen MODEL --seq 5 --past 7` in Debian's real riscv64 onnxruntime 1.23
under QEMU (stock ORT against ORT + the library, IME emulated).

Models: onnxruntime-genai's layout (tests/genai_layout.py, node for node as the real exports in
tests/data/genai: fused q/k/v, symmetric int4 at blocks 32 and 128, GroupQueryAttention with its rotary
caches, SkipSimplifiedLayerNormalization, the lm_head sharing its weights with a GatherBlockQuantized
embedding), one real export, onnxruntime's own MatMulNBitsQuantizer at its defaults (block 128,
accuracy_level unset), 8-bit, and float16 (refused: kept in ORT with the reason). Every float32 node must
be served, the check must pass, and each node's calls must be on the kernels its report line names.
"""

from pathlib import Path

import onnx
import pytest

import genai_layout as gl
from imegen.cli import main
from imegen.ir import load_attention_specs, load_specs
from imegen.ort.customop import parse_stats
from imegen.ort.model_check import model_check

ROOT = Path(__file__).resolve().parents[1]
REAL_B32 = ROOT / "tests" / "data" / "genai" / "qwen2_tiny_int4_b32" / "model.onnx"


def accelerate(capsys, model: Path, out: Path) -> tuple[int, list[str]]:
    code = main(["ort-accelerate", str(model), "-o", str(out), "--flavour", "qemu"])
    return code, capsys.readouterr().out.splitlines()


def kernels_named(lines: list[str]) -> set[str]:
    """The kernels the report says the served nodes run (M=1 and M>1, not the fallback)."""
    names = set()
    for line in lines:
        if line.startswith("served ") and "(N=" in line:  # a MatMulNBits node's line (not a decoder node's)
            route = line.split("): ", 1)[1].split(", no IME hart: ")[0]
            names |= {part.split(" ")[1] for part in route.split(", ")}
    return names


def save(model: onnx.ModelProto, path: Path) -> Path:
    onnx.save(model, str(path))
    return path


@pytest.mark.parametrize("make, nodes", [
    (lambda p: gl.save_genai_model(p / "genai_b32.onnx"), 11),
    (lambda p: gl.save_genai_model(p / "genai_b128.onnx", block=128), 11),
    (lambda p: REAL_B32, 11),
], ids=["genai-layout-b32", "genai-layout-b128", "real-genai-export-b32"])
def test_a_decoder_export_is_served_whole_and_checks_out(tmp_path, capsys, make, nodes):
    model = make(tmp_path)
    code, lines = accelerate(capsys, model, tmp_path / "out")
    assert code == 0 and lines[-1].startswith(f"{nodes} of {nodes} MatMulNBits nodes served"), lines[-3:]
    spec = tmp_path / "out" / "model.imegen"
    check = model_check(load_specs(spec), model, seq=5, past=7, attention=load_attention_specs(spec))
    assert check.ok, check.report()
    ran = {k for k, v in check.stats.items() if k in check.kernels and v}
    assert ran == kernels_named(lines), (ran, check.report())  # prefill on the gemm kernels, decode on the gemv
    assert check.stats["vmadots"] > 0
    # the decoder's other nodes too: 1 + 2 x layers norms, a SiLU gate and an attention per layer
    assert "9 of 9 other decoder nodes on imegen's RVV operators" in lines[-1]
    assert all(calls for _, calls in check.decoder_calls.values()) and len(check.decoder_calls) == 4


def test_ort_quantizer_defaults_run_on_rvv_fp32(tmp_path, capsys):
    """MatMulNBitsQuantizer's defaults: block 128 and no accuracy_level (0: fp32 in ORT), so RVV fp32
    kernels serve it and the check holds it to ORT's fp32 tolerance."""
    model = save(gl.ort_quantizer_model(), tmp_path / "q.onnx")
    code, lines = accelerate(capsys, model, tmp_path / "out")
    assert code == 0, lines
    assert all("block 128" in l and "level 0" in l for l in lines if l.startswith("served "))
    check = model_check(load_specs(tmp_path / "out" / "model.imegen"), model)
    assert check.ok and check.level == 0, check.report()
    assert "vmadots" not in check.stats or check.stats["vmadots"] == 0


def test_an_8_bit_model_runs_on_ime(tmp_path, capsys):
    model = save(gl.eight_bit_model(), tmp_path / "q8.onnx")
    code, lines = accelerate(capsys, model, tmp_path / "out")
    assert code == 0 and any("8-bit" in l for l in lines), lines
    check = model_check(load_specs(tmp_path / "out" / "model.imegen"), model, version="1.23")
    assert check.ok, check.report()
    assert check.stats["vmadots"] > 0


def test_a_float16_model_is_kept_with_the_reason_and_exits_3(tmp_path, capsys):
    model = save(gl.float16_model(), tmp_path / "f16.onnx")
    code, lines = accelerate(capsys, model, tmp_path / "out")
    assert code == 3
    assert any(l.startswith("kept ") and "T is float16" in l for l in lines), lines
    assert lines[-1].startswith("0 of 2 MatMulNBits nodes served; 2 kept (2 T is float16")


def test_compute_int8_output_checks_out(tmp_path, capsys):
    """`ort-accelerate --compute int8` moves level-0 nodes onto IME as level 4; the model check of its spec
    rewrites the same way (int8_compute) and judges them by level 4's tolerance."""
    model = save(gl.ort_quantizer_model(), tmp_path / "q.onnx")
    assert main(["ort-accelerate", str(model), "-o", str(tmp_path / "out"), "--flavour", "qemu",
                 "--compute", "int8"]) == 0
    specs = load_specs(tmp_path / "out" / "model.imegen")
    assert not model_check(specs, model).moved  # level 0 as written: the int8 kernels serve none of it
    check = model_check(specs, model, compute="int8")
    assert check.ok and check.level == 4 and check.stats["vmadots"] > 0, check.report()


def test_compute_fp32_output_checks_out(tmp_path, capsys):
    """`ort-accelerate --compute fp32` runs level-4 nodes on RVV fp32 as level 0; the model check of its spec
    lowers them the same way and holds them to ORT's fp32 tolerance."""
    model = REAL_B32
    assert main(["ort-accelerate", str(model), "-o", str(tmp_path / "out"), "--flavour", "qemu",
                 "--compute", "fp32"]) == 0
    specs = load_specs(tmp_path / "out" / "model.imegen")
    assert not model_check(specs, model).moved  # level 4 as written: the fp32 kernels serve none of it
    check = model_check(specs, model, compute="fp32", seq=3, past=2)
    assert check.ok and check.level == 0 and not check.stats.get("vmadots"), check.report()


def test_ort_rewrite_keeps_external_weights_in_their_files(tmp_path, capsys):
    """ort-rewrite never loads a model's external weights into Python (a real LLM's exceed a protobuf's 2 GB):
    it writes the rewritten graph and places the data files next to it, and the result loads whole."""
    spec = tmp_path / "k.imegen"
    spec.write_text("defaults { bits = 4 block = 32 zero_point = symmetric compute = int8 }\n"
                    "kernel g { op = gemv target = ime tile = 1x16 }\n")
    out = tmp_path / "rewritten" / "model.onnx"
    out.parent.mkdir()
    assert main(["ort-rewrite", str(spec), str(REAL_B32), "-o", str(out)]) == 0
    assert "11 of 11 MatMulNBits nodes moved" in capsys.readouterr().out
    assert (out.parent / "model.onnx.data").read_bytes() == (REAL_B32.parent / "model.onnx.data").read_bytes()
    loaded = onnx.load(str(out))  # with its external data, from the new folder
    assert sum(n.domain == "ai.imegen" and n.op_type == "MatMulNBits" for n in loaded.graph.node) == 11
