"""ONNX Runtime-facing modules: the custom-op library, model rewriting and checking, ORT source trees, and
conformance against onnxruntime itself (ort_check). The MLAS ABI code generation needs is in imegen.abi."""
