"""What `imegen bench` writes: the tuner's outputs, bench.txt, bench.csv, floors.txt, ort.csv and bench.png."""

from __future__ import annotations

import csv
import io
from pathlib import Path

from ..bench import BenchResult
from ..model import floors, x60
from ..search import tune
from . import onnxruntime
from .plot import plot


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
