"""RVV attention kernels (`attention NAME { tile = RxB ... }`): validation and the plan
templates/attention_rvv.c.j2 renders.

A call computes O = softmax(scale Q K^T) V for R query rows at a time that share one KV head, each row
seeing its own number of keys (causal). Keys stream in blocks of B: the R score vectors of a block (B lanes
each, one register group per row) accumulate over the head dimension from one strided load of a K column
per step, shared by the R rows; an online softmax (running max and sum per row, flash attention) turns them
into probabilities, and P V accumulates into the rows' fp32 outputs in memory, vectorized over the head
dimension. Nothing depends on the head dimension at generation time, and nothing on VLEN beyond the least
the spec names: the register groups hold B lanes from that VLEN up (vsetvl gives exactly B).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ...spec import AttentionSpec
from ..base import VECTOR_REGISTERS, Refuse, lmul_for

DEFAULT_VLEN = 128
MAX_LMUL = 8
MAX_ROWS = 16
SOFTMAX_TEMPORARIES = 3  # per block and row: the probabilities, the lane index, a scratch group
O_LMUL = 4  # the output rows' register group in the P V loop (the score groups are dead by then)


def budget(spec: AttentionSpec) -> dict[str, int]:
    lmul = lmul_for(spec.kv_block * 32, spec.vlen)
    return {"score rows": spec.q_rows * lmul, "K column": lmul, "softmax temporaries": SOFTMAX_TEMPORARIES * lmul}


def validate(spec: AttentionSpec, refuse: Refuse) -> AttentionSpec:
    spec = replace(spec, vlen=spec.vlen or DEFAULT_VLEN)
    if not 1 <= spec.q_rows <= MAX_ROWS:
        refuse("tile", f"{spec.q_rows} query rows; 1..{MAX_ROWS} (each keeps a register group of scores)")
    if spec.kv_block < 1 or spec.kv_block & (spec.kv_block - 1):
        refuse("tile", f"{spec.kv_block} keys per block: a power of two (one register group of fp32 scores)")
    if spec.kv_block * 32 > MAX_LMUL * spec.vlen:
        refuse("tile", f"{spec.kv_block} keys per block need LMUL > {MAX_LMUL} at VLEN={spec.vlen}")
    regs = budget(spec)
    if sum(regs.values()) > VECTOR_REGISTERS:
        parts = ", ".join(f"{k} {v}" for k, v in regs.items())
        refuse("tile", f"tile {spec.q_rows}x{spec.kv_block} needs {sum(regs.values())} vector registers ({parts}) > "
                       f"{VECTOR_REGISTERS} at VLEN={spec.vlen}")
    return spec


@dataclass(frozen=True)
class AttentionPlan:
    spec: AttentionSpec
    s_lmul: int  # register group of one row's block scores
    f32: str  # their intrinsic suffix, e.g. f32m2
    u32: str
    b1: str  # mask type suffix for that group (b32 / lmul)
    o_f32: str  # the output rows' suffix in the P V loop

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def rows(self) -> range:
        return range(self.spec.q_rows)


def plan(spec: AttentionSpec) -> AttentionPlan:
    lmul = lmul_for(spec.kv_block * 32, spec.vlen)
    return AttentionPlan(spec, lmul, f"f32m{lmul}", f"u32m{lmul}", f"b{32 // lmul}", f"f32m{O_LMUL}")
