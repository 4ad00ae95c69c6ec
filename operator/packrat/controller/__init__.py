"""The Kubernetes operator: pure manifest builders, thin kopf handlers, Kubernetes I/O."""
