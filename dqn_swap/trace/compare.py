"""Comparing recordings of one iteration on other shapes: :func:`same_structure`, :func:`envelope`
(the larger of two, a plan made for which holds on either) and :func:`dominates`."""

from __future__ import annotations

import numpy as np

from .core import Trace


# The columns that say what an iteration does (its ops, tensors, events and packs), and those that
# say how big it is.  Two recordings of one iteration on other shapes (a bucket of shapes: another
# sequence length, another graph of the same op sequence) differ only in the second.
_STRUCTURE_COLUMNS = ("op_name", "op_phase", "op_module", "tensor_role", "tensor_alloc_op", "tensor_free_op",
                      "tensor_saved_index", "event_kind", "event_op", "event_tensor", "saved", "saved_op",
                      "saved_unpack_op", "saved_in_op", "module_call_op", "tensor_held_op", "saved_dtype",
                      "saved_ndim", "saved_node")
_SIZE_COLUMNS = ("tensor_nbytes", "op_scratch", "op_duration", "op_flops", "op_bytes", "saved_dims")


def same_structure(a: Trace, b: Trace) -> bool:
    """Whether ``a`` and ``b`` record the same iteration up to sizes: the same ops in the same
    order, the same tensors made, saved and freed at the same ops, the same packs of the same
    dtypes, ranks and nodes.  Only bytes, shapes' extents, op costs and scratch may differ."""
    if (a.op_names != b.op_names or a.module_names != b.module_names
            or a.meta.get("saved_nodes") != b.meta.get("saved_nodes")):
        return False
    for name in _STRUCTURE_COLUMNS:
        x, y = getattr(a, name), getattr(b, name)
        if (x is None) != (y is None) or (x is not None and not np.array_equal(x, y)):
            return False
    return all(getattr(a, n) is None or getattr(a, n).shape == getattr(b, n).shape for n in _SIZE_COLUMNS)


def envelope(a: Trace, b: Trace) -> Trace:
    """The iteration of ``a`` and ``b`` (:func:`same_structure`) at the larger of their sizes, column
    by column: every tensor's bytes and every pack's extents, every op's scratch and cost.  A plan
    made for it holds, under its schedule, at most its bytes when followed on either, or on any
    recording of the same structure whose sizes are all at most its own (a bucket's smaller
    members; ``PlannedExecution(..., shapes="bounded")`` checks that at every pack)."""
    if not same_structure(a, b):
        raise ValueError("an envelope is of two recordings of one iteration (same_structure)")
    sizes = {n: np.maximum(getattr(a, n), getattr(b, n)) for n in _SIZE_COLUMNS if getattr(a, n) is not None}
    return a.replace(**sizes, meta={**a.meta, "envelope_of": int(a.meta.get("envelope_of", 1))
                                    + int(b.meta.get("envelope_of", 1))})


def dominates(a: Trace, b: Trace) -> bool:
    """Whether ``a`` is at least ``b`` in every size (both of one structure): ``envelope(a, b)`` is ``a``."""
    return same_structure(a, b) and all(
        getattr(a, n) is None or bool(np.all(getattr(a, n) >= getattr(b, n))) for n in _SIZE_COLUMNS)
