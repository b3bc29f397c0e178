"""Backward's in-place writes that a dispatch mode hides: :class:`InPlaceRewrites`, the part of the
recording dispatch mode (:class:`.mode._Recorder`) that finds the ops autograd runs in place outside
the recorder and out of place under it, and records them as the in-place writes they are in training."""

from __future__ import annotations

from typing import Any

import torch
from torch._prims_common import is_non_overlapping_and_dense_or_false

from ..trace import EventKind, Phase, Role


class InPlaceRewrites:
    """Mixed into :class:`.mode._Recorder`, whose state it reads: ``b`` (the trace builder), ``phase``,
    ``device_type``, ``seen`` (tensor -> id), ``zero_filled``, and the candidates its dispatch collects,
    ``accumulations`` and ``fills``."""

    def accumulation_candidate(self, func: torch._ops.OpOverload, args: tuple, kwargs: dict, out: Any) -> bool:
        """Whether ``func`` may be autograd summing two gradients of one tensor (``a + b``, in backward,
        into a dense result shaped like ``a``): see :meth:`accumulate_in_place`."""
        if self.phase != Phase.BACKWARD or func is not torch.ops.aten.add.Tensor or kwargs.get("alpha", 1) != 1:
            return False
        a = args[0]
        # The engine adds in place only into a tensor whose storage it holds alone
        # (``can_accumulate_inplace``: ``storage().use_count() == 1``): a view keeps its base alive,
        # so a gradient that is a view (a linear layer's weight gradient, ``mm(...).t()``) is summed
        # out of place, into a new tensor (measured: the allocator's timeline shows the new block).
        return (isinstance(a, torch.Tensor) and isinstance(out, torch.Tensor) and a.device.type == self.device_type
                and not a._is_view() and a.shape == out.shape and a.dtype == out.dtype and is_non_overlapping_and_dense_or_false(a)
                and a.untyped_storage().nbytes() == out.untyped_storage().nbytes())

    def fill_candidate(self, func: torch._ops.OpOverload, args: tuple, out: Any) -> bool:
        """Whether ``func`` may be the out-of-place form of an in-place write into a zero-filled tensor
        the same backward formula just made (``zeros(...).index_add(...)``): see :meth:`fill_in_place`."""
        a = args[0] if args else None
        if not (isinstance(a, torch.Tensor) and isinstance(out, torch.Tensor) and self.seen.get(a) in self.zero_filled):
            return False
        name = func._overloadpacket.__name__
        if not (name.endswith("_scatter") or hasattr(torch.ops.aten, name + "_")):
            return False
        return (a.dtype == out.dtype and a.shape == out.shape
                and a.untyped_storage().nbytes() == out.untyped_storage().nbytes())

    def fill_in_place(self) -> dict[int, int]:
        """Record the in-place writes that backward formulas make into a fresh zero-filled tensor as
        the in-place writes they are outside the recorder; returns the renamed tensors (result -> the
        tensor written).

        Several of autograd's formulas build a gradient by filling a fresh zero tensor in place
        (``grad.new_zeros(sizes).index_add_(dim, index, grad)`` for ``index_select``, ``scatter_add_``
        for ``gather``, ``index_put_`` for indexing, ``masked_scatter_`` for ``masked_select``) unless an
        operand is "tensor-subclass-like" (``at::areAnyTensorSubclassLike``), in which case they call the
        out-of-place form.  Under any ``TorchDispatchMode`` every tensor counts as subclass-like, so the
        recorder sees the out-of-place form: a second tensor of the gradient's size alive at once with
        the zeros (measured on the allocator's timeline: ``index_select``'s backward allocates one block
        outside the recorder, two under it).  A backward op whose first operand is a zero-filled tensor
        made in backward (``new_zeros``, ``zeros``, ``zeros_like``), read by nothing else, never saved and
        freed by that very op, whose result is shaped like it and which has an in-place form (``op_``, or
        is a ``*_scatter`` op, the functional form of a write into a view), writes that tensor instead
        of allocating a new one."""
        b = self.b
        merged: dict[int, int] = {}
        if not self.fills:
            return merged
        users: dict[int, set[int]] = {}
        wanted = {into for _, into, _ in self.fills}
        for kind, op, t in b.events:
            if t in wanted and kind != EventKind.FREE:
                users.setdefault(t, set()).add(op)
        for op, into, out in self.fills:
            alloc = b.t_alloc[into]
            if (b.t_free[into] == op and b.t_saved[into] < 0 and b.t_role[into] == Role.TEMPORARY
                    and self.zero_filled.get(into) == alloc and users.get(into, set()) <= {alloc, op}
                    and b.t_alloc[out] == op and b.t_nbytes[out] == b.t_nbytes[into]):
                b.write_in_place(op, out, into)
                merged[out] = into
        return merged

    def accumulate_in_place(self, merged: dict[int, int] | None = None) -> None:
        """Record autograd's gradient accumulation as the in-place add it is outside the recorder.

        The autograd engine sums two gradients of one tensor with ``old.add_(new)`` when it
        holds the last reference to ``old`` (``InputBuffer::accumulate`` in
        ``torch/csrc/autograd/input_buffer.cpp``), and with ``old + new`` otherwise.  Under any
        ``TorchDispatchMode`` every tensor has a Python object, so the reference count is never 1
        and the engine always takes the out-of-place path: a recorded trace would hold both sums
        at once at every residual junction (four activation-sized tensors instead of three in
        ResNet-50's backward).  A backward ``a + b`` whose ``a`` was a gradient made in backward,
        never saved and freed by that very op (the engine dropped it) is what the engine does in
        place in training: the trace writes ``a`` instead of allocating a new tensor.
        """
        b = self.b
        merged = dict(merged or {})  # tensors already renamed (fill_in_place): result -> the tensor it became
        for op, into, out in self.accumulations:
            into = merged.get(into, into)
            alloc = b.t_alloc[into]
            if (b.t_free[into] == op and b.t_saved[into] < 0 and b.t_role[into] == Role.TEMPORARY
                    and alloc >= 0 and b.ops[alloc][1] == Phase.BACKWARD and b.t_alloc[out] == op):
                b.write_in_place(op, out, into)
                merged[out] = into


__all__ = ["InPlaceRewrites"]
