#!/usr/bin/env bash
# Benchmark imegen's kernels on the Qwen2.5-0.5B MatMulNBits shapes (see README, "Performance"):
# instruction counts under QEMU, X60-modeled times, rvv-fp32 and llama-4x16 baselines, the tuned
# config per shape. Writes bench/results/{bench.txt,bench.csv,bench.png,tuned.imegen,tune.json}.
#   bench/qwen_bench.sh            # everything (a few minutes the first time, then cached)
#   bench/qwen_bench.sh --quick    # the CI subset, into bench/results-quick
set -euo pipefail
cd "$(dirname "$0")/.."
out=bench/results
[ "${1:-}" = "--quick" ] && out=bench/results-quick
exec imegen bench -o "$out" "$@"
