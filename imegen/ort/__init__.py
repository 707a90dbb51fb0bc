"""ONNX Runtime-facing modules: MLAS dispatch ABI (mlas_abi), the MLAS-driver check (mlas_check) and
conformance against onnxruntime itself (ort_check)."""
