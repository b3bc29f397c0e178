"""The program's bookkeeping: its variables (:class:`Columns`), its constraint matrix built row by row
(:class:`Rows`) and its size (:class:`ProgramSize`), what :mod:`.program` fills and the planner reports."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from scipy import sparse


class Columns:
    """The program's variables, one at a time: bounds, integrality and objective coefficient."""

    def __init__(self) -> None:
        self.lb: list[float] = []
        self.ub: list[float] = []
        self.integ: list[int] = []
        self.cost: list[float] = []

    def __len__(self) -> int:
        return len(self.lb)

    def new(self, lo: float = 0.0, hi: float = math.inf, binary: bool = False) -> int:
        """A new variable in ``[lo, hi]`` (binary: integral), with objective coefficient 0; its index."""
        self.lb.append(lo), self.ub.append(hi), self.integ.append(1 if binary else 0), self.cost.append(0.0)
        return len(self.lb) - 1


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


__all__ = ["Columns", "ProgramSize", "Rows"]
