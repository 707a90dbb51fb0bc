"""bench.csv carries the real baselines the report prints: llama.cpp's own kernels and stock ORT's MatMulNBits
per Run, with their MEASURED class counts and MODELED times (the same functions the report's tables use)."""

import csv
import io

import pytest

from imegen.perf.baselines.llama_cpp.rows import LlamaRow
from imegen.perf.baselines.onnxruntime.nodes import NodeCount, OrtRow
from imegen.perf.bench import BenchResult
from imegen.perf.model import x60
from imegen.perf.report.files import write_csv
from imegen.perf.workload import Case

CASE = Case("q/o", 1, 896, 896, 32)
COUNTS = {"kernel.int": 1_000_000, "kernel.vload": 20_000, "kernel.valu": 50_000, "callee.int": 3_000}


def rows_of(res) -> list[dict]:
    return list(csv.DictReader(io.StringIO(write_csv(res))))


def test_llama_cpp_and_stock_ort_rows():
    llama = LlamaRow(CASE, COUNTS, {k: v / 4 for k, v in COUNTS.items()}, None)
    stock = OrtRow(CASE, {1: NodeCount(COUNTS, [1.0], 0.1, "1.23"), 4: NodeCount(COUNTS, [1.0], 0.1, "1.23")}, None)
    res = BenchResult(rows=[], tuned=None, quick=True, llama=(llama,), ort=(stock,))
    rows = {r["kernel"]: r for r in rows_of(res)}
    assert set(rows) == {"llama.cpp-real", "stock-ort"}
    for kind, row in rows.items():
        assert int(row["int"]) == 1_003_000 and int(row["valu"]) == 50_000  # kernel + callee, by class
        assert (row["shape"], row["M"], row["N"], row["K"], row["block"]) == ("q/o", "1", "896", "896", "32")
    assert float(rows["llama.cpp-real"]["ms_1core"]) == pytest.approx(llama.times()["1"][0] * 1e3, rel=1e-4)
    assert float(rows["stock-ort"]["ms_4cores"]) == pytest.approx(stock.modeled(4)[0] * 1e3, rel=1e-4)
    assert x60.total_instructions(COUNTS) == 1_073_000


def test_no_baselines_no_rows():
    assert rows_of(BenchResult(rows=[], tuned=None, quick=True)) == []
