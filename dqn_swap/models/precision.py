"""Mixed precision for generated networks: a forward pass under ``torch.autocast`` in bfloat16.

Automatic mixed precision (Micikevicius et al., "Mixed Precision Training", ICLR 2018, in
bfloat16 instead of float16 with loss scaling): weights, gradients and optimizer state stay
in float32; the ops autocast lists (matrix products, convolutions) run in bfloat16, so
their outputs -- most saved activations -- take half the bytes.  Autocast acts on the
device type of the tensors; ``meta`` tensors have none it covers (their ops keep float32),
so a network under :class:`Autocast` records on ``cpu`` (:attr:`NetworkSpec.record_device
<dqn_swap.models.generator.NetworkSpec.record_device>`).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


class Autocast(nn.Module):
    """``model``'s forward under ``torch.autocast(device_type of the first tensor input, torch.bfloat16)``."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, *args: Any) -> Any:
        device = next((a.device.type for a in args if isinstance(a, torch.Tensor)), "cpu")
        if device == "meta":
            raise ValueError("bfloat16 autocast does not act on meta tensors: record this network on cpu "
                             "(dqn_swap.models.corpus.record_spec does)")
        with torch.autocast(device_type=device, dtype=torch.bfloat16):
            return self.model(*args)


__all__ = ["Autocast"]
