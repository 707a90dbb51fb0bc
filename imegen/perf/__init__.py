"""Performance tooling behind `imegen bench`, `imegen tune` and `imegen floors`, by job:
  count/      deterministic instruction counts under QEMU (the TCG plugin, a kernel's bench executable,
              reduced runs extrapolated to full shapes, the MLAS calling convention's cost)
  model/      the SpacemiT K1 / X60 cost model (counts and bytes to modeled time, LLVM's measured
              occupancies, the floors of IME register tilings)
  search/     kernel configs through the DSL's validator, their evaluation, the tile-config tuner
  baselines/  what imegen is compared with (DSL baselines, llama.cpp's real kernels, real onnxruntime)
  report/     the bench's tables, text, CSV and plot
workload.py is the Qwen2.5-0.5B workload and its cases, user_kernels.py a user's SPEC for --spec, bench.py
runs a bench; cli.py and arguments.py are the commands' arguments, commands.py runs them."""
