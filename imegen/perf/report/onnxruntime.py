"""The real-onnxruntime tables: stock riscv64 ORT per Run against imegen's tuned kernels, single nodes
(nodes_*) and the whole model (whole_model_*), with the method each was counted by."""

from __future__ import annotations

import csv
import io

import numpy as np

from ..baselines.onnxruntime.nodes import BLOCK, DESCRIBES, OrtRow, modeled_time
from ..baselines.onnxruntime.run_counts import serialized_threads_exact
from ..baselines.onnxruntime.whole_model import (DECODE_PAST, DEEP_RMS, LAYERS, PREFILL, PREFILL_VOCAB, STRICT_LAYERS,
                                                 WholeModel)
from ..bench import BenchResult
from ..model import x60
from ..workload import LLAMA_CPP_SOURCE, PUBLISHED_ORT_MS, PUBLISHED_PP512_TPS, PUBLISHED_TG128_TPS, QWEN25_05B
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


def whole_model_table(w: WholeModel, calibration: str = "") -> str:
    head = ["", "path", "instructions G", "MatMulNBits share", "1 core ms", "bound", "4 cores ms (ideal split)",
            "bound", "per token", "logits check"]
    body = []
    for mode, figs in (("decode (1 token)", w.decode), (f"prefill ({PREFILL} tokens)", w.prefill)):
        for path, f in figs.items():
            t1, b1 = modeled_time(f.counts, f.dram_bytes, 1)
            t4, b4 = modeled_time(f.counts, f.dram_bytes, 4)
            n = 1 if mode.startswith("decode") else PREFILL
            rate = f"{t4 * 1e3:.1f} ms/token (4c)" if n == 1 else f"{n / t4:.1f} tok/s (4c)"
            body.append([mode, path, f"{x60.total_instructions(f.counts) / 1e9:.3f}", f"{f.matmul / x60.total_instructions(f.counts):.0%}",
                         f"{t1 * 1e3:.1f}", b1, f"{t4 * 1e3:.1f}", b4, rate,
                         "-" if path == "stock ORT" else f"{f.check:.2f} tol" if np.isfinite(f.check) else "composed"])
    text = format_table(head, body, right={2, 3, 4, 6})
    ratio_d = x60.total_instructions(w.decode["stock ORT"].counts) / x60.total_instructions(w.decode["ORT+imegen"].counts)
    ratio_p = x60.total_instructions(w.prefill["stock ORT"].counts) / x60.total_instructions(w.prefill["ORT+imegen"].counts)
    deep = [(k, v) for k, v in w.counted.items() if len(k) == 4 and k[3] == "logits"]
    agreement = "".join(f" At {k[2]} layers ({k[1]}) ORT+imegen's logits differ from stock's by {v[0]:.2f} x the level-4 "
                        f"tolerance at worst, {v[1]:.2%} relative RMS, top token {'the same' if v[2] else 'DIFFERENT'} "
                        f"(int8 vs stock's fp32 compute, compounded over the layers; at 1-{STRICT_LAYERS} layers the "
                        "check is the tolerance itself)." for k, v in deep)
    lines = [text, f"stock ORT / ORT+imegen instructions: decode {ratio_d:.1f}x, prefill {ratio_p:.1f}x." + agreement,
             f"Published on K1, 4 threads, whole model (measured by others): llama.cpp Q4_0 tg128 {PUBLISHED_TG128_TPS} "
             f"tok/s = {1000 / PUBLISHED_TG128_TPS:.1f} ms/token, pp512 {PUBLISHED_PP512_TPS} tok/s "
             f"({LLAMA_CPP_SOURCE}); ONNX Runtime ~{PUBLISHED_ORT_MS:.0f} ms/token "
             "(the figure issue 10 cites; imegen found no public source for it)."]
    if calibration:
        lines.append(f"The X60 model's optimism on llama.cpp's real kernels (the calibration above; divide a modeled rate by it): {calibration}")
    return "\n".join(lines)


def whole_model_method_text(w: WholeModel) -> str:
    c = w.counted
    return (f"METHOD (whole model, imegen/perf/baselines/onnxruntime/whole_model.py): {QWEN25_05B.name} architecture (imegen/ort/qwen.py, random "
            f"weights, int4 block {BLOCK} asymmetric, accuracy_level 4) in onnxruntime {w.version} (riscv64, QEMU), "
            f"1 intra-op thread, instructions MEASURED per Run (prefill: at 1 and 2 layers, extrapolated linearly to {LAYERS}: "
            f"count(1) + 23 x (count(2) - count(1))). Decode: M = 1 after a KV cache of {DECODE_PAST} positions, full "
            f"vocabulary {QWEN25_05B.vocab} (counted: stock {c[('stock ORT', 'decode', 1)] / 1e9:.2f} / "
            f"{c[('stock ORT', 'decode', 2)] / 1e9:.2f} G at 1 / 2 layers; counted directly at {LAYERS} layers: "
            f"stock {c[('stock ORT', 'decode', LAYERS)] / 1e9:.2f} G, extrapolated "
            f"{c[('stock ORT', 'decode', 'extrapolated')] / 1e9:.2f} G; ORT+imegen "
            f"{c[('ORT+imegen', 'decode', LAYERS)] / 1e9:.4f} G, extrapolated "
            f"{c[('ORT+imegen', 'decode', 'extrapolated')] / 1e9:.4f} G: the direct counts are reported). Prefill: {PREFILL} tokens, empty cache, counted "
            f"at vocabulary {PREFILL_VOCAB}, its LM head (single-node count at M = {PREFILL}) replaced by the full one "
            "at M = 1 (last-position logits only, as llama.cpp's pp), the same for ORT+imegen (its 2-layer Run traps "
            f"~60 M emulated vmadots, ~25 min under QEMU; counted {c[('ORT+imegen', 'prefill', 1)] / 1e9:.3f} / "
            f"{c[('ORT+imegen', 'prefill', 2)] / 1e9:.3f} G at 1 / 2 layers), checked against the composed estimate "
            "(stock's prefill with the model's MatMulNBits single-node counts replaced by ORT+imegen's): "
            f"{c[('ORT+imegen', 'prefill', 'composed')] / 1e9:.3f} G. MatMulNBits share = Σ single-node per-Run "
            "counts of the model's 169 MatMulNBits over the total. ORT+imegen = the rewritten model with imegen's "
            "library (tuned q/o decode and prefill kernels, IME emulator excluded), logits within ORT's level-4 "
            f"tolerance of stock's up to {STRICT_LAYERS} layers, deeper within {DEEP_RMS:.0%} relative RMS. "
            "Times MODELED: max(core, DRAM); '4 cores (ideal split)' divides every instruction by 4 (an upper bound "
            "on speed: ORT runs the non-MatMulNBits ops on fewer threads); DRAM = MatMulNBits weights + A + C + KV cache.")
