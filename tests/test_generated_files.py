"""generated/ holds the example spec's kernels; they must match what the generator emits now."""

from pathlib import Path

from imegen.ir import load_specs
from imegen.plan import plan_kernel
from imegen.render import render_kernel

ROOT = Path(__file__).resolve().parent.parent
SPEC = "examples/qwen_mlp.imegen"


def test_generated_directory_is_up_to_date():
    for spec in load_specs(ROOT / SPEC):
        for name, text in render_kernel(plan_kernel(spec), SPEC).items():
            path = ROOT / "generated" / name
            assert path.exists(), f"{path} missing: run imegen generate {SPEC} -o generated/"
            assert path.read_text() == text, f"{path} is stale: run imegen generate {SPEC} -o generated/"
