"""The `imegen bench`, `imegen tune` and `imegen floors` arguments, added to imegen.cli's parser. Running
them is perf/commands.py, which imports the whole bench: imegen.cli imports it only to run one of them."""

from __future__ import annotations

from pathlib import Path

from .. import cli_types
from . import arguments
from .search.evaluate import RANKINGS
from .workload import BLOCKS

COMMANDS = ("bench", "tune", "floors")
FULL_RESULTS, QUICK_RESULTS = "bench/results", "bench/results-quick"


def output_dir(args) -> Path:
    """-o, else the committed results' folder, else (--quick) one beside it; --spec runs get one of their own
    (bench/results-STEM), so neither ever replaces the committed full results."""
    if args.output is not None:
        return Path(args.output)
    spec = getattr(args, "spec", None)
    base = f"{FULL_RESULTS}-{Path(spec).stem}" if spec else FULL_RESULTS
    return Path(f"{base}-quick" if spec and args.quick else QUICK_RESULTS if args.quick else base)


def add_perf_commands(sub) -> None:
    b = cli_types.add_command(sub, "bench", "Qwen2.5-0.5B shapes: QEMU instruction counts, X60-modeled times, baselines")
    t = cli_types.add_command(sub, "tune", "search IME tile configs per Qwen2.5-0.5B shape under the X60 cost model")
    b.add_argument("--mlas", metavar="SPEC", help="instead: the CompInt8 IME kernels of SPEC's MLAS dispatch, driven like "
                   "MlasQNBitGemmBatch, next to the same kernels with imegen's own ABI (instruction counts)")
    b.add_argument("--spec", metavar="SPEC", help="instead of the tuned kernels: SPEC's own kernels (abi imegen, target "
                   "ime or rvv) in the same tables, next to the baselines; each on the cases of its block")
    t.add_argument("--spec", metavar="SPEC", help="instead of searching: rank SPEC's own kernels (abi imegen, target ime "
                   "or rvv) per shape, and write the best of them per case")
    t.add_argument("--attention", action="store_true",
                   help="instead: count every attention tile on Qwen2.5-0.5B's GroupQueryAttention (decode at 128 and "
                        "512 cached positions, a 128-token prefill) next to stock ORT's, in riscv64 ORT under QEMU; "
                        "write attention_tune.json/.txt and the winner ort-accelerate uses")
    for p in (b, t):
        p.add_argument("--quick", action="store_true", help="the CI subset: q/o shape, M=1 and 128, block 32, small search "
                       "(with --spec: q/o, M=1 and 128, each kernel's block)")
        p.add_argument("-o", "--output", default=None,
                       help=f"directory for the outputs (default: {FULL_RESULTS}; with --quick {QUICK_RESULTS}; with "
                            f"--spec SPEC {FULL_RESULTS}-STEM[-quick]: no run but the full one replaces the committed "
                            "results)")
        p.add_argument("--blocks", type=arguments.blocks, default=None,
                       help=f"comma-separated block sizes (default: {','.join(map(str, BLOCKS))}; not with --spec, "
                            "whose kernels have their own)")
        p.add_argument("--shape", type=arguments.shape, action="append", metavar="NxK",
                       help="with --spec: a weight shape of N columns and K inputs to run on instead of the Qwen "
                            "shapes (repeatable)")
        p.add_argument("--m", type=arguments.m_values, metavar="M[,M...]",
                       help="with --spec: the rows M to run each shape at (default: 1,128,512; with --quick 1,128)")
        p.add_argument("-j", "--jobs", type=cli_types.jobs, default=None,
                       help="parallel builds/QEMU runs, at least 1 (default: CPU count)")
    f = cli_types.add_command(sub, "floors", "the X60 model's floors per IME register tiling, against the prefill "
                              "cells of a committed bench run (static: no QEMU)")
    f.add_argument("results", nargs="?", default=FULL_RESULTS, help=f"a bench output directory (default: {FULL_RESULTS})")
    t.add_argument("--occupancy", choices=RANKINGS, default=RANKINGS[0],
                   help="rank by each config's slower of the model's vector-unit charges and LLVM's hardware-measured "
                        "X60 occupancies (robust: the default, what `imegen bench` uses), by the model's alone, or by "
                        "LLVM's alone (docs/ime-isa.md §7)")
