"""GroupQueryAttention as a single-node model, in the form onnxruntime-genai exports it (packed QKV, past and
present KV cache in BNSH, seqlens_k / total_sequence_length, rotary inside with cos/sin caches), for per-Run
counts in stock riscv64 ORT and on imegen's decoder operators (the attention tuner, the whole-model account)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

SEED = 4321
ROPE_THETA = 1e6  # Qwen2.5's


@dataclass(frozen=True)
class GqaShape:
    heads: int = 14
    kv_heads: int = 2
    head: int = 64
    seq: int = 1  # new tokens
    past: int = 128  # cached positions before them

    @property
    def total(self) -> int:
        return self.past + self.seq

    def kv_bytes(self) -> int:
        """fp32 bytes of K and V over every position of the present cache."""
        return 2 * self.kv_heads * self.total * self.head * 4

    def dram_bytes(self) -> int:
        """What a step moves at least: the past cache read, the present cache written (genai's CPU export copies
        the past into present every step), present read by the attention, the packed QKV in and the output out."""
        io = 4 * self.seq * (self.heads + 2 * self.kv_heads) * self.head + 4 * self.seq * self.heads * self.head
        return self.kv_bytes() * self.past // max(self.total, 1) + 2 * self.kv_bytes() + io


def rotary_caches(positions: int, half: int, theta: float = ROPE_THETA) -> tuple[np.ndarray, np.ndarray]:
    inv = 1.0 / theta ** (np.arange(half, dtype=np.float64) / half)
    angles = np.outer(np.arange(positions), inv)
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)


def node_model(shape: GqaShape):
    """(ModelProto, feeds): genai's 12-input GroupQueryAttention with its attributes, random inputs."""
    from onnx import TensorProto, helper, numpy_helper

    cos, sin = rotary_caches(max(shape.total, 64), shape.head // 2)
    ins = ["qkv", "", "", "past_key", "past_value", "seqlens_k", "total_sequence_length", "cos_cache", "sin_cache",
           "", "", ""]
    node = helper.make_node("GroupQueryAttention", ins, ["out", "present_key", "present_value"], name="attn",
                            domain="com.microsoft", num_heads=shape.heads, kv_num_heads=shape.kv_heads,
                            scale=float(1 / np.sqrt(shape.head)), local_window_size=-1, softcap=0.0, do_rotary=1,
                            rotary_interleaved=0)
    f, i32 = TensorProto.FLOAT, TensorProto.INT32
    inputs = [helper.make_tensor_value_info(n, t, None) for n, t in
              (("qkv", f), ("past_key", f), ("past_value", f), ("seqlens_k", i32), ("total_sequence_length", i32))]
    outputs = [helper.make_tensor_value_info(n, f, None) for n in ("out", "present_key", "present_value")]
    graph = helper.make_graph([node], "gqa", inputs, outputs,
                              [numpy_helper.from_array(cos, "cos_cache"), numpy_helper.from_array(sin, "sin_cache")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = 10
    rng = np.random.default_rng([SEED, shape.seq, shape.past])
    kv = (1, shape.kv_heads, shape.past, shape.head)
    feeds = {"qkv": rng.standard_normal((1, shape.seq, (shape.heads + 2 * shape.kv_heads) * shape.head), np.float32),
             "past_key": rng.standard_normal(kv, np.float32), "past_value": rng.standard_normal(kv, np.float32),
             "seqlens_k": np.array([shape.total - 1], np.int32),
             "total_sequence_length": np.array([shape.total], np.int32)}
    return model, feeds


def write_node_model(d: Path, shape: GqaShape, *, imegen: bool) -> tuple[Path, dict[str, np.ndarray]]:
    """The model saved in d (moved onto imegen's GroupQueryAttention when `imegen`) and its feeds."""
    import onnx

    from ....ort.decoder_ops import rewrite_decoder_ops

    model, feeds = node_model(shape)
    if imegen and not all(x.moved for x in rewrite_decoder_ops(model)):
        raise RuntimeError("imegen's decoder operators do not serve the GroupQueryAttention node")
    path = d / "gqa.onnx"
    onnx.save(model, str(path))
    return path, feeds
