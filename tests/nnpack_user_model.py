"""Small models for the onnxruntime_nnpack backend's tests: a chain with two wide 3x3 layers NNPACK may
compute, and a residual block whose wide layers cannot be cut out alone."""

from __future__ import annotations

import torch
from torch import nn


def chain() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 256, 3, padding=1), nn.ReLU(),
        nn.Conv2d(256, 256, 3, padding=1), nn.ReLU(),  # a candidate
        nn.MaxPool2d(2),
        nn.Conv2d(256, 256, 3, padding=1),  # a candidate without an activation after it
        nn.Conv2d(256, 256, 3, padding=1, stride=2), nn.ReLU(),  # stride 2: not one
        nn.Conv2d(256, 64, 3, padding=1), nn.ReLU(),  # 64 out: too narrow
        nn.AdaptiveAvgPool2d(1), nn.Flatten(1), nn.Linear(64, 10),
    )


chain.input_shape = (3, 12, 12)


class _Residual(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 256, 3, padding=1)
        self.a = nn.Conv2d(256, 256, 3, padding=1)
        self.b = nn.Conv2d(256, 256, 3, padding=1)
        self.head = nn.Linear(256, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.stem(x))
        y = self.b(torch.relu(self.a(x)))
        return self.head(torch.relu(x + y).mean((2, 3)))


def residual() -> nn.Module:
    return _Residual()


residual.input_shape = (3, 8, 8)
