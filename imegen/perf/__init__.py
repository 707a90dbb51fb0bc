"""Performance tooling: deterministic instruction counts under QEMU (plugin.py, measure.py), the
SpacemiT X60 cost model (x60.py), the Qwen2.5-0.5B workload (workload.py), the tile-config
autotuner (tune.py) and the benchmark report (bench.py) behind `imegen bench` / `imegen tune`."""
