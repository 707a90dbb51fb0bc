"""Regenerate the onnxruntime-genai model-builder fixtures in this folder.

The fixtures are real exports of a tiny Qwen2-architecture model with random
weights, made by onnxruntime-genai's own model builder, so imegen's tests can
check themselves against what a real exporter writes (MatMulNBits attributes,
initializer layout, GroupQueryAttention inputs, external data) instead of
against graphs imegen built itself.

Not run by CI: it needs torch, transformers and onnxruntime-genai, which imegen
does not depend on. Run it in a separate virtualenv (see README.md here):

    python tests/data/genai/make_fixtures.py            # rebuild every variant
    python tests/data/genai/make_fixtures.py --inspect  # print the inventory only

--inspect needs only the onnx package, so imegen's own environment runs it.

No network access is needed: the Hugging Face checkpoint and its tokenizer are
made locally (the builder insists on loading a tokenizer).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent

# Qwen2.5 layout at toy size: head_dim 32, grouped-query attention (4 query
# heads sharing 2 KV heads), tied embeddings, Qwen's rope_theta.  K of every
# projection (128 and 256) is a multiple of 128, so block sizes 32 and 128
# both tile it exactly.
QWEN2_TINY_CONFIG = dict(
    hidden_size=128,
    intermediate_size=256,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=512,
    max_position_embeddings=256,
    tie_word_embeddings=True,
    rope_theta=1000000.0,
    rms_norm_eps=1e-6,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=0,
)
WEIGHT_SEED = 20240601

# Files the builder writes that the fixtures keep; the tokenizer files it
# copies beside them are left out (nothing in imegen reads them).
KEPT_FILES = ("model.onnx", "model.onnx.data", "genai_config.json")


@dataclass(frozen=True)
class Variant:
    name: str
    precision: str
    extra_options: tuple[str, ...]


VARIANTS = (
    Variant("qwen2_tiny_int4_b32", "int4", ()),
    Variant("qwen2_tiny_int4_b128", "int4", ("block_size=128", "accuracy_level=4")),
    # The builder shares the tied embedding with lm_head by default
    # (GatherBlockQuantized reading lm_head's int4 weight).  With asymmetric
    # quantization that sharing exports a graph ORT refuses to load (the
    # GatherBlockQuantized is fed lm_head's float weight through a uint8
    # Reshape, and no scales), so the asymmetric variant keeps the embedding
    # unshared.
    Variant("qwen2_tiny_int4_b32_asym", "int4", ("is_symmetric=false", "shared_embeddings=false")),
    # Unshared: a float Gather embedding and an lm_head MatMulNBits of its own.
    Variant("qwen2_tiny_int4_b32_untied", "int4", ("shared_embeddings=false",)),
    Variant("qwen2_tiny_int8_b32", "int8", ()),
)


def fill_weights_deterministically(model) -> None:
    """Give every parameter seeded values that do not depend on transformers' init code.

    Biases and norm scales are made non-trivial on purpose: with Hugging Face's
    init they are 0 and 1, and a consumer that dropped the q/k/v bias or the
    norm weight would then still agree with the reference.
    """
    import torch

    generator = torch.Generator().manual_seed(WEIGHT_SEED)
    with torch.no_grad():
        for name, parameter in sorted(model.named_parameters()):
            noise = torch.randn(parameter.shape, generator=generator, dtype=torch.float32)
            if "norm" in name:
                parameter.copy_(1.0 + 0.1 * noise)
            elif name.endswith(".bias"):
                parameter.copy_(0.1 * noise)
            else:
                parameter.copy_(0.05 * noise)


def save_tiny_tokenizer(directory: Path, vocab_size: int) -> None:
    """A word-level tokenizer over the model's whole vocabulary, made without any download."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<|endoftext|>": 0, "<|im_start|>": 1, "<|im_end|>": 2}
    vocab.update({f"w{i}": i for i in range(len(vocab), vocab_size)})
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<|endoftext|>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token="<|im_start|>",
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token="<|endoftext|>",
    ).save_pretrained(directory)


def save_hf_checkpoint(directory: Path) -> None:
    import torch
    import transformers

    torch.manual_seed(WEIGHT_SEED)
    config = transformers.Qwen2Config(**QWEN2_TINY_CONFIG)
    config.architectures = ["Qwen2ForCausalLM"]
    model = transformers.Qwen2ForCausalLM(config)
    fill_weights_deterministically(model)
    model.save_pretrained(directory)
    save_tiny_tokenizer(directory, config.vocab_size)


def export_variant(hf_dir: Path, variant: Variant, work_dir: Path) -> None:
    out_dir = work_dir / variant.name
    command = [
        sys.executable, "-m", "onnxruntime_genai.models.builder",
        "-i", str(hf_dir),
        "-o", str(out_dir),
        "-p", variant.precision,
        "-e", "cpu",
        "-c", str(work_dir / "cache"),
    ]
    if variant.extra_options:
        command += ["--extra_options", *variant.extra_options]
    print("+", " ".join(command), flush=True)
    subprocess.run(command, check=True)
    fixture_dir = HERE / variant.name
    if fixture_dir.exists():
        shutil.rmtree(fixture_dir)
    fixture_dir.mkdir()
    for file_name in KEPT_FILES:
        shutil.copy2(out_dir / file_name, fixture_dir / file_name)


PROMPT_IDS = (1, 17, 42, 300, 511, 3)
NEXT_ID = 7


def run_export(model_path: Path):
    """Prefill PROMPT_IDS from an empty cache, then decode NEXT_ID: (prefill logits, decode logits)."""
    import numpy as np
    import onnxruntime

    session = onnxruntime.InferenceSession(str(model_path), providers=["CPUExecutionProvider"])
    output_names = [o.name for o in session.get_outputs()]
    ids = np.array([PROMPT_IDS], dtype=np.int64)
    feeds = {"input_ids": ids, "attention_mask": np.ones_like(ids)}
    head_dim = QWEN2_TINY_CONFIG["hidden_size"] // QWEN2_TINY_CONFIG["num_attention_heads"]
    empty_cache = np.zeros((1, QWEN2_TINY_CONFIG["num_key_value_heads"], 0, head_dim), np.float32)
    for graph_input in session.get_inputs():
        if graph_input.name.startswith("past_key_values."):
            feeds[graph_input.name] = empty_cache
    prefill = dict(zip(output_names, session.run(None, feeds)))
    feeds = {"input_ids": np.array([[NEXT_ID]], np.int64), "attention_mask": np.ones((1, len(PROMPT_IDS) + 1), np.int64)}
    for name, value in prefill.items():
        if name.startswith("present."):
            feeds[name.replace("present.", "past_key_values.", 1)] = value
    decode = dict(zip(output_names, session.run(None, feeds)))
    return prefill["logits"][0], decode["logits"][0, -1]


def dequantize_matmulnbits(node, initializers):
    """The [N, K] float weight a MatMulNBits node multiplies by, read from its initializers.

    Layout (com.microsoft MatMulNBits): B is uint8 [N, K/block, block*bits/8],
    low nibble first for 4 bits; scales [N, K/block]; zero points are packed the
    same way as B (uint8 [N, ceil(K/block*bits/8)]) and default to 2^(bits-1).
    """
    import numpy as np
    import onnx.numpy_helper

    attributes = {a.name: a.i for a in node.attribute}
    bits, block, n, k = attributes["bits"], attributes["block_size"], attributes["N"], attributes["K"]
    blocks = -(-k // block)
    packed = onnx.numpy_helper.to_array(initializers[node.input[1]]).reshape(n, -1)
    scales = onnx.numpy_helper.to_array(initializers[node.input[2]]).reshape(n, blocks)

    def unpack(values, count):
        if bits == 8:
            return values.astype(np.float32)[:, :count]
        nibbles = np.stack([values & 0x0F, values >> 4], axis=-1).reshape(values.shape[0], -1)
        return nibbles.astype(np.float32)[:, :count]

    quantized = unpack(packed, blocks * block).reshape(n, blocks, block)
    if len(node.input) > 3 and node.input[3]:
        zero_points = unpack(onnx.numpy_helper.to_array(initializers[node.input[3]]).reshape(n, -1), blocks)
    else:
        zero_points = np.full((n, blocks), 2 ** (bits - 1), np.float32)
    weight = (quantized - zero_points[:, :, None]) * scales[:, :, None]
    return weight.reshape(n, blocks * block)[:, :k]


def load_dequantized_torch_model(hf_dir: Path, onnx_path: Path):
    """The PyTorch model with every exported quantized weight put back in dequantized form.

    The export and this model then differ only in how ORT computes, not in the
    weights, so a wrong attention, cache, bias or embedding path shows up as a
    large error instead of hiding inside quantization noise.
    """
    import onnx
    import torch
    import transformers

    model = transformers.Qwen2ForCausalLM.from_pretrained(hf_dir).eval()
    graph = onnx.load(str(onnx_path), load_external_data=True).graph
    initializers = {t.name: t for t in graph.initializer}
    heads = QWEN2_TINY_CONFIG["num_attention_heads"]
    kv_heads = QWEN2_TINY_CONFIG["num_key_value_heads"]
    head_dim = QWEN2_TINY_CONFIG["hidden_size"] // heads
    # Untie first: an unshared export keeps the float embedding beside a quantized lm_head.
    model.model.embed_tokens.weight = torch.nn.Parameter(model.model.embed_tokens.weight.detach().clone())
    shares_embedding = any(node.op_type == "GatherBlockQuantized" for node in graph.node)
    with torch.no_grad():
        for node in graph.node:
            if node.op_type != "MatMulNBits":
                continue
            weight = torch.from_numpy(dequantize_matmulnbits(node, initializers))
            if node.name.startswith("/lm_head/"):
                model.lm_head.weight = torch.nn.Parameter(weight)
                if shares_embedding:
                    model.model.embed_tokens.weight = torch.nn.Parameter(weight.clone())
                continue
            layer = model.model.layers[int(node.name.split("/")[2].split(".")[1])]
            projection = node.name.split("/")[-2]
            if projection == "qkv_proj":
                q, k, v = weight.split([heads * head_dim, kv_heads * head_dim, kv_heads * head_dim])
                layer.self_attn.q_proj.weight.copy_(q)
                layer.self_attn.k_proj.weight.copy_(k)
                layer.self_attn.v_proj.weight.copy_(v)
            elif projection == "o_proj":
                layer.self_attn.o_proj.weight.copy_(weight)
            else:
                getattr(layer.mlp, projection).weight.copy_(weight)
    return model


def with_fp32_accuracy(onnx_path: Path, out_dir: Path) -> Path:
    """A copy of the export whose MatMulNBits nodes compute in float (accuracy_level 0)."""
    import onnx

    model = onnx.load(str(onnx_path), load_external_data=True)
    for node in model.graph.node:
        for attribute in node.attribute:
            if node.op_type == "MatMulNBits" and attribute.name == "accuracy_level":
                attribute.i = 0
    copy_path = out_dir / "model_fp32_accuracy.onnx"
    onnx.save(model, str(copy_path))
    return copy_path


def logits_error(reference, onnx_path: Path) -> tuple[float, float]:
    """Largest |ORT - PyTorch| logit difference over prefill and decode, and top-1 agreement."""
    import numpy as np

    prefill, decode = run_export(onnx_path)
    got = np.concatenate([prefill, decode[None]], axis=0)
    return float(np.abs(got - reference).max()), float((got.argmax(-1) == reference.argmax(-1)).mean())


def check_against_torch(hf_dir: Path, fixture_dir: Path, work_dir: Path) -> None:
    """Compare an export's logits with PyTorch's on the export's own (dequantized) weights.

    With float compute the two must agree to rounding, which proves both the
    graph and the weight layout read above.  As exported (accuracy_level 4) ORT
    also quantizes activations to int8, so only a few percent of the logit range
    is allowed there.  A broken export is never committed.
    """
    import numpy as np
    import torch

    model = load_dequantized_torch_model(hf_dir, fixture_dir / "model.onnx")
    with torch.no_grad():
        reference = model(torch.tensor([PROMPT_IDS + (NEXT_ID,)])).logits[0].numpy()
    scale = float(np.abs(reference).max())
    exact_error, _ = logits_error(reference, with_fp32_accuracy(fixture_dir / "model.onnx", work_dir))
    error, top1 = logits_error(reference, fixture_dir / "model.onnx")
    print(
        f"{fixture_dir.name}: max |logit| {scale:.4f}; max |ORT - torch| {exact_error:.2e} with float compute, "
        f"{error:.4f} as exported (top-1 agreement {top1:.2f})"
    )
    if exact_error > 1e-4 * max(1.0, scale) or error > 0.05 * scale:
        raise SystemExit(f"error: {fixture_dir.name} disagrees with the PyTorch model on its own weights")


def describe_attribute(attribute) -> str:
    import onnx

    value = onnx.helper.get_attribute_value(attribute)
    if isinstance(value, bytes):
        value = value.decode()
    return f"{attribute.name}={value}"


def describe_value_info(value_info) -> str:
    import onnx

    tensor_type = value_info.type.tensor_type
    dims = [d.dim_param if d.HasField("dim_param") else str(d.dim_value) for d in tensor_type.shape.dim]
    return f"{value_info.name}: {onnx.TensorProto.DataType.Name(tensor_type.elem_type)}[{', '.join(dims)}]"


def inspect_fixture(fixture_dir: Path) -> str:
    """A plain-text inventory of one export: what a consumer of it has to handle."""
    import collections

    import onnx

    model = onnx.load(str(fixture_dir / "model.onnx"), load_external_data=True)
    graph = model.graph
    initializers = {t.name: t for t in graph.initializer}
    lines = [f"== {fixture_dir.name}"]
    lines.append("opsets: " + ", ".join(f"{o.domain or 'ai.onnx'}:{o.version}" for o in model.opset_import))
    lines.append(f"producer: {model.producer_name} {model.producer_version}, ir_version {model.ir_version}")
    ops = collections.Counter(f"{n.domain or 'ai.onnx'}::{n.op_type}" for n in graph.node)
    lines.append("ops: " + ", ".join(f"{op} x{count}" for op, count in sorted(ops.items())))
    lines += ["inputs:"] + ["  " + describe_value_info(v) for v in graph.input]
    lines += ["outputs:"] + ["  " + describe_value_info(v) for v in graph.output]
    for node in graph.node:
        if node.op_type not in ("MatMulNBits", "GatherBlockQuantized", "GroupQueryAttention"):
            continue
        attributes = ", ".join(describe_attribute(a) for a in node.attribute)
        lines.append(f"{node.op_type} {node.name}: {attributes}")
        for index, name in enumerate(node.input):
            if not name:
                lines.append(f"    in[{index}] (absent)")
            elif name in initializers:
                tensor = initializers[name]
                lines.append(
                    f"    in[{index}] {name}: initializer "
                    f"{onnx.TensorProto.DataType.Name(tensor.data_type)}{list(tensor.dims)}"
                )
            else:
                lines.append(f"    in[{index}] {name}: activation")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--inspect", action="store_true", help="only print the inventory of the committed fixtures")
    args = parser.parse_args()
    if not args.inspect:
        with tempfile.TemporaryDirectory() as temp:
            work_dir = Path(temp)
            hf_dir = work_dir / "hf_qwen2_tiny"
            save_hf_checkpoint(hf_dir)
            for variant in VARIANTS:
                export_variant(hf_dir, variant, work_dir)
                check_against_torch(hf_dir, HERE / variant.name, work_dir / variant.name)
    for variant in VARIANTS:
        print(inspect_fixture(HERE / variant.name))
    return 0


if __name__ == "__main__":
    sys.exit(main())
