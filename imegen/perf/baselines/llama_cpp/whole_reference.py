"""An independent NumPy forward of a Qwen2 model, to check llama.cpp's whole-model logits against.

Written from the model's definition (Hugging Face's Qwen2: RMSNorm, q/k/v with biases, rotary embedding
in the rotate-half form over the whole head, which is what llama.cpp's qwen2 graph selects as
LLAMA_ROPE_TYPE_NEOX, grouped-query causal attention, SiLU-gated MLP, final RMSNorm, lm_head tied to the
token embedding), on weights dequantized from their Q4_0 bytes by the format's definition (value
d * (q - 8); byte j of a block holds element j in its low nibble, element j + 16 in its high one), in
float64. It shares nothing with llama.cpp but the weights.

llama_like=True also rounds where llama.cpp's CPU path rounds (read from ggml's code, not taken from
it): every matmul input (activations) to 8-bit codes per 32 values with an fp32 scale amax / 127 (the
IME1 kernels' quantization of A), and attention as ggml's CPU flash attention computes it at these
sizes: Q, K and V in float16 (F16 KV cache; Q converted to K's type), an online softmax over the keys
in order with a float16 output accumulator (flash_attention_f16). What stays different is float32
rounding upstream (RoPE, norms, sums), which moves a float16 or 8-bit rounding now and then."""

from __future__ import annotations

import numpy as np

from .whole_gguf import QK, Q4_0_BYTES, QwenConfig


def dequantize_q4_0(raw: np.ndarray, cols: int) -> np.ndarray:
    """(rows, cols) float64 from (rows, cols / 32 * 18) uint8 Q4_0 blocks."""
    b = raw.reshape(raw.shape[0], cols // QK, Q4_0_BYTES)
    d = b[:, :, :2].copy().view(np.float16)[:, :, 0].astype(np.float64)
    qs = b[:, :, 2:]
    q = np.concatenate([qs & 15, qs >> 4], axis=2).astype(np.float64) - 8
    return (d[:, :, None] * q).reshape(raw.shape[0], cols)


def quantize_rows_q8(x: np.ndarray) -> np.ndarray:
    """x with every 32 consecutive values of a row rounded to int8 codes times an fp32 amax / 127 scale."""
    rows, cols = x.shape
    b = x.astype(np.float32).reshape(rows, cols // QK, QK)
    scale = (np.abs(b).max(axis=2) * np.float32(1 / 127)).astype(np.float32)
    inv = np.divide(np.float32(1), scale, out=np.zeros_like(scale), where=scale != 0)
    codes = np.clip(np.rint(b * inv[:, :, None]), -127, 127)
    return (codes * scale[:, :, None].astype(np.float64)).reshape(rows, cols)


def rms_norm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + eps) * w.astype(np.float64)


def rope_rotate_half(x: np.ndarray, positions: np.ndarray, theta: float) -> np.ndarray:
    """x (T, heads, D): pairs (i, i + D/2) rotated by position * theta^(-2i/D)."""
    half = x.shape[-1] // 2
    angle = positions[:, None].astype(np.float64) * theta ** (-2.0 * np.arange(half) / x.shape[-1])
    cos, sin = np.cos(angle)[:, None, :], np.sin(angle)[:, None, :]
    x1, x2 = x[..., :half], x[..., half:]
    return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


def causal_gqa_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
    """q (T, H, D), k and v (T, G, D); query head h reads key/value head h // (H / G). Returns (T, H * D)."""
    T, H, D = q.shape
    kv = np.repeat(np.arange(k.shape[1]), H // k.shape[1])
    scores = np.einsum("thd,shd->hts", q, k[:, kv]) / np.sqrt(D)
    scores = np.where(np.tril(np.ones((T, T), bool))[None], scores, -np.inf)
    p = np.exp(scores - scores.max(axis=-1, keepdims=True))
    p /= p.sum(axis=-1, keepdims=True)
    return np.einsum("hts,shd->thd", p, v[:, kv]).reshape(T, H * D)


def flash_attention_f16(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Causal GQA attention as ggml's CPU flash attention's one-chunk path computes it (float16 K and V):
    per query, keys in order: score = float32(q16 . k16) * float32(1 / sqrt(D)); on a new maximum M the
    float16 accumulator is scaled by float16(exp(M_old - M)) and the value's weight is 1, otherwise the
    weight is exp(score - M); acc = float16(acc + v * float16(weight)) (one rounding: a fused
    multiply-add), the weights summed in float32; out = acc / sum. q (T, H, D), k and v (T, G, D)."""
    T, H, D = q.shape
    kv = np.repeat(np.arange(k.shape[1]), H // k.shape[1])
    q, k, v = (a.astype(np.float16).astype(np.float64) for a in (q, k[:, kv], v[:, kv]))
    scale = np.float32(1 / np.sqrt(D))
    out = np.empty((T, H, D))
    with np.errstate(over="ignore"):
        for t in range(T):
            m = np.full(H, -np.inf, np.float32)
            total = np.zeros(H, np.float32)
            acc = np.zeros((H, D), np.float16)
            for j in range(t + 1):
                score = np.float32(np.einsum("hd,hd->h", q[t], k[j])).astype(np.float32) * scale
                new = score > m
                shrink = np.where(new, np.exp((m - score).astype(np.float64)).astype(np.float32), np.float32(1))
                weight = np.where(new, np.float32(1), np.exp((score - m).astype(np.float64)).astype(np.float32))
                m = np.where(new, score, m)
                acc = (acc.astype(np.float64) * shrink.astype(np.float16)[:, None]).astype(np.float16)
                acc = (acc.astype(np.float64) + v[j] * weight.astype(np.float16)[:, None]).astype(np.float16)
                total = (total * shrink + weight).astype(np.float32)
            out[t] = acc.astype(np.float32) / total[:, None]
    return out.reshape(T, H * D)


def forward(cfg: QwenConfig, w: dict[str, np.ndarray], tokens: np.ndarray, llama_like: bool = False) -> np.ndarray:
    """Logits (T, vocab) of every position of `tokens` (positions 0..T-1, causal)."""
    act = quantize_rows_q8 if llama_like else (lambda a: a)
    attention = flash_attention_f16 if llama_like else causal_gqa_attention
    T, D = len(tokens), cfg.head_dim

    def linear(x: np.ndarray, name: str) -> np.ndarray:
        y = act(x) @ dequantize_q4_0(w[name + ".weight"], x.shape[1]).T
        return y + w[name + ".bias"] if name + ".bias" in w else y

    embed = dequantize_q4_0(w["token_embd.weight"], cfg.hidden)
    x = embed[tokens]
    positions = np.arange(T)
    for i in range(cfg.n_layer):
        p = f"blk.{i}."
        a = rms_norm(x, w[p + "attn_norm.weight"], cfg.rms_eps)
        q = rope_rotate_half(linear(a, p + "attn_q").reshape(T, cfg.heads, D), positions, cfg.rope_theta)
        k = rope_rotate_half(linear(a, p + "attn_k").reshape(T, cfg.kv_heads, D), positions, cfg.rope_theta)
        v = linear(a, p + "attn_v").reshape(T, cfg.kv_heads, D)
        x = x + linear(attention(q, k, v), p + "attn_output")
        a = rms_norm(x, w[p + "ffn_norm.weight"], cfg.rms_eps)
        gate, up = linear(a, p + "ffn_gate"), linear(a, p + "ffn_up")
        x = x + linear(gate / (1 + np.exp(-gate)) * up, p + "ffn_down")
    x = rms_norm(x, w["output_norm.weight"], cfg.rms_eps)
    return act(x) @ embed.T
