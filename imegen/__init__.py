"""imegen: a tiling DSL and code generator for quantized MatMulNBits kernels on RISC-V.

Pipeline (one module per stage): parse -> ir -> plan -> render -> toolchain -> verify.
"""

__version__ = "0.1.0"

# The public API (imegen/api.py; docs/onnxruntime.md "Python API"), imported on first use so that `import imegen`
# stays light and `python3 -m imegen.ort.sysroot` runs without the package having imported it already.
_API = ("Kernel", "NodeDecision", "OrtError", "RiscvSession", "build_kernel", "build_ort_library", "load_attention",
        "load_spec", "parse_stats", "rewrite_model", "weights", "model_check")
__all__ = list(_API)


def __getattr__(name):
    if name == "model_check":
        from .ort.model_check import model_check
        return model_check
    if name in _API:
        from . import api
        return getattr(api, name)
    raise AttributeError(f"module 'imegen' has no attribute {name!r}")
