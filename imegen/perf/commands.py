"""Running `imegen bench`, `imegen tune` and `imegen floors` (their arguments: perf/cli.py)."""

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
from . import bench, user_kernels
from .cli import output_dir
from .count import mlas_counts
from .count.plugin import PluginUnavailable
from .model import floors
from .report import files
from .report.spec import spec_report
from .report.text import report as bench_report
from .search import tune
from .workload import BLOCKS, spec_cases, targets


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


def misused_options(args) -> str | None:
    """Options that contradict each other, or that need --spec without it (argparse checks each alone)."""
    if getattr(args, "mlas", None) and args.spec:
        return "--mlas and --spec are different runs: give one"
    if args.spec and args.blocks is not None:
        return "--blocks does not apply with --spec: each kernel runs at its own block"
    if not args.spec and (args.shape or args.m):
        return "--shape and --m choose the cases of --spec's kernels: give --spec SPEC"
    if getattr(args, "attention", False) and (args.spec or args.quick or args.blocks or args.shape or args.m):
        return "--attention tunes the attention tile alone: no --spec, --quick, --blocks, --shape or --m"
    return None


def _user_kernels(args) -> user_kernels.UserKernels:
    """SPEC's kernels the bench can run, each one it skips named on stderr (SpecError: none, or SPEC unreadable)."""
    user = user_kernels.load(args.spec)
    for name, why in user.skipped:
        _log(f"{args.command}: skipping kernel {name}: {why}")
    return user


def _floors(args) -> int:
    """Static: reads a bench output's bench.csv, runs nothing."""
    try:
        text = floors.report(Path(args.results))
    except (OSError, KeyError) as e:
        print(f"error: {args.results}: not a bench output directory ({e})", file=sys.stderr)
        return 2
    print(text)
    return 0


def _tune(args, user: user_kernels.UserKernels | None, out: Path, jobs: int) -> None:
    if args.attention:
        from .search import attention

        results = attention.tune(log=_log)
        print(attention.table(results))
        attention.write(results, out)
        _log(f"wrote {out / 'attention_tune.json'}, {out / 'attention_tune.txt'} and {attention.PACKAGE_TABLE}")
        return
    if user:
        cases = spec_cases(user.blocks, quick=args.quick, custom_shapes=args.shape, ms=args.m)
        result = tune.rank(list(user.specs), cases, jobs=jobs, log=_log, by=args.occupancy, source=user.source)
    else:
        result = tune.search(targets(quick=args.quick, blocks=args.blocks or BLOCKS), quick=args.quick, jobs=jobs,
                             log=_log, by=args.occupancy)
    print(result.spec_file())
    for path in tune.write_outputs(result, out):
        _log(f"wrote {path}")


def _bench(args, user: user_kernels.UserKernels | None, out: Path, jobs: int) -> None:
    if user:
        cases = spec_cases(user.blocks, quick=args.quick, custom_shapes=args.shape, ms=args.m)
        res = bench.run_spec(user, cases, quick=args.quick, jobs=jobs, log=_log)
        report, write = spec_report(res), files.write_spec_outputs
    else:
        res = bench.run(quick=args.quick, blocks=args.blocks or BLOCKS, jobs=jobs, log=_log)
        report, write = bench_report(res), files.write_outputs
    print(report)
    for path in write(res, out, report):
        _log(f"wrote {path}")


def run_perf_command(args) -> int:
    if args.command == "floors":
        return _floors(args)
    problem = misused_options(args)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    try:  # SPEC before anything is built: a spec error is one line, now
        user = _user_kernels(args) if args.spec else None
    except SpecError as e:
        print(e, file=sys.stderr)
        return 2
    missing = missing_tools()
    if missing:
        print(f"error: missing tools: {', '.join(missing)} (see README: install the toolchain first)", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    out = output_dir(args)
    mlas = args.command == "bench" and args.mlas
    if not mlas:  # the full run takes half an hour: fail now, not after it
        problem = _unwritable(out)
        if problem:
            print(f"error: cannot write the results to {out}: {problem}", file=sys.stderr)
            return 2
    jobs = args.jobs or os.cpu_count() or 1
    try:
        if mlas:
            print(_mlas_counts(args.mlas))
        else:
            (_tune if args.command == "tune" else _bench)(args, user, out, jobs)
    except (SpecError, ToolchainError, PluginUnavailable, OSError) as e:
        print(e if isinstance(e, SpecError) else f"error: {e}", file=sys.stderr)  # SpecError says "error:" itself
        return 2
    _log(f"{args.command}: {time.perf_counter() - t0:.1f} s")
    return 0
