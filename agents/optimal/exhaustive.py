"""Exhaustive enumeration of plans on small traces, and random small traces of every shape.

What the exact planner's certified bound is checked against: :func:`enumerate_plans`
simulates every plan (keep, swap or recompute each tensor at its valid event) and
returns the least makespan, the ground truth the program of :mod:`.program` must
never exceed (its optimum is a lower bound on every plan's simulated makespan).
:func:`random_case` draws the small traces this is done on: chains, skip
connections, kernel scratch, ops with several outputs, temporaries that a
re-run must re-create, ops that cannot be re-run (they write a buffer in place),
backward passes that bring saved tensors back in another order than they left
(and autograd nodes that unpack a tensor before the op that reads it), on every
device profile and on one with a single copy engine shared by both directions
(``duplex=False``).  Used by ``tests/agents/test_optimal_bound.py`` and
``benchmarks/bench_bound.py``.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import random
from dataclasses import dataclass

import numpy as np

from dqn_swap.cost import PROFILES, DeviceProfile
from dqn_swap.plan import Action, ActionKind
from dqn_swap.simulator import Simulator
from dqn_swap.trace import Phase, Role, Trace, TraceBuilder

MB = 1_000_000

#: the device profiles cases are drawn on: every named one, and one copy engine for both directions
CASE_PROFILES: tuple[DeviceProfile, ...] = tuple(PROFILES.values()) + (
    dataclasses.replace(PROFILES["v100-pcie3"], name="v100-pcie3-shared",
                        description="V100, PCIe 3, one copy engine shared by both directions", duplex=False),)

#: the shapes :func:`random_case` draws
SHAPES = ("chain", "skips", "scratch", "outputs", "out_of_order", "recompute_chain", "mixed")


@dataclass(frozen=True)
class Enumerated:
    """The best plan of an enumeration: its makespan (``inf`` if no plan fits), its actions, how
    many plans were simulated."""

    makespan: float
    actions: tuple[Action, ...]
    plans: int


def plan_choices(sim: Simulator) -> dict[int, list[Action | None]]:
    """Per tensor with a valid action, its choices: keep (``None``), swap, recompute where valid
    (at its last valid event: every valid event of a tensor is at the same op)."""
    trace = sim.trace
    can_swap, can_rec = sim.valid_actions()
    choices: dict[int, list[Action | None]] = {}
    for e in np.flatnonzero(can_swap).tolist():
        t = int(trace.event_tensor[e])
        opts: list[Action | None] = [None, Action(e, t, ActionKind.SWAP)]
        if can_rec[e]:
            opts.append(Action(e, t, ActionKind.RECOMPUTE))
        choices[t] = opts
    return choices


def count_plans(sim: Simulator) -> int:
    """How many plans :func:`enumerate_plans` would simulate."""
    return math.prod(len(c) for c in plan_choices(sim).values())


def enumerate_plans(sim: Simulator, max_plans: int = 50_000) -> Enumerated:
    """Simulate every plan on ``sim``'s trace, limit and profile; the best one (least makespan,
    the first in enumeration order among equals).  ``ValueError`` beyond ``max_plans`` plans."""
    choices = plan_choices(sim)
    total = math.prod(len(c) for c in choices.values())
    if total > max_plans:
        raise ValueError(f"{total} plans to enumerate, more than {max_plans}")
    best, best_actions = math.inf, ()
    for combo in itertools.product(*choices.values()):
        actions = tuple(a for a in combo if a is not None)
        r = sim.run(actions)
        if r.feasible and r.makespan < best:
            best, best_actions = r.makespan, actions
    return Enumerated(best, best_actions, total)


def _sizes(rng: random.Random) -> int:
    return rng.choice([6, 12, 24, 36]) * MB


def _duration(rng: random.Random) -> float:
    return rng.choice([0.5, 1, 2, 3]) * 1e-3


def random_trace(rng: random.Random, shape: str) -> Trace:
    """A small random training iteration of ``shape`` (one of :data:`SHAPES`).

    Forward: ``n`` ops, each reading the previous activation (and, with skips, an
    earlier one), writing one or two outputs (``outputs``); outputs are saved for
    backward, or temporaries freed after their last forward reader (a re-run must
    re-create them: ``recompute_chain``); an op that also writes a buffer in place
    cannot be re-run.  Backward: one node per forward op that saved something,
    in reverse order or shuffled (``out_of_order``); a node reads the incoming
    gradient and its saved tensors and frees them; a node of two ops unpacks its
    saved tensors before its first op although only its second reads one.
    """
    b = TraceBuilder()
    w = b.tensor(1000, Role.PARAMETER, preexisting=True)
    acts, saved_by, packs = _random_forward(rng, shape, b, w)
    _random_backward(rng, shape, b, w, acts, saved_by, packs)
    return b.build()



def _random_forward(rng: random.Random, shape: str, b: TraceBuilder, w: int
                    ) -> tuple[list[int], list[list[int]], list[int]]:
    """:func:`random_trace`'s forward pass into ``b`` (``w``: the weight every op reads): the forward
    values in order, the packs each op saved, and every pack."""
    chain = shape == "chain"
    skips = shape in ("skips", "mixed")
    scratch = shape in ("scratch", "mixed")
    outputs = shape in ("outputs", "mixed")
    rec_chain = shape in ("recompute_chain", "mixed")
    n = rng.randint(3, 5)
    buf = b.tensor(1000, Role.PARAMETER, preexisting=True)  # written in place by ops that cannot be re-run
    x0 = b.tensor(_sizes(rng), Role.INPUT, preexisting=True)
    acts = [x0]  # forward values, in order
    skippable: list[int] = []  # saved values a later op may read again (a skip connection)
    temps: dict[int, int] = {}  # temporary -> the op of its last forward reader
    saved_by: list[list[int]] = []  # per forward op, the packs it saved
    packs: list[int] = []
    for i in range(n):
        reads = [acts[-1], w]
        if skips and len(skippable) >= 2 and rng.random() < 0.5:
            reads.append(rng.choice(skippable[:-1]))
        n_out = 2 if outputs and rng.random() < 0.5 else 1
        outs = [b.tensor(_sizes(rng), Role.SAVED) for _ in range(n_out)]
        side_effect = not chain and rng.random() < 0.2
        op = b.op("aten.op", Phase.FORWARD, reads=reads, outputs=outs, writes=[buf] if side_effect else [],
                  duration=_duration(rng), scratch=_sizes(rng) * rng.choice([0, 1, 2]) if scratch else 0)
        # a temporary (not saved) input of this op is freed after it when nothing later reads it
        for t in reads:
            if t in temps and temps[t] == op:
                b.free(t)
        mine = []
        for j, out in enumerate(outs):
            if rec_chain and i < n - 1 and j == 0 and rng.random() < 0.4:
                b.set_role(out, Role.TEMPORARY)  # read by the next op only, then freed
                temps[out] = op + 1
            else:
                mine.append(b.mark_saved(out))
        saved_by.append(mine)
        packs += mine
        acts.append(outs[0])
        skippable += [t for t in outs if t not in temps]
    # Temporaries whose reader never came (the last op's) are freed at the end of forward.
    b.flush_frees()
    for t, reader in temps.items():
        if reader >= n:
            b.free(t)
    return acts, saved_by, packs


def _random_backward(rng: random.Random, shape: str, b: TraceBuilder, w: int, acts: list[int],
                     saved_by: list[list[int]], packs: list[int]) -> None:
    """:func:`random_trace`'s backward pass into ``b``: one node per forward op that saved something."""
    shuffled = shape in ("out_of_order", "mixed")
    g = b.tensor(1000, Role.TEMPORARY)
    last = [p for p in saved_by[-1]]
    loss_reads = [b.saved[p] for p in last] or [acts[-1]]
    b.op("aten.loss_backward", Phase.BACKWARD, reads=loss_reads, outputs=[g], duration=_duration(rng))
    nodes = [mine for mine in saved_by if mine]
    order = list(range(len(nodes)))[::-1]
    if shuffled:
        rng.shuffle(order)
    alive = set(b.saved[p] for p in packs)
    for node in order:
        mine = nodes[node]
        tensors = list(dict.fromkeys(b.saved[p] for p in mine if b.saved[p] in alive))
        if not tensors:
            continue
        two_ops = rng.random() < 0.3
        if two_ops:
            for p in mine:
                b.mark_unpacked(p)
            g2 = b.tensor(1000, Role.TEMPORARY)
            b.op("aten.node_first", Phase.BACKWARD, reads=[g, w], outputs=[g2], frees=[g], duration=_duration(rng))
            g = g2
        g2 = b.tensor(1000, Role.TEMPORARY)
        b.op("aten.node", Phase.BACKWARD, reads=[g, *tensors, w], outputs=[g2], frees=[g, *tensors],
             duration=_duration(rng))
        alive.difference_update(tensors)
        g = g2
    b.free(g)

def random_case(rng: random.Random, shape: str | None = None, max_plans: int = 2000,
                ) -> tuple[str, Trace, int, DeviceProfile]:
    """``(shape, trace, limit, profile)``: a random trace of ``shape`` (drawn if ``None``) with at
    most ``max_plans`` plans, a limit between its minimum and its peak memory, and a profile of
    :data:`CASE_PROFILES`."""
    shape = shape or rng.choice(SHAPES)
    while True:
        trace = random_trace(rng, shape)
        profile = rng.choice(CASE_PROFILES)
        lo, hi = int(trace.minimum_memory), int(trace.peak_bytes)
        limit = int(lo + rng.choice([0.1, 0.3, 0.5, 0.7, 0.9]) * (hi - lo))
        sim = Simulator(trace, limit, profile)
        if count_plans(sim) <= max_plans and np.any(sim.index.op_memory > limit):
            return shape, trace, limit, profile
