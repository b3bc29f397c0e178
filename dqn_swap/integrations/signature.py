"""What makes two steps of a user's loop the same iteration: the structure of the model and the
optimizer, and the shapes of the batch (:func:`signature`; :func:`bucket` rounds sizes up for
``shapes="bucket"``)."""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np
import torch
from torch.utils._pytree import tree_flatten_with_path

from ..trace import Trace


# --------------------------------------------------------------------------- signatures
def bucket(n: int) -> int:
    """The upper end of ``n``'s bucket of sizes: ``n`` up to 8, above it four buckets per doubling
    (9-10, 11-12, ..., 17-20, 21-24, ..., 2049-2560, ...).  A plan is made for the largest size a
    bucket met (``shapes="bucket"``), at most 25 % above the sizes it is followed on."""
    if n <= 8:
        return n
    step = 1 << max(0, (n - 1).bit_length() - 3)
    return -(-n // step) * step


def _describe(x: Any, buckets: bool = False) -> Any:
    if isinstance(x, torch.Tensor):
        shape = tuple(bucket(d) for d in x.shape) if buckets else tuple(x.shape)
        return ("tensor", shape, str(x.dtype), x.device.type, bool(x.requires_grad))
    if x is None or isinstance(x, (bool, int, float, str)):
        return x
    return type(x).__name__


def _name(path: tuple) -> str:
    """``arg0``, ``input_ids``, ``batch['mask']``: a leaf's place in the call."""
    head, *rest = path[1:]
    name = f"arg{head.idx}" if path[0].idx == 0 else str(head.key)
    return name + torch.utils._pytree.keystr(tuple(rest))


def structure(model: torch.nn.Module) -> tuple:
    """The model as a plan depends on it: its module tree (names and classes), and its parameters'
    and buffers' names, shapes, dtypes and whether they train.  Another head, a module swapped for
    another class or a frozen layer is another structure; the weights' values are not part of it."""
    modules = tuple((n, type(m).__qualname__) for n, m in model.named_modules())
    params = tuple((n, tuple(p.shape), str(p.dtype), p.requires_grad) for n, p in model.named_parameters())
    buffers = tuple((n, tuple(b.shape), str(b.dtype)) for n, b in model.named_buffers())
    return modules, params, buffers


def optimizer_layout(optimizer: torch.optim.Optimizer | None, state: bool = True) -> tuple:
    """What an optimizer holds, as memory sees it: its parameter groups' sizes and, per parameter,
    the shapes and dtypes of its state.  A group added midway, or state made for parameters not
    stepped before, is another layout (and other bytes at every step's start).

    A plan's signature holds the groups alone (``state=False``): a step whose optimizer has not
    made all its state yet holds less than the trace that has it, so the plan is followed; a
    recorded step in which the optimizer makes state is not a steady-state one, and is recorded
    again (:mod:`dqn_swap.integrations`)."""
    if optimizer is None:
        return ()
    groups = tuple(len(g["params"]) for g in optimizer.param_groups)
    if not state:
        return groups
    state = []
    for g in optimizer.param_groups:
        for p in g["params"]:
            st = optimizer.state.get(p)
            state.append(tuple(sorted((k, tuple(v.shape), str(v.dtype), v.device.type) for k, v in st.items()
                                      if isinstance(v, torch.Tensor))) if st else ())
    return groups, tuple(state)


def signature(model: torch.nn.Module, args: tuple, kwargs: dict, shapes_only: bool = False,
              optimizer: torch.optim.Optimizer | None = None, buckets: bool = False) -> tuple[str, str]:
    """(key, description) of a call of ``model``: what a plan is made for (module docstring).
    With ``shapes_only``, a key of the call's shapes and the parameters' alone; with ``buckets``,
    every extent of the call's tensors is its :func:`bucket`'s upper end."""
    leaves, _ = tree_flatten_with_path((args, kwargs))
    call = tuple((_name(p), _describe(x, buckets)) for p, x in leaves)
    seen = tuple((_name(p), _describe(x)) for p, x in leaves) if buckets else call
    params = tuple(tuple(p.shape) for p in model.parameters())
    # Which parameters hold a gradient as the call begins, not only whether any does: after a step
    # whose layerdrop skipped a layer, that layer's gradient is made (not accumulated into) in the
    # next micro-step, memory a plan made after another step did not count (wav2vec2 with
    # accumulation: 1.9 % over the limit).
    with_grad = [p.grad is not None for p in model.parameters() if p.requires_grad]  # (frozen ones never do)
    grads: bool | tuple[int, ...] = (False if not any(with_grad) else True if all(with_grad)
                                     else tuple(i for i, g in enumerate(with_grad) if g))
    dev = next((p.device.type for p in model.parameters()), "cpu")
    autocast = (torch.is_autocast_enabled(dev), str(torch.get_autocast_dtype(dev))) if dev in ("cpu", "cuda") else ()
    sig = (call, params, grads, model.training, torch.is_grad_enabled(), autocast, structure(model),
           optimizer_layout(optimizer, state=False))
    key = hashlib.sha256(repr(sig).encode()).hexdigest()[:16]
    if shapes_only:
        return hashlib.sha256(repr((call, params)).encode()).hexdigest()[:16], ""

    shapes = ", ".join(f"{p}={'x'.join(map(str, d[1])) or 'scalar'} {d[2].replace('torch.', '')}"
                       for p, d in seen if isinstance(d, tuple) and d and d[0] == "tensor")
    held = ", gradients present" if grads is True else \
        f", gradients on {len(grads)} of {len(with_grad)} parameters" if grads else ""
    desc = f"{shapes or 'no tensor arguments'}{held}"
    if autocast and autocast[0]:
        desc += f", autocast {autocast[1].replace('torch.', '')}"
    return key, desc


def batch_size_of(args: tuple, kwargs: dict) -> int | None:
    """The batch size of a call of the model: the leading dimension its tensor arguments (keyword
    ones and those nested in containers included) all share; ``None`` where it is ambiguous (no
    tensor with a dimension, or leading dimensions that differ)."""
    leaves, _ = tree_flatten_with_path((args, kwargs))
    dims = {int(x.shape[0]) for _, x in leaves if isinstance(x, torch.Tensor) and x.dim() > 0}
    return dims.pop() if len(dims) == 1 else None


def _same_iteration(a: Trace, b: Trace) -> bool:
    """Whether two recordings are the same iteration as the runtime sees it: the same ops, tensors
    and saved tensors (their shapes, dtypes and the nodes that made them)."""
    return (a.n_ops == b.n_ops and len(a.saved) == len(b.saved) and a.n_tensors == b.n_tensors
            and [a.op_names[i] for i in a.op_name] == [b.op_names[i] for i in b.op_name]
            and np.array_equal(a.tensor_nbytes, b.tensor_nbytes) and a.saved_signatures == b.saved_signatures
            and a.saved_nodes == b.saved_nodes)
