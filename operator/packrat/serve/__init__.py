"""Run one serving pod from a plan: TorchServe with pinned thin instances behind a dispatcher.

- :mod:`~packrat.serve.config`: pure decisions (plan -> instances and core sets, TorchServe's
  loopback-only settings, registrations, the status document).
- :mod:`~packrat.serve.dispatcher.routing`: which instance takes the next request (pure).
- :mod:`~packrat.serve.torchserve.archive` / :mod:`~packrat.serve.torchserve.handler` /
:mod:`~packrat.serve.codec`:
  model archives whose workers pin themselves before loading, the worker-side handler (native
  or wrapping a user's), the request wire format.
- :mod:`~packrat.serve.torchserve.process`: one isolated TorchServe
process.
- :mod:`~packrat.serve.dispatcher.app` / :mod:`~packrat.serve.dispatcher.metrics`: the public port,
with
  :mod:`~packrat.serve.dispatcher.slots` (the bounded queue in front of the instances),
  :mod:`~packrat.serve.dispatcher.connections` (connection cap, head deadlines, refused bodies left
  unread), :mod:`~packrat.serve.dispatcher.upstream` (the pooled session to TorchServe, what is
  proxied), :mod:`~packrat.serve.dispatcher.endpoints` (``/ping``, ``/healthz``, ``/metrics``,
  ``/status``, ``/arrivals``), :mod:`~packrat.serve.dispatcher.sampler` (the batch-size estimator's
  sampling loop) and :mod:`~packrat.serve.dispatcher.swap` (old instance sets finishing after an
  in-pod switch); the limits are documented in ``docs/serving.md``.
- :mod:`~packrat.serve.pod.server`: ``packrat serve`` end to end (readiness, restarts, drain),
  with :mod:`~packrat.serve.pod.health` (instance checks, warm-up, the monitor).
- :mod:`~packrat.bench.loadgen`: closed-loop load (the benchmarks live in :mod:`packrat.bench`).
"""
