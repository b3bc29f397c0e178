"""The program's bookkeeping: its constraint matrix built row by row (:class:`Rows`) and its size
(:class:`ProgramSize`), what :mod:`.program` fills and the planner reports."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from scipy import sparse


class Rows:
    """A sparse constraint matrix built row by row: ``lo <= A x <= hi``."""

    def __init__(self) -> None:
        self.r: list[int] = []
        self.c: list[int] = []
        self.v: list[float] = []
        self.lo: list[float] = []
        self.hi: list[float] = []

    def add(self, terms: Iterable[tuple[int, float]], lo: float = -math.inf, hi: float = math.inf) -> None:
        i = len(self.lo)
        for c, v in terms:
            self.r.append(i), self.c.append(c), self.v.append(v)
        self.lo.append(lo), self.hi.append(hi)

    def matrix(self, n_vars: int) -> sparse.csr_array:
        return sparse.csr_array((self.v, (self.r, self.c)), shape=(len(self.lo), n_vars))


@dataclass(frozen=True)
class ProgramSize:
    """How big a program is: variables, binaries, constraints, nonzeros."""

    variables: int
    binaries: int
    constraints: int
    nonzeros: int
    candidates: int
    checkpoints: int
    time_points: int


__all__ = ["ProgramSize", "Rows"]
