"""One PackratModel's reconcile pass."""
