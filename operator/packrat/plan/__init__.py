"""Pure decision logic: profiles, the exact optimizer, estimators and planners.

Nothing here imports torch, kubernetes or kopf, so every rule is tested exhaustively
without a cluster or a model.
"""
