"""Per-Run counts of real riscv64 onnxruntime (imegen/perf/baselines/onnxruntime/run_counts.py)."""

import numpy as np
import pytest

from imegen.perf.baselines.onnxruntime import nodes, run_counts
from imegen.perf.count.plugin import plugin_available
from imegen.perf.model import x60
from imegen.perf.workload import Case
from imegen.toolchain import missing_tools

pytestmark = pytest.mark.skipif(bool(missing_tools()) or not plugin_available(),
                                reason="needs the cross toolchain, QEMU and the counting plugin")

M, N, K = 1, 256, 512


def _total(c):
    return sum(x60.class_totals(c).values())


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    d = tmp_path_factory.mktemp("node")
    return nodes.node_model(d, M, N, K)


@pytest.fixture(scope="module")
def counted(node):
    model, feeds, wanted, check = node
    one = run_counts.count_runs(model, feeds, wanted, runs=1)
    three = run_counts.count_runs(model, feeds, wanted, runs=3)
    return one, three, check


def test_output_matches_numpy_before_counting(counted):
    one, three, check = counted
    assert check(one.outputs)["worst"] <= 1.0
    np.testing.assert_array_equal(one.outputs["Y"], three.outputs["Y"])


def test_per_run_counts_are_consistent(counted):
    one, three, _ = counted
    assert len(one.runs) == 1 and len(three.runs) == 3
    per = [_total(r) for r in three.runs]
    assert min(per) > 100_000  # a 256 x 512 CompInt8 MatMulNBits retires far more than this
    assert max(per) / min(per) < 1.01
    assert abs(sum(per) / (3 * _total(one.runs[0])) - 1) < 0.01
    # Everything is ORT's own work: libonnxruntime (kernel) and the libraries it calls (callee);
    # the runner's code between the markers is only the call.
    for r in three.runs:
        assert sum(x60.class_totals(r, tags=("excluded",)).values()) < 100
        assert sum(x60.class_totals(r, tags=("outside",)).values()) == 0
        assert sum(x60.class_totals(r, tags=("kernel",)).values()) > 0.9 * _total(r)


def test_session_creation_is_not_in_the_per_run_figure(counted):
    one, three, _ = counted
    whole = _total(one.total)
    creation = whole - _total(one.runs[0])
    # Creating the session (schema registration, model load, prepacking) and the warm-up Run dwarf
    # one Run; had any of it reached the first region, that Run would stand out from the other two.
    assert creation > 20 * _total(one.runs[0])
    assert _total(three.runs[0]) / _total(three.runs[1]) < 1.01
    # The extra Runs of the 3-Run process are exactly what its whole-process count adds.
    extra = _total(three.total) - whole
    assert abs(extra / (2 * _total(one.runs[0])) - 1) < 0.05


def test_four_threads_are_counted_exactly(node):
    model, feeds, wanted, _ = node
    a = run_counts.count_runs(model, feeds, wanted, runs=2, threads=4)
    b = run_counts.count_runs(model, feeds, wanted, runs=2, threads=4)
    one = run_counts.count_runs(model, feeds, wanted, runs=1, threads=1)
    if not run_counts.serialized_threads_exact():
        pytest.skip("SCHED_FIFO not permitted here: multi-thread counts are approximate")
    assert [_total(r) for r in a.runs[1:]] == [_total(r) for r in b.runs[1:]]  # repeatable
    # The same work split over threads: the sum is the 1-thread count plus the pool's bookkeeping.
    assert 0.98 < _total(a.runs[1]) / _total(one.runs[0]) < 1.2


def test_chosen_cases_keep_the_lm_head_at_decode_only():
    cases = [Case("lm_head", m, 151936, 896, 32) for m in (1, 128)] + [Case("q/o", 128, 896, 896, 64)]
    assert nodes.chosen_cases(cases, quick=False) == [cases[0], cases[2]]


def test_stock_riscv64_ort_computes_level_4_in_fp32(counted):
    """What the stock baseline is: Debian's riscv64 MLAS has no int8 path, so accuracy_level 4 runs the
    fp32 dequantize-and-multiply path (exact to fp32 rounding), not CompInt8 (~1e-2 off here)."""
    from imegen import reference as ref
    from imegen.ort import ort_check

    rng = np.random.default_rng([nodes.SEED, M, N, K, nodes.BLOCK])
    W = (0.02 * rng.standard_normal((K, N), dtype=np.float32)).astype(np.float32)
    qw = ort_check.ort_quantized_weights(W, 4, nodes.BLOCK, symmetric=False)
    A = rng.standard_normal((M, K), dtype=np.float32)
    Y = counted[0].outputs["Y"].astype(np.float64)
    assert np.abs(Y - ref.matmul_nbits(A, qw)).max() < 1e-5
    assert np.abs(Y - ref.matmul_nbits_int8(A, qw)[0]).max() > 1e-4
