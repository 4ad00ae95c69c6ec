"""The GPU tier's pure plans: per-layer placement (DeepPlan) and the two-stream schedule."""
