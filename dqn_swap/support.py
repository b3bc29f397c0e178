"""Training setups dqn-swap can record and follow plans in, and the ones it refuses.

A plan is a decision per saved activation of one eager iteration of a model whose
parameters stay on the device.  Two setups break that premise, and both the recorder and
the runtime refuse them with one line instead of failing later with an obscure error:

* **FSDP2** (``torch.distributed.fsdp.fully_shard``): parameters are all-gathered before
  each module and freed after it, inside the iteration, so the memory a plan manages is
  not the trace's; train unsharded, or with ``DistributedDataParallel`` (supported: record
  the unwrapped module, then follow the plan with the DDP-wrapped one);
* **torch.compile**: a compiled graph saves other tensors for backward than the eager
  model does (and the runtime's hooks would silently stop compilation); record and train
  the eager model.
"""

from __future__ import annotations

import torch


def unsupported_reason(model: torch.nn.Module | None) -> str | None:
    """Why ``model`` cannot be recorded or trained under a plan, or None."""
    if model is None:
        return None
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # pragma: no cover - older torch
        FSDPModule = None  # noqa: N806
    from torch._dynamo.eval_frame import OptimizedModule

    for name, m in model.named_modules():
        where = f"module {name!r}" if name else "the model"
        if FSDPModule is not None and isinstance(m, FSDPModule):
            return (f"{where} is sharded with FSDP2 (fully_shard), which gathers and frees parameters inside the "
                    "iteration; dqn-swap plans a model whose parameters stay on the device: train it unsharded, "
                    "or with DistributedDataParallel")
        if isinstance(m, OptimizedModule) or getattr(m, "_compiled_call_impl", None) is not None:
            return (f"{where} is compiled with torch.compile, whose graphs save other tensors for backward than "
                    "the eager model; record and follow the plan with the eager model (drop torch.compile)")
    return None


def under_torch_compile() -> bool:
    """Whether this code runs inside a function compiled with ``torch.compile``: traced by dynamo,
    or run eagerly by it after a graph break (its frame callback is then still installed)."""
    if torch.compiler.is_compiling():
        return True
    try:
        from torch._C._dynamo.eval_frame import get_eval_frame_callback
    except ImportError:  # pragma: no cover - builds without dynamo
        return False
    return get_eval_frame_callback() not in (None, False)


COMPILED_STEP = ("a planned iteration cannot run inside a function compiled with torch.compile (its graphs save "
                 "other tensors for backward than the eager model the trace recorded): compile neither the model "
                 "nor the training step that holds the `with` block")

__all__ = ["COMPILED_STEP", "under_torch_compile", "unsupported_reason"]
