"""Action nodes and the graph the agent sees (static part of the observation).

Section 4.9 of the DQN paper: "We use a heuristic method to decide which node
can also represent an action, and we guarantee that no node represents more
than one action."  Our heuristic:

* For every tensor and every action kind (swap, recompute) the simulator's
  :meth:`~dqn_swap.simulator.Simulator.valid_actions` allows, the *decision
  event* is the valid event followed by the longest idle period before the
  tensor's next read (for a saved activation: its last forward use, whose
  next read is in backward).  The simulator allows one action per tensor, so
  one event per (tensor, kind) loses no plan the agent could sensibly make.
* Node 0 stands for doing nothing.

Two graphs can be built from these action nodes (``graph=``):

``"candidates"`` (default, a departure from the paper for speed)
    Only node 0 and the action nodes.  Edges join nodes consecutive in
    forward order (decision events), nodes consecutive in reuse order (next
    reads, i.e. backward order), and the swap and recompute nodes of one
    tensor; each edge carries the time lag between the events it joins.  On
    ResNet-50 b64 that is ~430 nodes instead of ~4,300 events, on ResNet-1001
    ~8,000 instead of ~80,000.

``"dataflow"`` (ours)
    The candidates graph plus an edge between the recompute node of a tensor and
    every action node of a tensor its producer op reads: the inputs a re-run
    needs.  With ``recompute_chains`` a removal whose producer reads another removed
    tensor re-runs that one too (each re-run once per target, so a chain of ``k``
    removals costs ``O(k^2)`` re-runs); the candidates graph joins nodes only by
    time, so the agent cannot see which removals form a chain, and its recompute
    feature is the producer's own duration.  These edges let message passing read
    the ``chosen`` column of the inputs a removal would re-run.

``"events"`` (the paper's operation graph of section 4.2)
    Node ``1 + e`` is trace event ``e``; edges are
    :func:`dqn_swap.graph.edge_arrays` (consecutive and same-tensor events).
    A tensor's swap node is its swap decision event; its recompute node is
    the recompute decision event, or, when that is the same event, the
    tensor's first other event (so that no node stands for two actions).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from dqn_swap.cost import DeviceProfile
from dqn_swap.graph import edge_arrays, static_node_features
from dqn_swap.plan import Action, ActionKind
from dqn_swap.trace import EventKind, Trace

#: Node action types (feature column ``action_type``).
NOTHING, SWAP, RECOMPUTE = 0, 1, 2

#: Node feature columns.  The first six are those of section 4.4.1; the rest
#: are ours (see :class:`dqn_swap.env.SwapRecomputeEnv`).
FEATURES = ("size", "transfer_time", "recompute_time", "time_to_next_use", "action_type", "valid",
            "memory_limit", "under_execution", "deficit", "time_to_violation", "chosen", "swap_slack")
N_FEATURES = len(FEATURES)
F_VALID, F_LIMIT, F_EXEC, F_DEFICIT, F_TVIOL, F_CHOSEN, F_SLACK = 5, 6, 7, 8, 9, 10, 11
#: The columns of agents trained before ``swap_slack`` existed (they read the first 11).
N_FEATURES_BEFORE_SLACK = 11

GRAPHS = ("candidates", "dataflow", "events")


def next_read_event(trace: Trace) -> np.ndarray:
    """For each event, the index of the next ``read`` of its tensor after it (``-1``: none)."""
    n = trace.n_events
    order = np.lexsort((np.arange(n), trace.event_tensor))  # by tensor, then time
    is_read = trace.event_kind[order] == EventKind.READ
    pos = np.where(is_read, np.arange(n), n)
    nxt = np.minimum.accumulate(pos[::-1])[::-1]
    nxt = np.append(nxt[1:], n)  # strictly after
    tensor_sorted = trace.event_tensor[order]
    ok = nxt < n
    ok[ok] = tensor_sorted[nxt[ok]] == tensor_sorted[ok]
    out = np.full(n, -1, dtype=np.int64)
    out[order[ok]] = order[nxt[ok]]
    return out


def valid_event_masks(valid) -> tuple[np.ndarray, np.ndarray]:  # noqa: ANN001
    """``(swap_ok, recompute_ok)`` boolean arrays over events from ``Simulator.valid_actions()``."""
    if isinstance(valid, dict):
        def get(kind: ActionKind) -> np.ndarray:
            for key in (kind, int(kind), kind.name, kind.name.lower()):
                if key in valid:
                    return np.asarray(valid[key], dtype=bool)
            raise KeyError(kind)
        return get(ActionKind.SWAP), get(ActionKind.RECOMPUTE)
    if hasattr(valid, "swap") and hasattr(valid, "recompute"):
        return np.asarray(valid.swap, dtype=bool), np.asarray(valid.recompute, dtype=bool)
    if isinstance(valid, tuple) and len(valid) == 2:
        return np.asarray(valid[0], dtype=bool), np.asarray(valid[1], dtype=bool)
    arr = np.asarray(valid)
    if arr.ndim == 2 and arr.shape[1] == 2:
        return arr[:, 0].astype(bool), arr[:, 1].astype(bool)
    if arr.ndim == 2 and arr.shape[0] == 2:
        return arr[0].astype(bool), arr[1].astype(bool)
    raise TypeError(f"cannot read Simulator.valid_actions() of type {type(valid).__name__}")


@dataclass(frozen=True, eq=False)
class ActionGraph:
    """Static part of the observation for one trace (shared by all limits).

    Arrays over nodes (length ``n_nodes``; node 0 is *do nothing*):
    ``tensor`` (-1 for non-action nodes), ``kind`` (:data:`NOTHING`,
    :data:`SWAP`, :data:`RECOMPUTE`), ``event`` (the action's event, -1 if
    none), ``event_op`` and ``reuse_op`` (op of the decision event and of the
    tensor's next read; they bound the ops at which the action frees memory),
    ``event_time`` (unplanned time of the decision event), ``node_op`` (the op
    each node belongs to, for the node under execution).
    """

    mode: str
    n_nodes: int
    x_static: np.ndarray  # (N, N_FEATURES) float32, dynamic columns zero
    edge_index: np.ndarray  # (2, E) int64, both directions
    edge_attr: np.ndarray  # (E, 1) float32 transformed lags
    tensor: np.ndarray
    kind: np.ndarray
    event: np.ndarray
    event_op: np.ndarray
    reuse_op: np.ndarray
    event_time: np.ndarray
    node_op: np.ndarray
    action_nodes: np.ndarray  # indices of action nodes
    n_action_tensors: int
    size_scale: float
    time_scale: float

    def action(self, node: int) -> Action:
        return Action(int(self.event[node]), int(self.tensor[node]), ActionKind(int(self.kind[node]) - 1))


def _tf_time(t: np.ndarray, scale: float) -> np.ndarray:
    return np.log1p(np.maximum(np.asarray(t, dtype=np.float64), 0.0) / scale)


def _input_pairs(op_inputs: list[tuple[int, ...]], alloc_op: np.ndarray, a_tensor: np.ndarray,
                 a_kind: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Node pairs (1-based, as in the candidates graph) joining each recompute node to every action
    node of a tensor its producer op reads and did not allocate (``op_inputs``, a re-run's inputs:
    :attr:`dqn_swap.simulator.index.TraceIndex.op_inputs`): the ``"dataflow"`` graph's edges."""
    by_tensor: dict[int, list[int]] = {}
    for i, t in enumerate(a_tensor.tolist()):
        by_tensor.setdefault(int(t), []).append(i)
    src: list[int] = []
    dst: list[int] = []
    for i in np.flatnonzero(a_kind == RECOMPUTE).tolist():
        for u in sorted(set(op_inputs[int(alloc_op[int(a_tensor[i])])])):
            for j in by_tensor.get(int(u), ()):
                src.append(1 + i); dst.append(1 + j)
    return np.array(src, dtype=np.int64), np.array(dst, dtype=np.int64)


def _decision_events(trace: Trace, swap_ok: np.ndarray, rec_ok: np.ndarray, nxt: np.ndarray
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The action nodes' (event, kind, tensor), in event order: per (tensor, kind), the valid event
    with the longest gap to the tensor's next read."""
    t_ev = trace.event_time
    gap = np.where(nxt >= 0, t_ev[np.maximum(nxt, 0)] - t_ev, -1.0)
    choices: list[tuple[int, int, int]] = []  # (event, kind, tensor)
    for kind, ok in ((SWAP, swap_ok), (RECOMPUTE, rec_ok)):
        ev = np.flatnonzero(ok & (nxt >= 0))
        if len(ev) == 0:
            continue
        # sort by tensor, then gap, then event; take the last per tensor
        order = np.lexsort((ev, gap[ev], trace.event_tensor[ev]))
        ev = ev[order]
        tens = trace.event_tensor[ev]
        last = np.append(tens[1:] != tens[:-1], True)
        for e in ev[last]:
            choices.append((int(e), kind, int(trace.event_tensor[e])))
    choices.sort()
    return tuple(np.array([c[k] for c in choices], dtype=np.int64).reshape(-1) for k in range(3))


def _candidate_edges(trace: Trace, mode: str, a_event: np.ndarray, a_kind: np.ndarray, a_tensor: np.ndarray,
                     a_reuse: np.ndarray, op_inputs: list[tuple[int, ...]] | None) -> tuple[np.ndarray, np.ndarray]:
    """The ``"candidates"`` (and ``"dataflow"``) graph's edges, both directions, and their lags in
    seconds: decision-event order, reuse order, the swap and recompute nodes of one tensor (and,
    for ``"dataflow"``, each re-run's inputs)."""
    t_ev = trace.event_time
    n_act = len(a_event)
    node_event = np.concatenate([[0], a_event]).astype(np.int64)
    # the gap of the decision event, not of the event's own next use (same thing here)
    src, dst, lag = [], [], []
    if n_act:
        fwd = np.arange(1 + n_act)  # node order = decision-event order (do-nothing first)
        src.append(fwd[:-1]); dst.append(fwd[1:])
        lag.append(np.abs(t_ev[node_event[1:]] - t_ev[node_event[:-1]]))
        lag[-1][0] = 0.0
        order = 1 + np.lexsort((a_event, a_reuse))  # backward (reuse) order
        src.append(order[:-1]); dst.append(order[1:])
        r = t_ev[a_reuse[order - 1]]
        lag.append(np.abs(r[1:] - r[:-1]))
        # swap and recompute nodes of one tensor
        by_t = np.lexsort((a_kind, a_tensor))
        pair = np.flatnonzero(a_tensor[by_t][1:] == a_tensor[by_t][:-1])
        a, b = 1 + by_t[pair], 1 + by_t[pair + 1]
        src.append(a); dst.append(b); lag.append(np.abs(t_ev[a_event[a - 1]] - t_ev[a_event[b - 1]]))
        if mode == "dataflow":
            if op_inputs is None:
                from dqn_swap.simulator.index import TraceIndex

                op_inputs = TraceIndex(trace).op_inputs
            a, b = _input_pairs(op_inputs, trace.tensor_alloc_op, a_tensor, a_kind)
            src.append(a); dst.append(b); lag.append(np.abs(t_ev[a_event[a - 1]] - t_ev[a_event[b - 1]]))
    s = np.concatenate(src) if src else np.zeros(0, np.int64)
    d = np.concatenate(dst) if dst else np.zeros(0, np.int64)
    w = np.concatenate(lag) if lag else np.zeros(0)
    if len(s):
        key = np.unique(np.stack([np.minimum(s, d), np.maximum(s, d)]), axis=1, return_index=True)[1]
        s, d, w = s[key], d[key], w[key]
    return np.concatenate([np.stack([s, d]), np.stack([d, s])], axis=1).astype(np.int64), np.concatenate([w, w])


def _event_nodes(trace: Trace, a_event: np.ndarray, a_kind: np.ndarray, a_tensor: np.ndarray
                 ) -> tuple[np.ndarray, np.ndarray]:
    """The ``"events"`` graph's action nodes (1 + their event) and which decision each one is: swap at
    its event; recompute at its event unless taken, else another event of its tensor (dropped where
    none is free)."""
    taken: set[int] = set()
    nodes_l = []
    ev_by_tensor: dict[int, np.ndarray] = {}
    for i in np.argsort(a_kind, kind="stable"):  # swap nodes claim their events first
        e_node = int(a_event[i])
        if e_node in taken:
            if int(a_tensor[i]) not in ev_by_tensor:
                ev_by_tensor[int(a_tensor[i])] = np.flatnonzero(trace.event_tensor == a_tensor[i])
            free = [int(v) for v in ev_by_tensor[int(a_tensor[i])] if int(v) not in taken]
            if not free:
                continue
            e_node = free[0]
        taken.add(e_node)
        nodes_l.append((1 + e_node, i))
    nodes_l.sort()
    return np.array([p[0] for p in nodes_l], dtype=np.int64), np.array([p[1] for p in nodes_l], dtype=np.int64)


def build_action_graph(trace: Trace, profile: DeviceProfile, valid, mode: str = "candidates",  # noqa: ANN001
                       op_inputs: list[tuple[int, ...]] | None = None) -> ActionGraph:
    """Choose the action nodes of ``trace`` and build the graph the agent sees.

    ``op_inputs`` (the ``"dataflow"`` graph only): per op, the tensors a re-run of it reads, as the
    simulator's :class:`~dqn_swap.simulator.index.TraceIndex` has them (built here when not given)."""
    if mode not in GRAPHS:
        raise ValueError(f"unknown graph {mode!r}; choose one of: {', '.join(GRAPHS)}")
    swap_ok, rec_ok = valid_event_masks(valid)
    n_ev = trace.n_events
    if len(swap_ok) != n_ev or len(rec_ok) != n_ev:
        raise ValueError("Simulator.valid_actions() does not cover every event of the trace")
    nxt = next_read_event(trace)
    t_ev = trace.event_time
    static4 = static_node_features(trace, profile)  # size, transfer, recompute, next use
    a_event, a_kind, a_tensor = _decision_events(trace, swap_ok, rec_ok, nxt)
    a_reuse = nxt[a_event] if len(a_event) else np.zeros(0, np.int64)

    compute = max(trace.compute_time, 1e-12)
    time_scale = compute / 1000.0
    size_scale = max(float(trace.peak_bytes - trace.minimum_memory), 1.0) / 100.0

    def feats(events: np.ndarray, kinds: np.ndarray) -> np.ndarray:
        x = np.zeros((len(events), N_FEATURES), dtype=np.float32)
        if len(events):
            s = static4[events]
            x[:, 0] = np.log1p(s[:, 0] / size_scale)
            x[:, 1] = _tf_time(s[:, 1], time_scale)
            x[:, 2] = _tf_time(s[:, 2], time_scale)
            x[:, 3] = _tf_time(s[:, 3], time_scale)
            x[:, 4] = kinds
        return x

    if mode in ("candidates", "dataflow"):
        n = 1 + len(a_event)
        x = np.concatenate([np.zeros((1, N_FEATURES), np.float32), feats(a_event, a_kind)])
        edges, w = _candidate_edges(trace, mode, a_event, a_kind, a_tensor, a_reuse, op_inputs)
        nodes = np.arange(1, n)
        node_op = np.concatenate([[-1], trace.event_op[a_event]]).astype(np.int64)
    else:
        n = 1 + n_ev
        x = np.zeros((n, N_FEATURES), dtype=np.float32)
        x[1:] = feats(np.arange(n_ev), np.zeros(n_ev))
        e, lag_e = edge_arrays(trace)
        edges = np.concatenate([e + 1, np.array([[0, 1], [1, 0]])], axis=1).astype(np.int64)
        w = np.concatenate([lag_e, [0.0, 0.0]])
        nodes, keep = _event_nodes(trace, a_event, a_kind, a_tensor)
        a_event, a_kind, a_tensor, a_reuse = a_event[keep], a_kind[keep], a_tensor[keep], a_reuse[keep]
        x[nodes] = feats(a_event, a_kind)
        node_op = np.concatenate([[-1], trace.event_op]).astype(np.int64)

    def scatter(values: np.ndarray, fill: int | float, dtype) -> np.ndarray:  # noqa: ANN001
        out = np.full(n, fill, dtype=dtype)
        out[nodes] = values
        return out

    return ActionGraph(
        mode=mode, n_nodes=n, x_static=x.astype(np.float32), edge_index=edges,
        edge_attr=_tf_time(w, time_scale).astype(np.float32).reshape(-1, 1),
        tensor=scatter(a_tensor, -1, np.int64), kind=scatter(a_kind, NOTHING, np.int64),
        event=scatter(a_event, -1, np.int64),
        event_op=scatter(trace.event_op[a_event] if len(a_event) else a_event, -1, np.int64),
        reuse_op=scatter(trace.event_op[a_reuse] if len(a_reuse) else a_reuse, -1, np.int64),
        event_time=scatter(t_ev[a_event] if len(a_event) else np.zeros(0), 0.0, np.float64),
        node_op=node_op, action_nodes=nodes, n_action_tensors=len(np.unique(a_tensor)),
        size_scale=size_scale, time_scale=time_scale,
    )


def recompute_links(trace: Trace, sim: Any, g: ActionGraph) -> dict[int, np.ndarray]:
    """For each recompute node, the recompute nodes that choosing it makes invalid when chains are off.

    Removing ``X`` blocks removing the inputs of ``X``'s producer and the
    tensors whose producer reads ``X``: either would make a re-run need
    another re-run (a chain), which the simulator charges once per target
    (transient inputs), so a chain of ``k`` removed tensors costs ``O(k^2)``
    re-runs, as in an LSTM's cell-state chain.
    """
    rec_nodes = np.flatnonzero(g.kind == RECOMPUTE)
    node_of = {int(g.tensor[n]): int(n) for n in rec_nodes}
    inputs = sim.index.op_inputs  # per op: tensors it reads and did not allocate
    alloc = trace.tensor_alloc_op
    links: dict[int, set[int]] = {int(n): set() for n in rec_nodes}
    for n in rec_nodes.tolist():
        for y in inputs[int(alloc[int(g.tensor[n])])]:
            m = node_of.get(int(y))
            if m is not None and m != n:
                links[n].add(m)  # n removed: its producer's input y must stay
                links[m].add(n)  # y removed: n's re-run would need y's re-run
    return {n: np.fromiter(sorted(v), dtype=np.int64, count=len(v)) for n, v in links.items()}
