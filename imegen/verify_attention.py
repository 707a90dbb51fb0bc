"""Build, run and judge attention kernels (`attention NAME { ... }`) for `imegen check`: a driver feeds the
compiled kernel cases under QEMU at each VLEN, and each output is compared to a float64 NumPy attention
written here (softmax(scale Q K^T) V over each row's visible keys), never to the generator's own output."""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from . import cache, targets, toolchain
from .render import render_attention, render_attention_driver

# |got - want| <= TOLERANCE x (1 + max |want|) per case: fp32 dot products and sums over a few hundred terms
TOLERANCE = 2e-5


@dataclass(frozen=True)
class AttentionCase:
    len: np.ndarray  # uint32 [rows]: keys each row sees
    Q: np.ndarray  # float32 [rows, head_dim]
    K: np.ndarray  # float32 [keys, head_dim]
    V: np.ndarray
    scale: float

    @property
    def shape(self) -> tuple[int, int, int]:
        return self.Q.shape[0], self.Q.shape[1], self.K.shape[0]


@dataclass(frozen=True)
class AttentionResult:
    status: int
    O: np.ndarray


def plan_for(spec):
    return targets.get(spec.target).plan_attention(spec)


def build(plan, spec_file: str) -> Path:
    """The kernel and its driver, compiled for riscv64 (cached by their sources and the toolchain)."""
    sources = render_attention(plan, spec_file)
    sources["driver.c"] = render_attention_driver(plan, spec_file)
    march = targets.get(plan.spec.target).march
    inputs = cache.Inputs((), tuple(f"{n}\n{t}" for n, t in sorted(sources.items()))) + \
        toolchain.inputs("clang", marches=(march,))

    def fill(d: Path) -> None:
        for name, text in sources.items():
            (d / name).write_text(text)
        toolchain.compile_c([d / f"{plan.name}.c", d / "driver.c"], d / "driver", march=march, include_dirs=[d])

    return cache.entry(f"attn-{plan.name}", inputs.key(), fill) / "driver"


def make_cases(rng: np.random.Generator, q_rows: int, kv_block: int) -> list[AttentionCase]:
    """Rows around the tile (a partial tile, one tile, several), keys around the block (one key, a partial
    block, several blocks), head dims short and long, causal lengths and rows of equal length, scores large
    enough that a softmax without its running maximum would overflow."""
    cases = []
    for rows in sorted({1, q_rows, q_rows + 1, 2 * q_rows + 1}):
        for keys in sorted({1, kv_block - 1 or 1, kv_block, 3 * kv_block + 5}):
            for head_dim in (8, 64, 67):
                lens = np.minimum(keys, keys - rows + 1 + np.arange(rows)).clip(1).astype(np.uint32)
                if rows % 2:  # rows of one length (heads of one position), longest first
                    lens = np.full(rows, keys, np.uint32)
                cases.append(_case(rng, lens, keys, head_dim, big=(rows + keys) % 3 == 0))
    return cases


def _case(rng, lens, keys, head_dim, big=False) -> AttentionCase:
    spread = 8.0 if big else 1.0
    f = lambda *shape: (spread * rng.standard_normal(shape)).astype(np.float32)  # noqa: E731
    return AttentionCase(lens, f(len(lens), head_dim), f(keys, head_dim), f(keys, head_dim),
                         float(1 / np.sqrt(head_dim)))


def _encode(cases: list[AttentionCase]) -> bytes:
    parts = [struct.pack("<I", len(cases))]
    for c in cases:
        rows, hd, keys = c.shape
        parts += [struct.pack("<3If", rows, hd, keys, c.scale), c.len.astype("<u4").tobytes(),
                  c.Q.astype("<f4").tobytes(), c.K.astype("<f4").tobytes(), c.V.astype("<f4").tobytes()]
    return b"".join(parts)


def run_cases(exe: Path, cases: list[AttentionCase], vlen: int) -> list[AttentionResult]:
    out = toolchain.run(exe, vlen=vlen, input=_encode(cases)).stdout
    results, pos = [], 0
    for c in cases:
        rows, hd, _ = c.shape
        (status,) = struct.unpack_from("<i", out, pos)
        pos += 4
        results.append(AttentionResult(status, np.frombuffer(out, "<f4", rows * hd, pos).reshape(rows, hd)))
        pos += 4 * rows * hd
    return results


def reference(c: AttentionCase) -> np.ndarray:
    """softmax(scale Q K^T) V, each row over its first len keys, in float64."""
    out = np.zeros(c.Q.shape)
    for r, n in enumerate(c.len):
        s = c.scale * (c.Q[r].astype(np.float64) @ c.K[:n].astype(np.float64).T)
        p = np.exp(s - s.max())
        out[r] = (p / p.sum()) @ c.V[:n].astype(np.float64)
    return out


def error(c: AttentionCase, r: AttentionResult) -> tuple[float, float]:
    """(max |got - want|, that over 1 + max |want|)."""
    want = reference(c)
    err = float(np.abs(r.O - want).max())
    return err, err / (1 + float(np.abs(want).max()))
