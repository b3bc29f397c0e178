"""The structure2vec layer (Eq. 1) and the Q-network (Eq. 2-3) against dense references."""

from __future__ import annotations

import torch

from dqn_swap.agents.dqn import DQNConfig, QNetwork, S2VConv


def random_graph(n: int, e: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(0, n, (e,), generator=g)
    dst = torch.randint(0, n, (e,), generator=g)
    keep = src != dst
    src, dst = src[keep], dst[keep]
    ei = torch.cat([torch.stack([src, dst]), torch.stack([dst, src])], dim=1)
    w = torch.rand(src.numel(), generator=g)
    return ei, torch.cat([w, w])


def dense_s2v(conv: S2VConv, x, ei, w, T: int):
    """Eq. 1 with a dense adjacency matrix: N(v) = neighbours of v and v itself."""
    n = x.size(0)
    A = torch.zeros(n, n)
    A.index_put_((ei[1], ei[0]), torch.ones(ei.size(1)), accumulate=True)  # A[v, u] = #edges u->v
    edge_feat = torch.relu(conv.w4(w.view(-1, 1)))  # (E, p)
    E = torch.zeros(n, edge_feat.size(1)).index_add_(0, ei[1], edge_feat)
    E = E + torch.relu(conv.w4(torch.zeros(1, 1)))  # self loop, lag 0
    A = A + torch.eye(n)
    s = torch.zeros(n, conv.w2.in_features)
    for _ in range(T):
        s = torch.relu(conv.w1(x) + conv.w2(A @ s) + conv.w3(E))
    return s


def test_s2v_matches_dense_reference():
    torch.manual_seed(0)
    cfg = DQNConfig(p=16, T=4, aggr="sum")  # Eq. 1 as written
    net = QNetwork(cfg, in_features=5)
    x = torch.randn(30, 5)
    ei, w = random_graph(30, 60, 1)
    sparse = net.embed(x, ei, w)
    dense = dense_s2v(net.conv, x, ei, w, cfg.T)
    torch.testing.assert_close(sparse, dense, rtol=1e-5, atol=1e-5)


def test_s2v_without_bias_is_paper_eq1():
    torch.manual_seed(1)
    cfg = DQNConfig(p=8, T=3, bias=False, aggr="sum")
    net = QNetwork(cfg, in_features=6)
    assert net.conv.w1.weight.shape == (8, 6) and net.conv.w4.weight.shape == (8, 1)
    x = torch.randn(12, 6)
    ei, w = random_graph(12, 20, 2)
    torch.testing.assert_close(net.embed(x, ei, w), dense_s2v(net.conv, x, ei, w, 3), rtol=1e-5, atol=1e-5)


def test_q_of_a_batch_equals_q_of_each_graph():
    torch.manual_seed(2)
    for readout in ("sum", "mean"):
        net = QNetwork(DQNConfig(p=8, T=2, readout=readout), in_features=4)
        graphs = []
        for i, n in enumerate((7, 11)):
            ei, w = random_graph(n, 15, 10 + i)
            graphs.append((torch.randn(n, 4), ei, w, i % n))
        single = [net(x, ei, w, torch.zeros(x.size(0), dtype=torch.long), torch.tensor([c]), 1)
                  for x, ei, w, c in graphs]
        x = torch.cat([g[0] for g in graphs])
        ei = torch.cat([graphs[0][1], graphs[1][1] + 7], dim=1)
        w = torch.cat([graphs[0][2], graphs[1][2]])
        b = torch.tensor([0] * 7 + [1] * 11)
        batched = net(x, ei, w, b, torch.tensor([graphs[0][3], 7 + graphs[1][3]]), 2)
        torch.testing.assert_close(batched, torch.cat(single), rtol=1e-5, atol=1e-6)


def test_eq3_head_shapes():
    net = QNetwork(DQNConfig(p=64, T=4, head_features=False))
    assert net.w7.weight.shape == (1, 3 * 64) and net.w8.weight.shape == (64, 64)
    assert net.w5.weight.shape == net.w6.weight.shape == (64, 64)
    assert net.w9 is None


def test_head_features_widen_eq3():
    """``head_features=True`` (the default) appends W9 x_v to the concatenation of Eq. 3."""
    net = QNetwork(DQNConfig(p=64, T=4), in_features=7)
    assert net.w7.weight.shape == (1, 4 * 64) and net.w9.weight.shape == (64, 7)


def test_s2v_mean_aggregation_matches_dense_reference():
    """``aggr="mean"``: both neighbourhood sums of Eq. 1 divided by |N(v)| (self loop included)."""
    torch.manual_seed(3)
    cfg = DQNConfig(p=16, T=3, aggr="mean")
    net = QNetwork(cfg, in_features=5)
    x = torch.randn(25, 5)
    ei, w = random_graph(25, 50, 4)
    n = x.size(0)
    A = torch.zeros(n, n)
    A.index_put_((ei[1], ei[0]), torch.ones(ei.size(1)), accumulate=True)
    A = A + torch.eye(n)
    D = A.sum(1, keepdim=True)
    conv = net.conv
    E = torch.zeros(n, 16).index_add_(0, ei[1], torch.relu(conv.w4(w.view(-1, 1)))) + torch.relu(conv.w4(torch.zeros(1, 1)))
    s = torch.zeros(n, 16)
    for _ in range(cfg.T):
        s = torch.relu(conv.w1(x) + conv.w2((A @ s) / D) + conv.w3(E / D))
    torch.testing.assert_close(net.embed(x, ei, w), s, rtol=1e-5, atol=1e-5)


def test_head_features_read_the_node_itself():
    torch.manual_seed(4)
    net = QNetwork(DQNConfig(p=8, T=2, head_features=True), in_features=4)
    assert net.w7.weight.shape == (1, 4 * 8) and net.w9.weight.shape == (8, 4)
    ei, w = random_graph(9, 14, 5)
    x = torch.randn(9, 4)
    q = net(x, ei, w, torch.zeros(9, dtype=torch.long), torch.tensor([0]), 1)
    s = net.embed(x, ei, w)
    g = torch.cat([net.w5(s.mean(0, keepdim=True)), net.w6(s[:1])], dim=1)
    ref = net.w7(torch.relu(torch.cat([g.expand(9, -1), net.w8(s), net.w9(x)], dim=1))).squeeze(1)
    torch.testing.assert_close(q, ref, rtol=1e-5, atol=1e-6)
