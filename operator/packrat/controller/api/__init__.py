"""Kubernetes I/O: the API client, ownership checks, drift between what we set and what is there."""
