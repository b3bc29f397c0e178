"""Static validity of actions (the rule "Validity" of :mod:`dqn_swap.simulator`)."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ..plan import Action, ActionKind
from ..trace import EventKind, Phase, Role
from .index import TraceIndex


class ValidActions(NamedTuple):
    """Static validity per event: ``can_swap[e]``, ``can_recompute[e]`` (boolean arrays)."""

    can_swap: np.ndarray
    can_recompute: np.ndarray


def valid_actions(index: TraceIndex) -> ValidActions:
    """Per event, whether swapping / removing its tensor right after its op is valid: a read or
    write at the tensor's action op (:attr:`Trace.action_window`), used again; a removal also
    needs the return op within the tensor's :attr:`TraceIndex.recompute_limit`."""
    can_swap = index.event_at_action
    can_rec = can_swap & (index.event_return_op <= index.recompute_limit[index.event_tensor])
    return ValidActions(can_swap, can_rec)


def why_invalid(valid: ValidActions, index: TraceIndex, action: Action) -> str | None:
    """``None`` if ``action`` is valid, else a one-line reason."""
    e, t, k = action.event, action.tensor, action.kind
    trace = index.trace
    if k not in (ActionKind.SWAP, ActionKind.RECOMPUTE):
        return f"{action}: unknown action kind {k!r}"
    if not isinstance(e, (int, np.integer)) or not 0 <= e < trace.n_events:
        return f"{action}: event {e} is outside the trace (0..{trace.n_events - 1})"
    ev_t = int(index.event_tensor[e])
    if not isinstance(t, (int, np.integer)) or ev_t != t:
        return f"{action}: event {e} touches tensor {ev_t}, not {t}"
    name = "swap" if k == ActionKind.SWAP else "recompute"
    ok = valid.can_swap[e] if k == ActionKind.SWAP else valid.can_recompute[e]
    if ok:
        return None
    ev_op = int(index.event_op[e])
    where = f"{action}: cannot {name} tensor {t} after {trace.op_label(ev_op)}"
    ek = EventKind(trace.event_kind[e])
    if ek not in (EventKind.READ, EventKind.WRITE):
        return f"{where}: event {e} is a {ek.name.lower()}, not a read or write"
    role = Role(trace.tensor_role[t])
    if not trace.movable[t]:
        return f"{where}: it is a {role.name.lower()} (only tensors autograd saves for backward move)"
    nxt = int(index.event_return_op[e])
    if nxt < 0:
        return f"{where}: it is not used again"
    action_op = int(trace.action_window[0][t])
    if action_op < 0:
        return f"{where}: it has no forward use a plan could act after"
    if ev_op != action_op:
        return (f"{where}: a plan acts on a saved activation only after its last forward use, "
                f"{trace.op_label(action_op)}")
    p = int(index.tensor_alloc_op[t])
    if p < 0:
        return f"{where}: it existed before the iteration, nothing can recompute it"
    if trace.op_phase[p] != Phase.FORWARD:
        return f"{where}: its producer {trace.op_label(p)} is not a forward op"
    return (f"{where}: re-running {trace.op_label(p)} before op #{nxt} would not give "
            "the same value (it or an input is modified in place, or an input is gone and "
            "cannot be recomputed)")
