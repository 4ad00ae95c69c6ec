"""The Open Inference Protocol beyond v2 REST (:mod:`packrat.serve.dispatcher.v2`): over gRPC
(:mod:`.grpc_server`, its messages in :mod:`.messages`, needing the ``grpc`` extra), KServe's
v1 REST (:mod:`.v1`) and the statistics extension's counters (:mod:`.stats`)."""
