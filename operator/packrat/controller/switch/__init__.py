"""Moving traffic to a new configuration: the in-pod switch, the active-passive switch,
fail-over."""
