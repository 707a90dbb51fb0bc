"""Real riscv64 onnxruntime (Debian's build) under QEMU as a baseline: per-Run instruction counts of a
model (run_counts, ort_bench_runner.c), single MatMulNBits nodes of the bench's shapes in stock ORT and
in ORT + imegen's custom-op library (nodes), GroupQueryAttention as a single node (gqa), and onnxruntime-genai's
export form of the whole Qwen model node by node in three engines (per_node)."""
