"""Deterministic instruction counts under QEMU: the TCG plugin (plugin, insn_count.c), where code lies
in a static executable (image), a kernel's bench executable and its counted runs (measure,
bench_driver.c), reduced runs extrapolated to full shapes (extrapolate), and the MLAS calling
convention's cost (mlas_counts, `imegen bench --mlas`)."""
