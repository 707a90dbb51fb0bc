"""Shared by the custom-op library's routing tests (test_serving.py on the K1, test_k3.py on the K3): a model of two
MatMulNBits nodes reading one A, and a run of it in Debian's riscv64 ORT 1.23 under QEMU with the library, on the
harts a test names."""

import os
from contextlib import contextmanager

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from imegen.ort import ort_check as oc
from imegen.ort.riscv import RiscvSession


def two_node_model(rng, nodes: dict[str, int], K: int, *, symmetric: bool):
    """MatMulNBits nodes `nodes` (name -> N) on one A of K columns, ORT-quantized 4-bit block-32 weights
    (zero-point inputs unless `symmetric`), accuracy_level 4, each output a graph output."""
    inits, made, outputs = [], [], []
    for name, N in nodes.items():
        qw = oc.ort_quantized_weights(rng.normal(0, 0.25, (K, N)).astype(np.float32), 4, 32, symmetric)
        inits += [numpy_helper.from_array(qw.data, f"{name}_B"), numpy_helper.from_array(qw.scales, f"{name}_s")]
        inputs = ["A", f"{name}_B", f"{name}_s"]
        if not symmetric:
            inits.append(numpy_helper.from_array(qw.zero_points, f"{name}_z"))
            inputs.append(f"{name}_z")
        made.append(helper.make_node("MatMulNBits", inputs, [f"Y_{name}"], name=name, domain="com.microsoft", K=K,
                                     N=N, bits=4, block_size=32, accuracy_level=4))
        outputs.append(helper.make_tensor_value_info(f"Y_{name}", TensorProto.FLOAT, None))
    graph = helper.make_graph(made, "g", [helper.make_tensor_value_info("A", TensorProto.FLOAT, ["M", K])],
                              outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = 10
    return model


@contextmanager
def on_cpus(cpus: set[int] | None):
    """This process (and what it starts: QEMU, ORT's threads) confined to host CPUs `cpus` (None: unchanged)."""
    saved = os.sched_getaffinity(0)
    try:
        if cpus is not None:
            os.sched_setaffinity(0, cpus)
        yield
    finally:
        os.sched_setaffinity(0, saved)


def run_with_harts(model, lib, feeds, monkeypatch, harts: str | None, *, cpus: set[int] | None = None,
                   vlen: int = 256):
    """Every feed through ORT + the library with IMEGEN_IME_HARTS = harts (None: unset), the QEMU process started
    on `cpus`, 2 intra-op threads; returns (stats text, outputs)."""
    if harts is None:
        monkeypatch.delenv("IMEGEN_IME_HARTS", raising=False)
    else:
        monkeypatch.setenv("IMEGEN_IME_HARTS", harts)
    with on_cpus(cpus), RiscvSession(model, "1.23", custom_ops=lib, threads=2, vlen=vlen) as s:
        outs = [s.run(f) for f in feeds]
        return s.stats(), outs
