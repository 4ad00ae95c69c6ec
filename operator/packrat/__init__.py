"""Packrat operator: serve PyTorch models on CPU nodes with optimal thin-instance plans.

Layers (imports only go down, enforced by import-linter):
``cli`` > ``controller`` > ``profiler`` | ``serve`` > ``runtime`` > ``plan``.
"""

__version__ = "0.1.0"
