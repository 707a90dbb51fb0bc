"""ONNX Runtime MLAS QNBitGemm dispatch: the entry points imegen fills, in one table.

Signatures follow MLAS_QNBIT_GEMM_DISPATCH in onnxruntime/core/mlas/lib/qnbitgemm.h (ORT 1.2x,
without the later trailing MLAS_BACKEND_KERNEL_SELECTOR_CONFIG*): a change of ORT version is an
edit of ENTRIES. Each parameter has its C spelling (the generated dispatch .c) and its C++
spelling (the glue .cpp compiled inside ORT); the two are ABI-identical (std::byte* = uint8_t*,
the compute-type enum = int, MLAS_THREADPOOL* = void*).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from .errors import SpecError
from .plan import KernelPlan

COMPUTE_FP32 = 0  # SQNBIT_CompFp32, first enumerator of MLAS_QNBIT_GEMM_COMPUTE_TYPE
COMPUTE_INT8 = 3  # SQNBIT_CompInt8
WORKSPACE_ALIGNMENT = 64
WORKSPACE_SLACK = 64  # IME gemv loads 32 bytes of A at a time and may read past the last row

_TYPES = {  # short name -> (C, C++)
    "size": ("size_t", "size_t"),
    "bool": ("bool", "bool"),
    "compute": ("int", "MLAS_QNBIT_GEMM_COMPUTE_TYPE"),
    "cbytes": ("const uint8_t *", "const std::byte *"),
    "bytes": ("uint8_t *", "std::byte *"),
    "cfloats": ("const float *", "const float *"),
    "floats": ("float *", "float *"),
    "pool": ("void *", "MLAS_THREADPOOL *"),
    "void": ("void", "void"),
}


@dataclass(frozen=True)
class Entry:
    member: str  # MLAS_QNBIT_GEMM_DISPATCH member (and the generated function's suffix)
    ret: str
    params: tuple[tuple[str, str], ...]  # (type short name, parameter name)

    def signature(self, prefix: str, lang: str) -> str:
        i = 0 if lang == "c" else 1
        args = ", ".join(f"{_TYPES[t][i]}{'' if _TYPES[t][i].endswith('*') else ' '}{n}" for t, n in self.params)
        return f"{_TYPES[self.ret][i]} {prefix}{self.member}({args})"


def _e(member: str, ret: str, params: str) -> Entry:
    return Entry(member, ret, tuple(tuple(p.split()) for p in params.split(",")))  # type: ignore[misc]


ENTRIES = (
    _e("Q4BitGemmPackQuantBDataSize", "size", "size N, size K, size BlkLen, bool HasZeroPoint, compute ComputeType"),
    _e("SQ4BitGemmPackQuantBData", "void", "size N, size K, size BlkLen, compute ComputeType, cbytes QuantBDataBegin, "
       "bytes PackedQuantBDataBegin, pool ThreadPool"),
    _e("QNBitGemmPerGemmWorkspaceSize", "size", "size M, size N, size K, size BlkLen, bool HasZeroPoint, "
       "compute ComputeType, size BlkBitWidth"),
    _e("QNBitGemmPerGemmWorkspaceAlignment", "size", "size BlkLen, compute ComputeType"),
    _e("SQ4BitGemmM1Kernel_CompFp32", "void", "size BlkLen, cfloats A, cbytes QuantBData, cfloats QuantBScale, "
       "cbytes QuantBZeroPoint, floats C, size CountN, size CountK, size BlockStrideQuantB, cfloats Bias"),
    _e("SQ4BitBlkDequantBForSgemm_CompFp32", "void", "size BlkLen, floats FpData, cbytes QuantBData, "
       "cfloats QuantBScale, cbytes QuantBZeroPoint, size CountN, size CountK, size BlockStrideQuantB"),
    _e("QuantizeARow_CompInt8", "void", "size BlkLen, cfloats A, size CountK, bytes QuantA"),
    _e("SQ4BitGemmKernel_CompInt8", "size", "size BlkLen, cbytes QuantA, cbytes QuantBData, cfloats QuantBScale, "
       "cbytes QuantBZeroPoint, floats C, size CountM, size CountN, size CountK, size BlockCountK, size ldc, "
       "cfloats Bias"),
)
FP32_ENTRIES = ("SQ4BitGemmM1Kernel_CompFp32", "SQ4BitBlkDequantBForSgemm_CompFp32")
INT8_ENTRIES = ("QuantizeARow_CompInt8", "SQ4BitGemmKernel_CompInt8")


@dataclass(frozen=True)
class Group:
    """The kernels serving one (block size, compute type): they share one packed-B layout."""

    block: int
    compute: int
    packer: KernelPlan
    m1: KernelPlan | None = None  # CompFp32, M == 1
    dequant: KernelPlan | None = None  # CompFp32, M > 1 (dequantize B for MLAS's SGEMM)
    gemv: KernelPlan | None = None  # CompInt8, CountM == 1
    gemm: KernelPlan | None = None  # CompInt8


@dataclass(frozen=True)
class DispatchPlan:
    prefix: str
    groups: tuple[Group, ...]
    kernels: tuple[KernelPlan, ...]

    def has(self, compute: int) -> bool:
        return any(g.compute == compute for g in self.groups)


def dispatch_prefix(spec_file: str) -> str:
    return re.sub(r"\W", "_", Path(spec_file).stem) + "_"


def plan_dispatch(plans: list[KernelPlan], spec_file: str) -> DispatchPlan | None:
    """Group a spec's abi=mlas kernels by (block, compute); None if it has none."""
    mlas = [p for p in plans if p.spec.abi == "mlas"]
    if not mlas:
        return None
    roles: dict[tuple[int, int], dict[str, KernelPlan]] = {}
    for p in mlas:
        s = p.spec
        compute = COMPUTE_FP32 if s.compute == "fp32" else COMPUTE_INT8
        role = {("fp32", "gemv"): "m1", ("fp32", "gemm"): "dequant", ("int8", "gemv"): "gemv", ("int8", "gemm"): "gemm"}[(s.compute, s.op)]
        group = roles.setdefault((s.block, compute), {})
        if role in group:
            raise SpecError(s.source, f"kernel '{s.name}': MLAS dispatch already has '{group[role].name}' as {role} kernel for block {s.block}")
        for other in group.values():
            if other.pack != p.pack:
                raise SpecError(s.source, f"kernel '{s.name}' packs B differently from '{other.name}', but MLAS packs B once "
                                f"per compute type and block size: give both the same unpack and panel")
        group[role] = p
    groups = []
    for (block, compute), g in sorted(roles.items()):
        if compute == COMPUTE_FP32 and set(g) != {"m1", "dequant"}:
            have = next(iter(g.values()))
            raise SpecError(have.spec.source, f"MLAS CompFp32 for block {block} needs both an fp32 gemv kernel (M=1) and an "
                            f"fp32 gemm kernel (dequantize B for SGEMM); only {', '.join(sorted(g))} given")
        groups.append(Group(block, compute, next(iter(g.values())), **g))
    return DispatchPlan(dispatch_prefix(spec_file), tuple(groups), tuple(mlas))
