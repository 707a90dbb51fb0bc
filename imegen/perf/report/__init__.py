"""`imegen bench`'s outputs from a BenchResult: aligned text tables and config labels (tables), the
per-kernel counts, times and speedups (kernels), per-token figures (tokens), the prefill and scale-
precision goals (goals), the LLVM-occupancy sensitivity (sensitivity), the baselines' own tables
(llama_cpp, onnxruntime), the whole report (text), bench.csv and the output folder (files), the PNG (plot)."""
