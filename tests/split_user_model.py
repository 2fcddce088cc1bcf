"""A user model given as ``package.module:factory`` with a non-square input (the row-split tests and
the acceptance command: ``autohet run --model tests.split_user_model:tiny --strategy split``)."""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["Tiny", "tiny"]


class Tiny(nn.Module):
    """Convolutions with padding and stride 2, a residual join, ceil_mode pooling, then a classifier."""

    def __init__(self, classes: int = 7) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(inplace=True))
        self.body = nn.Sequential(nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8))
        self.down = nn.Sequential(nn.Conv2d(8, 16, 3, stride=2, padding=1), nn.ReLU(),
                                  nn.MaxPool2d(3, stride=2, ceil_mode=True))
        self.head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        x = torch.relu(self.body(x) + x)
        return self.head(self.down(x))


def tiny() -> nn.Module:
    return Tiny()


tiny.input_shape = (3, 40, 24)  # type: ignore[attr-defined]
