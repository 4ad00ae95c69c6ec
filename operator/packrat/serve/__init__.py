"""Run one serving pod from a plan: TorchServe with pinned thin instances behind a dispatcher.

- :mod:`~packrat.serve.config`: pure decisions (plan -> instances and core sets, TorchServe's
  loopback-only settings, registrations, the status document).
- :mod:`~packrat.serve.routing`: which instance takes the next request (pure).
- :mod:`~packrat.serve.archive` / :mod:`~packrat.serve.handler` / :mod:`~packrat.serve.codec`:
  model archives whose workers pin themselves before loading, the worker-side handler (native
  or wrapping a user's), the request wire format.
- :mod:`~packrat.serve.torchserve`: one isolated TorchServe process.
- :mod:`~packrat.serve.dispatcher` / :mod:`~packrat.serve.metrics`: the public port, with
  :mod:`~packrat.serve.slots` (the bounded queue in front of the instances),
  :mod:`~packrat.serve.connections` (connection cap, head deadlines, refused bodies left
  unread), :mod:`~packrat.serve.upstream` (the pooled session to TorchServe, what is
  proxied), :mod:`~packrat.serve.endpoints` (``/ping``, ``/healthz``, ``/metrics``,
  ``/status``, ``/arrivals``), :mod:`~packrat.serve.sampler` (the batch-size estimator's
  sampling loop) and :mod:`~packrat.serve.swap` (old instance sets finishing after an
  in-pod switch); the limits are documented in ``docs/serving.md``.
- :mod:`~packrat.serve.server`: ``packrat serve`` end to end (readiness, restarts, drain),
  with :mod:`~packrat.serve.health` (instance checks, warm-up, the monitor).
- :mod:`~packrat.serve.loadgen`: closed-loop load (the benchmarks live in :mod:`packrat.bench`).
"""
