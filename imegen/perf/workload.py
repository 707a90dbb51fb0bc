"""The MatMulNBits shapes of a Qwen2.5-0.5B decoder (config.json of Qwen/Qwen2.5-0.5B):
hidden 896, intermediate 4864, 14 query heads and 2 KV heads of dim 64, 24 layers, vocabulary
151936 (the LM head is a 896 x 151936 MatMulNBits in ORT's int4 exports).

Per layer: q 896->896, k 896->128, v 896->128, o 896->896, gate 896->4864, up 896->4864,
down 4864->896. Only these projections and the LM head are modeled: attention itself, norms,
rotary embedding, the q/k/v bias adds and sampling are not MatMulNBits and are left out of
every ms/token figure.

A Case is one shape at one M and block: what the tuner and the bench evaluate a kernel on.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Model:
    name: str
    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int


QWEN25_05B = Model("Qwen2.5-0.5B", layers=24, hidden=896, intermediate=4864, heads=14, kv_heads=2,
                   head_dim=64, vocab=151936)


@dataclass(frozen=True)
class Shape:
    """One distinct MatMulNBits weight shape: C[M, N] = A[M, K] x B[K, N]."""

    name: str  # e.g. "q/o"
    N: int
    K: int
    per_token: int  # how many such matmuls one decoder step runs (layers x uses per layer)


def shapes(model: Model = QWEN25_05B) -> list[Shape]:
    h, i, kv = model.hidden, model.intermediate, model.kv_heads * model.head_dim
    assert model.heads * model.head_dim == h
    L = model.layers
    return [
        Shape("q/o", h, h, 2 * L),
        Shape("k/v", kv, h, 2 * L),
        Shape("gate/up", i, h, 2 * L),
        Shape("down", h, i, L),
        Shape("lm_head", model.vocab, h, 1),
    ]


def weights_per_token(model: Model = QWEN25_05B) -> int:
    return sum(s.N * s.K * s.per_token for s in shapes(model))


DECODE_M = 1
PREFILL_M = (128, 512)
BLOCKS = (32, 64, 128)


@dataclass(frozen=True)
class Case:
    """One tuning target: a weight shape at one M and block size."""

    shape: str
    M: int
    N: int
    K: int
    block: int
    workload: str = "qwen"  # whose shape: the Qwen model's, or "shape" (`--shape NxK`); prefixes ident

    @property
    def mnk(self) -> tuple[int, int, int]:
        return self.M, self.N, self.K

    @property
    def label(self) -> str:
        return f"{self.shape} M={self.M} block={self.block}"

    @property
    def ident(self) -> str:
        return f"{self.workload}_{self.shape.replace('/', '_')}_m{self.M}_b{self.block}"


def cases(*, blocks=BLOCKS, ms=(DECODE_M, *PREFILL_M), only_shapes: tuple[str, ...] | None = None) -> list[Case]:
    return [Case(s.name, M, s.N, s.K, b) for b in blocks for s in shapes()
            if only_shapes is None or s.name in only_shapes for M in ms]


def targets(*, quick: bool = False, blocks=BLOCKS) -> list[Case]:
    """What `imegen tune`/`bench` cover: every Qwen shape x M x block, or the --quick CI subset
    (the q/o shape at M = 1 and 128, the first block)."""
    if quick:
        return cases(blocks=blocks[:1], ms=(DECODE_M, PREFILL_M[0]), only_shapes=("q/o",))
    return cases(blocks=blocks)

# Published end-to-end figures on K1 / X60 with 4 threads (whole model, not just MatMulNBits), with
# their public source: the K1 table of ggml-org/llama.cpp/docs/build-riscv64-spacemit.md at 6f8d9794,
# Qwen2.5 0.5B Q4_0. No public ONNX Runtime figure for the K1 is known (docs/ime-isa.md §7).
LLAMA_CPP_SOURCE = "ggml-org/llama.cpp/docs/build-riscv64-spacemit.md @6f8d9794"
PUBLISHED = {
    f"llama.cpp Q4_0, tg128 10.03 t/s ({LLAMA_CPP_SOURCE})": 1000.0 / 10.03,  # ms/token, decode
}
PUBLISHED_PP512_TPS = 64.12  # llama.cpp Q4_0 pp512 tokens/s, same table
PUBLISHED_TG128_TPS = 10.03  # llama.cpp Q4_0 tg128 tokens/s, same table (PUBLISHED in tokens/s)


def spec_cases(blocks, *, quick: bool = False, custom_shapes=None, ms=None) -> list[Case]:
    """The cases of `bench --spec` / `tune --spec`: every block of the user's kernels x shape x M. Shapes:
    custom_shapes ((N, K) pairs, named NxK), else the Qwen ones (--quick: q/o); ms: given, else decode
    and the prefill M values (--quick: 1 and 128, as targets())."""
    if ms is None:
        ms = (DECODE_M, PREFILL_M[0]) if quick else (DECODE_M, *PREFILL_M)
    if custom_shapes is None:
        return cases(blocks=blocks, ms=ms, only_shapes=("q/o",) if quick else None)
    return [Case(f"{N}x{K}", M, N, K, b, workload="shape") for b in blocks for N, K in custom_shapes for M in ms]
