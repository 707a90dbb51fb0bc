"""Which kernels serve a MatMulNBits node: the custom-op library's rule, in Python.

The library (customop_lib.c) applies this rule at session creation and per Run; `imegen ort-rewrite`
and `imegen ort-accelerate` apply it here, so they move exactly the nodes the library accepts and
report the kernels it will run. tests/test_serving.py holds the two to the same answers.

A node is matched on its quantization (bits, block size, accuracy level -> compute type, zero points,
bias); among the kernels that match:
- M = 1 runs the gemv kernel chosen for the node's weight shape (N, K) (`shapes`), else one with no
  `shapes`; with no gemv kernel, the gemm rule below with M = 1;
- M > 1 runs, among the gemm kernels chosen for the shape (else those with no `shapes`), the one with
  the largest `min_rows` <= M (a kernel tuned for long prompts next to one for short ones);
- a slice whose thread cannot reach an IME hart runs the node's `fallback = yes` kernel (rvv or scalar).
Fallback kernels are never chosen otherwise. When several kernels tie, the spec's first one wins.
"""

from __future__ import annotations

from dataclasses import dataclass

from .. import targets
from ..ir import KernelSpec

# ORT's accuracy_level -> the arithmetic its CPU MatMulNBits uses. Levels 2 (fp16) and 3 (bf16) have no
# MLAS kernels on CPU, so ORT computes them as level 0 does: dequantized B, fp32 products.
COMPUTE_FOR_LEVEL = {0: "fp32", 1: "fp32", 2: "fp32", 3: "fp32", 4: "int8"}
MAX_GEMM = 14  # gemm kernels (of different min_rows) one node may have: customop_lib.c's MAX_GEMM


@dataclass(frozen=True)
class NodeNeeds:
    """What a MatMulNBits node asks of a kernel."""

    bits: int
    block: int
    accuracy_level: int
    asymmetric: bool
    bias: bool
    N: int = 0  # weight shape; 0: unknown (kernels with `shapes` are not preferred)
    K: int = 0
    g_idx: bool = False
    zero_points_uint8: bool = True
    float16: bool = False  # T = float16 (A, scales, bias and Y in fp16)


@dataclass(frozen=True)
class Serving:
    """The kernels a node runs on, or why none does."""

    gemv: str | None = None  # M = 1
    gemm: tuple[tuple[int, str], ...] = ()  # (min_rows, kernel), ascending: M > 1 takes the last with min_rows <= M
    fallback: str | None = None  # slices whose thread cannot reach an IME hart (IME kernels only)
    reason: str = ""  # why no kernel serves the node

    @property
    def ok(self) -> bool:
        return self.gemv is not None or bool(self.gemm)

    def kernel_for(self, M: int) -> str:
        """The kernel a Run with M rows of A uses (M >= 1)."""
        if M == 1 and self.gemv:
            return self.gemv
        usable = [name for rows, name in self.gemm if rows <= M]
        return usable[-1] if usable else (self.gemm[0][1] if self.gemm else self.gemv)  # type: ignore[return-value]

    def names(self) -> list[str]:
        """Every kernel the node may run, each once: gemv, the gemm kernels, the fallback."""
        return list(dict.fromkeys([*([self.gemv] if self.gemv else []), *(n for _, n in self.gemm),
                                   *([self.fallback] if self.fallback else [])]))

    def describe(self) -> str:
        parts = [f"M=1 {self.gemv}"] if self.gemv else []
        for i, (rows, name) in enumerate(self.gemm):
            upper = self.gemm[i + 1][0] - 1 if i + 1 < len(self.gemm) else None
            low = rows if i else 2 if self.gemv else 1  # the first gemm kernel also takes fewer rows than its min_rows
            parts.append(f"M={low}{'+' if upper is None else f'..{upper}'} {name}")
        if self.fallback:
            parts.append(f"no IME hart: {self.fallback}")
        return ", ".join(parts)


def refusal(need: NodeNeeds) -> str:
    """Why no imegen kernel can serve this node whatever the spec holds ("" when one could)."""
    if need.float16:
        return "T is float16: imegen's kernels take and return float32 (keep the node in ORT)"
    if need.g_idx:
        return "g_idx (act-order) is not supported"
    if not need.zero_points_uint8:
        return "float zero points are not supported (imegen takes ORT's packed uint8 ones)"
    if need.accuracy_level not in COMPUTE_FOR_LEVEL:
        return f"accuracy_level {need.accuracy_level} is not one of ORT's 0-4"
    if need.bits not in (4, 8):
        return f"bits {need.bits} (imegen serves 4 and 8)"
    return ""


def _matches(s: KernelSpec, need: NodeNeeds, compute: str) -> bool:
    return (s.abi == "imegen" and s.bits == need.bits and s.block == need.block and s.compute == compute
            and (s.zero_point == "asymmetric") == need.asymmetric and s.bias == need.bias)


def _for_shape(kernels: list[KernelSpec], need: NodeNeeds) -> list[KernelSpec]:
    """The kernels chosen for the node's shape, else those chosen for no shape in particular."""
    own = [s for s in kernels if (need.N, need.K) in s.shapes]
    return own or [s for s in kernels if not s.shapes]


def serve(specs: list[KernelSpec], need: NodeNeeds) -> Serving:
    why = refusal(need)
    if why:
        return Serving(reason=why)
    compute = COMPUTE_FOR_LEVEL[need.accuracy_level]
    group = [s for s in specs if _matches(s, need, compute)]
    primary = [s for s in group if not s.fallback]
    gemv = _for_shape([s for s in primary if s.op == "gemv"], need)
    gemm = _for_shape([s for s in primary if s.op == "gemm"], need)
    if not gemv and not gemm:
        return Serving(reason=f"no kernel serves bits {need.bits}, block {need.block}, {compute} compute, "
                              f"{'asymmetric' if need.asymmetric else 'symmetric'} zero points, "
                              f"{'with' if need.bias else 'no'} bias"
                              + (f" (accuracy_level {need.accuracy_level})" if need.accuracy_level not in (0, 4) else ""))
    by_rows: dict[int, str] = {}
    for s in gemm:
        by_rows.setdefault(s.min_rows, s.name)  # the spec's first kernel for each min_rows
    if len(by_rows) > MAX_GEMM:
        return Serving(reason=f"{len(by_rows)} gemm kernels of different min_rows serve it; the library holds at most "
                              f"{MAX_GEMM} per node")
    uses_ime = any(targets.of(s).needs_ime for s in (*gemv[:1], *(s for s in gemm if by_rows.get(s.min_rows) == s.name)))
    fallbacks = _for_shape([s for s in group if s.fallback], need) if uses_ime else []
    return Serving(gemv[0].name if gemv else None, tuple(sorted(by_rows.items())),
                   fallbacks[0].name if fallbacks else None)


def serving_kernels(specs: list[KernelSpec], need: NodeNeeds) -> tuple[list[str], str]:
    """(kernel names serving the node, or [] with the reason)."""
    s = serve(specs, need)
    return (s.names(), "") if s.ok else ([], s.reason)
