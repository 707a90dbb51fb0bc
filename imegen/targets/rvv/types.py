"""RVV intrinsic type suffixes of an rvv kernel's register groups."""

from __future__ import annotations

from dataclasses import dataclass

from ...spec import KernelSpec
from ..base import lmul_for, lmul_name

_TYPE_PREFIX = {"f": "vfloat", "i": "vint", "u": "vuint"}


def vector_type(suffix: str) -> str:
    """RVV intrinsic suffix -> C type: 'f32m2' -> 'vfloat32m2_t', 'u8mf2' -> 'vuint8mf2_t'."""
    return f"{_TYPE_PREFIX[suffix[0]]}{suffix[1:]}_t"


@dataclass(frozen=True)
class RvvTypes:
    """Type/intrinsic suffixes: e.g. f32='f32m2', u8='u8mf2'."""

    lmul: int  # of the 32-bit accumulators
    f32: str
    i32: str
    u32: str
    i16: str
    u16: str
    u8: str


def rvv_types(spec: KernelSpec) -> RvvTypes:
    if spec.compute == "fp32":
        l32 = lmul_for(spec.tile_n * 32, spec.vlen)
        return RvvTypes(l32, f"f32m{l32}", f"i32m{l32}", f"u32m{l32}", "", "", "u8" + lmul_name(l32, 4))
    l16 = lmul_for(spec.tile_n * 16, spec.vlen)
    l32 = 2 * l16
    return RvvTypes(l32, f"f32m{l32}", f"i32m{l32}", f"u32m{l32}", f"i16m{l16}", f"u16m{l16}", "u8" + lmul_name(l16, 2))
