"""ONNX Runtime MLAS QNBitGemm dispatch: the entry points imegen fills, in one table per ORT pin.

ENTRIES is imegen's C ABI: plain C functions in the generated dispatch .c, shaped like
MLAS_QNBIT_GEMM_DISPATCH in onnxruntime/core/mlas/lib/qnbitgemm.h at ORT commit 001d12d2.
PINS maps each supported ORT version to its dispatch members (ORT's exact C++ signatures, read from
that version's qnbitgemm.h); the generated C++ glue (compiled inside ORT) wraps each C entry in a
function with the pinned signature: it casts std::byte* and the compute-type enum, drops what imegen
does not use (the selector config: one kernel per block size and compute type), supplies what the
older ABI lacks, and unpacks PackedQuantBDataStruct<float, 8>& into the three regions imegen fills.

- "main" (ORT commit 001d12d2): pack, size and workspace functions take a trailing
  MLAS_BACKEND_KERNEL_SELECTOR_CONFIG*; 8-bit weights run through the BlkSum family.
- "1.21" (ORT 1.21.0, Debian's onnxruntime 1.21.0+dfsg source): no selector config; the size and
  workspace members are 4-bit only (Q4BitGemmPackQuantBDataSize without HasZeroPoint,
  Q4BitGemmPerGemmWorkspaceSize/-Alignment); no 8-bit members at all.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import SpecError
from ..names import dispatch_prefix
from ..plan import KernelPlan

ORT_COMMIT = "001d12d2623fd411ce0f83d05abb5e82304a3389"  # the "main" pin
COMPUTE_FP32 = 0  # SQNBIT_CompFp32, first enumerator of MLAS_QNBIT_GEMM_COMPUTE_TYPE
COMPUTE_INT8 = 3  # SQNBIT_CompInt8
WORKSPACE_ALIGNMENT = 64
WORKSPACE_SLACK = 64  # IME gemv loads 32 bytes of A at a time and may read past the last row
BLKSUM_ALIGNMENT = 64  # PackedQuantBDataStruct aligns QuantBBlkSum to 16 floats
BLKSUM_COLUMNS = 16  # ... and sizes it for N rounded up to 16 columns

# short name -> (C parameter(s), C++ parameter, C++ expression(s) passed to C); "{n}" is the name.
# C None: the parameter exists only on the C++ side and is not passed on.
_TYPES = {
    "size": ("size_t {n}", "size_t {n}", "{n}"),
    "bool": ("bool {n}", "bool {n}", "{n}"),
    "compute": ("int {n}", "MLAS_QNBIT_GEMM_COMPUTE_TYPE {n}", "static_cast<int>({n})"),
    "cbytes": ("const uint8_t *{n}", "const std::byte *{n}", "reinterpret_cast<const uint8_t *>({n})"),
    "bytes": ("uint8_t *{n}", "std::byte *{n}", "reinterpret_cast<uint8_t *>({n})"),
    "cfloats": ("const float *{n}", "const float *{n}", "{n}"),
    "floats": ("float *{n}", "float *{n}", "{n}"),
    "pool": ("void *{n}", "MLAS_THREADPOOL *{n}", "{n}"),
    "selector": (None, "const MLAS_BACKEND_KERNEL_SELECTOR_CONFIG *", None),
    # ORT computes the regions (PackedQuantBData | 64-B aligned QuantBBlkSum | PackedQuantBScale)
    # from the size imegen reports; the unsigned-A correction region exists only for ARM64 kernels.
    "packed8": ("uint8_t *PackedQuantBData, float *PackedQuantBScale, float *QuantBBlkSum",
                "PackedQuantBDataStruct<float, 8> &{n}",
                "reinterpret_cast<uint8_t *>({n}.PackedQuantBData), {n}.PackedQuantBScale, {n}.QuantBBlkSum"),
    "void": ("void", "void", ""),
}
CXX_GUARDS = {  # C++ statements the glue runs before calling C, per parameter type
    "packed8": "if ({n}.BlkUnsignedQuantAZeroPointCorrection != nullptr) imegen_refuse(\"an unsigned-A correction region (ARM64 only)\");",
}

# Which (bits, compute) groups an entry serves: the glue assigns it only when the spec has one.
ANY, FP32_4, INT8_4, INT8_8 = (), ((4, COMPUTE_FP32),), ((4, COMPUTE_INT8),), ((8, COMPUTE_INT8),)
BITS4 = FP32_4 + INT8_4


@dataclass(frozen=True)
class Entry:
    member: str  # MLAS_QNBIT_GEMM_DISPATCH member (and the generated function's suffix)
    ret: str
    params: tuple[tuple[str, str], ...]  # (type short name, parameter name)
    serves: tuple[tuple[int, int], ...]  # (bits, compute) groups; () = every dispatch

    def signature(self, prefix: str) -> str:
        """The C declaration in the generated dispatch .c / .h."""
        args = ", ".join(_TYPES[t][0].format(n=n) for t, n in self.params if _TYPES[t][0] is not None)
        return f"{_TYPES[self.ret][0].format(n='').strip()} {prefix}{self.member}({args})"



def _e(member: str, ret: str, params: str, serves: tuple[tuple[int, int], ...]) -> Entry:
    return Entry(member, ret, tuple(tuple(p.split()) for p in params.split(",")), serves)  # type: ignore[misc]


ENTRIES = (
    _e("Q4BitGemmPackQuantBDataSize", "size", "size N, size K, size BlkLen, bool HasZeroPoint, compute ComputeType, "
       "selector Config", BITS4),
    _e("Q8BitGemmPackQuantBDataSize", "size", "size N, size K, size BlkLen, bool HasZeroPoint, compute ComputeType, "
       "selector Config", INT8_8),
    _e("SQ4BitGemmPackQuantBData", "void", "size N, size K, size BlkLen, compute ComputeType, cbytes QuantBDataBegin, "
       "bytes PackedQuantBDataBegin, pool ThreadPool, selector Config", BITS4),
    _e("SQ8BitGemmPackQuantBDataAndBlkSum", "void", "size N, size K, size BlkLen, compute ComputeType, "
       "cbytes QuantBDataBegin, cfloats QuantBScaleBegin, bool HasZeroPoint, cbytes QuantBZPBegin, "
       "packed8 PackedQuantB, pool ThreadPool, selector Config", INT8_8),
    _e("QNBitGemmPerGemmWorkspaceSize", "size", "size M, size N, size K, size BlkLen, bool HasZeroPoint, "
       "compute ComputeType, size BlkBitWidth, selector Config", ANY),
    _e("QNBitGemmPerGemmWorkspaceAlignment", "size", "size BlkLen, compute ComputeType", ANY),
    _e("SQ4BitGemmM1Kernel_CompFp32", "void", "size BlkLen, cfloats A, cbytes QuantBData, cfloats QuantBScale, "
       "cbytes QuantBZeroPoint, floats C, size CountN, size CountK, size BlockStrideQuantB, cfloats Bias", FP32_4),
    _e("SQ4BitBlkDequantBForSgemm_CompFp32", "void", "size BlkLen, floats FpData, cbytes QuantBData, "
       "cfloats QuantBScale, cbytes QuantBZeroPoint, size CountN, size CountK, size BlockStrideQuantB", FP32_4),
    _e("QuantizeARow_CompInt8", "void", "size BlkLen, cfloats A, size CountK, bytes QuantA", INT8_4),
    _e("SQ4BitGemmKernel_CompInt8", "size", "size BlkLen, cbytes QuantA, cbytes QuantBData, cfloats QuantBScale, "
       "cbytes QuantBZeroPoint, floats C, size CountM, size CountN, size CountK, size BlockCountK, size ldc, "
       "cfloats Bias", INT8_4),
    _e("QuantizeARowComputeBlkSum_CompInt8", "void", "size BlkLen, cfloats A, size CountK, bytes QuantA, "
       "floats QuantAScale, floats AScaledGroupSum", INT8_8),
    _e("SQ8BitGemmKernel_BlkSum_CompInt8", "size", "size BlkLen, cbytes QuantA, cfloats QuantAScale, "
       "cbytes QuantBData, cfloats QuantBScale, cbytes QuantBZeroPoint, floats C, size CountM, size CountN, "
       "size CountK, size BlockCountK, cfloats Bias, size ldc, cfloats ABlockSum, cfloats QuantBBlkSum, "
       "cfloats BlkUnsignedQuantAZeroPointCorrection", INT8_8),
)


C_ENTRY = {e.member: e for e in ENTRIES}


@dataclass(frozen=True)
class OrtEntry:
    """One MLAS_QNBIT_GEMM_DISPATCH member of a pinned ORT version and the C entry it forwards to."""

    member: str
    params: tuple[tuple[str, str], ...]  # ORT's parameters, matched to the C entry's by name
    forward: Entry
    supply: tuple[tuple[str, str], ...] = ()  # C parameters ORT does not pass: (name, C++ value)

    def cxx_wrapper(self, prefix: str) -> str:
        """A C++ function with ORT's signature that forwards to the C entry point."""
        ours, supplied = {n: t for t, n in self.params}, dict(self.supply)
        params = ", ".join(_TYPES[t][1].format(n=n) for t, n in self.params)
        args = ", ".join(supplied[n] if n not in ours else _TYPES[t][2].format(n=n)
                         for t, n in self.forward.params if _TYPES[t][2] is not None)
        guards = "".join(f"\n    {CXX_GUARDS[t].format(n=n)}" for t, n in self.params if t in CXX_GUARDS)
        ret = self.forward.ret
        return (f"{_TYPES[ret][1].format(n='').strip()} imegen_{self.member}({params})\n{{{guards}\n"
                f"    IMEGEN_COUNT_CALL({self.member});\n"
                f"    {'return ' if ret != 'void' else ''}{prefix}{self.forward.member}({args});\n}}")


def _o(member: str, params: str, forward: str | None = None, **supply: str) -> OrtEntry:
    return OrtEntry(member, tuple(tuple(p.split()) for p in params.split(",")),  # type: ignore[misc]
                    C_ENTRY[forward or member], tuple(supply.items()))


@dataclass(frozen=True)
class OrtPin:
    name: str  # what `imegen generate --mlas-pin` takes
    label: str  # the ORT source it was read from
    groups: tuple[tuple[int, int], ...]  # (bits, compute) that version's MLAS routes to a dispatch
    entries: tuple[OrtEntry, ...]


PINS = {
    "main": OrtPin("main", f"ORT commit {ORT_COMMIT[:8]}", BITS4 + INT8_8,
                   tuple(OrtEntry(e.member, e.params, e) for e in ENTRIES)),
    "1.21": OrtPin("1.21", "ORT 1.21.0", BITS4, (
        _o("Q4BitGemmPackQuantBDataSize", "size N, size K, size BlkLen, compute ComputeType", HasZeroPoint="false"),
        _o("SQ4BitGemmPackQuantBData", "size N, size K, size BlkLen, compute ComputeType, cbytes QuantBDataBegin, "
           "bytes PackedQuantBDataBegin, pool ThreadPool"),
        _o("Q4BitGemmPerGemmWorkspaceSize", "size M, size N, size K, size BlkLen, compute ComputeType",
           "QNBitGemmPerGemmWorkspaceSize", HasZeroPoint="false", BlkBitWidth="4"),
        _o("Q4BitGemmPerGemmWorkspaceAlignment", "size BlkLen, compute ComputeType", "QNBitGemmPerGemmWorkspaceAlignment"),
        *(OrtEntry(m, C_ENTRY[m].params, C_ENTRY[m]) for m in (
            "SQ4BitGemmM1Kernel_CompFp32", "SQ4BitBlkDequantBForSgemm_CompFp32", "QuantizeARow_CompInt8",
            "SQ4BitGemmKernel_CompInt8")),
    )),
}
DEFAULT_PIN = "main"


@dataclass(frozen=True)
class Group:
    """The kernels serving one (bits, block size, compute type): they share one packed-B layout."""

    bits: int
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
    pin: OrtPin = PINS[DEFAULT_PIN]

    def serves(self, entry: Entry) -> bool:
        """Does some group use this entry point (so the glue assigns it)?"""
        return not entry.serves or any((g.bits, g.compute) in entry.serves for g in self.groups)

    def groups_for(self, bits: int, compute: int) -> list[Group]:
        return [g for g in self.groups if (g.bits, g.compute) == (bits, compute)]


def plan_dispatch(plans: list[KernelPlan], spec_file: str, ort: str = DEFAULT_PIN) -> DispatchPlan | None:
    """Group a spec's abi=mlas kernels by (bits, block, compute) for ORT pin `ort`; None if it has none."""
    mlas = [p for p in plans if p.spec.abi == "mlas"]
    if not mlas:
        return None
    if ort not in PINS:
        raise SpecError(None, f"unknown ORT version '{ort}': imegen's MLAS glue is pinned to {', '.join(PINS)}")
    pin = PINS[ort]
    roles: dict[tuple[int, int, int], dict[str, KernelPlan]] = {}
    for p in mlas:
        s = p.spec
        compute = COMPUTE_FP32 if s.compute == "fp32" else COMPUTE_INT8
        if (s.bits, compute) not in pin.groups:
            raise SpecError(s.source, f"kernel '{s.name}': {pin.label}'s MLAS has no {s.bits}-bit {s.compute} QNBitGemm "
                            f"entry points (it routes only {', '.join(f'{b}-bit ' + ('fp32' if c == COMPUTE_FP32 else 'int8') for b, c in pin.groups)})")
        role = {("fp32", "gemv"): "m1", ("fp32", "gemm"): "dequant", ("int8", "gemv"): "gemv", ("int8", "gemm"): "gemm"}[(s.compute, s.op)]
        group = roles.setdefault((s.bits, s.block, compute), {})
        if role in group:
            raise SpecError(s.source, f"kernel '{s.name}': MLAS dispatch already has '{group[role].name}' as {role} kernel "
                            f"for {s.bits}-bit block {s.block}")
        for other in group.values():
            if other.pack != p.pack:
                raise SpecError(s.source, f"kernel '{s.name}' packs B differently from '{other.name}', but MLAS packs B once "
                                f"per bit width, compute type and block size: give both the same unpack and panel")
        group[role] = p
    groups = []
    for (bits, block, compute), g in sorted(roles.items()):
        if compute == COMPUTE_FP32 and set(g) != {"m1", "dequant"}:
            have = next(iter(g.values()))
            raise SpecError(have.spec.source, f"MLAS CompFp32 for block {block} needs both an fp32 gemv kernel (M=1) and an "
                            f"fp32 gemm kernel (dequantize B for SGEMM); only {', '.join(sorted(g))} given")
        groups.append(Group(bits, block, compute, next(iter(g.values())), **g))
    return DispatchPlan(dispatch_prefix(spec_file), tuple(groups), tuple(mlas), pin)
