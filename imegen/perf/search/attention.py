"""`imegen tune --attention`: which attention tile (query rows x keys per block) GroupQueryAttention runs on.

Every tile the validator accepts at VLEN 256 (a K1 core's) is generated into the custom-op library and counted
per Run on Qwen2.5-0.5B's attention (14 query heads, 2 KV heads of 64) in Debian's riscv64 ORT 1.23 under QEMU
(run_counts.py, 1 intra-op thread), next to stock ORT's own GroupQueryAttention on the same inputs: decode (one
token) after 128 and 512 cached positions, and a 128-token prefill. Each imegen output must match stock's within
2e-5 relative before its count is used. MODELED time per Run (model/x60.py): max(core cycles / clock / threads,
KV-cache bytes / DRAM bandwidth), threads = min(4 cores, the Run's parallel tasks: imegen's tiles, stock's
heads). The winner has the least decode time at 512 cached positions (ties: prefill); ort-accelerate's derived
specs take it (imegen/ort/attention_tuning.json).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from ...errors import SpecError
from ...ir import attention_specs_from_text, specs_from_text
from ..baselines.onnxruntime import run_counts
from ..baselines.onnxruntime.gqa import GqaShape, write_node_model
from ..model import x60

VLEN = 256
ROWS = (1, 2, 4, 7, 8, 14)
BLOCKS = (8, 16, 32)
WORKLOADS = {"decode@128": GqaShape(seq=1, past=128), "decode@512": GqaShape(seq=1, past=512),
             "prefill 128": GqaShape(seq=128, past=0)}
CORES = 4
TOLERANCE = 2e-5
# The library needs one MatMulNBits kernel; it serves no node of these models.
LIBRARY_KERNEL = ("kernel unused_gemv { op = gemv tile = 1x16 target = rvv vlen = 128 bits = 4 block = 32 "
                  "compute = fp32 }\n")
PACKAGE_TABLE = Path(__file__).resolve().parents[2] / "ort" / "attention_tuning.json"


@dataclass(frozen=True)
class Cell:
    instructions: float
    threads: int
    ms_modeled: float
    bound: str


@dataclass(frozen=True)
class Candidate:
    tile: str  # "RxB", or "stock ORT"
    cells: dict[str, Cell]


def spec_text(rows: int, block: int) -> str:
    return f"attention gqa_attention {{ target = rvv vlen = {VLEN} tile = {rows}x{block} }}\n"


def candidate_tiles() -> list[tuple[int, int]]:
    """Every (rows, block) the validator accepts at VLEN 256."""
    tiles = []
    for block in BLOCKS:
        for rows in ROWS:
            try:
                attention_specs_from_text(spec_text(rows, block))
            except SpecError:
                continue
            tiles.append((rows, block))
    return tiles


def imegen_tasks(shape: GqaShape, rows: int) -> int:
    """Parallel tasks of imegen's attention: tiles of the query rows sharing each KV head."""
    return shape.kv_heads * math.ceil(shape.heads // shape.kv_heads * shape.seq / rows)


def modeled(counts: dict, shape: GqaShape, tasks: int) -> Cell:
    threads = max(1, min(CORES, tasks))
    core_s = x60.core_seconds(counts) / threads
    dram_s = shape.dram_bytes() / x60.X60.dram_effective
    return Cell(x60.total_instructions(counts), threads, 1e3 * max(core_s, dram_s), "dram" if dram_s >= core_s else "core")


def _maker(shape: GqaShape, imegen: bool, stock_outputs: dict | None):
    def make(d: Path):
        path, feeds = write_node_model(d, shape, imegen=imegen)

        def check(outputs: dict) -> dict:
            if stock_outputs is None:
                return {"worst": 0.0}
            worst = 0.0
            for name, want in stock_outputs.items():
                err = float(np.abs(outputs[name] - want).max()) / (1 + float(np.abs(want).max()))
                if not err <= TOLERANCE:
                    raise RuntimeError(f"imegen's GroupQueryAttention {name} is {err:.3g} off stock ORT's")
                worst = max(worst, err)
            return {"worst": worst}

        return path, feeds, ["out", "present_key", "present_value"], check

    return make


def count(shape: GqaShape, library: Path | None, key: tuple[str, ...], stock_outputs: dict | None = None):
    parts = ("gqa-node", repr(asdict(shape)), *key, Path(__file__).with_name("attention.py").read_text())
    return run_counts.cached_count_runs(parts, _maker(shape, library is not None, stock_outputs), threads=1, runs=1,
                                        custom_ops=library)


def tune(log=print) -> list[Candidate]:
    """Stock ORT first, then every candidate tile; each a cell per workload."""
    from ...ort.customop import build_library

    stock, stock_out = {}, {}
    for name, shape in WORKLOADS.items():
        log(f"stock ORT GroupQueryAttention, {name}...")
        rc = count(shape, None, ("stock",))
        stock[name], stock_out[name] = modeled(rc.runs[0], shape, shape.heads), rc.outputs
    results = [Candidate("stock ORT", stock)]
    for rows, block in candidate_tiles():
        text = spec_text(rows, block)
        lib = build_library(specs_from_text(LIBRARY_KERNEL), "attention.imegen",
                            attention=attention_specs_from_text(text))
        cells = {}
        for name, shape in WORKLOADS.items():
            log(f"imegen attention {rows}x{block}, {name}...")
            rc = count(shape, lib, (text,), stock_out[name])
            cells[name] = modeled(rc.runs[0], shape, imegen_tasks(shape, rows))
        results.append(Candidate(f"{rows}x{block}", cells))
    return results


def winner(results: list[Candidate]) -> Candidate:
    mine = [c for c in results if c.tile != "stock ORT"]
    return min(mine, key=lambda c: (c.cells["decode@512"].ms_modeled, c.cells["prefill 128"].ms_modeled))


def table(results: list[Candidate]) -> str:
    names = list(WORKLOADS)
    head = f"{'tile':<10}" + "".join(f"{n + ' (M instr, MODELED ms, threads)':>40}" for n in names)
    lines = [head]
    for c in results:
        cells = "".join(f"{c.cells[n].instructions / 1e6:>22.3f} {c.cells[n].ms_modeled:>10.4f} {c.cells[n].threads:>6}"
                        for n in names)
        lines.append(f"{c.tile:<10}{cells}")
    best, stock = winner(results), results[0]
    ratios = ", ".join(f"{n} {stock.cells[n].ms_modeled / best.cells[n].ms_modeled:.1f}x" for n in names)
    lines.append(f"winner {best.tile} (least MODELED decode@512 time); vs stock ORT's GroupQueryAttention: {ratios}")
    return "\n".join(lines)


METHOD = __doc__.split("\n\n", 1)[1].strip()


def write(results: list[Candidate], out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    data = {"method": METHOD, "vlen": VLEN, "winner": winner(results).tile,
            "results": [{"tile": c.tile, "cells": {n: asdict(v) for n, v in c.cells.items()}} for c in results]}
    (out_dir / "attention_tune.json").write_text(json.dumps(data, indent=1) + "\n")
    (out_dir / "attention_tune.txt").write_text(METHOD + "\n\n" + table(results) + "\n")
    best = winner(results).tile
    PACKAGE_TABLE.write_text(json.dumps({"tile": best, "vlen": VLEN, "source": "bench/results/attention_tune.json"})
                             + "\n")
