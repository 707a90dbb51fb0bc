"""The SpacemiT K1 / X60 cost model: instruction counts and bytes to modeled time (x60), LLVM's measured
vector occupancies (occupancy), and the floors any IME register tiling can reach (floors)."""
