"""The hooks around a recorded iteration: module paths without keeping gradients alive
(:class:`_ModuleTracker`), a guard against tensors of another device, and the holder of a saved
tensor."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.module_tracker import ModuleTracker

from .vocabulary import RecordingError, _tensors


def _multi_grad_hook(tensors: list[torch.Tensor], fn: Callable[[], None]) -> list[Any]:
    """``fn()`` once the gradients of all ``tensors`` that backward computes have been computed:
    ``register_multi_grad_hook(tensors, fn, mode="all")`` without keeping the gradients.  PyTorch's
    buffers every gradient until the last one arrives, to hand them all to ``fn``; under the
    recorder that would hold a gradient the engine has already dropped (measured: T5's 4-byte
    gradient of its loss output, kept by the module tracker until the gradient of the logits came,
    278 ops later), so the trace would not be the memory of training."""
    nodes = [torch.autograd.graph._get_grad_fn_or_grad_acc(t) for t in tensors]
    count: dict[int, int] = {}
    expected: dict[int, int] = {}

    def hook(grad: torch.Tensor) -> None:
        task = torch._C._current_graph_task_id()
        if task not in expected:
            expected[task] = sum(map(torch._C._will_engine_execute_node, nodes))
        count[task] = count.get(task, 0) + 1
        if count[task] == expected[task]:
            del count[task], expected[task]
            fn()

    return [t.register_hook(hook) for t in tensors]


class _ModuleTracker(ModuleTracker):
    """:class:`ModuleTracker` whose backward hooks keep no gradient alive (:func:`_multi_grad_hook`),
    and that hooks no gradient of a module called inside backward.

    Activation checkpointing (``torch.utils.checkpoint``, Hugging Face's
    ``gradient_checkpointing_enable()``) calls modules again in backward to recompute their
    activations; that graph is thrown away once they are recomputed.  A gradient hook on its
    tensors would hold its nodes (a hook refers to the nodes it waits for, and sits on one of
    them: a cycle through C++ the collector does not see), and the nodes the recomputed
    activations, until the recording ends.  Measured on four checkpointed MLP blocks: PyTorch's
    ``ModuleTracker`` raised training's peak from 1.32 to 2.30 MB, and the trace overstated the
    peak by 24 %.  Their ops are named by the module all the same (the forward hooks still mark
    it); their gradients never come."""

    def __enter__(self) -> "_ModuleTracker":
        self._thread = threading.get_ident()  # its forward hooks are the process's (dqn_swap.threads)
        return super().__enter__()

    def _fw_pre_hook(self, mod: torch.nn.Module, input: Any) -> None:  # noqa: A002
        if threading.get_ident() != getattr(self, "_thread", None):
            return  # a module called on another thread (a planner's network, planning meanwhile)
        name = self._get_mod_name(mod)
        self._get_append_fn(name, False)()
        if torch._C._current_graph_task_id() != -1:  # a recomputation inside backward
            return
        tensors = [a for a in tree_flatten(input)[0] if isinstance(a, torch.Tensor) and a.requires_grad]
        if tensors:
            self._hooks.extend(_multi_grad_hook(tensors, self._get_pop_fn(name, True)))

    def _fw_post_hook(self, mod: torch.nn.Module, input: Any, output: Any) -> None:  # noqa: A002
        if threading.get_ident() != getattr(self, "_thread", None):
            return
        name = self._get_mod_name(mod)
        self._get_pop_fn(name, False)()
        if torch._C._current_graph_task_id() != -1:
            return
        tensors = [a for a in tree_flatten(output)[0] if isinstance(a, torch.Tensor) and a.requires_grad]
        if tensors:
            self._hooks.extend(_multi_grad_hook(tensors, self._get_append_fn(name, True)))


class _DeviceGuard(TorchDispatchMode):
    """On ``meta``, an op mixing the model's tensors with another device's non-scalar ones reads a
    tensor the model or the loss captured from elsewhere (a loss target made on the CPU): name it."""

    _MOVES = (torch.ops.aten._to_copy.default, torch.ops.aten.copy_.default, torch.ops.aten.lift_fresh.default)

    def __init__(self, device_type: str) -> None:
        super().__init__()
        self.device_type = device_type

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        kwargs = kwargs or {}
        if func not in self._MOVES:
            tensors = _tensors((args, kwargs))
            if any(t.device.type == self.device_type for t in tensors):
                for t in tensors:
                    if t.device.type != self.device_type and t.dim() > 0:
                        raise RecordingError(
                            f"{func._overloadpacket} reads a {t.device.type} tensor of shape {tuple(t.shape)} "
                            f"({str(t.dtype).replace('torch.', '')}) while the model records on {self.device_type}: "
                            f"make it on {self.device_type} too (a target the loss function captured: create it "
                            "on the same device as the inputs)")
        return func(*args, **kwargs)


# Data-parallel wrappers: their forward only hands over to the wrapped module, whose calls count.
