"""The C ABIs generated code presents: imegen's own (imegen.abi.imegen: the status codes every kernel
returns) and ONNX Runtime's MLAS QNBitGemm dispatch (imegen.abi.mlas: its entry points per ORT version
and the planning of a spec's dispatch; imegen.abi.mlas_check: running a dispatch the way MLAS does).
Code generation (render, check) depends on these; imegen.ort, the ORT-facing tooling, builds on them."""
