"""The Q-network: structure2vec embedding (Eq. 1), graph state (Eq. 2), Q head (Eq. 3).

Also :class:`GraphBatcher`, the learner's fast path: the static graph of each
trace is turned into tensors once; a batch of states only writes the columns
that change (validity, node under execution, deficit, time to the decision
point, memory limit) into copies of the static node features.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn
from torch_geometric.nn import MessagePassing
from torch_geometric.utils import scatter

from dqn_swap.env.candidates import (F_CHOSEN, F_DEFICIT, F_EXEC, F_LIMIT, F_SLACK, F_TVIOL, F_VALID, N_FEATURES,
                                     N_FEATURES_BEFORE_SLACK, ActionGraph)
from dqn_swap.env.swap_recompute import DynamicState

from .config import DQNConfig


class S2VConv(MessagePassing):
    r"""One structure2vec iteration (Eq. 1 of the DQN paper; Dai et al., 2017):

    .. math::

        s_v^{t+1} = \mathrm{ReLU}\Big(W_1 x_v + W_2 \sum_{u \in \mathcal N(v)} s_u^t
                    + W_3 \sum_{u \in \mathcal N(v)} \mathrm{ReLU}\big(W_4\, w(u, v)\big)\Big)

    with :math:`W_1 \in \mathbb R^{p \times F}`, :math:`W_2, W_3 \in \mathbb R^{p \times p}`,
    :math:`W_4 \in \mathbb R^{p \times 1}`, :math:`w(u, v)` the edge's time lag and
    :math:`\mathcal N(v)` the neighbours of ``v`` *and v itself* (a self loop
    of lag 0).  The paper's ``F`` is 6; ours is the environment's 11 columns.
    ``bias=True`` gives every map a bias (the paper writes none).
    ``aggr="mean"`` (ours) divides both sums by :math:`|\mathcal N(v)|`, so
    that the embedding's scale does not grow with the degree and with ``T``.

    Shapes: ``x`` ``(N, F)``, ``edge_index`` ``(2, E)``, ``edge_weight`` ``(E,)``,
    ``s`` and the output ``(N, p)``.

    The two terms that do not depend on :math:`s^t` are the same in every
    iteration; :meth:`static_term` computes them once and :meth:`forward`
    takes them, so ``T`` iterations cost ``T`` sparse sums.
    """

    def __init__(self, in_features: int, p: int, bias: bool = True, aggr: str = "sum") -> None:
        if aggr not in ("sum", "mean"):
            raise ValueError(f"aggr must be 'sum' or 'mean', not {aggr!r}")
        super().__init__(aggr="add")
        self.mean = aggr == "mean"
        self.w1 = nn.Linear(in_features, p, bias=bias)
        self.w2 = nn.Linear(p, p, bias=False)
        self.w3 = nn.Linear(p, p, bias=False)
        self.w4 = nn.Linear(1, p, bias=bias)

    def _inv_size(self, edge_index: Tensor, n: int, like: Tensor) -> Tensor | None:
        """``1 / |N(v)|`` per node (self loop included) for ``aggr="mean"``, else None."""
        if not self.mean:
            return None
        deg = torch.bincount(edge_index[1], minlength=n).to(like.dtype) + 1.0
        return deg.reciprocal().unsqueeze(1)

    def static_term(self, x: Tensor, edge_index: Tensor, edge_weight: Tensor) -> Tensor:
        r""":math:`W_1 x_v + W_3 \sum_{u \in N(v)} ReLU(W_4 w(u, v))` (self loop included)."""
        n = x.size(0)
        e = torch.relu(self.w4(edge_weight.view(-1, 1)))
        agg = scatter(e, edge_index[1], dim=0, dim_size=n, reduce="sum")
        agg = agg + torch.relu(self.w4(edge_weight.new_zeros(1, 1)))  # the self loop, lag 0
        inv = self._inv_size(edge_index, n, x)
        if inv is not None:
            agg = agg * inv
        return self.w1(x) + self.w3(agg)

    def forward(self, s: Tensor, edge_index: Tensor, static: Tensor) -> Tensor:  # noqa: D102
        agg = self.propagate(edge_index, x=s) + s
        inv = self._inv_size(edge_index, s.size(0), s)
        if inv is not None:
            agg = agg * inv
        return torch.relu(static + self.w2(agg))

    def message(self, x_j: Tensor) -> Tensor:  # noqa: D102
        return x_j


class QNetwork(nn.Module):
    r"""Q-values of every node of a batch of graphs.

    * node states :math:`s^T` by ``T`` iterations of :class:`S2VConv` from :math:`s^0 = 0`;
    * graph state (Eq. 2) :math:`g = [W_5 \sum_{u} s_u^T,\; W_6 s_c^T]` with ``c`` the node
      under execution (``readout="mean"`` averages instead of summing);
    * Q head (Eq. 3) :math:`\hat Q(g, s_a^T) = W_7\, \mathrm{ReLU}([g, W_8 s_a^T])` for every node ``a``
      (``head="mlp"``: :math:`W_7` is a two-layer perceptron; ``head_features=True`` (ours)
      appends :math:`W_9 x_a`, the node's own features, to the head's input, so that the
      ranking of actions can read them unmixed with the neighbourhood).

    It reads the first ``in_features`` node feature columns: all of them with
    ``config.swap_slack``, else those before ``swap_slack`` (what agents trained
    before that column existed read).
    """

    def __init__(self, config: DQNConfig, in_features: int | None = None) -> None:
        super().__init__()
        if in_features is None:
            in_features = N_FEATURES if config.swap_slack else N_FEATURES_BEFORE_SLACK
        self.in_features = in_features
        p, bias = config.p, config.bias
        if config.readout not in ("sum", "mean"):
            raise ValueError(f"readout must be 'sum' or 'mean', not {config.readout!r}")
        self.T = config.T
        self.readout = config.readout
        self.conv = S2VConv(in_features, p, bias, config.aggr)
        self.w5 = nn.Linear(p, p, bias=bias)
        self.w6 = nn.Linear(p, p, bias=bias)
        if config.head not in ("eq3", "mlp"):
            raise ValueError(f"head must be 'eq3' or 'mlp', not {config.head!r}")
        width = 4 * p if config.head_features else 3 * p
        self.w7 = nn.Linear(width, 1, bias=bias) if config.head == "eq3" else nn.Sequential(
            nn.Linear(width, p, bias=bias), nn.ReLU(), nn.Linear(p, 1, bias=bias))
        self.w8 = nn.Linear(p, p, bias=bias)
        self.w9 = nn.Linear(in_features, p, bias=bias) if config.head_features else None

    def embed(self, x: Tensor, edge_index: Tensor, edge_attr: Tensor) -> Tensor:
        static = self.conv.static_term(x, edge_index, edge_attr)
        s = torch.relu(static)  # s^1: W2 * sum(s^0) = 0
        for _ in range(self.T - 1):
            s = self.conv(s, edge_index, static)
        return s

    def forward(self, x: Tensor, edge_index: Tensor, edge_attr: Tensor, batch: Tensor, current: Tensor,
                num_graphs: int) -> Tensor:
        """Q-value of every node (shape ``(N,)``); ``current`` holds global node indices."""
        x = x[:, :self.in_features]
        s = self.embed(x, edge_index, edge_attr)
        pooled = scatter(s, batch, dim=0, dim_size=num_graphs, reduce=self.readout)
        g = torch.cat([self.w5(pooled), self.w6(s[current])], dim=1)
        parts = [g[batch], self.w8(s)] if self.w9 is None else [g[batch], self.w8(s), self.w9(x)]
        return self.w7(torch.relu(torch.cat(parts, dim=1))).squeeze(1)


class GraphBatcher:
    """Turns ``(graph, DynamicState)`` pairs into one disjoint-union batch of tensors."""

    def __init__(self) -> None:
        self._static: dict[int, tuple[ActionGraph, Tensor, Tensor, Tensor]] = {}

    def register(self, graph: ActionGraph) -> int:
        key = id(graph)
        if key not in self._static:
            self._static[key] = (graph, torch.from_numpy(graph.x_static), torch.from_numpy(graph.edge_index),
                                 torch.from_numpy(graph.edge_attr).view(-1))
        return key

    def batch(self, items: Sequence[tuple[int, DynamicState]]):  # noqa: ANN201
        xs, eis, eas, bs, cur, offsets = [], [], [], [], [], []
        off = 0
        for i, (key, st) in enumerate(items):
            _, x0, ei, ea = self._static[key]
            x = x0.clone()
            x[:, F_VALID] = torch.from_numpy(np.asarray(st.valid, dtype=np.float32))
            x[:, F_LIMIT] = st.limit
            x[st.current, F_EXEC] = 1.0
            x[:, F_DEFICIT] = st.deficit
            x[:, F_TVIOL] = torch.from_numpy(np.asarray(st.time_to_violation, dtype=np.float32))
            x[:, F_CHOSEN] = torch.from_numpy(np.asarray(st.chosen, dtype=np.float32))
            if st.swap_slack is not None:
                x[:, F_SLACK] = torch.from_numpy(np.asarray(st.swap_slack, dtype=np.float32))
            n = x.size(0)
            xs.append(x)
            eis.append(ei + off if off else ei)
            eas.append(ea)
            bs.append(torch.full((n,), i, dtype=torch.long))
            cur.append(off + st.current)
            offsets.append(off)
            off += n
        return (torch.cat(xs), torch.cat(eis, dim=1), torch.cat(eas), torch.cat(bs),
                torch.tensor(cur, dtype=torch.long), len(items), torch.tensor(offsets, dtype=torch.long))

    def valid_mask(self, items: Sequence[tuple[int, DynamicState]]) -> Tensor:
        return torch.from_numpy(np.concatenate([np.asarray(st.valid, dtype=bool) for _, st in items]))


class QEnsemble(nn.Module):
    r"""The mean of several Q-networks' Q-values: :math:`\bar Q(s, a) = \frac1K \sum_k \hat Q_k(s, a)`.

    Ours, after Averaged-DQN (Anschel, Baram and Shimkin, "Averaged-DQN: Variance Reduction and
    Stabilization for Deep Reinforcement Learning", ICML 2017), which averages the Q-estimates of
    one network's past snapshots to cut their variance; here the members are agents trained
    apart (other seeds, lengths or widths) in the same environment. Greedy decoding of the mean
    is still one pass: one Q read per decision, ``K`` networks' worth of arithmetic. Measured in
    docs/learning.md ("Ensembles"): agents that differ by their seed alone differ on the test
    families by more than most training options do, and their mean is at or ahead of every member
    on the validation families.

    Members of one shape (the same ``p``, ``T``, readout, aggregation, biases, feature columns and
    the ``eq3`` head) run side by side (:meth:`fused`): every sparse sum, gather and pooling is done
    once for all of them, on their states laid side by side, and only the dense maps member by
    member, so a decision costs one pass of Python and kernel launches per shape instead of one
    per member.  The Q-values are the members' to rounding (the sums run in another order); members
    of a shape of their own, or that cannot be fused, run alone.
    """

    def __init__(self, members: Sequence[nn.Module]) -> None:
        super().__init__()
        if len(members) < 2:
            raise ValueError("an ensemble needs at least two agents")
        self.members = nn.ModuleList(members)
        by_shape: dict[Any, list[int]] = {}
        for i, m in enumerate(self.members):
            shape = _shape(m)
            by_shape.setdefault(("alone", i) if shape is None else shape, []).append(i)
        #: indices of the members run together (side by side when more than one), in first-member order
        self.groups = list(by_shape.values())
        self.fusable = len(self.groups) == 1

    def forward(self, *args: Tensor) -> Tensor:
        q = []
        for group in self.groups:
            ms = [self.members[i] for i in group]
            q.append(self.fused(*args, members=ms) if len(ms) > 1 else ms[0](*args).unsqueeze(0))
        return torch.cat(q).mean(dim=0)

    def fused(self, x: Tensor, edge_index: Tensor, edge_attr: Tensor, batch: Tensor, current: Tensor,
              num_graphs: int, members: Sequence[QNetwork] | None = None) -> Tensor:
        """:meth:`QNetwork.forward` of ``members`` (of one shape; default all) at once, side by side
        in ``(N, K p)``: their Q-values, ``(K, N)``."""
        ms: list[QNetwork] = list(self.members if members is None else members)  # type: ignore[arg-type]
        first, n = ms[0], x.size(0)
        x = x[:, :first.in_features]
        p = first.w5.in_features

        def shared(mods: list[nn.Linear], h: Tensor) -> Tensor:  # every member's map of one input
            w = torch.cat([m.weight for m in mods])
            return nn.functional.linear(h, w, torch.cat([m.bias for m in mods]) if mods[0].bias is not None else None)

        def own(mods: list[nn.Linear], h: Tensor, width: int) -> Tensor:  # member i's map of its columns
            return torch.cat([m(h[:, i * width:(i + 1) * width]) for i, m in enumerate(mods)], dim=1)

        convs = [c.conv for c in ms]
        w4 = [c.w4 for c in convs]
        e = torch.relu(shared(w4, torch.cat([edge_attr.view(-1, 1), edge_attr.new_zeros(1, 1)])))  # last: self loop
        agg = scatter(e[:-1], edge_index[1], dim=0, dim_size=n, reduce="sum") + e[-1:]
        inv = first.conv._inv_size(edge_index, n, x)
        if inv is not None:
            agg = agg * inv
        static = shared([c.w1 for c in convs], x) + own([c.w3 for c in convs], agg, p)
        s = torch.relu(static)
        for _ in range(first.T - 1):
            agg = scatter(s.index_select(0, edge_index[0]), edge_index[1], dim=0, dim_size=n, reduce="sum") + s
            if inv is not None:
                agg = agg * inv
            s = torch.relu(static + own([c.w2 for c in convs], agg, p))
        pooled = scatter(s, batch, dim=0, dim_size=num_graphs, reduce=first.readout)
        g5, g6 = own([m.w5 for m in ms], pooled, p), own([m.w6 for m in ms], s[current], p)
        h8 = own([m.w8 for m in ms], s, p)
        h9 = shared([m.w9 for m in ms], x) if first.w9 is not None else None
        q = []
        for i, m in enumerate(ms):  # member i's head input, in QNetwork.forward's order
            cols = slice(i * p, (i + 1) * p)
            g = torch.cat([g5[:, cols], g6[:, cols]], dim=1)
            parts = [g[batch], h8[:, cols]] + ([h9[:, cols]] if h9 is not None else [])
            q.append(m.w7(torch.relu(torch.cat(parts, dim=1))).squeeze(1))
        return torch.stack(q)


def _shape(m: nn.Module) -> tuple | None:
    """What must agree for members to run fused (:meth:`QEnsemble.fused`); None: not fusable."""
    if type(m) is not QNetwork or not isinstance(m.w7, nn.Linear):
        return None
    return (m.w5.in_features, m.conv.w1.in_features, m.T, m.readout, m.conv.mean, m.w9 is not None,
            m.conv.w1.bias is not None)


def q_values(net: QNetwork, batcher: GraphBatcher, items: Sequence[tuple[int, DynamicState]]):  # noqa: ANN201
    """``(q, batch, offsets)``: Q of every node of every item, with the item index of each node."""
    x, ei, ea, b, cur, n, offsets = batcher.batch(items)
    return net(x, ei, ea, b, cur, n), b, offsets


def masked_argmax(q: Tensor, valid: Tensor, batch: Tensor, num_graphs: int, offsets: Tensor) -> Tensor:
    """Per graph, the local index of the valid node with the highest Q."""
    qm = torch.where(valid, q, torch.full_like(q, -torch.inf))
    best = scatter(qm, batch, dim=0, dim_size=num_graphs, reduce="max")
    is_best = (qm == best[batch]) & valid
    idx = torch.arange(q.numel())
    # first best node per graph
    first = scatter(torch.where(is_best, idx, torch.full_like(idx, q.numel())), batch, dim=0,
                    dim_size=num_graphs, reduce="min")
    return first - offsets
