"""The rvv micro-kernel's statements, intrinsics spelled here: each of the TM rows keeps TN columns in
one register group; per k step one packed-B byte row is loaded, unpacked, widened and accumulated.
templates/micro_rvv.c.j2 places these statements in the tile function's loops."""

from __future__ import annotations

from dataclasses import dataclass

from ...spec import KernelSpec
from ..base import byte_row_k_pair, default_zero_point
from .types import RvvTypes, rvv_types, vector_type

# Continuation lines of the longer statements, indented under their start.
_W_CONT = "\n" + " " * 20
_SCALE_CONT = "\n" + " " * 12
_FOLD_CONT = "\n" + " " * 43


@dataclass(frozen=True)
class RvvPlan:
    """KernelPlan.rvv: the statements of one rvv tile, by where the template places them."""

    types: RvvTypes
    setvl: str  # vsetvl for the 32-bit accumulators: setvl(TN), setvl(cols)
    a_type: str  # A's element type in the k loop (fp32 A, or quantized int8 A)
    a_view: str  # the aview accessor of a row's block: a_block | qa_block
    k_rows: int  # packed-B byte rows per block
    acc_init: tuple[str, ...]  # the tile's fp32 accumulators, zeroed
    block_loads: tuple[str, ...]  # per block, before the k loop: scales, zero points, int32 dots
    k_step: tuple[str, ...]  # one byte row: load, unpack, multiply-accumulate every row
    block_fold: tuple[str, ...]  # per block, after the k loop (int8): acc += float(dot) * b_scale * a_scale
    bias_add: tuple[str, ...]  # the first K chunk: the bias into every row
    stores: tuple[str, ...]  # row i's store into C (added to C after the first K chunk)

    @property
    def lmul(self) -> int:
        return self.types.lmul


def _b_values(spec: KernelSpec, T: RvvTypes, codes: str, blksum: bool) -> str:
    """B values (code - zero point) of one nibble plane, in the compute type."""
    sub = "vsub_vv" if spec.zero_point == "asymmetric" else "vsub_vx"
    if spec.compute == "fp32":
        return (f"__riscv_vfmul_vv_{T.f32}(__riscv_vfcvt_f_x_v_{T.f32}({_W_CONT}__riscv_{sub}_{T.i32}("
                f"__riscv_vreinterpret_v_{T.u32}_{T.i32}(__riscv_vzext_vf4_{T.u32}({codes}, vl)), zp, vl), vl), scale, vl)")
    if blksum:  # codes stored signed (q - 128)
        return f"__riscv_vsext_vf2_{T.i16}(__riscv_vreinterpret_v_{T.u8}_{T.u8.replace('u', 'i')}({codes}), vl)"
    return f"__riscv_{sub}_{T.i16}(__riscv_vreinterpret_v_{T.u16}_{T.i16}(__riscv_vzext_vf2_{T.u16}({codes}, vl)), zp, vl)"


def _block_loads(spec: KernelSpec, T: RvvTypes, zp_default: int, blksum: bool) -> tuple[str, ...]:
    asym = spec.zero_point == "asymmetric"
    zp8 = f"__riscv_vle8_v_{T.u8}(ch.zp + c0, vl)"
    if spec.compute == "fp32":
        zp = (f"const {vector_type(T.i32)} zp = __riscv_vreinterpret_v_{T.u32}_{T.i32}(__riscv_vzext_vf4_{T.u32}({zp8}, vl));"
              if asym else f"const int32_t zp = {zp_default};")
        return f"const {vector_type(T.f32)} scale = __riscv_vle32_v_{T.f32}(ch.scales + c0, vl);", zp
    if asym:
        zp = (f"const {vector_type(T.i16)} zp = __riscv_vreinterpret_v_{T.u16}_{T.i16}(__riscv_vzext_vf2_{T.u16}({zp8}, vl));",)
    else:
        zp = () if blksum else (f"const int16_t zp = {zp_default};",)
    return (*zp, *(f"{vector_type(T.i32)} dot{i} = __riscv_vmv_v_x_{T.i32}(0, vl);" for i in range(spec.tile_m)))


def _k_step(spec: KernelSpec, T: RvvTypes, k_index: tuple[str, ...], blksum: bool) -> tuple[str, ...]:
    planes = ([f"__riscv_vand_vx_{T.u8}(codes, 15, vl)", f"__riscv_vsrl_vx_{T.u8}(codes, 4, vl)"] if spec.bits == 4
              else ["codes"])
    w_type = vector_type(T.f32 if spec.compute == "fp32" else T.i16)
    lines = [f"const {vector_type(T.u8)} codes = __riscv_vle8_v_{T.u8}(ch.data + kp * NB + c0, vl);"]
    for n, (k, plane) in enumerate(zip(k_index, planes)):
        lines.append(f"const {w_type} w{n} = {_b_values(spec, T, plane, blksum)};")
        for i in range(spec.tile_m):
            lines.append(f"acc{i} = __riscv_vfmacc_vf_{T.f32}(acc{i}, a[{i}][{k}], w{n}, vl);" if spec.compute == "fp32"
                         else f"dot{i} = __riscv_vwmacc_vx_{T.i32}(dot{i}, a[{i}][{k}], w{n}, vl);")
    return tuple(lines)


def _b_scale(spec: KernelSpec, T: RvvTypes) -> tuple[str, ...]:
    f32, u32 = vector_type(T.f32), vector_type(T.u32)
    if spec.scale_type != "fp16":
        return (f"const {f32} bscale = __riscv_vle32_v_{T.f32}(ch.scales + c0, vl);",)
    return ("/* fp16 -> fp32 (finite): magnitude bits << 13 are the value * 2^-112; rebias, then the sign */",
            f"const {u32} h = __riscv_vzext_vf2_{T.u32}(__riscv_vle16_v_{T.u16}(ch.scales_h + c0, vl), vl);",
            f"const {f32} mag = __riscv_vfmul_vf_{T.f32}(__riscv_vreinterpret_v_{T.u32}_{T.f32}({_SCALE_CONT}"
            f"__riscv_vsll_vx_{T.u32}(__riscv_vand_vx_{T.u32}(h, 0x7fff, vl), 13, vl)), 0x1p112f, vl);",
            f"const {f32} bscale = __riscv_vreinterpret_v_{T.u32}_{T.f32}(__riscv_vor_vv_{T.u32}({_SCALE_CONT}"
            f"__riscv_vreinterpret_v_{T.f32}_{T.u32}(mag), __riscv_vsll_vx_{T.u32}(__riscv_vsrl_vx_{T.u32}(h, 15, vl), 31, vl), vl));")


def _block_fold(spec: KernelSpec, T: RvvTypes, blksum: bool) -> tuple[str, ...]:
    """int8: acc += float(dot) * (b_scale * a_scale) (+ MLAS's block-sum product)."""
    if spec.compute != "int8":
        return ()
    P = f"{spec.name}_"
    lines = ["/* acc += float(dot) * b_scale * a_scale */", *_b_scale(spec, T)]
    if blksum:
        lines.append(f"const {vector_type(T.f32)} bsum = __riscv_vle32_v_{T.f32}(ch.bsum + c0, vl);")
    for i in range(spec.tile_m):
        lines.append(f"acc{i} = __riscv_vfmacc_vf_{T.f32}(acc{i}, {P}qa_scale(av, row[{i}], blk),{_FOLD_CONT}"
                     f"__riscv_vfmul_vv_{T.f32}(__riscv_vfcvt_f_x_v_{T.f32}(dot{i}, vl), bscale, vl), vl);")
        if blksum:
            lines.append(f"acc{i} = __riscv_vfmacc_vf_{T.f32}(acc{i}, {P}qa_blksum(av, row[{i}], blk), bsum, vl);")
    return tuple(lines)


def rvv_plan(spec: KernelSpec) -> RvvPlan:
    T = rvv_types(spec)
    k_index, zp_default, blksum = byte_row_k_pair(spec), default_zero_point(spec), spec.zero_point == "blksum"
    f32 = T.f32
    return RvvPlan(
        types=T, setvl=f"__riscv_vsetvl_e32m{T.lmul}", a_type="float" if spec.compute == "fp32" else "int8_t",
        a_view="a_block" if spec.compute == "fp32" else "qa_block", k_rows=spec.block // 2 if spec.bits == 4 else spec.block,
        acc_init=tuple(f"{vector_type(f32)} acc{i} = __riscv_vfmv_v_f_{f32}(0.0f, vl);" for i in range(spec.tile_m)),
        block_loads=_block_loads(spec, T, zp_default, blksum),
        k_step=_k_step(spec, T, k_index, blksum),
        block_fold=_block_fold(spec, T, blksum),
        bias_add=(f"const {vector_type(f32)} b = __riscv_vle32_v_{f32}(bias, vs);",
                  *(f"acc{i} = __riscv_vfadd_vv_{f32}(acc{i}, b, vs);" for i in range(spec.tile_m))),
        stores=tuple(f"__riscv_vse32_v_{f32}(c + {i} * ldc, blk0 ? __riscv_vfadd_vv_{f32}(acc{i}, "
                     f"__riscv_vle32_v_{f32}(c + {i} * ldc, vs), vs) : acc{i}, vs);" for i in range(spec.tile_m)),
    )
