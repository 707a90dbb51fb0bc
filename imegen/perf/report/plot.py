"""`imegen bench`'s PNG: the roofline with every kernel's modeled GOPS and, for full runs, per-token bars
and the stock-ORT panels."""

from __future__ import annotations

from pathlib import Path

from ..baselines.llama_cpp.rows import per_token_s
from ..baselines.onnxruntime import nodes as ort_nodes
from ..bench import KINDS, BenchResult
from ..model import x60
from ..workload import DECODE_M, LLAMA_CPP_SOURCE, PREFILL_M, PUBLISHED, PUBLISHED_PP512_TPS, PUBLISHED_TG128_TPS
from .sensitivity import best_under_measured, has_measured, with_imegen
from .tokens import pick_measured, token_summaries


def plot(res: BenchResult, path: Path, p: x60.X60Params = x60.X60) -> Path | None:
    """Roofline (modeled GOPS vs arithmetic intensity) and, for full runs, per-token bars."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    sums = token_summaries(res, p)
    rows = 2 if res.ort else 1
    fig, axes = plt.subplots(rows, 3 if sums else 1, figsize=(18 if sums else 7, 6 * rows), squeeze=False)
    ax = axes[0][0]
    cores = p.ime_cores
    peak = p.peak_ops_per_core * cores / 1e9
    ai = [10 ** (e / 20) for e in range(-20, 81)]  # 0.1 .. 1e4, dense enough for the knee
    for bw, style, label in ((p.dram_effective, "-", f"DRAM {p.dram_effective / 1e9:.2f} GB/s (effective)"),
                             (p.dram_theoretical, ":", f"DRAM {p.dram_theoretical / 1e9:.2f} GB/s (theoretical)")):
        ax.plot(ai, [min(peak, a * bw / 1e9) for a in ai], "k" + style, lw=1, label=f"roofline: {label}")
    ax.axhline(peak, color="k", lw=0.5)
    ax.text(0.12, peak * 1.1, f"IME peak, {cores} cores: {peak:.0f} GOPS", fontsize=8)
    colors = {"imegen": "tab:green", "llama-4x16": "tab:blue", "rvv-fp32": "tab:red"}
    m_markers = {m: mk for m, mk in zip(sorted({c.M for c in res.cases}), "o^sDv")}
    block = min(c.block for c in res.cases)
    for r in res.rows:
        if r.case.block == block:
            c = r.case
            ax.scatter(2 * c.M * c.N * c.K / x60.compulsory_bytes(c.M, c.N, c.K, c.block), r.ev.four_cores.gops,
                       marker=m_markers[c.M], color=colors[r.kind], s=28, zorder=3, alpha=0.85)
    from matplotlib.lines import Line2D

    handles = ax.get_legend_handles_labels()[0]
    handles += [Line2D([], [], ls="", marker="o", color=colors[k], label=f"{k} (modeled)") for k in KINDS]
    handles += [Line2D([], [], ls="", marker=m_markers[m], color="gray", label=f"M = {m}") for m in m_markers]
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (int8 ops per compulsory DRAM byte)")
    ax.set_ylabel(f"modeled GOPS, {cores} IME cores")
    ax.set_title(f"Qwen2.5-0.5B MatMulNBits shapes, int4 block {block}:\nmodeled GOPS vs roofline")
    ax.legend(handles=handles, fontsize=7, loc="lower right")
    ax.grid(True, which="both", lw=0.3)
    if sums:
        ax = axes[0][1]
        width = 0.2
        xs = range(len(sums))
        for i, kind in enumerate(KINDS):
            ax.bar([x + (i - 1) * width for x in xs], [s.decode_ms[kind] for s in sums], width,
                   color=colors[kind], label=f"{kind} (modeled)")
        for i, s in enumerate(sums):
            ax.hlines(s.limit_effective_ms, i - 1.5 * width, i + 1.5 * width, colors="k", linestyles="-", lw=1)
            ax.hlines(s.limit_theoretical_ms, i - 1.5 * width, i + 1.5 * width, colors="k", linestyles=":", lw=1)
        llama_bar(ax, res, sums, width, lambda t: t[0] * 1e3, DECODE_M)
        for (name, ms), ls in zip(PUBLISHED.items(), ("--", "-.")):
            ax.axhline(ms, color="gray", ls=ls, lw=1, label=f"published: {name.split(' (')[0]}")
        ax.plot([], [], "k-", label="memory-bound limit, 5.24 GB/s")
        ax.plot([], [], "k:", label="memory-bound limit, 10.66 GB/s")
        ax.set_xticks(list(xs), [f"block {s.block}" for s in sums])
        ax.set_ylabel("ms per token (decode, M=1, MatMulNBits only)")
        ax.set_title("Decode: modeled ms/token on 4 IME cores")
        ax.set_ylim(0, 1.75 * max(PUBLISHED.values()))
        ax.legend(fontsize=6.5, loc="upper left")
        ax = axes[0][2]
        M = PREFILL_M[-1]
        for i, kind in enumerate(KINDS):
            ax.bar([x + (i - 1) * width for x in xs], [s.prefill_tps[M][kind] for s in sums], width,
                   color=colors[kind], label=f"{kind} (modeled)")
        llama_bar(ax, res, sums, width, lambda t: M / t[0], M)
        if has_measured(res):  # the sensitivity: markers over imegen's bars (and llama.cpp's)
            xi = [x - width for x in xs]
            for r, marker, label in ((res, "x", "imegen tuned, LLVM-measured occupancies"),
                                     (with_imegen(res, best_under_measured(res)), "D", "imegen best under them")):
                ax.scatter(xi, [t.prefill_tps[M]["imegen"] for t in token_summaries(r, pick=pick_measured)], marker=marker,
                           color="k", s=22, zorder=3, label=label)
            at = next((i for i, t in enumerate(sums) if t.block == 32), None)
            t = per_token_s(list(res.llama), M) if res.llama else None
            if at is not None and t and t[2]:
                ax.scatter([at + 2 * width], [M / t[2]], marker="x", color="k", s=22, zorder=3)
        ax.axhline(PUBLISHED_PP512_TPS, color="gray", ls="-.", lw=1,
                   label=f"published: llama.cpp Q4_0 pp512 {PUBLISHED_PP512_TPS} tok/s")
        ax.set_xticks(list(xs), [f"block {s.block}" for s in sums])
        ax.set_ylabel(f"tokens/s (prefill M={M}, MatMulNBits only)")
        ax.set_title(f"Prefill M={M}: modeled tokens/s on 4 IME cores")
        ax.set_ylim(0, 1.45 * max(s.prefill_tps[M][k] for s in sums for k in KINDS))
        ax.legend(fontsize=6.5, loc="upper left")
    if res.ort:
        ort_panels(res, axes[1], colors)
    fig.text(0.5, 0.005, "All imegen/baseline figures are MODELED (X60 cost model over QEMU-counted instructions), "
             f"not measured on hardware. Published llama.cpp figures: {LLAMA_CPP_SOURCE}.", ha="center", fontsize=8)
    fig.tight_layout(rect=(0, 0.02, 1, 1))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def llama_bar(ax, res: BenchResult, sums: list, width: float, value, M: int) -> None:
    """llama.cpp's real Q4_0 kernels (block 32 only), as a fourth bar beside imegen's block-32 group."""
    t = per_token_s(list(res.llama), M)
    at = next((i for i, s in enumerate(sums) if s.block == 32), None)
    if t is not None and at is not None:
        ax.bar([at + 2 * width], [value(t)], width, color="tab:purple", label="llama.cpp real Q4_0 kernels (modeled)")


def ort_panels(res: BenchResult, axes, colors: dict) -> None:
    """Row 2: stock ORT per Run vs imegen per shape; with a full run, the whole model (decode, prefill)."""
    ax = axes[0]
    rs = [r for r in res.ort if r.case.block == ort_nodes.BLOCK]
    labels = [f"{r.case.shape} M={r.case.M}" for r in rs]
    xs = range(len(rs))
    series = [("stock ORT, 1 thread", "tab:gray", [r.modeled(1)[0] for r in rs]),
              ("stock ORT, 4 threads", "silver", [r.modeled(4)[0] for r in rs]),
              ("imegen tuned, 1 core", colors["imegen"], [res.get(r.case, "imegen").one_core.time_s for r in rs]),
              ("imegen tuned, 4 cores", "yellowgreen", [res.get(r.case, "imegen").four_cores.time_s for r in rs])]
    width = 0.8 / len(series)
    for i, (label, color, ts) in enumerate(series):
        ax.bar([x + (i - 1.5) * width for x in xs], [t * 1e3 for t in ts], width, color=color, label=f"{label} (modeled)")
    ax.set_yscale("log")
    ax.set_xticks(list(xs), labels, fontsize=7, rotation=60, ha="right")
    ax.set_ylabel("modeled ms per call (per ORT Run)")
    ax.set_title(f"Stock ORT {rs[0].stock[1].version.split('+')[0]} riscv64 MatMulNBits\nper Run vs imegen (block {ort_nodes.BLOCK})")
    ax.legend(fontsize=7)
    if res.whole is not None and len(axes) >= 3:
        whole_panels(res.whole.rows(), axes[1], axes[2])


ENGINE_COLORS = {"stock-ort": "tab:gray", "ort-imegen-matmul": "yellowgreen", "ort-imegen-decoder": "tab:green",
                 "llama.cpp": "tab:purple"}


def whole_panels(rows: list, decode_ax, prefill_ax) -> None:
    """The whole exporter-form model per engine (report/whole_model.py rows): decode ms/token and prefill
    tokens/s at each context, MODELED, with the published llama.cpp K1 figures as lines."""
    contexts = sorted({r.context for r in rows})
    engines = [e for e in ENGINE_COLORS if any(r.engine == e for r in rows)]
    width = 0.8 / max(len(engines), 1)
    for ax, phase in ((decode_ax, "decode"), (prefill_ax, "prefill")):
        for i, engine in enumerate(engines):
            vals = [next((r.ms_modeled if phase == "decode" else r.tokens_per_s for r in rows
                          if r.engine == engine and r.phase == phase and r.context == c), 0.0) for c in contexts]
            ax.bar([x + (i - (len(engines) - 1) / 2) * width for x in range(len(contexts))], vals, width,
                   color=ENGINE_COLORS[engine], label=f"{engine} (modeled)")
        ax.set_xticks(range(len(contexts)), [f"{'cached' if phase == 'decode' else 'prompt'} {c}" for c in contexts])
        ax.set_yscale("log")
        if phase == "decode":
            ax.axhline(1000 / PUBLISHED_TG128_TPS, color="tab:blue", ls="--", lw=1,
                       label=f"published llama.cpp Q4_0 tg128 on a K1 ({1000 / PUBLISHED_TG128_TPS:.1f} ms)")
            ax.set_ylabel("ms per token")
            ax.set_title("Whole Qwen2.5-0.5B (onnxruntime-genai's form), decode: modeled ms/token")
        else:
            ax.axhline(PUBLISHED_PP512_TPS, color="tab:blue", ls="--", lw=1,
                       label=f"published llama.cpp Q4_0 pp512 on a K1 ({PUBLISHED_PP512_TPS} tok/s)")
            ax.set_ylabel("tokens per second")
            ax.set_title("Whole model, prefill: modeled tokens/s")
        low, high = ax.get_ylim()
        ax.set_ylim(low, high * 30)  # an empty band of 1.5 decades on top for the legend, clear of the bars
        ax.legend(fontsize=7, loc="upper left")
