"""The GPU tier of pools (Ignite on a GPU): staged models, pinned host memory and a device
budget, a copy stream beside the compute stream, direct host access (docs/gpu.md)."""
