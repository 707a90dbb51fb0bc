"""imegen's public Python API (exported from `imegen`): what the commands themselves use.

    import imegen
    specs = imegen.load_spec("examples/qwen_mlp.imegen")
    k = imegen.build_kernel(specs, "q4_decode_ime")            # or host=True for a scalar kernel
    Y = k.run(A, B, scales, zero_points, K=896)                # ORT's MatMulNBits initializers, A [..., K]
    print(k.compare(A, B, scales, zero_points, K=896))         # vs imegen.reference (NumPy)

    lib = imegen.build_ort_library(specs)                      # the custom-op library (qemu flavour)
    moved = imegen.rewrite_model(model, specs)                 # onnx.ModelProto, in place
    with imegen.RiscvSession("model.onnx", custom_ops=lib) as s: s.run({"A": A})

Each wraps the pipeline (ir, plan, verify, reference), never duplicates it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from . import reference as ref
from . import verify
from .ir import KernelSpec, attention_specs_from_text, load_attention_specs, load_specs, specs_from_text
from .ort.customop import build_library, parse_stats
from .ort.rewrite import NodeDecision, rewrite
from .ort.riscv import OrtError, RiscvSession
from .plan import plan_kernel


def load_spec(source: str | Path) -> list[KernelSpec]:
    """The kernels of a spec file (a path), or of spec text (a string containing '{')."""
    if isinstance(source, str) and "{" in source:
        return specs_from_text(source)
    return load_specs(source)


def load_attention(source: str | Path) -> list:
    """The attention kernels (AttentionSpec) of a spec file (a path), or of spec text (a string containing '{')."""
    if isinstance(source, str) and "{" in source:
        return attention_specs_from_text(source)
    return load_attention_specs(source)


def _pick(specs: list[KernelSpec] | KernelSpec, name: str | None) -> KernelSpec:
    if isinstance(specs, KernelSpec):
        return specs
    if name is None:
        if len(specs) != 1:
            raise ValueError(f"the spec has {len(specs)} kernels: name one of {', '.join(s.name for s in specs)}")
        return specs[0]
    for s in specs:
        if s.name == name:
            return s
    raise ValueError(f"no kernel {name!r} in the spec (it has {', '.join(s.name for s in specs)})")


def weights(B: np.ndarray, scales: np.ndarray, zero_points: np.ndarray | None, *, K: int, bits: int,
            block_size: int) -> ref.QuantizedWeights:
    """ORT's MatMulNBits initializers (B [N, k_blocks, blob], scales, packed uint8 zero points) as imegen's
    QuantizedWeights; scales and zero points may be flat, as ORT stores them."""
    B = np.asarray(B, np.uint8)
    N = B.shape[0]
    kb = -(-K // block_size)
    scales = np.asarray(scales, np.float32).reshape(N, kb)
    zp = None if zero_points is None else np.asarray(zero_points, np.uint8).reshape(N, -1)
    return ref.QuantizedWeights(B.reshape(N, kb, block_size * bits // 8), scales, zp, K, N, bits, block_size)


@dataclass(frozen=True)
class Kernel:
    """A built kernel: its spec and test-driver build (natively for host scalar kernels, else under QEMU)."""

    spec: KernelSpec
    build: verify.Build

    def _case(self, A, B, scales, zero_points, bias, K) -> tuple[verify.Case, tuple[int, ...]]:
        qw = weights(B, scales, zero_points, K=K, bits=self.spec.bits, block_size=self.spec.block)
        A = np.asarray(A, np.float32)
        if A.shape[-1] != K:
            raise ValueError(f"A's last dimension is {A.shape[-1]}, expected K = {K}")
        lead = A.shape[:-1]
        case = verify.Case(np.ascontiguousarray(A.reshape(-1, K)), qw,
                           None if bias is None else np.asarray(bias, np.float32))
        return case, lead

    def run(self, A, B, scales, zero_points=None, bias=None, *, K: int, vlen: int | None = 256) -> np.ndarray:
        """Y[..., N] = MatMulNBits(A[..., K], B, scales, zero_points, bias) on this kernel."""
        case, lead = self._case(A, B, scales, zero_points, bias, K)
        r = verify.run_cases(self.build, [case], vlen=vlen)[0]
        if r.status != 0:
            raise RuntimeError(f"kernel {self.spec.name} returned status {r.status}")
        return r.C.reshape(*lead, case.qw.N)

    def compare(self, A, B, scales, zero_points=None, bias=None, *, K: int, vlen: int | None = 256) -> verify.Comparison:
        """Run and compare with imegen.reference within the kernel's error bound (and vmadot count for IME)."""
        case, _ = self._case(A, B, scales, zero_points, bias, K)
        r = verify.run_cases(self.build, [case], vlen=vlen)[0]
        return verify.compare(self.build.plan, case, r)


def build_kernel(specs: list[KernelSpec] | KernelSpec, name: str | None = None, *, compiler: str = "clang",
                 host: bool = False, spec_file: str = "<spec>") -> Kernel:
    """Generate and compile one kernel of the spec (cached)."""
    spec = _pick(specs, name)
    return Kernel(spec, verify.build(plan_kernel(spec), spec_file, compiler=compiler, host=host))


def build_ort_library(specs: list[KernelSpec], spec_file: str = "<spec>", *, flavour: str = "qemu",
                      attention: list | None = None) -> Path:
    """The ORT custom-op library for the spec's imegen-ABI kernels ("qemu": IME emulated; "hardware": for a K1);
    `attention`: the spec's attention kernels (ir.load_attention_specs), which GroupQueryAttention nodes run on."""
    return build_library(specs, spec_file, flavour=flavour, attention=attention)


def rewrite_model(model, specs: list[KernelSpec]) -> list[NodeDecision]:
    """Move the com.microsoft MatMulNBits nodes the spec serves into imegen's domain (in place)."""
    return rewrite(model, specs)


__all__ = ["Kernel", "NodeDecision", "OrtError", "RiscvSession", "build_kernel", "build_ort_library", "load_attention",
           "load_spec", "parse_stats", "rewrite_model", "weights"]
