"""`imegen tune --attention`: its candidates, its task and time model, and one counted cell against stock ORT's
GroupQueryAttention in riscv64 ORT 1.23 under QEMU (the full search runs in `imegen tune --attention`)."""

import json

import pytest

from imegen import toolchain
from imegen.ir import attention_specs_from_text, specs_from_text
from imegen.perf.baselines.onnxruntime.gqa import GqaShape
from imegen.perf.count.plugin import plugin_available
from imegen.perf.search import attention as tune

needs_counts = pytest.mark.skipif(bool(toolchain.missing_tools()) or not plugin_available(),
                                  reason="needs the cross toolchains, qemu-riscv64 and the counting plugin")


def test_candidates_are_every_valid_tile():
    tiles = tune.candidate_tiles()
    assert (4, 16) in tiles and (14, 8) in tiles
    assert (8, 32) not in tiles  # (8 + 4) x LMUL 4 > 32 registers at VLEN 256
    for rows, block in tiles:
        assert attention_specs_from_text(tune.spec_text(rows, block))[0].q_rows == rows


def test_tasks_are_tiles_of_each_kv_heads_rows():
    decode, prefill = GqaShape(seq=1, past=512), GqaShape(seq=128, past=0)
    assert tune.imegen_tasks(decode, 4) == 2 * 2  # 7 rows per KV head: tiles of 4, 3
    assert tune.imegen_tasks(decode, 7) == 2
    assert tune.imegen_tasks(prefill, 8) == 2 * 112


def test_modeled_time_is_the_slower_of_core_and_dram():
    shape = GqaShape(seq=1, past=512)
    tiny = tune.modeled({"kernel.int": 1000}, shape, 4)
    assert tiny.bound == "dram" and tiny.ms_modeled == pytest.approx(1e3 * shape.dram_bytes() / 5.24e9, rel=1e-6)
    heavy = tune.modeled({"kernel.int": 4e9}, shape, 1)
    assert heavy.bound == "core" and heavy.threads == 1


@needs_counts
def test_imegen_attention_counts_below_stock_and_matches_it():
    from imegen.ort.customop import build_library

    shape = GqaShape(seq=1, past=128)
    stock = tune.count(shape, None, ("stock",))
    text = tune.spec_text(4, 16)
    lib = build_library(specs_from_text(tune.LIBRARY_KERNEL), "attention.imegen",
                        attention=attention_specs_from_text(text))
    mine = tune.count(shape, lib, (text,), stock.outputs)  # raises if its outputs are off stock's
    assert mine.check["worst"] <= tune.TOLERANCE
    s, m = (tune.modeled(rc.runs[0], shape, 4) for rc in (stock, mine))
    assert m.instructions < s.instructions / 4  # vectorized vs Debian's scalar rv64gc build


def test_package_table_names_a_valid_tile():
    data = json.loads(tune.PACKAGE_TABLE.read_text())
    rows, block = map(int, data["tile"].split("x"))
    assert (rows, block) in tune.candidate_tiles() and data["vlen"] == tune.VLEN
