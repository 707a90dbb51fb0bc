"""What imegen's kernels are compared with: kernels written in imegen's DSL in a baseline's layout (dsl),
llama.cpp's real IME kernels (llama_cpp), and real riscv64 onnxruntime, stock and with imegen's
custom-op library (onnxruntime)."""
