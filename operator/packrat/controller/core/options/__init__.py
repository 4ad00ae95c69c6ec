"""Optional features of a PackratModel spec, each validated and typed once for
:class:`packrat.controller.core.model.ModelSpec`: a canary rollout (``spec.canary``) and
request and response logging at the serving pods (``spec.requestLogging``)."""
