"""The operation graph of section 4.2 of the DQN paper.

"We can view each GPU operation as a node in the graph.  If two rows are
continuous or use the same variable, we will add an edge to these two nodes.
The weight of the edge is the time lag between the two nodes."

Nodes are the trace's memory operations (events), in order.  Edges join

* consecutive events ``(e, e + 1)``, and
* successive events on the same tensor,

in both directions (the embedding of Eq. 1 sums over neighbours, which are
undirected in the paper).  Each edge carries the time lag between its two
events (seconds, from the unplanned schedule).

:func:`static_node_features` gives the four features of section 4.4.1 that
do not change while planning (variable size, transfer time, recompute time,
time to next use); the environment appends the two that do (the node's
action type and whether that action is valid now).
"""

from __future__ import annotations

import numpy as np
import torch
from torch_geometric.data import Data

from .cost import DeviceProfile
from .trace import EventKind, Trace

STATIC_FEATURES = ("size", "transfer_time", "recompute_time", "time_to_next_use")


def edge_arrays(trace: Trace) -> tuple[np.ndarray, np.ndarray]:
    """Directed edge list ``(2, E)`` (both directions) and each edge's time lag."""
    n = trace.n_events
    seq = np.arange(n - 1, dtype=np.int64)
    consecutive = np.stack([seq, seq + 1])
    # Successive events on one tensor: sort by (tensor, event) and join neighbours.
    order = np.lexsort((np.arange(n), trace.event_tensor))
    same = trace.event_tensor[order[1:]] == trace.event_tensor[order[:-1]]
    per_tensor = np.stack([order[:-1][same], order[1:][same]]).astype(np.int64)
    # A pair can be both consecutive and on the same tensor: keep it once.
    forward = np.unique(np.concatenate([consecutive, per_tensor], axis=1), axis=1)
    edges = np.concatenate([forward, forward[::-1]], axis=1)
    t = trace.event_time
    lag = np.abs(t[edges[1]] - t[edges[0]])
    return edges, lag


def next_use_time(trace: Trace) -> np.ndarray:
    """For each event, the time until the next read of its tensor (0 when none)."""
    n = trace.n_events
    t = trace.event_time
    order = np.lexsort((np.arange(n), trace.event_tensor))  # grouped by tensor, in time order
    is_read = trace.event_kind[order] == EventKind.READ
    # Position of the next read at or after each sorted position, via a reversed running minimum.
    pos = np.where(is_read, np.arange(n), n)
    nxt = np.minimum.accumulate(pos[::-1])[::-1]
    # Strictly after: shift by one, and stay within the same tensor.
    nxt = np.append(nxt[1:], n)
    tensor_sorted = trace.event_tensor[order]
    valid = nxt < n
    valid[valid] = tensor_sorted[nxt[valid]] == tensor_sorted[valid]
    out = np.zeros(n, dtype=np.float64)
    out[order[valid]] = t[order[nxt[valid]]] - t[order[valid]]
    return out


def static_node_features(trace: Trace, profile: DeviceProfile) -> np.ndarray:
    """``(n_events, 4)`` array: bytes, swap-out time, recompute time, time to next use.

    The recompute time of a tensor is the duration of the op that produced it
    (0 for tensors that existed before the iteration).
    """
    tensor = trace.event_tensor
    size = trace.tensor_nbytes[tensor].astype(np.float64)
    transfer = np.asarray(profile.transfer_time(size, "d2h"), dtype=np.float64)
    producer = trace.tensor_alloc_op[tensor]
    recompute = np.where(producer >= 0, trace.op_duration[np.maximum(producer, 0)], 0.0)
    return np.stack([size, transfer, recompute, next_use_time(trace)], axis=1)


def operation_graph(trace: Trace, profile: DeviceProfile | None = None) -> Data:
    """The operation graph as a :class:`torch_geometric.data.Data`.

    Attributes: ``edge_index`` ``(2, E)``, ``edge_attr`` ``(E, 1)`` time lags in
    seconds, ``num_nodes``, and with ``profile`` also ``x`` ``(N, 4)``, the
    static node features (:data:`STATIC_FEATURES`).  ``event_op`` and
    ``event_tensor`` map nodes back to the trace.
    """
    edges, lag = edge_arrays(trace)
    data = Data(edge_index=torch.from_numpy(edges), edge_attr=torch.from_numpy(lag).float().unsqueeze(1),
                num_nodes=trace.n_events)
    data.event_op = torch.from_numpy(trace.event_op.astype(np.int64))
    data.event_tensor = torch.from_numpy(trace.event_tensor.astype(np.int64))
    if profile is not None:
        data.x = torch.from_numpy(static_node_features(trace, profile)).float()
    return data
