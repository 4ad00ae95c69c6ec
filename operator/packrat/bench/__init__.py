"""Benchmarks, a layer above ``profiler`` and ``serve`` (it calls both directly).

- :mod:`~packrat.bench.microbench`: ``packrat bench``, the plan against the baselines on raw
  pinned worker processes;
- :mod:`~packrat.bench.serving`: ``packrat bench --serving``, the same comparison through the
  serving stack (and TorchServe out of the box), with :mod:`~packrat.bench.servers` starting
  and stopping what is measured and :mod:`~packrat.bench.serving_report` summing up the runs.

The baselines (fat, one instance per core) are defined once, in :mod:`packrat.plan.baselines`.
"""
