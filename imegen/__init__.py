"""imegen: a tiling DSL and code generator for quantized MatMulNBits kernels on RISC-V.

Pipeline (one module per stage): parse -> ir -> plan -> render -> toolchain -> verify.
"""

__version__ = "0.1.0"
