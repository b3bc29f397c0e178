"""The recorder's vocabulary: its error, the forms of a loss and an optimizer it takes, and what an
op's arguments hold (tensors, storage slots, arguments mutated in place, the bytes a collective
moves)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch.utils._pytree import tree_flatten

from ..errors import DqnSwapRuntimeError



LossFn = Callable[[Any], torch.Tensor]
OptimizerArg = torch.optim.Optimizer | Callable[[Iterable[torch.nn.Parameter]], torch.optim.Optimizer] | None

# The CUDA caching allocator hands out blocks in multiples of 512 bytes.
_CUDA_BLOCK = 512


class RecordingError(DqnSwapRuntimeError):
    """The model could not be recorded; the message says which op or step failed."""


def _tensors(tree: Any) -> list[torch.Tensor]:
    return [x for x in tree_flatten(tree)[0] if isinstance(x, torch.Tensor)]


# Backward ops that make a zero-filled tensor a formula then fills (:meth:`.in_place.InPlaceRewrites.fill_in_place`).
_ZERO_FILL = frozenset({"aten.new_zeros", "aten.zeros", "aten.zeros_like"})

# Bytes of the tensor PyTorch wraps a Python number in (``wrapped_scalar_tensor``: bool, int64,
# double, complex double) when it is given where an op's schema wants a Tensor.
_WRAPPED_BYTES = {bool: 1, int: 8, float: 8, complex: 16}


def _tensor_slots(func: torch._ops.OpOverload) -> tuple[int, ...]:
    """Positions of the schema arguments typed ``Tensor`` (or ``Tensor?``)."""
    out = []
    for i, a in enumerate(func._schema.arguments):
        t = a.type
        if isinstance(t, torch._C.OptionalType):
            t = t.getElementType()
        if isinstance(t, torch._C.TensorType):
            out.append(i)
    return tuple(out)


def _mutated_args(func: torch._ops.OpOverload) -> tuple[int, ...]:
    """Positions of the schema arguments an op writes in place (``Tensor(a!)``)."""
    return tuple(i for i, a in enumerate(func._schema.arguments)
                 if a.alias_info is not None and a.alias_info.is_write)


# c10d collectives (FSDP2's all-gathers and reduce-scatters, DDP's all-reduces) by the bytes one rank
# sends in the ring algorithm, per byte of the largest buffer: (w - 1) / w times this factor.
_COLLECTIVES = {
    "_allgather_base_": 1.0, "allgather_": 1.0, "allgather_into_tensor_coalesced_": 1.0,
    "allgather_coalesced_": 1.0, "_reduce_scatter_base_": 1.0, "reduce_scatter_": 1.0,
    "reduce_scatter_tensor_coalesced_": 1.0, "allreduce_": 2.0, "allreduce_coalesced_": 2.0,
    "broadcast_": None, "alltoall_base_": 1.0, "alltoall_": 1.0,
}


def _world_size(args: tuple) -> int:
    """The size of the process group a c10d op was given (the default group's if it cannot say)."""
    for a in args:
        size = getattr(a, "size", None)
        if callable(size) and not isinstance(a, torch.Tensor):
            try:
                n = size()
            except Exception:  # noqa: BLE001 - not a process group after all
                continue
            if isinstance(n, int) and n > 0:
                return n
    import torch.distributed as dist

    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def _wire_bytes(name: str, args: tuple, inputs: list[torch.Tensor], outputs: list[torch.Tensor]) -> float:
    """Bytes one rank sends in collective ``name`` (:data:`_COLLECTIVES`): for an all-gather or a
    reduce-scatter of a ``B``-byte buffer (the larger side) over ``w`` ranks ``B (w - 1) / w``, for
    an all-reduce twice that, for a broadcast ``B``."""
    tensors = [*inputs, *outputs]
    if not tensors:
        return 0.0
    if name.startswith("allreduce") or name.startswith("alltoall"):
        total = sum(t.numel() * t.element_size() for t in {id(t): t for t in inputs}.values())
    else:
        total = max(t.numel() * t.element_size() for t in tensors)
    factor = _COLLECTIVES[name]
    if factor is None:
        return float(total)
    w = _world_size(args)
    return factor * total * (w - 1) / w
