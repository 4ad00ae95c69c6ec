"""The tiny test model of :mod:`packrat.runtime.zoo`: fast enough for tests, real enough to pin."""

from __future__ import annotations

from torch import Tensor, nn


class Tiny(nn.Module):
    """A three-layer MLP, (B, 16) -> (B, 4): fast enough for tests, real enough to pin."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4)
        )

    def forward(self, x: Tensor) -> Tensor:
        out: Tensor = self.net(x)
        return out
