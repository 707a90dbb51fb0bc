"""The `imegen check` job: for every kernel, compiler and VLEN it accepts, run an edge-shape
matrix plus exactly-representable data through the compiled kernel and compare to NumPy; at the
other VLENs of 128..512, check that it refuses (IMEGEN_ERR_VLEN) without computing anything, and that
an MLAS dispatch's supported() says no. A kernel (or dispatch group) whose results no run compared to
NumPy fails: its refusals alone would be a pass with nothing checked behind it."""

from __future__ import annotations

import sys
from dataclasses import dataclass

import numpy as np

from . import interrupt
from . import reference as ref
from .abi import mlas_check
from .abi.imegen import IMEGEN_ERR_VLEN
from .abi.mlas import COMPUTE_FP32, DispatchPlan, Group
from .plan import KernelPlan
from .toolchain import ToolchainError
from .verify import Build, Case, Result, build, compare, compilers_for, run_cases

VLENS = (128, 256, 512)  # the harts check runs kernels on (QEMU -cpu rv64,vlen=...)
QEMU_VLEN = 256  # where kernels without vector registers run
NAN = float("nan")  # no error to report: a refusal computes nothing
REFUSES = " (refuses)"  # the vlen column of a refusal row


@dataclass(frozen=True)
class Row:
    kernel: str
    target: str
    compiler: str
    vlen: str
    cases: int
    max_abs: float
    max_rel: float
    vmadots: int
    ok: bool
    message: str

    @property
    def refusal(self) -> bool:
        """A run at a VLEN the kernel must refuse: it shows that nothing is computed there, not that
        anything is computed right."""
        return self.vlen.endswith(REFUSES)


def vlens_for(plan: KernelPlan) -> list[int | None]:
    """VLENs to run at: those of 128..512 the target accepts (IME only 256; RVV every one from its
    minimum), or the kernel's own if it accepts none of them (RVV above 512: never at none, which would
    pass without running). A kernel without vector registers runs once, at QEMU_VLEN."""
    s = plan.spec
    if not plan.target.vector:
        return [QEMU_VLEN]  # VLEN is irrelevant
    return [v for v in VLENS if plan.target.accepts_vlen(s, v)] or [s.vlen]


def refused_vlens(plan: KernelPlan) -> list[int]:
    """The VLENs of 128..512 a vector kernel does not accept: there it must return IMEGEN_ERR_VLEN."""
    if not plan.target.vector:
        return []
    return [v for v in VLENS if v not in vlens_for(plan)]


def _not_refused(case: Case, result: Result) -> str | None:
    """Why a run at a refused VLEN was not a clean refusal (None: it was)."""
    if result.status != IMEGEN_ERR_VLEN:
        return f"returned status {result.status}, not IMEGEN_ERR_VLEN ({IMEGEN_ERR_VLEN})"
    if result.vmadots:
        return f"executed {result.vmadots} vmadot before refusing"
    if np.any(result.C != 0):  # the driver zero-fills C
        return "wrote C before refusing"
    # with slices, prepare_a (which returns nothing) has filled the workspace; matmul_prepared then refuses
    if case.slices == 1 and result.workspace_touched:
        return f"wrote {result.workspace_touched} workspace bytes before refusing"
    return None


def edge_shapes(plan: KernelPlan) -> list[tuple[int, int, int]]:
    """(M, N, K) around the tile, panel and block edges (XNNPACK-style), plus degenerate ones."""
    s = plan.spec
    tm, tn, blk = s.tile_m, s.tile_n, s.block
    ms = sorted({1, max(1, tm - 1), tm, tm + 1, 2 * tm + 1}) if s.op == "gemm" else [1, 2]
    ns = sorted({1, max(1, tn - 1), tn, tn + 1, s.panel + tn + 1})
    ks = [blk, 2 * blk + 3, blk // 2 + 1]  # whole blocks, a padded last block, K < block
    shapes = [(m, tn + 1, 2 * blk + 3) for m in ms]
    shapes += [(ms[-1], n, blk) for n in ns]
    shapes += [(tm + 1, 2 * tn + 3, k) for k in ks]
    return list(dict.fromkeys(shapes))


def make_cases(plan: KernelPlan, rng: np.random.Generator, shapes, *, exact: bool) -> list[Case]:
    s = plan.spec
    sym = s.zero_point == "symmetric"
    cases = []
    for i, (M, N, K) in enumerate(shapes):
        if exact:
            A, qw = ref.exact_test_data(rng, M, N, K, s.bits, s.block, sym)
            bias = rng.integers(-100, 101, N).astype(np.float32) if s.bias else None
        else:
            A = rng.standard_normal((M, K)).astype(np.float32)
            qw = ref.quantize_weights(rng.standard_normal((K, N)).astype(np.float32), s.bits, s.block, sym)
            bias = rng.uniform(1, 5, N).astype(np.float32) if s.bias else None  # ORT's bias range
        # every third case with several columns runs as column slices on one prepared A (matmul_prepared)
        cases.append(Case(A, qw, bias, lda_pad=i % 3, ldc_pad=(i + 1) % 3, slices=2 + i % 2 if i % 3 == 2 and N > 1 else 1))
    return cases


def _row(plan: KernelPlan, compiler: str, vlen: str, random_cases: list[Case], exact_cases: list[Case], results) -> Row:
    """Compare one build's results: random data within bounds, exactly-representable data to the bit."""
    cases = random_cases + exact_cases
    cmp = [compare(plan, c, r, exact=i >= len(random_cases) and plan.exact_on_exact_data)
           for i, (c, r) in enumerate(zip(cases, results))]
    bad = [(c, x) for c, x in zip(cases, cmp) if not x.ok]
    message = "ok" if not bad else f"{len(bad)} failed; first M,N,K={bad[0][0].shape}: {bad[0][1].message}"
    return Row(plan.name, plan.spec.target, compiler, vlen, len(cmp), max(x.max_abs for x in cmp),
               max(x.max_rel for x in cmp), sum(r.vmadots for r in results), not bad, message)


def died(e: ToolchainError) -> str:
    """Why a run ended early, in one line: how it ended (e.g. killed by SIGILL), then the program's own
    last word (e.g. the driver's "the call wrote C outside its M x N elements")."""
    how, said = str(e).splitlines()[0], e.stderr.strip().splitlines()
    return f"{how}: {said[-1].strip()}" if said else how


def nothing_checked_row(kernel: str, target: str, why: str) -> Row:
    """A kernel no run compared to NumPy fails: refusals alone say nothing about its results."""
    return Row(kernel, target, "-", "-", 0, NAN, NAN, 0, False, f"nothing checked: {why}")


def checked_cases(rows: list[Row]) -> int:
    """Cases whose results were compared to NumPy (refusal runs compute nothing to compare)."""
    return sum(r.cases for r in rows if not r.refusal)


def died_row(kernel: str, target: str, compiler: str, vlen: str, cases: int, e: ToolchainError) -> Row:
    return Row(kernel, target, compiler, vlen, cases, NAN, NAN, 0, False, f"run failed: {died(e)}")


def refusal_row(b: Build, vlen: int, cases: list[Case]) -> Row:
    """Run the cases at a VLEN the kernel does not accept: each must be a clean refusal."""
    plan = b.plan
    try:
        results = run_cases(b, cases, vlen=vlen)
    except ToolchainError as e:  # e.g. SIGILL: an IME kernel reached a vmadot with no emulator installed
        return Row(plan.name, plan.spec.target, b.compiler, f"{vlen}{REFUSES}", len(cases), NAN, NAN, 0, False,
                   f"did not refuse: {died(e)}")
    bad = [(c, why) for c, r in zip(cases, results) if (why := _not_refused(c, r))]
    message = "ok" if not bad else f"{len(bad)} not refused; first M,N,K={bad[0][0].shape}: {bad[0][1]}"
    return Row(plan.name, plan.spec.target, b.compiler, f"{vlen}{REFUSES}", len(cases), NAN, NAN,
               sum(r.vmadots for r in results), not bad, message)


def check_kernel(plan: KernelPlan, spec_file: str, *, seed: int = 0, log=None) -> list[Row]:
    rng = np.random.default_rng(seed)
    shapes = edge_shapes(plan)
    random_cases = make_cases(plan, rng, shapes, exact=False)
    exact_cases = make_cases(plan, rng, shapes, exact=True)
    rows = []
    for compiler in compilers_for(plan):
        b = build(plan, spec_file, compiler=compiler)
        for vlen in vlens_for(plan):
            if log:
                log(f"  {plan.name}: {compiler}, vlen {vlen}: {len(shapes)} shapes x (random + exact) data")
            try:
                results = run_cases(b, random_cases + exact_cases, vlen=vlen)
            except ToolchainError as e:  # the driver died: a crash, or a write outside what the call owns
                rows.append(died_row(plan.name, plan.spec.target, compiler, str(vlen), len(random_cases + exact_cases), e))
                continue
            rows.append(_row(plan, compiler, str(vlen), random_cases, exact_cases, results))
        for vlen in refused_vlens(plan):
            if log:
                log(f"  {plan.name}: {compiler}, vlen {vlen}: {len(shapes)} shapes, must refuse")
            rows.append(refusal_row(b, vlen, random_cases))
    if plan.target.host_build:  # also natively, as the portable reference build
        try:
            results = run_cases(build(plan, spec_file, host=True), random_cases + exact_cases, vlen=None)
            rows.append(_row(plan, "host cc", "-", random_cases, exact_cases, results))
        except ToolchainError as e:
            rows.append(died_row(plan.name, plan.spec.target, "host cc", "-", len(random_cases + exact_cases), e))
    if not checked_cases(rows):
        rows.append(nothing_checked_row(plan.name, plan.spec.target, "no build ran at a VLEN the kernel accepts"))
    return rows


def _group_shapes(g: Group) -> list[tuple[int, int, int]]:
    """Rows around the group's tiles; N across MLAS's 16-column thread split and 128-column chunks."""
    tm = max(p.spec.tile_m for p in (g.m1, g.dequant, g.gemv, g.gemm) if p)
    ms = [1] if g.compute == COMPUTE_FP32 and g.dequant is None else sorted({1, tm, tm + 1, 2 * tm + 1})
    if g.bits == 8:  # the BlkSum kernel gets MLAS's whole 128-row range in one call
        ms.append(130)
    return [(m, n, k) for m in ms for n, k in [(1, g.block), (40, 2 * g.block + 3), (133, g.block // 2 + 1)]]


def dispatch_vlens(d: DispatchPlan) -> list[int]:
    """VLENs a dispatch runs at: those of 128..512 every kernel accepts (256 with an IME kernel, else each
    from its RVV kernels' minimum up), or that minimum, if above 512 (as vlens_for, never none)."""
    need = max(p.spec.vlen or 128 for p in d.kernels)
    return [v for v in VLENS if all(p.target.accepts_vlen(p.spec, v) for p in d.kernels)] or [need]


def dispatch_refused_vlens(d: DispatchPlan) -> list[int]:
    """The VLENs of 128..512 a dispatch with vector kernels does not accept: there supported() must say no."""
    if not any(p.target.vector for p in d.kernels):
        return []
    return [v for v in VLENS if v not in dispatch_vlens(d)]


def dispatch_refusal_row(d: DispatchPlan, exe, compiler: str, vlen: int) -> Row:
    """At a VLEN one of its kernels does not accept, the dispatch's supported() must say no: MLAS asks it
    once at init and then installs none of the entries (no entry can refuse: they return void)."""
    name, target = f"{d.prefix}supported()", "mlas:" + "/".join(sorted({p.spec.target for p in d.kernels}))
    try:
        said = mlas_check.supported(exe, vlen=vlen)
    except ToolchainError as e:
        return Row(name, target, compiler, f"{vlen}{REFUSES}", 1, NAN, NAN, 0, False, f"did not answer: {died(e)}")
    return Row(name, target, compiler, f"{vlen}{REFUSES}", 1, NAN, NAN, 0, not said,
               "ok" if not said else "returned 1: MLAS would install the dispatch on this hart")


def check_dispatch(d: DispatchPlan, spec_file: str, *, seed: int = 0, log=None) -> list[Row]:
    """abi=mlas kernels are checked through their dispatch, driven the way MLAS drives it; at the other
    VLENs of 128..512, its supported() must refuse."""
    rng = np.random.default_rng(seed)
    vlens = dispatch_vlens(d)
    rows = []
    group_targets = {}  # "+"-joined kernel names -> target label
    for compiler in [c for c in ("clang", "gcc") if all(c in p.target.compilers for p in d.kernels)]:
        exe = mlas_check.build(d, spec_file, compiler=compiler)
        for g in d.groups:
            names = [p.name for p in (g.m1, g.dequant, g.gemv, g.gemm) if p]
            shapes = _group_shapes(g)
            cases = [(mlas_check.random_case(rng, M, N, K, g.block, i % 2 == 0, i % 3 == 0, g.compute, exact, g.bits), exact)
                     for exact in (False, True) for i, (M, N, K) in enumerate(shapes)]
            target = "mlas:" + "/".join(sorted({p.spec.target for p in (g.m1, g.dequant, g.gemv, g.gemm) if p}))
            group_targets["+".join(names)] = target
            for vlen in vlens:
                if log:
                    log(f"  dispatch {d.prefix}: {'+'.join(names)}: {compiler}, vlen {vlen}: {len(cases)} cases")
                try:
                    results = mlas_check.run(exe, [c for c, _ in cases], vlen=vlen)
                except ToolchainError as e:  # the driver died: the group's row fails, the others still run
                    rows.append(died_row("+".join(names), target, compiler, str(vlen), len(cases), e))
                    continue
                cmp = [mlas_check.check(d, c, r, exact=exact) for (c, exact), r in zip(cases, results)]
                bad = [(c, x) for (c, _), x in zip(cases, cmp) if not x.ok]
                message = "ok" if not bad else f"{len(bad)} failed; first M,N,K={bad[0][0].case.shape}: {bad[0][1].message}"
                rows.append(Row("+".join(names), target, compiler, str(vlen), len(cmp), max(x.max_abs for x in cmp),
                                max(x.max_rel for x in cmp), sum(r.vmadots for r in results), not bad, message))
        for vlen in dispatch_refused_vlens(d):
            if log:
                log(f"  dispatch {d.prefix}: {compiler}, vlen {vlen}: supported() must refuse")
            rows.append(dispatch_refusal_row(d, exe, compiler, vlen))
    for kernels, target in group_targets.items():
        if not checked_cases([r for r in rows if r.kernel == kernels]):
            rows.append(nothing_checked_row(kernels, target, "no run at a VLEN the dispatch accepts"))
    return rows


def format_table(rows: list[Row]) -> str:
    head = ("kernel", "target", "compiler", "vlen", "cases", "max abs err", "max rel err", "vmadot", "result")
    err = lambda x: "-" if np.isnan(x) else f"{x:.2e}"  # noqa: E731
    body = [(r.kernel, r.target, r.compiler, r.vlen, str(r.cases), err(r.max_abs), err(r.max_rel),
             str(r.vmadots), "PASS" if r.ok else f"FAIL: {r.message}") for r in rows]
    widths = [max(len(x[i]) for x in [head, *body]) for i in range(len(head))]
    line = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()  # noqa: E731
    return "\n".join([line(head), line(["-" * w for w in widths]), *map(line, body)])


def stderr_log(msg: str) -> None:
    interrupt.check()  # a Ctrl-C a finalizer swallowed stops the run at its next progress line
    print(msg, file=sys.stderr, flush=True)


ATTENTION_VLENS = (128, 256, 512, 1024)


def check_attention(spec, spec_file: str, *, seed: int = 0, log=None) -> list[Row]:
    """An attention kernel at every VLEN of ATTENTION_VLENS: where it accepts the VLEN, every case against the
    float64 NumPy attention (verify_attention.reference); below, every call must return IMEGEN_ERR_VLEN."""
    from . import verify_attention as va

    plan = va.plan_for(spec)
    cases = va.make_cases(np.random.default_rng(seed), spec.q_rows, spec.kv_block)
    exe = va.build(plan, spec_file)
    rows = []
    for vlen in ATTENTION_VLENS:
        accepts = vlen >= spec.vlen
        if log:
            log(f"  {spec.name}: clang, vlen {vlen}: {len(cases)} cases" + ("" if accepts else ", must refuse"))
        try:
            results = va.run_cases(exe, cases, vlen)
        except ToolchainError as e:
            rows.append(died_row(spec.name, spec.target, "clang", str(vlen), len(cases), e))
            continue
        if not accepts:
            bad = sum(r.status != IMEGEN_ERR_VLEN for r in results)
            rows.append(Row(spec.name, spec.target, "clang", f"{vlen}{REFUSES}", len(cases), NAN, NAN, 0, not bad,
                            "ok" if not bad else f"{bad} calls not refused"))
            continue
        errors = [va.error(c, r) for c, r in zip(cases, results)]
        failed = [(c, r, e) for c, r, e in zip(cases, results, errors) if r.status != 0 or e[1] > va.TOLERANCE]
        message = "ok" if not failed else (f"{len(failed)} cases off; first rows,head_dim,keys={failed[0][0].shape}: "
                                          f"status {failed[0][1].status}, error {failed[0][2][1]:.2e} of (1 + max|O|)")
        rows.append(Row(spec.name, spec.target, "clang", str(vlen), len(cases), max(e[0] for e in errors),
                        max(e[1] for e in errors), 0, not failed, message))
    if not checked_cases(rows):
        rows.append(nothing_checked_row(spec.name, spec.target, "no build ran at a VLEN the kernel accepts"))
    return rows
