"""The `imegen bench` and `imegen tune` commands (added to imegen.cli's parser)."""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

from ..abi.mlas import plan_dispatch
from ..errors import SpecError
from ..ir import load_specs
from ..plan import plan_kernel
from ..toolchain import ToolchainError, missing_tools
from . import bench
from .count import mlas_counts
from .count.plugin import PluginUnavailable
from .model import floors
from .report import files
from .report.text import report as bench_report
from .search import tune
from .search.evaluate import RANKINGS
from .workload import BLOCKS, targets

COMMANDS = ("bench", "tune", "floors")
FULL_RESULTS, QUICK_RESULTS = "bench/results", "bench/results-quick"


def output_dir(args) -> Path:
    if args.output is not None:
        return Path(args.output)
    return Path(QUICK_RESULTS if args.quick else FULL_RESULTS)


def _blocks(text: str) -> tuple[int, ...]:
    blocks = tuple(int(b) for b in text.split(","))
    bad = [b for b in blocks if b not in BLOCKS]
    if bad:
        raise ValueError(f"blocks must be among {', '.join(map(str, BLOCKS))}, got {', '.join(map(str, bad))}")
    return blocks


def add_perf_commands(sub) -> None:
    b = sub.add_parser("bench", help="Qwen2.5-0.5B shapes: QEMU instruction counts, X60-modeled times, baselines")
    t = sub.add_parser("tune", help="search IME tile configs per Qwen2.5-0.5B shape under the X60 cost model")
    b.add_argument("--mlas", metavar="SPEC", help="instead: the CompInt8 IME kernels of SPEC's MLAS dispatch, driven like "
                   "MlasQNBitGemmBatch, next to the same kernels with imegen's own ABI (instruction counts)")
    for p in (b, t):
        p.add_argument("--quick", action="store_true", help="the CI subset: q/o shape, M=1 and 128, block 32, small search")
        p.add_argument("-o", "--output", default=None,
                       help=f"directory for the outputs (default: {FULL_RESULTS}; with --quick {QUICK_RESULTS}, "
                            "so a quick run never replaces the committed full results)")
        p.add_argument("--blocks", type=_blocks, default=BLOCKS, help="comma-separated block sizes (default: 32,64,128)")
        p.add_argument("-j", "--jobs", type=int, default=None, help="parallel builds/QEMU runs (default: CPU count)")
    f = sub.add_parser("floors", help="the X60 model's floors per IME register tiling, against the prefill cells of a "
                       "committed bench run (static: no QEMU)")
    f.add_argument("results", nargs="?", default=FULL_RESULTS, help=f"a bench output directory (default: {FULL_RESULTS})")
    t.add_argument("--occupancy", choices=RANKINGS, default=RANKINGS[0],
                   help="rank by each config's slower of the model's vector-unit charges and LLVM's hardware-measured "
                        "X60 occupancies (robust: the default, what `imegen bench` uses), by the model's alone, or by "
                        "LLVM's alone (docs/ime-isa.md §7)")


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _mlas_counts(spec_file: str) -> str:
    d = plan_dispatch([plan_kernel(s) for s in load_specs(spec_file)], spec_file)
    if d is None:
        raise SpecError(None, f"{spec_file} has no abi = mlas kernels")
    return mlas_counts.report(mlas_counts.run(d, spec_file, log=_log))


def _unwritable(out: Path) -> str | None:
    """Why the outputs could not be written to `out` (made here if missing), or None."""
    try:
        out.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=out):
            pass
    except OSError as e:
        return e.strerror or str(e)
    return None


def run_perf_command(args) -> int:
    if args.command == "floors":  # static: reads bench.csv, runs nothing
        try:
            text = floors.report(Path(args.results))
        except (OSError, KeyError) as e:
            print(f"error: {args.results}: not a bench output directory ({e})", file=sys.stderr)
            return 2
        print(text)
        return 0
    missing = missing_tools()
    if missing:
        print(f"error: missing tools: {', '.join(missing)} (see README: install the toolchain first)", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    out = output_dir(args)
    if not (args.command == "bench" and args.mlas):  # the full run takes half an hour: fail now, not after it
        problem = _unwritable(out)
        if problem:
            print(f"error: cannot write the results to {out}: {problem}", file=sys.stderr)
            return 2
    try:
        if args.command == "bench" and args.mlas:
            print(_mlas_counts(args.mlas))
        elif args.command == "tune":
            result = tune.search(targets(quick=args.quick, blocks=args.blocks), quick=args.quick,
                                 jobs=args.jobs or os.cpu_count() or 1, log=_log, by=args.occupancy)
            print(result.spec_file())
            for path in tune.write_outputs(result, out):
                _log(f"wrote {path}")
        else:
            res = bench.run(quick=args.quick, blocks=args.blocks, jobs=args.jobs, log=_log)
            report = bench_report(res)
            print(report)
            for path in files.write_outputs(res, out, report):
                _log(f"wrote {path}")
    except (SpecError, ToolchainError, PluginUnavailable, OSError) as e:
        print(e if isinstance(e, SpecError) else f"error: {e}", file=sys.stderr)  # SpecError says "error:" itself
        return 2
    _log(f"{args.command}: {time.perf_counter() - t0:.1f} s")
    return 0
