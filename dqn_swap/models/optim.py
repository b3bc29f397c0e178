"""The optimizers the workloads train with.

SGD (lr 0.1, momentum 0.9) for vision networks, Adam (lr 1e-3) for language models;
``foreach=False`` keeps the per-parameter update ops, which also run on ``meta``.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn


def sgd_momentum(params: Iterable[nn.Parameter]) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=0.1, momentum=0.9, foreach=False)


def adam(params: Iterable[nn.Parameter]) -> torch.optim.Optimizer:
    return torch.optim.Adam(params, lr=1e-3, foreach=False)


__all__ = ["adam", "sgd_momentum"]
