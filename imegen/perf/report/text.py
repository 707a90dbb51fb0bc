"""The whole `imegen bench` report: method, model, the tables, the baselines', the goals and the summaries."""

from __future__ import annotations

from ..baselines.llama_cpp import rows as llama_rows
from ..baselines.llama_cpp.source import VERSION as LLAMA_CPP_VERSION
from ..bench import BenchResult
from ..count.measure import METHOD
from ..model import x60
from ..workload import QWEN25_05B
from . import ime2, llama_cpp, onnxruntime, whole_model
from .goals import prefill_goal_text, scale_precision_text
from .kernels import kernel_tables, ratio_table, vtype_note
from .sensitivity import measured_text
from .tokens import summary_text


def model_text(p: x60.X60Params = x60.X60) -> str:
    return (f"MODEL (imegen/perf/model/x60.py; modeled, not measured): X60 at {p.clock_hz / 1e9:.1f} GHz, VLEN {p.vlen}, "
            f"DLEN {p.dlen}, in-order dual issue, 1 vmadot/cycle/core ({p.peak_ops_per_core / 1e9:.0f} int8 GOPS/core), "
            f"{p.ime_cores} IME cores, L1 {p.l1_bytes // 1024} KB, L2 {p.l2_bytes // 1024} KB/cluster, "
            f"DRAM {p.dram_effective / 1e9:.2f} GB/s effective (2 x measured 1-thread memcpy {p.dram_memcpy_1t / 1e9:.2f} GB/s; "
            f"theoretical {p.dram_theoretical / 1e9:.2f}). time = max(core resource bound, DRAM bytes / bandwidth); "
            "roofline = max(2MNK / IME peak, ORT-format bytes / bandwidth); 'x roofline' = modeled / roofline (1.00 is ideal). "
            "4 cores: N tiles split across cores, A preparation split evenly, DRAM shared.")


def report(res: BenchResult, refused_note: bool = True) -> str:
    ratios, not_beaten = ratio_table(res)
    parts = [
        f"imegen bench: {QWEN25_05B.name} MatMulNBits shapes, int4 asymmetric"
        + (" (--quick subset)" if res.quick else ""),
    ]
    if res.whole is not None:  # the whole model first: what a user's model gains
        parts += [whole_model.report_text(res.whole.rows(), res.whole.version, list(res.whole.accounts),
                                          list(res.whole.llama))]
        parts += [res.whole.llama_note] if res.whole.llama_note else []
        parts += [""]
    parts += [
        "METHOD: " + METHOD,
        model_text(),
        "",
        *kernel_tables(res),
        "",
        "imegen's best (tuned) config as a speedup over each baseline (baseline modeled time / imegen modeled time):",
        ratios,
    ]
    if not_beaten:
        parts += ["", "Where the tuned config does not clearly beat a baseline on 4 cores:", *("  " + n for n in not_beaten)]
    parts += ["", vtype_note(res)]
    if res.llama:
        parts += ["", "llama.cpp real (SpacemiT IME1 kernels from the llama-cpp-python " + LLAMA_CPP_VERSION + " sdist, "
                  "driven like ime.cpp, see imegen/perf/baselines/llama_cpp/): instructions MEASURED (millions, one call; "
                  "'4t' = the busiest of 4 threads), times MODELED ('+lat' = the latency sensitivity: +"
                  f"{llama_rows.LOAD_USE_EXTRA} cycles per vector load, vmadot latency {llama_rows.VMADOT_LATENCY} "
                  "per dependent step, both ASSUMPTIONS; '1c core ms' = the core-side time on one core with DRAM "
                  "ignored, i.e. who is ahead where DRAM does not bind). " + llama_rows.DESCRIBES + "; against it the symmetric "
                  "fp16-scale twin of imegen's tuned config (same bits, block, scale precision):",
                  llama_cpp.table(list(res.llama)), "Calibration of the X60 model on llama.cpp's real kernels "
                  "(Qwen2.5-0.5B MatMulNBits only, 4 threads; the published figures are whole-model):",
                  llama_cpp.calibration(list(res.llama))]
    if res.ime2 is not None:
        parts += ["", ime2.report_text(res.ime2)]
    if res.ort:
        parts += ["", onnxruntime.nodes_method_text(list(res.ort)), onnxruntime.nodes_table(res, list(res.ort))]
    goal = "\n".join(t for t in (prefill_goal_text(res), prefill_goal_text(res, measured=True)) if t)
    if goal:
        parts += ["", goal]
    measured = measured_text(res)
    if measured:
        parts += ["", measured]
    parts += ["", scale_precision_text(res)]
    parts += ["", summary_text(res)]
    if refused_note:
        parts += ["", f"Tuner: {res.tuned.evaluated} configs measured, {len(res.tuned.refused)} refused by the "
                      f"validator (e.g. {res.tuned.refused[0][1] if res.tuned.refused else '-'})."]
    return "\n".join(parts)
