"""Optional features of a PackratModel spec and the platform's policy over it, each validated
and typed once for :class:`packrat.controller.core.model.ModelSpec`: a canary rollout
(``spec.canary``), request and response logging at the serving pods (``spec.requestLogging``),
and the operator's allow-lists for what a model author may pick (``policy``)."""
