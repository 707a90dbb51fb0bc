"""imegen: a tiling DSL and code generator for quantized MatMulNBits kernels on RISC-V.

Pipeline (one module per stage): parse -> ir -> plan -> render -> toolchain -> verify.
"""

__version__ = "0.1.0"

# The public API (imegen/api.py; README "Python API"). Imported after __version__, which render.py reads.
from .api import (Kernel, NodeDecision, OrtError, RiscvSession, build_kernel, build_ort_library,  # noqa: E402
                  load_spec, parse_stats, rewrite_model, weights)
from .ort.model_check import model_check  # noqa: E402
