"""The profile: the profiling Job's builders, reusing or running it, its progress, isolation and
measured speedup."""
