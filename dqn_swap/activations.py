"""The saved activations of a trace a plan may act on, and where: the facts planners, pins and
hand-made plans share."""

from __future__ import annotations

import numpy as np

from .trace import EventKind, Phase, Trace


def saved_activations(trace: Trace) -> list[int]:
    """Tensor ids of the saved tensors a plan may move (saved for backward, made in the forward
    pass or an input, used again after their last forward use), in packing order."""
    action, _ = trace.action_window
    seen: dict[int, None] = {}
    for tid in trace.saved.tolist():
        op = trace.tensor_alloc_op[tid]
        if action[tid] >= 0 and (op < 0 or trace.op_phase[op] == Phase.FORWARD):
            seen.setdefault(int(tid), None)
    return list(seen)


def last_forward_event(trace: Trace, tid: int) -> int:
    """The last event of ``tid`` in its last forward use (the event a plan acts after).

    Raises:
        ValueError: ``tid`` is not a tensor id of ``trace``, or no plan can move that tensor.
    """
    if isinstance(tid, bool) or not isinstance(tid, (int, np.integer)) or not 0 <= int(tid) < trace.n_tensors:
        raise ValueError(f"tensor {tid!r} is not a tensor of this trace (ids 0 to {trace.n_tensors - 1})")
    op = int(trace.action_window[0][tid])
    ev = np.flatnonzero((trace.event_tensor == tid) & (trace.event_op == op) & (trace.event_kind != EventKind.FREE))
    if op < 0 or not len(ev):
        raise ValueError(f"tensor {tid} is not an activation a plan can move")
    return int(ev[-1])


__all__ = ["last_forward_event", "saved_activations"]
