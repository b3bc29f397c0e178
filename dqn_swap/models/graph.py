"""A graph network of the corpus generator's ``graph_network`` family (:mod:`dqn_swap.models.generator`).

:class:`GraphNetwork` is ``layers`` message-passing layers of PyTorch Geometric's own
convolutions -- GCN (Kipf and Welling, ICLR 2017), GIN (Xu et al., ICLR 2019, a two-layer
MLP per layer) or GAT (Velickovic et al., ICLR 2018, ``heads`` concatenated heads) --
with ReLU and dropout between them, and a linear classifier per node: node classification
(cross entropy per node) on random graphs (:func:`random_graphs`).

GCN and GAT add self-loops, and removing the existing ones first selects edges with a
boolean mask, whose size depends on the data: such a network does not run on ``meta``, so
the family records on ``cpu`` (``Family.device``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def _geometric():  # noqa: ANN202
    try:
        import torch_geometric.nn as gnn
    except ImportError:
        raise ValueError("graph networks need the torch-geometric package: pip install torch-geometric") from None
    return gnn


class GraphNetwork(nn.Module):
    """``layers`` ``conv`` layers (``"gcn"``, ``"gin"`` or ``"gat"``) of width ``hidden``, a linear head per node."""

    def __init__(self, conv: str, features: int, hidden: int, layers: int, classes: int, heads: int = 4,
                 dropout: float = 0.5) -> None:
        super().__init__()
        gnn = _geometric()
        convs: list[nn.Module] = []
        cin = features
        for _ in range(layers):
            if conv == "gcn":
                convs.append(gnn.GCNConv(cin, hidden))
            elif conv == "gin":
                convs.append(gnn.GINConv(nn.Sequential(nn.Linear(cin, hidden), nn.ReLU(), nn.Linear(hidden, hidden))))
            elif conv == "gat":
                convs.append(gnn.GATConv(cin, hidden // heads, heads=heads))
            else:
                raise ValueError(f"unknown graph convolution {conv!r}: 'gcn', 'gin' or 'gat'")
            cin = hidden
        self.convs = nn.ModuleList(convs)
        self.dropout = dropout
        self.head = nn.Linear(hidden, classes)

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        for conv in self.convs:
            x = F.dropout(F.relu(conv(x, edge_index)), self.dropout, self.training)
        return self.head(x)


def random_graphs(graphs: int, nodes: int, edges: int, randint) -> torch.Tensor:  # noqa: ANN001
    """``edge_index`` (2, graphs * edges) of ``graphs`` disjoint random graphs of ``nodes`` nodes and ``edges``
    directed edges each (endpoints uniform); ``randint(high, *shape)`` draws the endpoints."""
    ends = randint(nodes, 2, graphs, edges)
    offsets = torch.arange(graphs, device=ends.device).view(1, graphs, 1) * nodes
    return (ends + offsets).reshape(2, graphs * edges)


__all__ = ["GraphNetwork", "random_graphs"]
