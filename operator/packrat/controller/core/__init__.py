"""What every pass shares: the typed spec and its defaults, the status, the pass context, the
plan's wire form, metrics."""
