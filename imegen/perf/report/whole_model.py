"""The whole-model account users' graph adds up node by node (baselines/onnxruntime/per_node.py): one row per
engine x phase x context, llama.cpp's whole-model counts beside it when bench/results/llama_whole_model.json
exists, and the method text. bench/results/whole_model.csv and whole_model.txt are written by

    python3 -m imegen.perf.report.whole_model [--out bench/results]

and `imegen bench` shows whole_model.txt through `text_from_results(results_dir)`.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

from ..baselines.llama_cpp.whole_nodes import CALL_CATEGORY as LLAMA_CALL
from ..baselines.onnxruntime import per_node as pn
from ..model import x60
from ..workload import QWEN25_05B, shapes
from .tables import format_table

LLAMA_JSON = "llama_whole_model.json"
CSV_NAME = "whole_model.csv"
TEXT_NAME = "whole_model.txt"
LLAMA = "llama.cpp"
COLUMNS = ("engine", "phase", "context", "instructions", "ms_modeled", "tokens_per_s_modeled", "non_matmul_share",
           "dram_mb", "check_of_tolerance", "op_time_shares", "op_instruction_shares", "core_ms_modeled")
Q4_0_BYTES_PER_32 = 18  # ggml's Q4_0 block: an fp16 scale and 32 4-bit codes
KV_BYTES = 2  # llama.cpp's default KV cache type, f16


@dataclass(frozen=True)
class Row:
    engine: str
    phase: str  # decode | prefill
    context: int
    instructions: float  # per token (decode) or per prefill, every thread
    ms_modeled: float
    non_matmul_share: float | None  # of the modeled time; None where not separable (llama.cpp)
    dram_bytes: float
    check: float = 0.0  # worst imegen-vs-stock disagreement of a counted node, fraction of its tolerance
    time_shares: dict[str, float] = field(default_factory=dict)
    instruction_shares: dict[str, float] = field(default_factory=dict)
    core_ms: float = 0.0  # MODELED core-side time with DRAM ignored (nodes over their cores; llama.cpp over 4)

    @property
    def tokens(self) -> int:
        return 1 if self.phase == "decode" else self.context

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / (self.ms_modeled / 1e3)


def row_of(a: pn.Account) -> Row:
    return Row(a.engine, a.phase.kind, a.phase.context, a.instructions, a.seconds * 1e3, a.non_matmul_share,
               sum(n.multiplicity * n.dram_bytes for n in a.nodes), max(n.check for n in a.nodes),
               a.time_shares(), a.instruction_shares(), a.core_seconds * 1e3)


# ------------------------------------------------------------------------------------------ llama.cpp
def llama_weights(m=QWEN25_05B) -> int:
    """Weights one token streams: every decoder matrix and the (tied) lm_head, all Q4_0 in the baseline."""
    return sum(s.N * s.K * s.per_token for s in shapes(m))


def llama_dram_bytes(phase: str, context: int, m=QWEN25_05B) -> float:
    """Q4_0 weights once (18 bytes per 32) + the f16 KV cache: decode reads the `context` cached positions and
    the new one and writes one; prefill writes and reads its `context` positions."""
    per_position = m.layers * 2 * m.kv_heads * m.head_dim * KV_BYTES
    positions = 2 * context if phase == "prefill" else context + 2
    return llama_weights(m) * Q4_0_BYTES_PER_32 / 32 + per_position * positions


def llama_core_seconds(r: dict) -> float:
    """One thread's core time (the row's own X60 figure from its full counters, else from its class totals, which
    leave out the vector units' beats), split evenly over the 4 cores."""
    if "modeled_core_ms_x60" in r:
        one = r["modeled_core_ms_x60"] / 1e3
    elif "whole_call_modeled_x60_ms" in r or "modeled_x60_ms" in r:  # llama_cpp/whole_model.py's: full counters
        one = r.get("whole_call_modeled_x60_ms", r.get("modeled_x60_ms"))["core"] / 1e3
    elif "counts" in r:
        one = x60.core_seconds(r["counts"])
    else:
        one = x60.core_seconds({f"kernel.{c}": v for c, v in r["classes"].items()})
    return one / x60.X60.ime_cores


def llama_row(r: dict) -> Row:
    """A llama.cpp row: its per-node account when the row has one (llama_cpp/whole_model.py's "per_node"), else the
    whole-call model (whole_call_row)."""
    if "per_node" not in r:
        return whole_call_row(r)
    p = r["per_node"]
    ops = p["by_op"]
    seconds = sum(o["ms"] for o in ops) or 1.0
    instructions = sum(o["instructions"] for o in ops) or 1.0
    matmul = sum(o["ms"] for o in ops if o["op"] == "MUL_MAT")
    by_time = sorted(ops, key=lambda o: -o["ms"])
    by_instr = sorted(ops, key=lambda o: -o["instructions"])
    return Row(LLAMA, r["phase"], int(r["context"]), float(p["instructions"]), float(p["ms_modeled"]),
               1.0 - matmul / seconds, float(p["dram_bytes"]),
               time_shares={o["op"]: o["ms"] / seconds for o in by_time},
               instruction_shares={o["op"]: o["instructions"] / instructions for o in by_instr},
               core_ms=float(p["core_ms_modeled"]))


def whole_call_row(r: dict) -> Row:
    """llama.cpp's whole call as one region: max(all core time / 4, (Q4_0 weights + f16 KV) / bandwidth)."""
    dram = llama_dram_bytes(r["phase"], int(r["context"]))
    seconds = max(llama_core_seconds(r), dram / x60.X60.dram_effective)
    split = r.get("split") or {}
    total = sum(split.values()) or 1
    return Row(LLAMA, r["phase"], int(r["context"]), float(r["instructions"]), seconds * 1e3, None, dram,
               instruction_shares={("SpacemiT code" if k == "spacemit" else k): v / total for k, v in split.items()},
               core_ms=llama_core_seconds(r) * 1e3)


def llama_json_rows(path: Path) -> list[dict]:
    """The rows of llama_cpp/whole_model.py --write's JSON; [] when the file is not there."""
    return json.loads(path.read_text())["rows"] if path.exists() else []


def llama_rows(path: Path) -> list[Row]:
    """llama.cpp rows from `path` (llama_cpp/whole_model.py --write): {"rows": [{"phase": "decode" | "prefill",
    "context": P, "instructions": N (per llama_decode call, 1 thread), "modeled_core_ms_x60": one thread's X60
    core time (or "counts": the plugin's counters, or "classes": instruction class totals), "split":
    {"spacemit": N, "rest": N} (optional)}, ...]}; [] when the file is not there."""
    return [llama_row(r) for r in llama_json_rows(path)]


# ------------------------------------------------------------------------------------------ CSV and text
def _shares_text(shares: dict[str, float]) -> str:
    return ";".join(f"{k}={v:.4f}" for k, v in shares.items())


def _shares_of(text: str) -> dict[str, float]:
    return {k: float(v) for k, v in (p.split("=", 1) for p in text.split(";") if p)}


def write_csv(rows: list[Row]) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(COLUMNS)
    for r in rows:
        w.writerow([r.engine, r.phase, r.context, round(r.instructions), f"{r.ms_modeled:.4f}", f"{r.tokens_per_s:.3f}",
                    "" if r.non_matmul_share is None else f"{r.non_matmul_share:.4f}", f"{r.dram_bytes / 1e6:.3f}",
                    f"{r.check:.3f}", _shares_text(r.time_shares), _shares_text(r.instruction_shares), f"{r.core_ms:.4f}"])
    return buf.getvalue()


def read_csv(text: str) -> list[Row]:
    out = []
    for d in csv.DictReader(io.StringIO(text)):
        missing = [c for c in COLUMNS if c not in d]
        if missing:
            raise ValueError(f"{CSV_NAME} lacks the column {missing[0]}")
        out.append(Row(d["engine"], d["phase"], int(d["context"]), float(d["instructions"]), float(d["ms_modeled"]),
                       float(d["non_matmul_share"]) if d["non_matmul_share"] else None, float(d["dram_mb"]) * 1e6,
                       float(d["check_of_tolerance"]), _shares_of(d["op_time_shares"]),
                       _shares_of(d["op_instruction_shares"]), float(d["core_ms_modeled"])))
    return out


ORDER = (*pn.ENGINES, LLAMA)


def _sorted(rows: list[Row]) -> list[Row]:
    return sorted(rows, key=lambda r: (r.phase != "decode", r.context, ORDER.index(r.engine) if r.engine in ORDER else 9))


def _top_shares(shares: dict[str, float], n: int = 4) -> str:
    short = {"SkipSimplifiedLayerNormalization": "SkipRMSNorm", "SimplifiedLayerNormalization": "RMSNorm",
             "GroupQueryAttention": "GQA", "GatherBlockQuantized": "embed"}
    return " ".join(f"{short.get(k, k)} {v:.1%}" for k, v in list(shares.items())[:n])


def table(rows: list[Row]) -> str:
    head = ["phase", "context", "engine", "G instr", "ms MODELED", "tok/s MODELED", "core ms (DRAM ignored)",
            "non-MatMulNBits", "DRAM MB", "largest shares of modeled time"]
    body = []
    for r in _sorted(rows):
        shares = r.time_shares or r.instruction_shares
        body.append([r.phase, str(r.context), r.engine, f"{r.instructions / 1e9:.3f}", f"{r.ms_modeled:.2f}",
                     f"{r.tokens_per_s:.1f}", f"{r.core_ms:.2f}",
                     "-" if r.non_matmul_share is None else f"{r.non_matmul_share:.1%}",
                     f"{r.dram_bytes / 1e6:.1f}", _top_shares(shares)])
    return format_table(head, body, right={1, 3, 4, 5, 6, 7, 8})


def _find(rows: list[Row], engine: str, phase: str, context: int) -> Row | None:
    return next((r for r in rows if (r.engine, r.phase, r.context) == (engine, phase, context)), None)


def headline(rows: list[Row], llama_whole: list[Row] = ()) -> str:
    """The ratios of modeled time: ORT+imegen's decoder engine against stock, against matmul-only, and against
    llama.cpp (node by node; `llama_whole`: its whole-call rows, shown beside); the non-MatMulNBits share at
    decode 512."""
    lines = []
    for phase, context in ((p.kind, p.context) for p in pn.PHASES):
        stock, mm, dec = (_find(rows, e, phase, context) for e in (pn.STOCK, pn.MATMUL, pn.DECODER))
        llama = _find(rows, LLAMA, phase, context)
        if not (dec and stock and mm):
            continue
        parts = [f"{stock.ms_modeled / dec.ms_modeled:.1f}x faster than stock-ort",
                 f"{mm.ms_modeled / dec.ms_modeled:.2f}x vs ort-imegen-matmul"]
        if llama:
            parts.append(f"{dec.ms_modeled / llama.ms_modeled:.2f}x llama.cpp's time ({dec.core_ms / llama.core_ms:.2f}x "
                         "its core-side time, DRAM ignored on both sides)")
        whole = _find(list(llama_whole), LLAMA, phase, context)
        if llama and whole:
            parts.append(f"llama.cpp {llama.ms_modeled:.2f} ms node by node, {whole.ms_modeled:.2f} ms as one whole-call "
                         f"region (the ratio {dec.ms_modeled / whole.ms_modeled:.2f}x)")
        lines.append(f"  {phase} {context}: ort-imegen-decoder {dec.ms_modeled:.2f} ms, " + ", ".join(parts))
    shares = [f"{e} {r.non_matmul_share:.1%}" for e in ORDER
              if (r := _find(rows, e, "decode", 512)) and r.non_matmul_share is not None]
    if shares:
        lines.append("  non-MatMulNBits share of the modeled time at decode 512: " + ", ".join(shares))
    return "\n".join(["Headline (all MODELED):", *lines]) if lines else ""


def category_table(accounts: list[pn.Account], phase: pn.Phase) -> str:
    """Per category of node, each engine's instructions and modeled ms at `phase` (multiplicities included)."""
    mine = {a.engine: a for a in accounts if a.phase == phase}
    engines = [e for e in pn.ENGINES if e in mine]
    cats: dict[str, None] = {}
    for e in engines:
        cats.update(dict.fromkeys(mine[e].time_shares()))
    head = ["node", *(f"{e} {what}" for e in engines for what in ("M instr", "ms"))]
    body = []
    for c in cats:
        cells = []
        for e in engines:
            nodes = [n for n in mine[e].nodes if n.category == c]
            cells += [f"{sum(n.multiplicity * n.instructions for n in nodes) / 1e6:.2f}" if nodes else "-",
                      f"{sum(n.multiplicity * n.seconds for n in nodes) * 1e3:.3f}" if nodes else "-"]
        body.append([c, *cells])
    body.append(["total", *(x for e in engines for x in (f"{mine[e].instructions / 1e6:.2f}",
                                                          f"{mine[e].seconds * 1e3:.3f}"))])
    return format_table(head, body)


def method_text(version: str = "1.23", llama_present: bool = False) -> str:
    m = QWEN25_05B
    return (
        f"WHOLE MODEL, node by node: onnxruntime-genai's export form of {m.name} (imegen/ort/genai_form.py, "
        f"`imegen qwen-model`: hidden {m.hidden}, {m.heads}/{m.kv_heads} heads of {m.head_dim}, FFN {m.intermediate}, "
        f"{m.layers} layers, vocab {m.vocab}, int4 block 32 symmetric, accuracy_level 4, tied embedding: "
        "GatherBlockQuantized + MatMulNBits lm_head; per layer fused qkv MatMulNBits + bias Add, GroupQueryAttention "
        "with rotary inside and BNSH past/present in onnxruntime-genai's shared buffer (its CPU export sets "
        "past_present_share_buffer: genai passes each layer's max-length past buffer as the pre-allocated present "
        "too, so the operator, stock or imegen's, writes the new tokens' K/V rows into it and copies no past), o_proj, "
        "two (Skip)SimplifiedLayerNormalization, gate/up, SiLU as "
        "Sigmoid-Mul-Mul, down; the attention-mask subgraph) in three engines: stock-ort (Debian's riscv64 "
        f"onnxruntime {version}), ort-imegen-matmul (MatMulNBits on imegen's custom-op library with the kernels "
        "`imegen ort-accelerate --matmul-only` derives, the rest stock), ort-imegen-decoder (also RMSNorms and "
        "GroupQueryAttention on imegen's RVV operators, and the SiLU gate inside the up projection's MatMulNBits: "
        "`imegen ort-accelerate`). Phases: decode = 1 new token after "
        "128 or 512 cached positions; prefill = 128 or 512 tokens from an empty cache, the lm_head computing the last "
        "position's logits only (M = 1, as llama.cpp does; ORT's graph would compute every position's). "
        "ENUMERATION: the graph's nodes are grouped as ORT runs them after its optimizer (its MatMulNBitsFusion folds the "
        "qkv bias Add into a com.microsoft MatMulNBits, not into one in imegen's domain, where the Add stays a node; "
        "its QuickGeluFusion makes Sigmoid+Mul one node, so the SiLU gate is one unit in stock ORT and the matmul-only "
        "engine; ort-imegen-decoder folds it into the up projection's MatMulNBits, whose kernel applies the SiLU to "
        "each block of C it finishes while the block is in cache, so there the four nodes are one MatMulNBits unit; "
        "Constant nodes "
        "and the embedding's Reshape of the lm_head weights are folded at session creation), enumerated on a "
        f"{pn.ENUMERATED_LAYERS}-layer model of the full sizes (layer 0 once, the other layer's nodes x {m.layers - 1}); "
        "distinct nodes (ops, attributes, input shapes) are counted once with their multiplicity. "
        "COUNTS MEASURED: each distinct node as a single-node model (its real initializers: the form's seeded random "
        "weights quantized by imegen.reference's bit-exact port of ORT's MatMulNBitsQuantizer; the rotary caches; "
        "seeded random activations and KV cache, the real attention-mask values; GroupQueryAttention's presents "
        "pre-allocated in its past buffers of past + new positions, as genai runs it, shared_runs.py: the work does "
        "not depend on the buffer's length beyond the valid rows) run in ORT under QEMU with 1 "
        "intra-op thread (run_counts.py: per-Run instructions after a warm-up Run, libonnxruntime and every library "
        "it calls, imegen's library for the imegen engines, the IME emulator excluded, each vmadot counted once); "
        "an imegen node's outputs agree with the same node's in stock ORT (MatMulNBits: ORT's level-4 tolerance, "
        f"int8 vs stock's fp32; decoder operators: |diff| <= {pn.DECODER_RTOL:g} x (1 + max |stock|)) before its "
        "count is used ('check': the worst, as a fraction of its tolerance). Both imegen engines' MatMulNBits run the "
        "same kernels (ort-accelerate derives one kernel spec with or without --matmul-only), so they are counted "
        "once, in the matmul-only engine's library (the gated up projection is a distinct node of its own). Every count is direct (none scaled in M). The bench's "
        "single-node MatMulNBits rows (ort.csv) are not reused: they are asymmetric at the bench's separate q/k/v "
        "shapes, this form's nodes symmetric with a fused qkv (N = 1152). A node's own work = its per-Run count "
        "minus that of a trivial one-node model (Neg of one float, counted the same way: ORT's Run overhead), class "
        "by class; the graph's own one Run overhead is added once ('ORT Run'). "
        "TIME MODELED (imegen/perf/model/x60.py) per node: max(core cycles of its counts split evenly over the cores "
        "it runs on / 2 GHz, DRAM bytes / 5.24 GB/s), summed with multiplicities; ms per token for decode, per prefill "
        "for prefill. ASSUMPTIONS, cores a node runs on = min(4, its parallel tasks): MatMulNBits 4 (MLAS's and "
        "imegen's 4 slices); imegen's GroupQueryAttention its tiles of the query rows sharing a KV head (KV heads x "
        "ceil(group x new tokens / the attention kernel's rows): 2 at decode), ORT's batch x heads (14); norms, SiLU gate, bias Add and embedding their rows (1 at decode); the "
        "attention-mask integer ops and the Run overhead 1. DRAM bytes: MatMulNBits its weights as stored (ORT's "
        "format for stock: int4 codes + fp32 scales; imegen: its kernel's traffic, x60.dram_traffic: the packed "
        "weights x60.packed_b_bytes once per M block, A, A's workspace, C, a gated one's gate read once) + A and C; "
        "GroupQueryAttention the "
        "cached K/V rows read and the new tokens' K/V rows written (the shared buffer: no copy of the past) + "
        "q/k/v in and output out; other nodes their activations in and out and the constants they read (the "
        "embedding its gathered rows, the rotary caches the positions used). Every tensor is taken from DRAM: at "
        "decode the small activations would sit in cache, so DRAM time is a little pessimistic there. "
        "'core ms (DRAM ignored)': the same counts' core-side time alone, node by node over its cores."
        + (" LLAMA.CPP rows, node by node the same way (imegen/perf/baselines/llama_cpp/whole_model.py and "
           "whole_nodes.py): llama.cpp with the SpacemiT IME1 backend (Q4_0 weights, f16 KV cache, flash attention) "
           "runs the whole model under QEMU with 1 thread; its graph-eval callback (llama_context_params.cb_eval, "
           "called by ggml's scheduler before and after each node it is asked to observe) cuts every llama_decode "
           "into one counted region per ggml node, with the node's tensors named on the driver's output. Observing "
           "makes ggml compute each node as a graph of its own: the logits stay bit-identical (checked), but each "
           "node then pays a graph launch (plan, a disposable thread pool, the scheduler's loop) that the unobserved "
           "call pays once; that cost (about 7,500 instructions per node, all of it scalar code of ggml's, measured "
           "as the per-node run's total minus the same call counted as one region by the same executable) is shared "
           "evenly among the nodes and taken off, so the nodes plus the call's own work add up to the whole-call "
           "count exactly (its spread from node to node, a few hundred instructions, stays in the split). RMS_NORM "
           "is observed together with the MUL after it, which ggml-cpu fuses with it. Layers as before, 1 and 2 "
           "layers counted: the 2-layer graph's extra layer x 23, the other nodes as the 1-layer graph counts them, "
           "and 23 x what those count more in the 2-layer run (the observation's mean shared out differently, a few "
           "hundred instructions a node) with the call's own work: exact in sum. Per node, as for ORT's: time = "
           "max(its core time over the cores it runs on, DRAM bytes / 5.24 GB/s); cores = min(4, ggml's split: "
           "MUL_MAT and FLASH_ATTN_EXT 4, other ops their rows, so 1 at decode for norms, adds, SWIGLU, row "
           "gathers and the KV writes, 4 for ROPE); DRAM = its input and output tensors as stored (weights Q4_0, 18 "
           "bytes per 32; activations f32; KV f16), the embedding's GET_ROWS the gathered rows, SET_ROWS the new "
           "K/V rows written, FLASH_ATTN_EXT the K/V cells its mask lets some query attend (what it reads) and the "
           "mask. The call's own work (graph building or reuse, inputs, scheduling, logits: 'llama.cpp call') on "
           "one core, no DRAM, as ORT's Run overhead. Its op table names ggml's ops. What still differs: an "
           "imegen MatMulNBits is charged its kernel's own traffic (packed weights once per M block, A's "
           "workspace), a llama.cpp MUL_MAT only its weights, input and output (not the 8-bit copy of the input "
           "ggml quantizes into its work buffer); every tensor is taken from DRAM on both sides. The whole-call "
           "figures (one region per llama_decode: max(all core time / 4, (Q4_0 weights + f16 KV) / bandwidth), "
           "activations not charged) stay in llama_whole_model.json as whole_call_modeled_x60_ms and in the "
           "headline beside the per-node ones."
           if llama_present else "")
    )


def llama_op_table(r: dict) -> str:
    """llama.cpp's per-node account of one row by op (multiplicities included), as its JSON row has it."""
    head = ["op", "nodes", "M instr", "DRAM MB", "threads", "ms MODELED", "core ms (DRAM ignored)"]
    body = [[o["op"], str(o["nodes"]), f"{o['instructions'] / 1e6:.2f}", f"{o['dram_bytes'] / 1e6:.1f}",
             "1" if o["op"] == LLAMA_CALL else "per node", f"{o['ms']:.3f}", f"{o['core_ms']:.3f}"]
            for o in r["per_node"]["by_op"]]
    p = r["per_node"]
    body.append(["total", str(p["nodes"]), f"{p['instructions'] / 1e6:.2f}", f"{p['dram_bytes'] / 1e6:.1f}", "",
                 f"{p['ms_modeled']:.3f}", f"{p['core_ms_modeled']:.3f}"])
    return format_table(head, body, right={1, 2, 3, 5, 6})


def report_text(rows: list[Row], version: str = "1.23", accounts: list[pn.Account] = (),
                llama_json: list[dict] = ()) -> str:
    """The method, the table, the headline and (given the accounts) the split by node at the 512 contexts; given
    llama.cpp's JSON rows, its split by op there and its whole-call figures beside the per-node ones."""
    llama = any(r.engine == LLAMA for r in rows)
    per_node = [r for r in llama_json if "per_node" in r]
    parts = [method_text(version, llama), "Whole model per node: instructions MEASURED, times MODELED:", table(rows)]
    head = headline(rows, [whole_call_row(r) for r in per_node])
    if head:
        parts.append(head)
    for phase in (p for p in pn.PHASES if p.context == max(pn.CONTEXTS)):
        if any(a.phase == phase for a in accounts):
            parts += [f"By node, {phase.label} (instructions MEASURED, ms MODELED, multiplicities included):",
                      category_table(list(accounts), phase)]
        r = next((r for r in per_node if (r["phase"], int(r["context"])) == (phase.kind, phase.context)), None)
        if r:
            parts += [f"llama.cpp by op, {phase.label} (instructions MEASURED, ms MODELED, multiplicities included):",
                      llama_op_table(r)]
    return "\n".join(parts)


def text_from_results(results_dir: Path) -> str:
    """The whole-model report `imegen bench` prints: the results folder's whole_model.txt (written with the
    account by `python3 -m imegen.perf.report.whole_model`; the account takes an hour and more of QEMU uncached),
    or '' without it."""
    path = Path(results_dir) / TEXT_NAME
    return path.read_text().rstrip("\n") if path.exists() else ""


def rows_of(accounts: list[pn.Account], results_dir: Path) -> list[Row]:
    return [row_of(a) for a in accounts] + llama_rows(Path(results_dir) / LLAMA_JSON)


def write_outputs(rows: list[Row], out_dir: Path, version: str = "1.23", accounts: list[pn.Account] = (),
                  llama_json: list[dict] = ()) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / CSV_NAME).write_text(write_csv(_sorted(rows)))
    (out_dir / TEXT_NAME).write_text(report_text(rows, version, accounts, llama_json) + "\n")
    return [out_dir / CSV_NAME, out_dir / TEXT_NAME]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m imegen.perf.report.whole_model",
                                     description="Count the genai-form Qwen2.5-0.5B node by node in three ORT engines "
                                                 "(cached; hours of QEMU uncached) and write whole_model.csv/.txt.")
    parser.add_argument("--out", type=Path, default=Path("bench/results"), help="results folder (bench/results)")
    args = parser.parse_args(argv)

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    try:
        with pn.setup(log=log) as s:
            accounts = pn.accounts(s, log=log)
    except (RuntimeError, OSError, ValueError) as e:
        print(f"error: {str(e).splitlines()[0] if str(e) else e}", file=sys.stderr)
        return 1
    rows = rows_of(accounts, args.out)
    for p in write_outputs(rows, args.out, accounts[0].version or "1.23", accounts,
                           llama_json_rows(Path(args.out) / LLAMA_JSON)):
        print(p)
    return 0


if __name__ == "__main__":
    sys.exit(main())
