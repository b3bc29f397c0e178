"""``optimal``: the exact planner, and the certified bound that every other plan is measured against.

:class:`OptimalPlanner` solves the program of :mod:`.program` with HiGHS in
rounds of row generation:

1. checkpoints: the ``checkpoints`` critical ops of largest excess, and the
   first and last op over the limit;
2. solve (within what is left of ``time_limit``), take the solution's plan and
   replay it in the simulator;
3. if the simulator charges the plan no more than the program did, the plan is
   the program's optimum (up to ``gap``) and the rounds stop (a round cut short
   by its share of the time, ``round_time_limit``, is solved once more with all
   the time left); otherwise every op over the limit where the replay ran out
   of memory, stalled, or needs more than the limit is made a checkpoint (ops
   whose re-runs ran out of memory get the re-run rows), the plan is cut off,
   and the next round solves again.

Every round's dual bound is a lower bound on every plan's simulated makespan
(a program with fewer checkpoints is a relaxation of one with more, and each is
a relaxation of the simulator: :mod:`.program`), so the certified bound is the
largest of them and of :func:`dqn_swap.lower_bound.lower_bound`.  The plan
returned is the best simulated one among the rounds and the ``incumbents``
(cheap baselines whose plans seed the comparison, so that a solve cut short
by its time limit never returns worse than they do).

``Plan.settings`` carries ``certified_bound`` (seconds), ``certified_gap``
(makespan over that bound, minus one), ``proved_optimal``, ``bound_source``,
``solve_seconds``, ``rounds`` and the last program's size.
"""

from __future__ import annotations

import math
import sys
import time
from typing import Any

import numpy as np

from dqn_swap.agents.baselines.base import ActionSet, BasePlanner, Evaluator, TraceFacts
from dqn_swap.plan import ActionKind

from .program import SwapProgram, candidates, critical_ops
from .solver import Progress, solve

#: gaps at or below this count as proved optimal (the solver's own feasibility tolerance is ~1e-7)
OPTIMAL_GAP = 1e-6


class OptimalPlanner(BasePlanner):
    """Joint keep / swap / recompute by mixed-integer programming (HiGHS); see the module docstring.

    Settings:
        time_limit: seconds for the whole solve (all rounds); the bound found by then stands.
        round_time_limit: seconds a round may take before the last (default: a quarter of
            ``time_limit``, at least ``min(time_limit, 120)``).
        gap: HiGHS's relative optimality tolerance per round.
        checkpoints: critical ops enforced in the first round, and most added a round.
        rounds: most rounds of row generation.
        chain_depth, fifo: see :class:`~.program.SwapProgram`.
        incumbents: baselines whose plans compete with the program's.
        progress: write a live line (round, incumbent, bound, gap) to standard error.
    """

    name = "optimal"

    @classmethod
    def defaults(cls) -> dict[str, Any]:
        return {"time_limit": 600.0, "gap": 1e-4, "checkpoints": 10, "rounds": 30, "chain_depth": 3,
                "fifo": True, "incumbents": ("tflms", "window", "lru"), "progress": False, "round_time_limit": None}

    def choose(self, facts: TraceFacts, evaluator: Evaluator) -> tuple[ActionSet, dict[str, Any]]:
        s = self.settings
        sim = evaluator.simulator
        T = sim.compute_time
        limit = sim.memory_limit
        t_start = time.perf_counter()
        deadline = t_start + float(s["time_limit"])
        bound, source = float(sim.lower_bound), "lower bound"
        best: ActionSet = ()
        unplanned = evaluator.run(())
        best_ms = float(unplanned.makespan) if unplanned.feasible else math.inf

        # The incumbents: cheap baselines' plans.
        from dqn_swap.agents.baselines import get_planner

        incumbent_from = "none" if math.isfinite(best_ms) else None
        for name in s["incumbents"]:
            plan = get_planner(name).plan(evaluator.trace, limit, evaluator.profile)
            r = evaluator.run(plan.actions)
            if r.feasible and r.makespan < best_ms:
                best, best_ms, incumbent_from = plan.actions, float(r.makespan), name

        cands = candidates(sim)
        over = np.flatnonzero(sim.op_memory > limit)
        found: dict[str, Any] = {"candidates": len(cands)}
        rounds: list[dict[str, Any]] = []
        program_infeasible = False
        if len(over) and bound < best_ms * (1 - OPTIMAL_GAP):
            ks = set(critical_ops(sim, cands)[: int(s["checkpoints"])]) | {int(over[0]), int(over[-1])}
            reruns: set[int] = set()
            tried: list[ActionSet] = []  # replayed plans, cut off from later rounds
            tried_best = math.inf  # the least simulated makespan among them
            # A round may take a quarter of the time limit (but at least two minutes: below that a
            # ResNet-50 round finds no plan of its own), so that a plan the simulator charges more
            # than the program leaves time for the rounds that correct it; once the simulator agrees,
            # the last round gets all the time left.
            limit_s = float(s["time_limit"])
            round_cap = float(s["round_time_limit"] or max(limit_s / 4, min(limit_s, 120.0)))
            last = False
            for rnd in range(int(s["rounds"])):
                left = deadline - time.perf_counter()
                if left <= 0.5:
                    break
                budget = left if last or rnd == int(s["rounds"]) - 1 else min(left, round_cap)
                prog = SwapProgram(sim, cands, ks, rerun_points=reruns, exclude=tried,
                                   chain_depth=int(s["chain_depth"]), fifo=bool(s["fifo"]))
                show = self._progress_line(rnd, prog, T, best_ms) if s["progress"] else None
                out = solve(prog, time_limit=budget, gap=float(s["gap"]), on_progress=show)
                if show is not None:
                    sys.stderr.write("\n")
                row: dict[str, Any] = {"checkpoints": len(ks), "rerun_points": len(reruns), "cuts": len(tried),
                                       "status": out.status, "seconds": round(out.seconds, 3),
                                       "size": vars(prog.size)}
                rounds.append(row)
                if out.status == 2:
                    # No untried plan covers every checkpoint: without tried plans nothing fits;
                    # with them, the best tried plan is optimal.
                    if tried:
                        bound, source = max(bound, tried_best), "program"
                    else:
                        program_infeasible = True
                    break
                if math.isfinite(out.dual_bound):
                    # every plan is either tried (simulated: >= tried_best) or bounded by the program
                    b = min(prog.makespan_seconds(out.dual_bound), tried_best)
                    row["bound"] = b
                    if b > bound:
                        bound, source = b, "program"
                if out.x is None:  # no plan yet: the round ran out of time
                    if last:
                        break
                    last = True
                    continue
                acts = prog.actions(out.x)
                res = sim.run(acts, timeline=True)
                model = prog.makespan_seconds(out.objective)
                sim_ms = float(res.makespan) if res.feasible else math.inf
                row.update(program_makespan=model, simulated_makespan=sim_ms if res.feasible else None)
                if sim_ms < best_ms:
                    best, best_ms, incumbent_from = acts, sim_ms, "program"
                if best_ms <= bound * (1 + float(s["gap"])):
                    break  # proved, up to the solver's gap
                if sim_ms <= model * (1 + 1e-9) + 1e-12:
                    # The simulator agrees with the program: its optimum if the solver finished,
                    # else solve once more with all the time left.
                    if out.status == 0 or last:
                        break
                    last = True
                    continue
                # Disagreement: where memory ran out or the replay stalled, enforce memory from now on;
                # and cut this plan off (its cost is known).
                # at most `checkpoints` more a round, the busiest first: the program grows with each
                new = sorted(self._new_checkpoints(sim, res) - ks, key=lambda k: -int(sim.op_memory[k]))
                ks |= set(new[: int(s["checkpoints"])])
                reruns |= self._new_rerun_points(sim, acts, res)
                tried.append(acts)
                tried_best = min(tried_best, sim_ms)
            found["program_size"] = rounds[-1]["size"] if rounds else None
        if program_infeasible:
            found["no_plan_fits"] = "the program proves that no plan keeps every op under the limit"
        bound = min(bound, best_ms) if math.isfinite(best_ms) else bound
        gap = best_ms / bound - 1 if math.isfinite(best_ms) and bound > 0 else math.inf
        found.update(certified_bound=bound, bound_source=source, certified_gap=gap,
                     proved_optimal=bool(gap <= OPTIMAL_GAP), plan_from=incumbent_from,
                     solve_seconds=round(time.perf_counter() - t_start, 3), rounds=rounds)
        return tuple(best), found

    @staticmethod
    def _new_checkpoints(sim: Any, res: Any) -> set[int]:
        """Ops over the limit where the replay ``res`` ran out of memory, stalled, or needs more
        than the limit (its ``memory_need``: the plan's memory with instant swap-outs)."""
        limit = sim.memory_limit
        over = sim.op_memory > limit
        new = {int(k) for k in np.flatnonzero(res.memory_need > limit)}
        if not res.feasible and res.infeasible is not None:
            new.add(int(res.infeasible.op))
        st = res.op_start
        if st is not None and len(st) > 1:
            d = sim.trace.op_duration[: len(st) - 1]
            new.update(int(k) + 1 for k in np.flatnonzero(np.diff(st) - d > 1e-12))
        return {k for k in new if over[k]}

    @staticmethod
    def _new_rerun_points(sim: Any, acts: ActionSet, res: Any) -> set[int]:
        """Ops whose re-runs ran out of memory in the replay, or need more than the limit."""
        out: set[int] = set()
        if not res.feasible and res.infeasible is not None and res.infeasible.reason.startswith("recomputing"):
            out.add(int(res.infeasible.op))
        nxt = sim.event_next_use
        for a in acts:
            if a.kind == ActionKind.RECOMPUTE and res.memory_need[nxt[a.event]] > sim.memory_limit:
                out.add(int(nxt[a.event]))
        return out

    @staticmethod
    def _progress_line(rnd: int, prog: SwapProgram, T: float, best_ms: float):  # noqa: ANN205
        size = prog.size

        def show(p: Progress) -> None:
            inc = prog.makespan_seconds(p.incumbent) / T if math.isfinite(p.incumbent) else math.inf
            bnd = prog.makespan_seconds(p.bound) / T if math.isfinite(p.bound) else 0.0
            gap = f"{100 * (inc / bnd - 1):.3f} %" if math.isfinite(inc) and bnd > 0 else "-"
            sys.stderr.write(f"\roptimal: round {rnd + 1} ({size.binaries} binaries, {size.checkpoints} checkpoints)"
                             f"  incumbent {inc:.5f} T  bound {bnd:.5f} T  gap {gap}  {p.seconds:.0f} s   ")
            sys.stderr.flush()

        return show
