"""The operation graph of section 4.2 on a hand-built trace."""

import numpy as np
import torch

from dqn_swap.cost import get_profile
from dqn_swap.graph import operation_graph, static_node_features

from .test_trace import small_trace


def test_edges_join_consecutive_and_same_tensor_events():
    t = small_trace()
    g = operation_graph(t)
    assert g.num_nodes == t.n_events == 11
    pairs = {tuple(e) for e in g.edge_index.t().tolist()}
    for e in range(t.n_events - 1):  # consecutive events, both directions
        assert (e, e + 1) in pairs and (e + 1, e) in pairs
    # Tensor y (id 2): malloc 0, write 3, read 5, read 8, free 9 -> successive pairs.
    y_events = np.flatnonzero(t.event_tensor == 2).tolist()
    assert y_events == [0, 3, 5, 8, 9]
    for a, b in zip(y_events, y_events[1:]):
        assert (a, b) in pairs
    assert (0, 5) not in pairs  # only successive uses
    # The weight of an edge is the time lag between its events.
    lag = dict(zip(map(tuple, g.edge_index.t().tolist()), g.edge_attr.squeeze(1).tolist()))
    assert lag[(3, 5)] == 0.0  # y written at the end of op 0 = start of op 1
    assert lag[(5, 8)] == 2.0  # read by op 1 at 1 s and by op 2 at 3 s
    assert g.edge_index.shape[1] == len(pairs)


def test_static_features():
    t = small_trace()
    x = static_node_features(t, get_profile("v100-pcie3"))
    assert x.shape == (11, 4)
    assert x[0, 0] == 16  # size of y
    assert x[0, 2] == 1.0  # y is recomputed by re-running op 0 (1 s)
    assert x[0, 3] == 1.0  # y's next read is by op 1, 1 s after its malloc
    assert x[5, 3] == 2.0 and x[8, 3] == 0.0  # then by op 2; after that, never
    g = operation_graph(t, get_profile("v100-pcie3"))
    assert torch.allclose(g.x, torch.from_numpy(x).float())
