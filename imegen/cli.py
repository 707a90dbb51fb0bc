"""imegen's command line: build_parser() (every command's arguments; `imegen --help` lists them by group) and
main(), which runs one and turns its errors into one line and an exit status."""

from __future__ import annotations

import argparse
import importlib.util
import os
import signal
import sys
import textwrap
import time
from collections import Counter
from pathlib import Path

from . import __version__, cli_types, interrupt, targets
from .check import check_attention, check_dispatch, check_kernel, checked_cases, format_table, stderr_log
from .errors import SpecError
from .cli_types import add_command
from .ir import load_attention_specs, load_specs
from .abi.mlas import DEFAULT_PIN, PINS, plan_dispatch
from .plan import KernelPlan, plan_kernel
from .ort.ort_tree import OrtTreeError
from .ort.sysroot import SysrootError
from .outputs import write_if_changed, write_outputs
from .perf.model import occupancy
from .render import march_for, render_spec
from .toolchain import ToolchainError, missing_tools


# Python packages only some commands need (the test extras in pyproject.toml): import name -> pip name.
OPTIONAL_PACKAGES = {"onnx": "onnx", "onnxruntime": "onnxruntime", "onnx_ir": "onnx-ir", "matplotlib": "matplotlib"}


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def missing_module(command: str, e: ModuleNotFoundError) -> str:
    """One line for a module that could not be imported: which package to install (or upgrade)."""
    top = (e.name or "").split(".")[0]
    package = OPTIONAL_PACKAGES.get(top)
    if package is None:  # a module every command needs: the installation itself is incomplete
        return f"error: {e}; reinstall imegen with its dependencies (pip install -e .)"
    if e.name != top and _installed(top):  # there, without a module this command imports from it: too old
        return (f"error: imegen {command} needs the Python package {package} with its module {e.name}, which the "
                f"installed one lacks (pip install --upgrade {package})")
    return f"error: imegen {command} needs the Python package {package} (pip install {package})"


def _plans(spec: str, only: list[str] | None = None) -> list[KernelPlan]:
    plans = [plan_kernel(s) for s in load_specs(spec)]
    return _only(plans, spec, only, _attention(spec))


def _attention(spec: str, only: list[str] | None = None):
    """The spec's attention kernels (AttentionSpec), those named by -k when it is given."""
    return [a for a in load_attention_specs(spec) if not only or a.name in only]


def _only(plans: list[KernelPlan], spec: str, only: list[str] | None, others=()) -> list[KernelPlan]:
    if only:
        unknown = sorted(set(only) - {p.name for p in plans} - {a.name for a in others})
        if unknown:
            have = [p.name for p in plans] + [a.name for a in others]
            raise SpecError(None, f"{spec} defines no kernel named {', '.join(unknown)}; it has {', '.join(have)}")
        plans = [p for p in plans if p.name in only]
    return plans


def _attention_files(spec: str, only: list[str] | None = None) -> dict[str, str]:
    """The .h and .c of the spec's attention kernels (those named by -k when given)."""
    from .render import render_attention
    from .verify_attention import plan_for

    files: dict[str, str] = {}
    for a in _attention(spec, only):
        files.update(render_attention(plan_for(a), spec))
    return files


def cmd_generate(args) -> int:
    plans = _plans(args.spec)
    chosen = _only(plans, args.spec, args.kernel, _attention(args.spec))
    files = {**render_spec(chosen, args.spec, args.mlas_pin), **_attention_files(args.spec, args.kernel)}
    all_names = set(render_spec(plans, args.spec, args.mlas_pin)) | set(_attention_files(args.spec))
    # Every file is written before anything is printed: a closed stdout (`| head`) cannot stop it half way.
    report = write_outputs(Path(args.output), args.spec, files, all_names)
    for line in report:
        print(line, file=sys.stderr if line.startswith("warning:") else sys.stdout)
    return 0


def cmd_outputs(args) -> int:
    """File names `generate` writes, each with the -march its .c needs (for build systems)."""
    plans = _plans(args.spec)
    march = {f"{p.name}.c": march_for(p) for p in plans}
    march.update({f"{a.name}.c": targets.get(a.target).march for a in _attention(args.spec)})
    for name in [*render_spec(plans, args.spec, args.mlas_pin), *_attention_files(args.spec)]:
        print(f"{name}\t{march.get(name, 'rv64gc' if name.endswith('.c') else '')}".rstrip())
    return 0


def cmd_cmake_snippet(args) -> int:
    if args.spec:
        load_specs(args.spec)  # a missing or invalid spec is an error now, not at build time
    module = Path(__file__).resolve().parent / "cmake" / "imegen.cmake"
    print(f"""# imegen: generate MatMulNBits kernels at build time (see docs/onnxruntime.md, "ONNX Runtime integration (MLAS)")
include("{module}")
imegen_generate(onnxruntime_mlas SPEC "{Path(args.spec).resolve() if args.spec else '${{IMEGEN_SPEC}}'}")""")
    return 0


def cmd_ort_patch(args) -> int:
    """Write the unified diff that hooks imegen into a real ORT tree (default: Debian's, fetched)."""
    from .ort import ort_tree

    if args.mlas_pin not in ort_tree.SOURCES and not (args.tree and args.output):
        raise OrtTreeError(f"--mlas-pin {args.mlas_pin}: imegen fetches no tree for it; give your checkout and -o FILE")
    tree = Path(args.tree) if args.tree else ort_tree.pristine_tree(args.mlas_pin)
    out = Path(args.output) if args.output else ort_tree.committed_patch_path(args.mlas_pin)
    changed = write_if_changed(out, ort_tree.make_patch(tree, args.mlas_pin))
    print(f"{'wrote' if changed else 'unchanged'} {out}")
    return 0


def cmd_ort_mlas_test(args) -> int:
    """Build ORT's MLAS (patched, imegen's hook generating SPEC) for riscv64 and run ORT's own MLAS unit
    tests for the QNBitGemm path under QEMU, with imegen's dispatch and without it (the baseline)."""
    from .ort import ort_tree

    spec = Path(args.spec)
    exe = ort_tree.build_mlas_test(args.ort_version, spec)
    flt = None if args.full else ort_tree.CI_FILTER
    vlen = args.vlen or ort_tree.emulator_vlen(spec)
    print(f"ORT {args.ort_version} onnxruntime_mlas_test, spec {spec}, gtest filter {flt or '(none: the full grid)'}, QEMU VLEN {vlen}")
    failed = False
    for label, off in (("imegen dispatch", False), ("baseline (IMEGEN_MLAS_DISABLE=1)", True)):
        ort_tree.log(f"running {label}")
        r = ort_tree.run_mlas_test(exe, flt, vlen=vlen, disable_imegen=off)
        print(f"  {label}: {r.summary()}")
        failed |= r.failed > 0 or r.passed == 0
        if r.passed == 0:
            print(f"error: {label}: no test passed, so nothing was checked (gtest filter {flt or '(none)'})",
                  file=sys.stderr)
        elif not off and not sum(r.calls.values()):  # MLAS kept its own kernels: the passes say nothing of imegen's
            print(f"error: {label}: imegen's dispatch was never called (MLAS did not install it: does every kernel "
                  f"of {spec} run at VLEN {vlen}?), so nothing of imegen was checked", file=sys.stderr)
            failed = True
    return 1 if failed else 0


def cmd_check(args) -> int:
    missing = missing_tools()
    if missing:
        print(f"error: missing tools: {', '.join(missing)} (see README: install the toolchain first)", file=sys.stderr)
        return 2
    plans = _plans(args.spec, args.kernel)
    own = [p for p in plans if p.spec.abi == "imegen"]
    attention = _attention(args.spec, args.kernel)
    rows = []
    for i, plan in enumerate(own, 1):
        stderr_log(f"[{i}/{len(own) + len(attention)}] {plan.name}: {plan.spec.describe()}")
        rows += check_kernel(plan, args.spec, seed=args.seed, log=stderr_log)
    for i, spec in enumerate(attention, len(own) + 1):
        stderr_log(f"[{i}/{len(own) + len(attention)}] {spec.name}: {spec.describe()}")
        rows += check_attention(spec, args.spec, seed=args.seed, log=stderr_log)
    dispatch = plan_dispatch(plans, args.spec)
    if dispatch:  # abi=mlas kernels run through their dispatch, as ORT's MLAS would call them
        stderr_log(f"[MLAS dispatch] {', '.join(p.name for p in dispatch.kernels)}")
        rows += check_dispatch(dispatch, args.spec, seed=args.seed, log=stderr_log)
    print(format_table(rows))
    failed = [r for r in rows if not r.ok or not r.cases]
    print(f"\n{len(rows) - len(failed)} of {len(rows)} builds passed ({sum(r.cases for r in rows)} cases, "
          f"{sum(r.vmadots for r in rows)} vmadot instructions emulated)")
    if not checked_cases(rows):  # refusals alone (or no rows) verify no result
        print("error: nothing was checked: no case ran at a VLEN its kernel accepts", file=sys.stderr)
        return 1
    return 1 if failed else 0


def cmd_list(args) -> int:
    for plan in _plans(args.spec):
        print(f"{plan.name}: {plan.spec.describe()}")
    for spec in _attention(args.spec):
        print(f"{spec.name}: {spec.describe()}")
    return 0


def explain(plan: KernelPlan) -> str:
    s, L = plan.spec, plan.pack
    if s.abi == "mlas":
        loops = "MLAS hands over the rows (M outer), N tiles inner"
        a_ws = ("MLAS PerGemmQuantAWorkspace: int8 rows k_blocks*BLK bytes apart, per-block fp32 scale and scale*sum(q)"
                if plan.blksum else "MLAS Q8 blocks per row: [fp32 scale][BLK x int8]" if s.compute == "int8" else "ORT's fp32 rows")
    else:
        loops = f"K chunks outer (1-4 per call, as few DRAM bytes as B passes and C round trips allow), M blocks (the A rows {plan.a_block_bytes} B of the L2 hold), then N tiles, M tiles inner"
        if plan.ime and plan.ime.staged:
            loops = (f"K chunks, M blocks, then N tiles, each staged once per M block into the workspace (B - zero points, "
                     f"spread fp32 scales: {plan.ime.stage_block_bytes} B per block), M tiles inner")
        a_ws = f"{'int8, per-block scale and sum' if s.compute == 'int8' else 'fp32 copy'}; A[m][k] at {plan.a_index}"
        if plan.target.a_row_finish(s):
            a_ws += f"; {plan.target.a_row_finish(s)}"
    lines = [f"kernel {plan.name}", f"  config      {s.describe()}",
             f"  tile        {s.tile_m}x{s.tile_n} outputs per micro-kernel call; loops: {loops}",
             f"  packed B    panels of {L.panel} columns; per (panel, block): {L.data_bytes} data B, "
             f"{L.scale_bytes} scale B, {L.zp_bytes} zero-point B, scales {s.scales}",
             f"              element (c, kk) -> byte {L.byte}, shift {L.shift}"]
    if plan.blksum:
        lines.append(f"              codes stored as q - 128; the last N % {L.panel} columns in ORT's order; scales and "
                     "block sums in ORT's PackedQuantBDataStruct regions")
    if L.finished:
        lines.append(f"              {plan.target.finishes_pack(s)}")
    lines.append(f"  A workspace {a_ws}")
    if plan.budget:
        lines.append("  registers   " + ", ".join(f"{k} {v}" for k, v in plan.budget.items())
                     + f" = {sum(plan.budget.values())} of 32"
                     + (f" (the validator's lower bound; the allocation uses v0-v{len(plan.ime.clobbers) - 1})"
                        if plan.ime and len(plan.ime.clobbers) > sum(plan.budget.values()) else ""))
    if plan.rvv:
        lines.append(f"  rvv types   accumulators {plan.rvv.types.f32} (LMUL {plan.rvv.lmul}), B codes {plan.rvv.types.u8}; needs VLEN >= {s.vlen}")
    if plan.ime and plan.ime.program:  # a whole-tile asm statement the target lays out itself
        I = plan.ime
        lines += [f"  ime         {I.na} vmadot tiles ({I.vmadots_per_tile_block} vmadots per block), one accumulator "
                  f"register each ({', '.join(f'v{r}' for row in I.acc_regs for r in range(row[0], row[0] + I.na))}); "
                  f"the tile's one asm statement ({len(I.program)} instructions):"]
        lines += [f"    {op.text:<28} {('# ' + op.comment) if op.comment else ''}".rstrip() for op in I.program]
        lines.append(f"  occupancy   no cost model for this kernel's core (this kernel runs at {plan.target.vlen_need(plan.spec)})")
    elif plan.ime:
        I = plan.ime
        regs = ", ".join(f"v{vd}-v{vd + 1}" for row in I.acc_regs for vd in row)
        mix = Counter(op.kind for op in I.body)
        where = ("fp32 accumulators in registers " + ", ".join(f"v{r}-v{r + 1}" for row in I.facc_regs for r in row)
                 + "; one asm statement loops over all blocks") if I.whole_k else "fp32 accumulators in memory; one asm statement per block"
        lines += [f"  ime         {I.ma}x{I.na} vmadot tiles; int32 accumulator pairs {regs}",
                  f"              {where}",
                  f"              {I.iterations_per_block} iterations per block{' (unrolled)' if I.unrolled else ''}; per iteration: "
                  + ", ".join(f"{n} {k}" for k, n in sorted(mix.items())),
                  f"  block start ({len(I.acc_zero + I.prologue)} instruction{'s' * (len(I.acc_zero + I.prologue) != 1)}: "
                  "accumulators zeroed, zero points spread):"]
        lines += [f"    {op.text:<28} {('# ' + op.comment) if op.comment else ''}".rstrip() for op in I.acc_zero + I.prologue]
        lines.append("  inner loop:")
        lines += [f"    {op.text:<28} {('# ' + op.comment) if op.comment else ''}".rstrip() for op in I.body]
        lines.append(f"  block fold ({len(I.fold)} instructions, after the loop):")
        lines += [f"    {op.text:<28} {('# ' + op.comment) if op.comment else ''}".rstrip() for op in I.fold]
        if plan.target.accepts_vlen(plan.spec, occupancy.VLEN):
            lines += occupancy.summary(plan)
        else:  # the occupancy models are the K1's X60 (VLEN 256): not this kernel's core
            lines.append(f"  occupancy   no cost model for this kernel's core (the X60 models are the K1's, VLEN "
                         f"{occupancy.VLEN}; this kernel runs at {plan.target.vlen_need(plan.spec)})")
    return "\n".join(lines)


def cmd_explain(args) -> int:
    texts = [explain(p) for p in _plans(args.spec, args.kernel)]
    texts += [explain_attention(a) for a in _attention(args.spec, args.kernel)]
    print("\n\n".join(texts))
    return 0


def explain_attention(spec) -> str:
    from .targets.rvv.attention import budget
    from .verify_attention import plan_for

    plan = plan_for(spec)
    regs = budget(spec)
    return "\n".join([
        f"attention {spec.name}", f"  config      {spec.describe()}",
        f"  tile        {spec.q_rows} query rows (sharing one KV head) x {spec.kv_block} keys per block; loops: row tiles "
        f"outer, key blocks, then the head dimension",
        f"  scores      one {plan.f32} group per row (LMUL {plan.s_lmul}); per head-dimension step one strided load of "
        f"a K column, {spec.q_rows} vfmacc.vf",
        "  softmax     online (running max and sum per row; earlier output rescaled by e^(old max - new max))",
        f"  P V         per row, over the head dimension in {plan.o_f32} groups: one vle + vfmacc.vf per visible key",
        f"  registers   {sum(regs.values())} of 32 ({', '.join(f'{k} {v}' for k, v in regs.items())})"])


def cmd_ort_check(args) -> int:
    """Conformance against onnxruntime: ORT's shapes, ORT's quantized bytes, ORT's tolerances."""
    from .ort import ort_check as oc

    problem = oc.ort_import_problem()
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    missing = missing_tools()
    if missing:
        print(f"error: missing tools: {', '.join(missing)} (see README: install the toolchain first)", file=sys.stderr)
        return 2
    specs = [p.spec for p in _plans(args.spec, args.kernel)] if args.spec else oc.builtin_specs(args.full)
    if args.kernel and not args.spec:
        unknown = sorted(set(args.kernel) - {s.name for s in specs})
        if unknown:
            raise SpecError(None, f"ort-check's built-in set has no kernel named {', '.join(unknown)}; it has "
                            f"{', '.join(s.name for s in specs)}")
        specs = [s for s in specs if s.name in args.kernel]
    suite = oc.Suite(specs, oc.full_shapes() if args.full else oc.fast_shapes(), full=args.full)
    t0 = time.perf_counter()
    stderr_log(f"ort-check: {len(specs)} kernels, {len(suite.shapes)} ORT shapes "
               f"({'full grid' if args.full else 'fast subset; --full for the whole grid'})")
    rows = oc.run_suite(suite, jobs=args.jobs, log=stderr_log)
    print(oc.format_table(rows))
    print()
    print(oc.summarize(rows))
    print()
    print(oc.footer(rows, suite))
    failed = [r for r in rows if not r.verdict.ok]
    print(f"\n{len(rows) - len(failed)} of {len(rows)} kernel x shape cases within ORT's tolerance "
          f"({time.perf_counter() - t0:.1f} s)")
    missed = oc.unchecked(suite, rows)
    if missed:  # a kernel with no case would otherwise pass unseen (no row, so no FAIL either)
        print(f"error: nothing was checked for {len(missed)} of {len(specs)} kernels ({', '.join(missed)}): "
              "ORT's shapes have no case for them", file=sys.stderr)
        return 1
    return 1 if failed else 0


# `imegen --help`: every command once, in groups in the order a user meets them.
OVERVIEW = ("imegen generates the kernels behind ONNX Runtime's MatMulNBits (int4/int8 LLM matmuls) for RISC-V: "
            "SpacemiT K1 IME (vmadot), RVV 1.0 and portable C, from a small tiling DSL; checks them against NumPy "
            "and onnxruntime under QEMU; and puts them into a stock ONNX Runtime as a custom-op library.")
GROUPS = (
    ("a model on a K1", ("ort-accelerate", "ort-model-check", "ort-library", "ort-rewrite")),
    ("kernels from a spec (docs/dsl.md)", ("generate", "check", "list", "explain", "ort-check")),
    ("ONNX Runtime builds (the MLAS patch)", ("ort-patch", "ort-mlas-test", "cmake-snippet", "outputs")),
    ("models", ("qwen-model",)),
    ("performance (the X60 cost model: times MODELED, not measured on a K1)", ("bench", "tune", "floors")),
)
SPEC_HELP = "the kernel spec (.imegen file)"


def _overview(commands: dict[str, argparse.ArgumentParser]) -> str:
    """The top-level description: OVERVIEW, then each group's commands with their one-line summaries."""
    width = max(map(len, commands)) + 4
    lines = [textwrap.fill(OVERVIEW, 100), ""]
    for title, names in GROUPS:
        lines.append(f"{title}:")
        for name in names:
            lines += textwrap.wrap(commands[name].description, 100, initial_indent=f"  {name:<{width - 2}}",
                                   subsequent_indent=" " * width)
        lines.append("")
    lines.append("`imegen COMMAND --help` shows a command's arguments (docs/commands.md: what each command does).")
    return "\n".join(lines)


def _add_mlas_pin(p: argparse.ArgumentParser, default: str = DEFAULT_PIN, text: str | None = None) -> None:
    """--mlas-pin: the ORT version whose MLAS ABI (MLAS_QNBIT_GEMM_DISPATCH) the glue is written for."""
    pin = p.add_argument("--mlas-pin", default=default, choices=sorted(PINS), help=text or (
        f"the ORT version whose MLAS dispatch ABI the glue of abi=mlas kernels is written for (default {default}; "
        "imegen/abi/mlas.py)"))
    cli_types.add_renamed(p, "--ort", pin)


def _add_kernel_commands(sub) -> None:
    """generate, check, list, explain, ort-check: a spec's kernels."""
    g = add_command(sub, "generate", "write each kernel's .c and .h")
    g.add_argument("-o", "--output", type=cli_types.folder, default="generated", metavar="DIR",
                   help="folder to write into (default generated)")
    _add_mlas_pin(g)
    c = add_command(sub, "check", "generate, compile, run under QEMU, compare to NumPy")
    c.add_argument("--seed", type=cli_types.seed, default=0, help="seed of the random test data (default 0)")
    lst = add_command(sub, "list", "one line per kernel")
    e = add_command(sub, "explain", "show the lowered plan: layouts, registers, instruction mix")
    for p in (g, c, lst, e):
        p.add_argument("spec", help=SPEC_HELP)
    for p in (g, c, e):
        p.add_argument("-k", "--kernel", action="append", metavar="NAME", help="only this kernel (repeatable)")
    o = add_command(sub, "ort-check", "conformance against onnxruntime: ORT's shapes, quantizer and tolerances")
    o.add_argument("spec", nargs="?", help="kernels to check (default: a built-in set covering every target)")
    o.add_argument("--full", action="store_true", help="ORT's whole shape grid (default: the fast CI subset)")
    o.add_argument("-j", "--jobs", type=cli_types.jobs, default=None,
                   help="parallel builds/QEMU runs, at least 1 (default: CPU count)")
    o.add_argument("-k", "--kernel", action="append", metavar="NAME", help="only this kernel of SPEC (repeatable)")


def _add_ort_build_commands(sub) -> None:
    """ort-patch, ort-mlas-test, cmake-snippet, outputs: imegen built into ORT's MLAS."""
    op = add_command(sub, "ort-patch", "write the patch hooking imegen into a real ORT source tree")
    op.add_argument("tree", nargs="?", help="pristine ORT tree (default: Debian's onnxruntime source, fetched and cached)")
    _add_mlas_pin(op, "1.21", "1.21 (Debian's tree, fetched; the patch CI applies) or main (your checkout; untested "
                  "anchors)")
    op.add_argument("-o", "--output", metavar="FILE",
                    help="the patch file to write (default examples/ort/onnxruntime-<version>-imegen.patch)")
    om = add_command(sub, "ort-mlas-test", "ORT's own MLAS QNBitGemm unit tests with imegen's dispatch, under QEMU")
    om.add_argument("spec", help="the kernel spec (.imegen) whose abi=mlas kernels MLAS dispatches to")
    version = om.add_argument("--ort-version", default="1.21", choices=["1.21"],
                              help="the ORT source tree MLAS and its tests are built from (Debian's 1.21.0)")
    cli_types.add_renamed(om, "--ort", version)
    om.add_argument("--full", action="store_true", help="the whole gtest grid (default: the CI filter)")
    om.add_argument("--vlen", type=cli_types.vlen, choices=cli_types.VLENS, default=None,
                    help="QEMU's VLEN (default: the spec's IME target's, 1024 for ime2 (the K3's A100), else 256 "
                    "(the K1's))")
    cs = add_command(sub, "cmake-snippet", "print the CMake lines that hook imegen into a build")
    cs.add_argument("spec", nargs="?", help=f"{SPEC_HELP}, checked now (default: ${{IMEGEN_SPEC}} in the lines)")
    out = add_command(sub, "outputs", "list generated files and their -march (for build systems)")
    out.add_argument("spec", help=SPEC_HELP)
    _add_mlas_pin(out)


def build_parser() -> argparse.ArgumentParser:
    """imegen's whole command line (parsing only: each command imports what it runs when it runs)."""
    parser = argparse.ArgumentParser(prog="imegen", usage="imegen [-h] [--version] COMMAND ...",
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"imegen {__version__}",
                        help="print imegen's version and exit")
    # The overview lists the commands (grouped); argparse's own flat list would repeat it.
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", prog="imegen",
                                help=argparse.SUPPRESS)
    from .ort import qwen
    from .ort.commands import add_commands as add_ort_commands
    from .perf.cli import add_perf_commands  # bench, tune, floors: their arguments only

    add_ort_commands(sub)  # ort-accelerate, ort-model-check, ort-library, ort-rewrite
    _add_kernel_commands(sub)
    _add_ort_build_commands(sub)
    qwen.add_arguments(add_command(sub, "qwen-model", qwen.SUMMARY))
    add_perf_commands(sub)
    parser.description = _overview(sub.choices)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from .ort import qwen
    from .ort.commands import COMMANDS as ORT_COMMANDS, run_command as run_ort_command
    from .perf.cli import COMMANDS as PERF_COMMANDS

    handler = {"generate": cmd_generate, "check": cmd_check, "list": cmd_list, "explain": cmd_explain,
               "ort-check": cmd_ort_check, "outputs": cmd_outputs, "cmake-snippet": cmd_cmake_snippet,
               "qwen-model": qwen.run_command, "ort-patch": cmd_ort_patch, "ort-mlas-test": cmd_ort_mlas_test}
    try:
        if args.command in PERF_COMMANDS:  # imported to run one: it loads the whole bench (baselines, reports, numpy)
            from .perf.commands import run_perf_command as run
        else:
            run = run_ort_command if args.command in ORT_COMMANDS else handler[args.command]
        code = run(args)
        interrupt.check()  # a Ctrl-C that a finalizer swallowed: still "interrupted", status 130
        sys.stdout.flush()  # here, so that a closed pipe is caught below and not at interpreter exit
        return code
    except SpecError as e:
        print(e, file=sys.stderr)
        return 2
    except BrokenPipeError:  # stdout closed early (`imegen list SPEC | head`): stop quietly
        _silence_stdout()
        return 0
    except (ToolchainError, OrtTreeError, SysrootError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as e:  # an optional package (onnx, onnxruntime, ...) that is not installed
        print(missing_module(args.command, e), file=sys.stderr)
        return 2
    except OSError as e:  # "error: PATH: No such file or directory", not Python's errno repr
        print(f"error: {e.filename}: {e.strerror}" if e.filename and e.strerror else f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        # Honour the first Ctrl-C: a second one while imegen winds down (its builders cleaning up) must not
        # kill it half way with a traceback or a signal status.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        print("interrupted", file=sys.stderr)
        return 130


def _silence_stdout() -> None:
    """Point stdout at /dev/null, so the interpreter's final flush does not fail again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):  # not a real file (tests capture it)
        pass


if __name__ == "__main__":
    sys.exit(main())
