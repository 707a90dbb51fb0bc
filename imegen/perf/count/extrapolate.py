"""Counts of a full shape from reduced runs (measure.py's method): a kernel runs at M in {r_m, t_m + r_m}
x N in {r_n, t_n + r_n} with the full K (t = tile, r = rows/columns in the last tile), and the counts
extrapolate to ceil(M/t_m) x ceil(N/t_n) tiles: A preparation linearly in the M tiles, the tile loop
bilinearly in M and N tiles."""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import product

from ...plan import KernelPlan
from ..model import x60


@dataclass(frozen=True)
class CaseCounts:
    M: int
    N: int
    K: int
    prep: dict[str, int]  # prepare_a alone
    matmul: dict[str, int]  # the whole matmul call (prepare_a + tiles)
    emulated_vmadots: int


def _sub(a: dict[str, int], b: dict[str, int]) -> dict[str, int]:
    return {k: a[k] - b[k] for k in a}


def _axpy(base: dict[str, int], *terms: tuple[float, dict[str, int]]) -> dict[str, float]:
    out = {k: float(v) for k, v in base.items()}
    for scale, d in terms:
        if scale:
            for k, v in d.items():
                out[k] += scale * v
    return out


def tiles_of(plan: KernelPlan, M: int, N: int) -> tuple[int, int, int, int]:
    """(M tiles, N tiles, rows of the last M tile, cols of the last N tile)."""
    tm, tn = plan.spec.tile_m, plan.spec.tile_n
    mt, nt = -(-M // tm), -(-N // tn)
    return mt, nt, M - (mt - 1) * tm, N - (nt - 1) * tn


def sample_shapes(plan: KernelPlan, M: int, N: int, K: int) -> list[tuple[int, int, int]]:
    """The reduced shapes run to extrapolate (M, N, K)."""
    mt, nt, rm, rn = tiles_of(plan, M, N)
    xs = [rm] if mt == 1 else [rm, plan.spec.tile_m + rm]
    ys = [rn] if nt == 1 else [rn, plan.spec.tile_n + rn]
    return [(m, n, K) for m, n in product(xs, ys)]


@dataclass(frozen=True)
class ShapeCounts:
    """Counts of one kernel at one full shape, from the reduced runs.

    `prep(mt)` is linear and `tiles(mt, nt)` bilinear in whole tiles; `matmul(cores)` is the
    count one core executes when N tiles are split across `cores` cores and the A preparation
    is split evenly (the way ORT/llama.cpp parallelise).
    """

    M: int
    N: int
    K: int
    mt: int
    nt: int
    p0: dict[str, int]
    dp: dict[str, int]
    f00: dict[str, int]
    dm: dict[str, int]
    dn: dict[str, int]
    dmn: dict[str, int]
    samples: tuple[tuple[int, int, int], ...] = field(default=())
    m_blocks: int = 1  # M blocks per K chunk of the full shape (x60.m_block_rows); the samples lie in one

    def prep(self) -> dict[str, float]:
        return _axpy(self.p0, (self.mt - 1, self.dp))

    def tiles(self, nt: int | None = None) -> dict[str, float]:
        """The tile loop over mt x nt tiles. What one M block costs besides its M tiles (the N loop,
        and a staged B's staging of every N tile) is f00 + y dn - (dm + y dmn): once per further block
        (which also repeats the call's entry code, ~130 instructions a block: the only inexact part)."""
        nt = self.nt if nt is None else nt
        x, y = self.mt - 1, nt - 1
        per_block = _axpy(self.f00, (y, self.dn), (-1, self.dm), (-y, self.dmn))
        return _axpy(self.f00, (x, self.dm), (y, self.dn), (x * y, self.dmn), (self.m_blocks - 1, per_block))

    def matmul(self, cores: int = 1) -> dict[str, float]:
        """Per-core count: all of A's preparation / cores + the tiles of ceil(nt / cores) N tiles."""
        prep, tiles = self.prep(), self.tiles(-(-self.nt // cores))
        return {k: prep[k] / cores + tiles[k] for k in prep}


def extrapolate(plan: KernelPlan, M: int, N: int, K: int, measured: dict[tuple[int, int, int], CaseCounts]) -> ShapeCounts:
    samples = sample_shapes(plan, M, N, K)
    mt, nt, rm, rn = tiles_of(plan, M, N)
    tm, tn = plan.spec.tile_m, plan.spec.tile_n

    def at(i: int, j: int) -> CaseCounts:
        return measured[(rm + i * tm, rn + j * tn, K)]

    def tiles(c: CaseCounts) -> dict[str, int]:
        return _sub(c.matmul, c.prep)

    zero = {k: 0 for k in at(0, 0).prep}
    c00 = at(0, 0)
    p0, f00 = c00.prep, tiles(c00)
    dp = _sub(at(1, 0).prep, p0) if mt > 1 else zero
    dm = _sub(tiles(at(1, 0)), f00) if mt > 1 else zero
    dn = _sub(tiles(at(0, 1)), f00) if nt > 1 else zero
    dmn = (_sub(_sub(tiles(at(1, 1)), tiles(at(1, 0))), _sub(tiles(at(0, 1)), f00))
           if mt > 1 and nt > 1 else zero)
    rows = x60.m_block_rows(plan, x60.chunk_k(plan, K, x60.k_chunks(plan, M, N, K)))
    return ShapeCounts(M, N, K, mt, nt, p0, dp, f00, dm, dn, dmn, tuple(samples), -(-M // rows))
