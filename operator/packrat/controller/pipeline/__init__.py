"""One PackratPipeline's reconcile pass: its spec, children, planning and measured latency."""
