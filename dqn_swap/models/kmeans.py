"""One Lloyd iteration of K-means (Lloyd, "Least squares quantization in PCM", 1982) as a
module with no parameters: assign every point to its nearest centroid and move each
centroid to the mean of its points.

Every tensor has a data-independent shape (matmul distances, argmin, ``index_add_`` sums
and counts; no bincount/nonzero/unique), so it also runs on the ``meta`` device.  An
empty cluster keeps its previous centroid."""

from __future__ import annotations

import torch
from torch import nn


class KMeansStep(nn.Module):
    """Buffers ``points`` (n, d) and ``centroids`` (k, d); forward updates ``centroids`` in place and returns it."""

    points: torch.Tensor
    centroids: torch.Tensor

    def __init__(self, points: torch.Tensor, centroids: torch.Tensor) -> None:
        super().__init__()
        self.register_buffer("points", points)
        self.register_buffer("centroids", centroids)

    def forward(self) -> torch.Tensor:
        p, c = self.points, self.centroids
        # ||p - c||^2 = ||p||^2 - 2 p.c + ||c||^2
        dist = (p * p).sum(1, keepdim=True) - 2 * (p @ c.T) + (c * c).sum(1)
        assign = dist.argmin(dim=1)
        sums = torch.zeros_like(c).index_add_(0, assign, p)
        counts = torch.zeros(c.shape[0], dtype=p.dtype, device=p.device).index_add_(0, assign, torch.ones_like(p[:, 0]))
        new = torch.where(counts[:, None] > 0, sums / counts.clamp(min=1)[:, None], c)
        return self.centroids.copy_(new)
