"""Random-weight Qwen2 models as GGUF files for llama.cpp: the configuration, the weights (every matrix
raw Q4_0 blocks, drawn from a seed; norms and q/k/v biases F32) and the file, written by gguf-py's
GGUFWriter from the llama-cpp-python sdist. The same weights feed the NumPy reference
(whole_reference.py), which dequantizes the Q4_0 bytes by the format's definition.

No tokenizer: tokenizer.ggml.model is "none" with qwen2.vocab_size set, llama.cpp's no-vocabulary
mode, which makes that many dummy tokens; the driver passes token ids, so nothing is tokenized."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

QK = 32  # Q4_0 block: one fp16 scale d, 32 4-bit codes q, value d * (q - 8)
Q4_0_BYTES = 18
Q4_0_STD = float(np.sqrt((16 ** 2 - 1) / 12))  # std of q - 8 for uniform codes
# Small embeddings, as trained models have: the layers' outputs, not the token's own embedding, then
# dominate the residual stream, so the tied lm_head's argmax is not simply the input token.
EMBED_STD = 0.1


@dataclass(frozen=True)
class QwenConfig:
    n_layer: int
    hidden: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int
    rms_eps: float = 1e-6
    rope_theta: float = 1e6
    context_train: int = 32768
    seed: int = 0

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    def with_layers(self, n: int) -> QwenConfig:
        return replace(self, n_layer=n)


# Qwen2.5-0.5B's architecture (its config.json): head dim 896 / 14 = 64, tied embeddings.
QWEN25_05B = QwenConfig(n_layer=24, hidden=896, heads=14, kv_heads=2, intermediate=4864, vocab=151936)
# A small Qwen2 for checking llama.cpp's logits against NumPy (head dim 32, every K a multiple of 32).
TINY = QwenConfig(n_layer=2, hidden=128, heads=4, kv_heads=2, intermediate=256, vocab=512, seed=1)


def q4_0_random(rng: np.random.Generator, rows: int, cols: int, std: float) -> np.ndarray:
    """(rows, cols / 32 * 18) uint8 Q4_0 blocks: uniform codes, scales d around std / Q4_0_STD."""
    blocks = cols // QK
    d = (std / Q4_0_STD * rng.uniform(0.5, 1.5, (rows, blocks))).astype(np.float16)
    raw = np.empty((rows, blocks, Q4_0_BYTES), np.uint8)
    raw[:, :, :2] = d.view(np.uint8).reshape(rows, blocks, 2)
    raw[:, :, 2:] = rng.integers(0, 256, (rows, blocks, 16), dtype=np.uint8)
    return raw.reshape(rows, blocks * Q4_0_BYTES)


def weights(cfg: QwenConfig) -> dict[str, np.ndarray]:
    """GGUF tensor name -> array: uint8 (out, in / 32 * 18) Q4_0 blocks for matrices (GGUF ne0 = in),
    float32 vectors. Matrices have std 1 / sqrt(in), so activations stay O(1); the embedding EMBED_STD."""
    for name, k in (("hidden", cfg.hidden), ("intermediate", cfg.intermediate)):
        if k % QK:
            raise ValueError(f"{name} {k} is not a multiple of the Q4_0 block ({QK})")
    rng = np.random.default_rng(cfg.seed)
    h, kv, ff = cfg.hidden, cfg.kv_heads * cfg.head_dim, cfg.intermediate

    def mat(rows: int, cols: int) -> np.ndarray:
        return q4_0_random(rng, rows, cols, 1 / np.sqrt(cols))

    def vec(n: int, mean: float, std: float) -> np.ndarray:
        return (mean + std * rng.standard_normal(n)).astype(np.float32)

    w = {"token_embd.weight": q4_0_random(rng, cfg.vocab, h, EMBED_STD), "output_norm.weight": vec(h, 1.0, 0.1)}
    for i in range(cfg.n_layer):
        p = f"blk.{i}."
        w |= {p + "attn_norm.weight": vec(h, 1.0, 0.1),
              p + "attn_q.weight": mat(h, h), p + "attn_q.bias": vec(h, 0.0, 0.1),
              p + "attn_k.weight": mat(kv, h), p + "attn_k.bias": vec(kv, 0.0, 0.1),
              p + "attn_v.weight": mat(kv, h), p + "attn_v.bias": vec(kv, 0.0, 0.1),
              p + "attn_output.weight": mat(h, h),
              p + "ffn_norm.weight": vec(h, 1.0, 0.1),
              p + "ffn_gate.weight": mat(ff, h), p + "ffn_up.weight": mat(ff, h),
              p + "ffn_down.weight": mat(h, ff)}
    return w


def matrix_bytes(cfg: QwenConfig) -> int:
    """Q4_0 bytes of every matrix weights() makes: what one llama_decode call reads (the tied embedding
    read whole as the lm_head; its get_rows reads only the prompt's rows)."""
    h, kv, ff = cfg.hidden, cfg.kv_heads * cfg.head_dim, cfg.intermediate
    per_layer = 2 * h * h + 2 * kv * h + 3 * h * ff
    return (cfg.n_layer * per_layer + cfg.vocab * h) // QK * Q4_0_BYTES


def gguf_writer_module(gguf_py: Path):
    """gguf-py's gguf_writer (and constants) from the sdist, imported without the package's __init__,
    which also imports its metadata module and with it PyYAML, which imegen does not depend on. Loaded
    under a private package name, so an installed `gguf` package is neither used nor disturbed."""
    name = "_imegen_sdist_gguf"
    if name not in sys.modules:
        pkg = gguf_py / "gguf"
        spec = importlib.util.spec_from_file_location(name, pkg / "__init__.py", submodule_search_locations=[str(pkg)])
        sys.modules[name] = importlib.util.module_from_spec(spec)  # not executed: only its path is needed
    return importlib.import_module(f"{name}.gguf_writer"), importlib.import_module(f"{name}.constants")


def write_gguf(cfg: QwenConfig, path: Path, gguf_py: Path, w: dict[str, np.ndarray] | None = None) -> None:
    """Write `cfg` with weights `w` (default: weights(cfg)) as a qwen2 GGUF file."""
    writer_mod, const = gguf_writer_module(gguf_py)
    w = weights(cfg) if w is None else w
    out = writer_mod.GGUFWriter(str(path), "qwen2")
    out.add_context_length(cfg.context_train)
    out.add_embedding_length(cfg.hidden)
    out.add_block_count(cfg.n_layer)
    out.add_feed_forward_length(cfg.intermediate)
    out.add_head_count(cfg.heads)
    out.add_head_count_kv(cfg.kv_heads)
    out.add_rope_freq_base(cfg.rope_theta)
    out.add_layer_norm_rms_eps(cfg.rms_eps)
    out.add_file_type(const.LlamaFileType.MOSTLY_Q4_0)
    out.add_tokenizer_model("none")
    out.add_vocab_size(cfg.vocab)
    for name, a in w.items():
        if a.dtype == np.uint8:
            out.add_tensor(name, a, raw_shape=a.shape, raw_dtype=const.GGMLQuantizationType.Q4_0)
        else:
            out.add_tensor(name, a)
    out.write_header_to_file()
    out.write_kv_data_to_file()
    out.write_tensors_to_file()
    out.close()
