"""Measure a model's latency profile L(t, b) on pinned cores, and Packrat's microbenchmark."""
