"""The real-onnxruntime tables: stock riscv64 ORT per Run against imegen's tuned kernels, single nodes (nodes_*),
with the method they were counted by (the whole model: report/whole_model.py)."""

from __future__ import annotations

import csv
import io

from ..baselines.onnxruntime.nodes import DESCRIBES, OrtRow, modeled_time
from ..baselines.onnxruntime.run_counts import serialized_threads_exact
from ..bench import BenchResult
from ..model import x60
from .tables import format_table


def nodes_table(res: BenchResult, rs: list[OrtRow]) -> str:
    head = ["shape", "M", "block", "ORT 1t M", "ORT 4t M (sum)", "imegen 1c M", "instr ratio", "ORT 1t ms", "ORT 4t ms",
            "imegen 1c ms", "imegen 4c ms", "ratio 1t/1c", "ratio 4t/4c", "ORT+imegen 1t M", "glue M",
            "ORT+imegen 1t ms", "check"]
    body = []
    for r in rs:
        ev = res.get(r.case, "imegen")
        s1, s4 = r.stock[1], r.stock[4]
        t1, t4 = r.modeled(1)[0], r.modeled(4)[0]
        mine = x60.total_instructions(ev.counts)
        lib = r.imegen_lib
        lib_cells = ["-", "-", "-"]
        if lib is not None:
            lt = modeled_time(lib.counts, ev.one_core.dram_bytes, 1)[0]
            lib_cells = [f"{x60.total_instructions(lib.counts) / 1e6:.3f}", f"{(x60.total_instructions(lib.counts) - mine) / 1e6:.3f}", f"{lt * 1e3:.4f}"]
        worst = max([s1.worst, s4.worst] + ([lib.worst] if lib else []))
        body.append([r.case.shape, str(r.case.M), str(r.case.block), f"{x60.total_instructions(s1.counts) / 1e6:.3f}", f"{x60.total_instructions(s4.counts) / 1e6:.3f}",
                     f"{mine / 1e6:.3f}", f"{x60.total_instructions(s1.counts) / mine:.1f}x", f"{t1 * 1e3:.4f}", f"{t4 * 1e3:.4f}",
                     f"{ev.one_core.time_s * 1e3:.4f}", f"{ev.four_cores.time_s * 1e3:.4f}",
                     f"{t1 / ev.one_core.time_s:.1f}x", f"{t4 / ev.four_cores.time_s:.1f}x", *lib_cells,
                     f"{worst:.2f} tol"])
    return format_table(head, body, right=set(range(1, len(head))))


def nodes_method_text(rs: list[OrtRow]) -> str:
    version = rs[0].stock[1].version if rs else "?"
    return (f"Stock ONNX Runtime {version} (Debian's riscv64 build, libonnxruntime1.23) per Run: single-node "
            f"com.microsoft MatMulNBits models ({DESCRIBES}), run under QEMU by imegen/perf/baselines/onnxruntime/ort_bench_runner.c. "
            "Instructions MEASURED per Run (millions): the plugin's begin/end markers bracket each OrtRun after session "
            "creation and one warm-up Run, and count everything ORT executes on every thread (libonnxruntime and "
            "every library it calls: libc, libstdc++, ...; the runner executable excluded); '4t (sum)' = the sum over "
            "the 4 intra-op threads (the plugin's counters are process-wide, not per thread, and not atomic: the "
            "guest threads run serialized on one host CPU under SCHED_FIFO, which makes the counts exact and "
            "repeatable; unpinned, parallel vCPUs lose 10-35% of them"
            + ("" if serialized_threads_exact() else
               "; SCHED_FIFO was NOT permitted in this run, so the 4-thread counts are APPROXIMATE (low)")
            + "), the busiest thread is not separable. "
            "Output checked against the NumPy CompInt8 oracle, i.e. what level 4 allows ('check': worst error as a "
            "fraction of ORT's level-4 tolerance). Times MODELED (x60.py) as max(core, DRAM): 1t = the counts on one core, 4t = the sum split "
            "evenly over 4 cores; DRAM bytes = ORT-format weights (fp32 scales, packed zero points) + A + C. "
            "imegen = the tuned kernel's own rows above; ratio = stock ORT / imegen. 'ORT+imegen' = the same model "
            "rewritten to imegen's custom-op library (its tuned kernel, IME emulator excluded) in the same ORT, "
            "1 thread; 'glue' = ORT+imegen minus the kernel alone (ORT's Run, the custom op's dispatch, A/C handling).")


def nodes_csv(res: BenchResult, rs: list[OrtRow]) -> str:
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(["shape", "M", "N", "K", "block", "path", "threads", "instructions_per_run", "ms_modeled", "bound",
                "check_of_tolerance", "ort_version"])
    for r in rs:
        c = r.case
        for t, nc in sorted(r.stock.items()):
            ms, bound = r.modeled(t)
            w.writerow([c.shape, c.M, c.N, c.K, c.block, "stock ORT", t, round(x60.total_instructions(nc.counts)), f"{ms * 1e3:.6f}",
                        bound, f"{nc.worst:.4f}", nc.version])
        if r.imegen_lib is not None:
            ev = res.get(c, "imegen")
            ms, bound = modeled_time(r.imegen_lib.counts, ev.one_core.dram_bytes, 1)
            w.writerow([c.shape, c.M, c.N, c.K, c.block, "ORT+imegen", 1, round(x60.total_instructions(r.imegen_lib.counts)),
                        f"{ms * 1e3:.6f}", bound, f"{r.imegen_lib.worst:.4f}", r.imegen_lib.version])
    return buf.getvalue()
