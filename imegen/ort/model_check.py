"""`imegen ort-model-check`: a user's ONNX model in stock ORT vs ORT + imegen's library.

Both sides are the same real riscv64 onnxruntime (Debian's build) under QEMU (RiscvSession): the
original model, and the model rewritten by imegen.ort.rewrite with the qemu-flavour custom-op
library registered. Inputs are given (.npz) or random from a seed. Each output must agree within
ORT's operator-test tolerance (ort_check.TOLERANCE) of the strictest accuracy level among the moved
nodes (level 4 if any moved node computes in int8, else level 0).
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..ir import KernelSpec
from .customop import build_library, parse_stats
from .ort_check import TOLERANCE, tolerance_text
from .rewrite import NodeDecision, rewrite
from .riscv import DTYPES, RiscvSession

FLOAT_DTYPES = (np.float32, np.float64, np.float16)


@dataclass
class OutputAgreement:
    name: str
    max_abs: float
    worst: float  # max |imegen - stock| / tolerance
    ok: bool


@dataclass
class ModelCheck:
    ort_version: str
    decisions: list[NodeDecision]
    level: int
    outputs: list[OutputAgreement] = field(default_factory=list)
    stats: dict[str, int] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return bool(self.outputs) and all(o.ok for o in self.outputs)

    def report(self) -> str:
        moved = [d for d in self.decisions if d.moved]
        lines = [f"onnxruntime {self.ort_version} (riscv64, under QEMU): stock vs imegen custom ops",
                 f"MatMulNBits nodes: {len(moved)} of {len(self.decisions)} rewritten"]
        lines += [f"  {d}" for d in self.decisions]
        lines.append(f"tolerance (accuracy_level {self.level}): {tolerance_text(self.level)}")
        for o in self.outputs:
            lines.append(f"  {o.name:24s} max |diff| {o.max_abs:.3g}  {o.worst:.3f} of tolerance  "
                         f"{'PASS' if o.ok else 'FAIL'}")
        calls = ", ".join(f"{k} {v}" for k, v in self.stats.items() if k != "vmadots" and v)
        lines.append(f"imegen kernel calls: {calls or 'none'}"
                     + (f"; emulated vmadots {self.stats['vmadots']}" if "vmadots" in self.stats else ""))
        lines.append("PASS" if self.ok else "FAIL")
        return "\n".join(lines)


def random_inputs(model, seed: int = 0, dims: dict[str, int] | None = None) -> dict[str, np.ndarray]:
    """Seeded inputs for the graph's inputs: floats ~ N(0, 0.25), integers in [0, 16); symbolic dims
    from `dims` (default 1; a dim named like a past sequence length may be 0)."""
    rng = np.random.default_rng(seed)
    inits = {t.name for t in model.graph.initializer}
    feeds = {}
    for vi in model.graph.input:
        if vi.name in inits:
            continue
        t = vi.type.tensor_type
        shape = [d.dim_value if d.HasField("dim_value") else (dims or {}).get(d.dim_param, 1) for d in t.shape.dim]
        dtype = DTYPES[t.elem_type]
        if dtype in FLOAT_DTYPES:
            feeds[vi.name] = rng.normal(0, 0.25, shape).astype(dtype)
        else:
            feeds[vi.name] = rng.integers(0, 16, shape).astype(dtype)
    return feeds


def compare_outputs(stock: dict, mine: dict, level: int) -> list[OutputAgreement]:
    a, r = TOLERANCE[level]
    out = []
    for name, y0 in stock.items():
        y1 = mine[name]
        if y0.dtype.type not in FLOAT_DTYPES:
            same = y0.shape == y1.shape and np.array_equal(y0, y1)
            out.append(OutputAgreement(name, 0.0 if same else np.inf, 0.0 if same else np.inf, same))
            continue
        if y0.shape != y1.shape:
            out.append(OutputAgreement(name, np.inf, np.inf, False))
            continue
        y0d, y1d = y0.astype(np.float64), y1.astype(np.float64)
        err = np.abs(y1d - y0d)
        ratio = err / (a + r * np.abs(y0d))
        worst = float(np.nan_to_num(ratio, nan=np.inf).max(initial=0.0))
        out.append(OutputAgreement(name, float(err.max(initial=0.0)), worst, worst <= 1.0))
    return out


def model_check(specs: list[KernelSpec], model_path: str | Path, *, spec_file: str = "<spec>", version: str = "1.23",
                inputs: dict[str, np.ndarray] | None = None, seed: int = 0, dims: dict[str, int] | None = None,
                threads: int = 1) -> ModelCheck:
    import onnx

    model = onnx.load(str(model_path))
    lib = build_library(specs, spec_file, flavour="qemu")
    decisions = rewrite(model, specs)
    feeds = inputs if inputs is not None else random_inputs(model, seed, dims)
    levels = {int(next((a.i for a in n.attribute if a.name == "accuracy_level"), 0))
              for n in model.graph.node if n.domain == "ai.imegen"}
    level = 4 if 4 in levels else 0
    with tempfile.TemporaryDirectory() as tmp:
        rewritten = Path(tmp) / "imegen.onnx"
        onnx.save(model, str(rewritten), save_as_external_data=model.ByteSize() > 1_900_000_000)
        with RiscvSession(model_path, version, threads=threads) as s:
            stock = s.run(feeds)
            ort_version = s.version
        with RiscvSession(rewritten, version, custom_ops=lib, threads=threads) as s:
            mine = s.run(feeds)
            stats = parse_stats(s.stats())
    check = ModelCheck(ort_version, decisions, level, compare_outputs(stock, mine, level), stats)
    return check
