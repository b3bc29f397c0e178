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

Where the replay disagrees with the program (charges more), the checkpoints
added are the ops over the limit where the replay needed memory that the
program did not enforce: where memory ran out or the replay stalled, and the
ops during which the admission rule held a swapped tensor away (from its
action to the op its copy back started in), where the program let it come
back (a copy back that starts later than the program assumed delays it and
every copy queued behind it).  A round that finds no such op cuts its plan off,
which is progress too: the program is a relaxation of the simulator
(:mod:`.program`), so the cut removes one plan and the bound can only rise
(on the 5,000 enumerated traces of ``benchmarks/bench_bound.py`` rounds of cuts
reach the optimum).  The rounds end at ``rounds``, at the time limit, or after
``cut_only_rounds`` cut-only rounds in a row where that is set (default: no
such limit), and ``stopped`` says which.

Every round's dual bound is a lower bound on every plan's simulated makespan
(a program with fewer checkpoints is a relaxation of one with more, and each is
a relaxation of the simulator: :mod:`.program`), so the certified bound is the
largest of them and of :func:`dqn_swap.lower_bound.lower_bound`.

The ``incumbents`` -- every baseline and ``dqn``'s single pass by default,
``dqn-search`` where asked for -- plan first.  Their plans seed every round
(HiGHS's starting solutions, the fastest simulated first, :mod:`.solver`) and
compete with the rounds' plans by simulated makespan, so ``optimal`` never
returns a plan slower than any of them, however short its time limit.

``Plan.settings`` carries ``certified_bound`` (seconds), ``certified_gap``
(makespan over that bound, minus one), ``proved_optimal``, ``bound_source``,
``plan_from`` (who made the plan returned: ``program``, an incumbent's name,
or ``none``), ``started_from`` and ``started_makespan`` (the best incumbent, where
the solve started), ``incumbents`` (each one's simulated makespan, ``None``
where its plan does not fit), ``solve_seconds`` (wall clock),
``solve_cpu_seconds`` (the CPU time the rounds received: on a busy machine far
below the wall clock), ``incumbents_cpu_seconds``, ``stopped``, ``rounds`` and
the last program's size.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dqn_swap.agents.baselines.base import ActionSet, BasePlanner, Evaluator, TraceFacts
from dqn_swap.plan import ActionKind
from dqn_swap.planner_options import checked_seconds

from dqn_swap.progress import Progress as ProgressLine
from dqn_swap.stop import check as check_stop

from .candidates import candidates, critical_ops
from .program import SwapProgram
from .solver import Progress, solve

#: gaps at or below this count as proved optimal (the solver's own feasibility tolerance is ~1e-7)
OPTIMAL_GAP = 1e-6

#: Most ops a round where the replay held a tensor away (:meth:`OptimalPlanner._new_checkpoints`).
HELD_PER_ROUND = 2

#: The planners whose plans seed the solve by default: every baseline and the agent's single pass
#: (``dqn-search``, whose local search costs more, only where asked for).
DEFAULT_INCUMBENTS = ("window", "greedy", "dynprog", "vdnn", "lru", "tflms", "sqrt-n", "layrub", "dqn")


@dataclass
class _Best:
    """What a solve has so far: the best plan replayed and who made it, and the best bound proved."""

    bound: float
    makespan: float
    actions: ActionSet = ()
    plan_from: str | None = None
    bound_source: str = "lower bound"
    no_plan_fits: bool = False

    def raise_bound(self, bound: float) -> None:
        """Keep ``bound``, a bound the program proved, where it is the best so far."""
        if bound > self.bound:
            self.bound, self.bound_source = bound, "program"


@dataclass
class _Enforced:
    """What the rounds' programs enforce: checkpoints, re-run points, and the plans replayed, cut off
    from later rounds (``tried_best``: the least simulated makespan among them)."""

    checkpoints: set[int]
    reruns: set[int] = field(default_factory=set)
    tried: list[ActionSet] = field(default_factory=list)
    tried_keys: set[ActionSet] = field(default_factory=set)
    tried_best: float = math.inf


class OptimalPlanner(BasePlanner):
    """Joint keep / swap / recompute by mixed-integer programming (HiGHS); see the module docstring.

    Settings:
        time_limit: CPU seconds for the whole solve (all rounds; the process's CPU time, HiGHS's
            threads included, :mod:`.solver`); the bound found by then stands.  The incumbents'
            planning is not counted (``incumbents_cpu_seconds`` reports it).
        wall_limit: wall-clock seconds for the whole solve (default: none).
        round_time_limit: CPU seconds a round may take before the last (default: a quarter of
            ``time_limit``, at least ``min(time_limit, 120)``).
        gap: HiGHS's relative optimality tolerance per round.
        checkpoints: critical ops enforced in the first round, and most added a round.
        rounds: most rounds of row generation.
        cut_only_rounds: stop after this many rounds in a row that only cut a plan off (``None``,
            the default: cuts are progress, the rounds go on to ``rounds`` or the time limit).
        chain_depth, fifo: see :class:`~.program.SwapProgram`.
        incumbents: planners whose plans seed the solve and compete with the program's (any of
            the baselines, ``dqn`` and ``dqn-search``; default :data:`DEFAULT_INCUMBENTS`).
        agent: the agent file of the ``dqn`` incumbents (default: the shipped agent).
        progress: report the rounds (round, incumbent, bound, gap) on standard error even outside
            :func:`dqn_swap.progress.showing` (inside it they are reported anyway).
    """

    name = "optimal"

    @classmethod
    def defaults(cls) -> dict[str, Any]:
        return {"time_limit": 600.0, "wall_limit": None, "gap": 1e-4, "checkpoints": 10, "rounds": 30,
                "chain_depth": 3, "fifo": True, "incumbents": DEFAULT_INCUMBENTS, "agent": None,
                "progress": False, "round_time_limit": None, "cut_only_rounds": None}

    def __init__(self, **settings: Any) -> None:
        super().__init__(**settings)
        s = self.settings
        s["time_limit"] = checked_seconds(self.name, "time_limit", s["time_limit"], optional=False)
        for key in ("wall_limit", "round_time_limit"):
            s[key] = checked_seconds(self.name, key, s[key])

    def progress_enabled(self) -> bool | None:
        return True if self.settings["progress"] else None

    def _incumbents(self, evaluator: Evaluator) -> list[dict[str, Any]]:
        """Every planner of ``incumbents`` on this trace and limit: its name, actions and simulated
        makespan (``None`` where its plan does not fit or it cannot plan: then ``error``)."""
        from dqn_swap.agents import get_planner, planner_names

        out = []
        for name in self.settings["incumbents"]:
            c0 = time.process_time()
            row: dict[str, Any] = {"name": name, "actions": (), "makespan": None}
            try:
                planner = (get_planner(name, agent=self.settings["agent"], threads=1) if name in planner_names("dqn")
                           else get_planner(name))
                plan = planner.plan(evaluator.trace, evaluator.memory_limit, evaluator.profile)
            except Exception as e:  # noqa: BLE001 -- one planner that cannot plan this case is recorded, not fatal
                row["error"] = f"{type(e).__name__}: {e}"[:200]
            else:
                r = evaluator.run(plan.actions)
                row["actions"] = tuple(plan.actions)
                row["makespan"] = float(r.makespan) if r.feasible else None
            row["cpu_seconds"] = round(time.process_time() - c0, 3)
            out.append(row)
            check_stop()  # a signal whose exception an incumbent swallowed (dqn_swap.stop.check)
        return out

    def choose(self, facts: TraceFacts, evaluator: Evaluator) -> tuple[ActionSet, dict[str, Any]]:
        sim = evaluator.simulator
        t_start = time.perf_counter()
        unplanned = evaluator.run(())
        best = _Best(bound=float(sim.lower_bound), makespan=float(unplanned.makespan) if unplanned.feasible
                     else math.inf)
        best.plan_from = "none" if math.isfinite(best.makespan) else None

        # The incumbents: the cheap planners' plans; the best is where the solve starts from.
        incumbents = self._incumbents(evaluator) if best.bound < best.makespan else []
        for row in sorted(incumbents, key=lambda r: math.inf if r["makespan"] is None else r["makespan"]):
            if row["makespan"] is not None and row["makespan"] < best.makespan:
                best.actions, best.makespan, best.plan_from = row["actions"], row["makespan"], row["name"]
        started_from, started_ms = best.plan_from, best.makespan
        # feasible incumbents, fastest first: HiGHS's starting solutions
        seeds = [r["actions"] for r in sorted((r for r in incumbents if r["makespan"] is not None),
                                              key=lambda r: r["makespan"])]

        cands = candidates(sim)
        over = np.flatnonzero(sim.index.op_memory > sim.memory_limit)
        found: dict[str, Any] = {"candidates": len(cands)}
        rounds: list[dict[str, Any]] = []
        stopped = None
        c_start = time.process_time()
        if len(over) and best.bound < best.makespan * (1 - OPTIMAL_GAP):
            stopped = self._rounds(evaluator, cands, over, seeds, best, rounds, t_start, c_start)
            found["program_size"] = rounds[-1]["size"] if rounds else None
        if best.no_plan_fits:
            found["no_plan_fits"] = "the program proves that no plan keeps every op under the limit"
        bound = min(best.bound, best.makespan) if math.isfinite(best.makespan) else best.bound
        gap = best.makespan / bound - 1 if math.isfinite(best.makespan) and bound > 0 else math.inf
        found.update(certified_bound=bound, bound_source=best.bound_source, certified_gap=gap,
                     proved_optimal=bool(gap <= OPTIMAL_GAP), plan_from=best.plan_from,
                     started_from=started_from,
                     started_makespan=started_ms if math.isfinite(started_ms) else None,
                     incumbents={r["name"]: {k: v for k, v in r.items() if k not in ("name", "actions")}
                                 for r in incumbents},
                     stopped=stopped,
                     solve_seconds=round(time.perf_counter() - t_start, 3),
                     solve_cpu_seconds=round(time.process_time() - c_start, 3),
                     incumbents_cpu_seconds=round(sum(r["cpu_seconds"] for r in incumbents), 3),
                     rounds=rounds)
        return tuple(best.actions), found

    def _rounds(self, evaluator: Evaluator, cands: list, over: np.ndarray, seeds: list[ActionSet], best: "_Best",
                rounds: list[dict[str, Any]], t_start: float, c_start: float) -> str | None:
        """The rounds of row generation (the module docstring's 2 and 3): each solves the program, replays
        its plan, and adds checkpoints and a cut where the simulator disagrees.  Updates ``best`` and
        appends a row per round to ``rounds``; returns why the rounds stopped short (``None``: settled).
        ``t_start``, ``c_start``: when the solve began, on the wall clock and in CPU time."""
        s, sim = self.settings, evaluator.simulator
        cpu_limit = float(s["time_limit"])
        wall_deadline = t_start + float(s["wall_limit"]) if s["wall_limit"] is not None else math.inf
        cut = _Enforced(set(critical_ops(sim, cands)[: int(s["checkpoints"])]) | {int(over[0]), int(over[-1])})
        # A round may take a quarter of the time limit (but at least two minutes: below that a
        # ResNet-50 round finds no plan of its own), so that a plan the simulator charges more
        # than the program leaves time for the rounds that correct it; once the simulator agrees,
        # the last round gets all the time left.
        round_cap = float(s["round_time_limit"] or max(cpu_limit / 4, min(cpu_limit, 120.0)))
        last, cut_only = False, 0
        for rnd in range(int(s["rounds"])):
            left = cpu_limit - (time.process_time() - c_start)
            wall_left = wall_deadline - time.perf_counter()
            if left <= 0.5 or wall_left <= 0.5:
                return "time limit"
            budget = left if last or rnd == int(s["rounds"]) - 1 else min(left, round_cap)
            prog = SwapProgram(sim, cands, cut.checkpoints, rerun_points=cut.reruns, exclude=cut.tried,
                               chain_depth=int(s["chain_depth"]), fifo=bool(s["fifo"]))
            show = (self._progress_line(evaluator.progress, rnd, prog, sim.compute_time)
                    if evaluator.progress is not None and evaluator.progress.enabled else None)
            starts = [a for a in ([best.actions] if best.actions else []) + seeds if a not in cut.tried_keys]
            out = solve(prog, time_limit=budget, gap=float(s["gap"]), on_progress=show, starts=starts,
                        wall_limit=wall_left if math.isfinite(wall_left) else None)
            row: dict[str, Any] = {"checkpoints": len(cut.checkpoints), "rerun_points": len(cut.reruns),
                                   "cuts": len(cut.tried),
                                   "status": out.status, "seconds": round(out.seconds, 3),
                                   "cpu_seconds": round(out.cpu_seconds, 3), "starts": out.starts_given,
                                   "size": vars(prog.size)}
            rounds.append(row)
            if out.status == 2:
                # No untried plan covers every checkpoint: without tried plans nothing fits;
                # with them, the best tried plan is optimal.
                if cut.tried:
                    best.raise_bound(cut.tried_best)
                else:
                    best.no_plan_fits = True
                return None
            if math.isfinite(out.dual_bound):
                # every plan is either tried (simulated: >= tried_best) or bounded by the program
                row["bound"] = min(prog.makespan_seconds(out.dual_bound), cut.tried_best)
                best.raise_bound(row["bound"])
            if out.x is None:  # no plan yet: the round ran out of time
                if last:
                    return "time limit"
                last = True
                continue
            acts = prog.actions(out.x)
            res = sim.run(acts, timeline=True)
            model = prog.makespan_seconds(out.objective)
            sim_ms = float(res.makespan) if res.feasible else math.inf
            row.update(program_makespan=model, simulated_makespan=sim_ms if res.feasible else None)
            if sim_ms < best.makespan:
                best.actions, best.makespan, best.plan_from = acts, sim_ms, "program"
            if best.makespan <= best.bound * (1 + float(s["gap"])):
                return None  # proved, up to the solver's gap
            if sim_ms <= model * (1 + 1e-9) + 1e-12:
                # The simulator agrees with the program: its optimum if the solver finished,
                # else solve once more with all the time left.
                if out.status == 0 or last:
                    return None
                last = True
                continue
            new, new_reruns = self._enforce(sim, cut, acts, res, sim_ms)
            row.update(added_checkpoints=new, added_rerun_points=new_reruns)
            if new or new_reruns:
                cut_only = 0
                continue
            cut_only += 1
            if s["cut_only_rounds"] is not None and cut_only >= int(s["cut_only_rounds"]):
                return (f"{cut_only} rounds in a row cut off a plan that the simulator charged more than "
                        "the program and found no op over the limit to enforce: the program and the "
                        "simulator disagree where memory is not the reason (copy order or timing)")
        return f"the rounds limit ({int(s['rounds'])}) was reached"  # every round ran and none settled it

    def _enforce(self, sim: Any, cut: "_Enforced", acts: ActionSet, res: Any, sim_ms: float) -> tuple[int, int]:
        """Where the replay ``res`` of the round's plan ``acts`` disagrees with the program: the ops where it
        needed memory the program did not enforce (ran out, stalled, needs more than the limit, or held a
        tensor away that the program let come back) become checkpoints, at most ``checkpoints`` a round,
        the busiest first (the program grows with each); and the plan is cut off (its cost is known).
        Returns how many checkpoints and re-run points were added."""
        new = sorted(self._new_checkpoints(sim, acts, res, cut.checkpoints) - cut.checkpoints,
                     key=lambda k: -int(sim.index.op_memory[k]))[: int(self.settings["checkpoints"])]
        new_reruns = self._new_rerun_points(sim, acts, res) - cut.reruns
        cut.checkpoints |= set(new)
        cut.reruns |= new_reruns
        cut.tried.append(acts)
        cut.tried_keys.add(tuple(acts))
        cut.tried_best = min(cut.tried_best, sim_ms)
        return len(new), len(new_reruns)

    @staticmethod
    def _new_checkpoints(sim: Any, acts: ActionSet, res: Any, ks: set[int] = frozenset()) -> set[int]:
        """Ops over the limit where the replay ``res`` of ``acts`` needed memory that the program did not
        enforce: where it ran out of memory, stalled, or needs more than the limit (its ``memory_need``:
        the plan's memory with instant swap-outs); and, for each swapped tensor, the ops it was held
        away during, from the op after its action to the op during which its copy back started (the
        admission rule keeps it away while an op before its use would not fit with it; the program,
        where those ops are not checkpoints, lets it come back at once, and its copy back and those
        queued behind it are then charged too early): a few a round, only where the first kind (minus
        the checkpoints ``ks`` already enforced) finds none."""
        limit = sim.memory_limit
        over = sim.index.op_memory > limit
        new = {int(k) for k in np.flatnonzero(res.memory_need > limit)}
        if not res.feasible and res.infeasible is not None:
            new.add(int(res.infeasible.op))
        st = res.op_start
        stalled: list[int] = []
        if st is not None and len(st) > 1:
            d = sim.trace.op_duration[: len(st) - 1]
            stalled = [int(k) + 1 for k in np.flatnonzero(np.diff(st) - d > 1e-12)]
            new.update(stalled)
        direct = {k for k in new if over[k]} - set(ks)
        if direct:
            return direct
        # Nothing over the limit ran out or stalled: the replay is slower because copies came back
        # later than the program let them.  The first stalled op waited for the tensors due by it
        # (and the H2D queue is in order of next use): enforce memory where those were held away.
        schedule = res.schedule
        if schedule is not None:
            back_at = {int(t): int(op) for t, op in schedule.prefetch}
            nxt = sim.index.event_return_op
            first_stall = stalled[0] if stalled else len(over)
            held: set[int] = set()
            # the tensors due by the first stall; if their ops are all enforced already, every swap
            for due in (first_stall, len(over)):
                for a in acts:
                    if a.kind != ActionKind.SWAP or int(nxt[a.event]) > due:
                        continue
                    start = back_at.get(int(a.tensor), int(nxt[a.event]))
                    first = int(sim.trace.event_op[a.event]) + 1
                    held.update(int(k) for k in np.flatnonzero(over[first:start + 1]) + first)
                held -= ks
                if held:
                    break
            # a few a round, the busiest first: these ops are where the plan's tensors were away, not
            # where memory ran out, and each one grows the program
            new |= set(sorted(held, key=lambda k: -int(sim.index.op_memory[k]))[:HELD_PER_ROUND])
        return {k for k in new if over[k]} - set(ks)

    @staticmethod
    def _new_rerun_points(sim: Any, acts: ActionSet, res: Any) -> set[int]:
        """Ops whose re-runs ran out of memory in the replay, or need more than the limit."""
        out: set[int] = set()
        if not res.feasible and res.infeasible is not None and res.infeasible.reason.startswith("recomputing"):
            out.add(int(res.infeasible.op))
        nxt = sim.index.event_return_op
        for a in acts:
            if a.kind == ActionKind.RECOMPUTE and res.memory_need[nxt[a.event]] > sim.memory_limit:
                out.add(int(nxt[a.event]))
        return out

    @staticmethod
    def _progress_line(line: ProgressLine, rnd: int, prog: SwapProgram, T: float):  # noqa: ANN205
        """The solver's progress callback of round ``rnd``: the incumbent, bound and gap (makespans in
        units of the compute time ``T``) on the planner's progress ``line``."""
        size = prog.size

        def show(p: Progress) -> None:
            def text() -> str:
                inc = prog.makespan_seconds(p.incumbent) / T if math.isfinite(p.incumbent) else math.inf
                bnd = prog.makespan_seconds(p.bound) / T if math.isfinite(p.bound) else 0.0
                gap = f"{100 * (inc / bnd - 1):.3f} %" if math.isfinite(inc) and bnd > 0 else "-"
                return (f"round {rnd + 1} ({size.binaries} binaries, {size.checkpoints} checkpoints), "
                        f"incumbent {inc:.5f} T, bound {bnd:.5f} T, gap {gap}, solver {p.seconds:.0f} CPU s")

            line(text)

        return show
