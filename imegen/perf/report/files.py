"""What `imegen bench` writes: the tuner's outputs, bench.txt, bench.csv, floors.txt, ort.csv and bench.png."""

from __future__ import annotations

import csv
import io
from pathlib import Path

from ..bench import BenchResult
from ..model import floors, x60
from ..search import tune
from . import ime2, onnxruntime, whole_model
from .plot import plot


LLAMA_CONFIG = "llama.cpp's own ime1_kernels.cpp, Q4_0 (symmetric int4 block 32, fp16 scales), A as Q8 per 32"
STOCK_CONFIG = "Debian's riscv64 onnxruntime MatMulNBits per Run (4-bit asymmetric, accuracy_level 4; fp32 compute)"


def _baseline_row(case, kind: str, config: str, counts: dict, ms_1core: float, ms_4cores: float) -> list:
    """A bench.csv row of a real baseline (llama.cpp's kernels, stock ORT): its MEASURED counts (one thread) and
    MODELED times; the columns the imegen-built kernels' evaluations alone fill stay empty."""
    cls = x60.class_totals(counts)
    vec_bytes = sum(x60.mem_stat(counts, c, "bytes") for c in ("vload", "vstore", "vlsx"))
    return [case.shape, case.M, case.N, case.K, case.block, kind, config, *(round(cls[c]) for c in x60.CLASSES),
            round(vec_bytes), f"{ms_1core * 1e3:.6f}", "", f"{ms_4cores * 1e3:.6f}", "", "", "", "", "", "", ""]


def baseline_rows(res: BenchResult) -> list[list]:
    """llama.cpp's real kernels (block 32) and stock ORT's MatMulNBits, as the report prints them."""
    rows = []
    for r in res.llama:
        t = r.times()
        rows.append(_baseline_row(r.case, "llama.cpp-real", LLAMA_CONFIG, r.one, t["1"][0], t["4"][0]))
    for r in res.ort:
        if 1 in r.stock and 4 in r.stock:
            rows.append(_baseline_row(r.case, "stock-ort", STOCK_CONFIG, r.stock[1].counts, r.modeled(1)[0],
                                      r.modeled(4)[0]))
    return rows


def write_csv(res: BenchResult) -> str:
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(["shape", "M", "N", "K", "block", "kernel", "config", *x60.CLASSES, "vec_bytes",
                "ms_1core", "bound_1core", "ms_4cores", "bound_4cores", "dram_bytes", "roofline_ms_4cores",
                "x_roofline_4cores", "gops_4cores", "ms_4cores_llvm_occ", "x_roofline_4cores_llvm_occ"])
    for r in res.rows:
        cls = x60.class_totals(r.ev.counts)
        vec_bytes = sum(x60.mem_stat(r.ev.counts, c, "bytes") for c in ("vload", "vstore", "vlsx"))
        one, four = r.ev.one_core, r.ev.four_cores
        w.writerow([r.case.shape, r.case.M, r.case.N, r.case.K, r.case.block, r.kind, r.ev.spec.describe(),
                    *(round(cls[c]) for c in x60.CLASSES), round(vec_bytes), f"{one.time_s * 1e3:.6f}", one.bound,
                    f"{four.time_s * 1e3:.6f}", four.bound, round(four.dram_bytes), f"{four.roofline_s * 1e3:.6f}",
                    f"{four.efficiency:.4f}", f"{four.gops:.3f}",
                    *((f"{r.ev.measured[1].time_s * 1e3:.6f}", f"{r.ev.measured[1].efficiency:.4f}") if r.ev.measured else ("", ""))])
    w.writerows(baseline_rows(res))
    if res.ime2 is not None:
        w.writerows(ime2.bench_csv_rows(res.ime2))
    return buf.getvalue()


def write_outputs(res: BenchResult, out_dir: Path, text: str) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    written = tune.write_outputs(res.tuned, out_dir)
    (out_dir / "bench.txt").write_text(text + "\n")
    (out_dir / "bench.csv").write_text(write_csv(res))
    (out_dir / "floors.txt").write_text(floors.report(out_dir) + "\n")  # static, from the bench.csv just written
    written += [out_dir / "bench.txt", out_dir / "bench.csv", out_dir / "floors.txt"]
    if res.ort:
        (out_dir / "ort.csv").write_text(onnxruntime.nodes_csv(res, list(res.ort)))
        written.append(out_dir / "ort.csv")
    if res.ime2 is not None:
        written += ime2.write_outputs(res.ime2, out_dir)
    if res.whole is not None:
        written += whole_model.write_outputs(res.whole.rows(), out_dir, res.whole.version, list(res.whole.accounts),
                                             list(res.whole.llama))
    png = plot(res, out_dir / "bench.png")
    if png:
        written.append(png)
    return written


def write_spec_outputs(res: BenchResult, out_dir: Path, text: str) -> list[Path]:
    """`bench --spec`: the report and bench.csv (the tuner's files, floors.txt, ort.csv and the plot are the
    tuned kernels')."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "bench.txt").write_text(text + "\n")
    (out_dir / "bench.csv").write_text(write_csv(res))
    return [out_dir / "bench.txt", out_dir / "bench.csv"]
