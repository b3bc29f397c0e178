"""The :class:`Simulator` (one trace, one limit, one profile; many plans) and its helpers."""

from __future__ import annotations

import os
from functools import cached_property
from operator import attrgetter, index
from typing import Any, Iterable

import numpy as np

from ..cost import DeviceProfile, profile_of
from ..limits import plan_bytes
from ..lower_bound import lower_bound
from ..plan import Action, ActionKind, Plan, Schedule
from ..stop import kernel_interruption
from ..trace import Trace
from .analysis import Analysis, analyse
from .engine import run_reference
from .index import IndexLists, TraceIndex
from .result import Infeasibility, RunSummary, SimResult, make_result, overhead_of
from .validity import ValidActions, valid_actions, why_invalid

#: The engines :class:`Simulator` can run: ``"compiled"`` (Numba, the default) and ``"python"``
#: (the reference).  The environment variable ``DQN_SWAP_ENGINE`` sets the default.
ENGINES = ("compiled", "python")
_EMPTY = np.zeros(0, dtype=np.int64)
_EVENT, _KIND, _TENSOR = attrgetter("event"), attrgetter("kind"), attrgetter("tensor")


def default_engine() -> str:
    """The engine a :class:`Simulator` uses when none is named: ``$DQN_SWAP_ENGINE`` or ``"compiled"``."""
    name = os.environ.get("DQN_SWAP_ENGINE", "") or "compiled"
    if name not in ENGINES:
        raise ValueError(f"DQN_SWAP_ENGINE must be one of {', '.join(ENGINES)}, not {name!r}")
    return name


class Simulator:
    """Simulates plans on one trace under one memory limit; construct once, :meth:`run` many times.

    ``engine``: ``"compiled"`` (default; :mod:`dqn_swap.simulator.compiled`) or ``"python"``
    (the reference, :mod:`dqn_swap.simulator.engine`); both give identical results.  A run with
    ``timeline=True`` always uses the reference.  ``index`` (:class:`TraceIndex`) holds the
    trace's static tables; pass one to share it between simulators of the same trace.
    ``points``: the ops at whose start a prefetch may be issued (:attr:`points`); by default the
    trace's :attr:`~dqn_swap.trace.Trace.progress_ops`, ``None`` for anywhere.
    """

    def __init__(self, trace: Trace, memory_limit: int, profile: DeviceProfile | None = None, *,
                 engine: str | None = None, index: TraceIndex | None = None,
                 points: Iterable[int] | None | str = "trace") -> None:
        profile = profile_of(trace, profile)
        if engine is None:
            engine = default_engine()
        if engine not in ENGINES:
            raise ValueError(f"engine must be one of {', '.join(ENGINES)}, not {engine!r}")
        if index is not None and index.trace is not trace:
            raise ValueError("index must be the TraceIndex of this trace")
        self.trace = trace
        self.memory_limit = plan_bytes(memory_limit, "Simulator")
        self.profile = profile
        self.engine = engine
        self.compute_time = trace.compute_time
        self.lower_bound = lower_bound(trace, self.memory_limit, profile)
        #: the trace's static tables (next uses, op memory, op inputs, ...)
        self.index = index if index is not None else TraceIndex(trace)
        self._valid = valid_actions(self.index)
        nbytes = self.index.tensor_nbytes
        #: per tensor, seconds of its device-to-host and host-to-device copies (float64)
        self.tt_d2h = np.ascontiguousarray(profile.transfer_time(nbytes, "d2h"), dtype=np.float64)
        self.tt_h2d = np.ascontiguousarray(profile.transfer_time(nbytes, "h2d"), dtype=np.float64)
        self._duplex = bool(profile.duplex)
        self._last_end = float(self.index.op_end[-1]) if self.index.n_ops else 0.0
        if isinstance(points, str):
            if points != "trace":
                raise ValueError(f"points must be 'trace', None or op indices, not {points!r}")
            points = trace.progress_ops
        #: Where the runtime has control, so that a prefetch can be issued: a bool per op (``None``:
        #: anywhere, at any time).  A gated run issues a prefetch only at the start of such an op (or
        #: of an op that waits for a copy back or re-runs ops first, where the runtime is in an
        #: unpack), allocating it then; its copy starts when the link is free (module docstring).
        #: ``horizon``: per op, the compute time from its start to the next point's (float64, one
        #: entry more than ops): at a point, prefetches are issued while the link would be free by then.
        self.points, self.horizon = _control_points(self.index, points)
        self._pts = self.points if self.points is not None else np.ones(self.index.n_ops, dtype=np.bool_)

    # ------------------------------------------------------------ tables
    @cached_property
    def lists(self) -> IndexLists:
        """The index as Python lists (the reference engine's tables)."""
        return IndexLists(self.index, self._valid.can_swap, self._valid.can_recompute)

    @cached_property
    def tt_lists(self) -> tuple[list[float], list[float]]:
        return self.tt_d2h.tolist(), self.tt_h2d.tolist()

    @cached_property
    def _kernel(self) -> tuple:
        """The compiled engine: ``(module, static arguments)``, the arguments of
        :func:`compiled.simulate` before the limit (:func:`compiled.pack_tables`' arrays, the op
        inputs as CSR, op durations, initial bytes), made once."""
        from . import compiled

        ix = self.index
        packed = compiled.pack_tables(ix.event_op, ix.event_return_op, ix.event_tensor, ix.tensor_held_op,
                                      ix.tensor_nbytes, ix.tensor_alloc_op, ix.tensor_free_op, ix.op_malloc,
                                      ix.op_scratch, ix.op_free, ix.op_phase, ix.op_memory, self.tt_d2h,
                                      self.tt_h2d, self._valid.can_swap, self._valid.can_recompute)
        kernel = compiled, (*packed, np.ascontiguousarray(ix.op_inputs_ptr, dtype=np.int64),
                            np.ascontiguousarray(ix.op_inputs_idx, dtype=np.int64),
                            np.ascontiguousarray(ix.op_duration, dtype=np.float64), int(ix.initial_bytes))
        if not _KERNELS_LOADED:
            _load_kernels(self, kernel)
        return kernel

    def _compiled_analysis(self, ev: np.ndarray, kd: np.ndarray, te: np.ndarray) -> tuple:
        """:func:`compiled.analyse` of valid action arrays."""
        c, (ev_tab, t_tab, op_tab, _tt, _ok, in_ptr, in_idx, _dur, _initial) = self._kernel
        try:
            return c.analyse(ev_tab[0], ev_tab[1], t_tab[0], t_tab[1], t_tab[2], t_tab[3], op_tab[0], op_tab[1],
                             in_ptr, in_idx, op_tab[4], ev, kd, te)
        except SystemError as e:
            raise kernel_interruption(e) from None

    # ------------------------------------------------------------- validity
    def valid_actions(self) -> ValidActions:
        """Static validity of actions per event (the DQN environment's mask).

        ``can_swap[e]`` / ``can_recompute[e]``: whether swapping / removing
        ``trace.event_tensor[e]`` right after ``trace.event_op[e]`` is valid
        (module docstring, "Validity").  The at-most-one-action-per-tensor rule
        is dynamic and not part of this mask.
        """
        return self._valid

    def why_invalid(self, action: Action) -> str | None:
        """``None`` if ``action`` is valid, else a one-line reason."""
        return why_invalid(self._valid, self.index, action)

    # ------------------------------------------------------------- analysis
    def analyse(self, actions: Iterable[Action]) -> Analysis:
        """Validate, deduplicate and analyse an action set (everything that does not need time;
        the reference engine's :class:`~dqn_swap.simulator.analysis.Analysis`)."""
        return analyse(self.index, self.lists, actions, self.why_invalid)

    def memory_need(self, actions: Iterable[Action] = ()) -> np.ndarray:
        """Bytes each op needs under ``actions`` if every swap-out completed at once
        (int64 per op; the admission rule's ``need``, a lower bound on what :meth:`run` sees)."""
        if self.engine == "python":
            return self.analyse(actions).need
        if not isinstance(actions, (list, tuple)):
            actions = list(actions)
        arrays = self._arrays(actions)
        if arrays is None:
            return self.analyse(actions).need
        self._check(arrays, actions)
        return self._compiled_analysis(*arrays)[19]

    def instant_copy_memory(self, actions: Iterable[Action], schedule: Schedule) -> np.ndarray:
        """Bytes allocated at each op when ``schedule`` is followed with copies that take no time.

        What a synchronous runtime (the CPU) holds: a swapped tensor leaves when
        its action's op ends and is back from the op at which the runtime
        starts its prefetch (the first of :attr:`Trace.progress_ops` at or after
        the schedule's op: in backward the runtime gets control only when a node
        unpacks its saved tensors) until it dies, a removed tensor is away until
        the re-runs before its next use.  It is :meth:`memory_need` plus every
        prefetch counted from its start: the simulator's own curve with the
        swap-out delays taken away.  int64 per op.
        """
        prep = self.analyse(actions)
        mem = prep.need.copy()
        points = self.trace.progress_ops
        nbytes = self.index.tensor_nbytes
        for tensor, op in schedule.prefetch:
            use = prep.next_use.get(tensor)
            if points is not None:
                # The runtime starts it at the first point at or after ``op`` where it learns how far
                # the iteration has come (a pack, or a node's unpacks in backward: Trace.progress_ops).
                j = int(np.searchsorted(points, op, side="left"))
                op = int(points[j]) if j < len(points) else self.index.n_ops
            if use is not None and use > op:
                mem[op:use] += int(nbytes[tensor])
        return mem

    # ------------------------------------------------------------------ run
    def run(self, actions: Iterable[Action] = (), *, timeline: bool = False,
            overcommit: bool = False) -> SimResult:
        """Simulate ``actions``; raises ``ValueError`` on an invalid action (see ``valid_actions``).

        ``overcommit=True``: where the plan does not fit, record the first such
        point (``infeasible``) and go on as if the device had just enough more
        memory from then on (the limit is raised by the shortfall; a prefetch
        that could never start is started when its tensor is needed), so that
        ``makespan`` and ``overhead`` cover the whole iteration.  A plan that
        fits runs exactly as without it.  The environment uses this to charge
        every action its whole cost when it is taken (section 4.7).
        """
        if self.engine == "python" or timeline:
            return run_reference(self, self.analyse(actions), timeline, overcommit)
        if not isinstance(actions, (list, tuple)):
            actions = list(actions)
        arrays = self._arrays(actions)
        if arrays is None:  # not plain integers: the reference words the error, or runs it
            return run_reference(self, self.analyse(actions), False, overcommit)
        return self._run_compiled(arrays[0], arrays[1], arrays[2], bool(overcommit), actions)

    def run_arrays(self, events: np.ndarray, tensors: np.ndarray, kinds: np.ndarray, *,
                   overcommit: bool = False) -> SimResult:
        """:meth:`run` for a plan given as three integer arrays (``Action`` fields: event, tensor,
        kind: 0 swap, 1 recompute): no Python object per action (planners, the environment)."""
        ev, te, kd = _plan_arrays(events, tensors, kinds)
        if self.engine == "python":
            return run_reference(self, self.analyse(_actions_of(ev, te, kd)), False, overcommit)
        return self._run_compiled(ev, kd, te, bool(overcommit), None)

    def run_summary(self, events: np.ndarray, tensors: np.ndarray, kinds: np.ndarray, *,
                    overcommit: bool = False) -> RunSummary:
        """:meth:`run_arrays`, returning only the figures a step-by-step environment reads at every
        step (a :class:`~dqn_swap.simulator.result.RunSummary`); its ``result`` is the
        :class:`SimResult` :meth:`run_arrays` returns, made from the same run when first asked for."""
        ev, te, kd = _plan_arrays(events, tensors, kinds)
        if self.engine == "python":
            return RunSummary.of(run_reference(self, self.analyse(_actions_of(ev, te, kd)), False, overcommit))
        out = self._simulate_compiled(ev, kd, te, bool(overcommit), None)
        c = self._kernel[0]
        s = out[1].tolist()
        f = out[2].tolist()
        feasible, whole, makespan = self._ending(c, s, f)
        stuck = s[c.STUCK]
        return RunSummary(feasible, overhead_of(feasible, whole, makespan, self.compute_time, f[c.ST_SWAP],
                                                f[c.ST_PF], f[c.ST_REC]),
                          s[c.ST_OP] if stuck else -1, s[c.ST_NEEDED] - s[c.ST_AVAIL] if stuck else 0,
                          s[c.PEAK], s[c.PEAK_OP], out[3], lambda: self._compiled_result(out, ev, kd, te, None))

    def _arrays(self, actions: list[Action] | tuple[Action, ...]) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """``(events, kinds, tensors)`` int64 arrays of ``actions``, or None where a field is not an
        integer (the reference then handles them)."""
        n = len(actions)
        if not n:
            return _EMPTY, _EMPTY, _EMPTY
        try:
            return (np.fromiter(map(index, map(_EVENT, actions)), np.int64, n),
                    np.fromiter(map(index, map(_KIND, actions)), np.int64, n),
                    np.fromiter(map(index, map(_TENSOR, actions)), np.int64, n))
        except (TypeError, AttributeError, OverflowError, ValueError):
            return None

    def _check(self, arrays: tuple[np.ndarray, np.ndarray, np.ndarray],
               actions: list[Action] | tuple[Action, ...] | None) -> None:
        """Raise the reference's ``ValueError`` for the first invalid action of ``arrays``."""
        c, (ev_tab, _t_tab, _op_tab, _tt, ok, *_rest) = self._kernel
        ev, kd, te = arrays
        try:
            bad = c.first_invalid(ev_tab[2], ok[0], ok[1], ev, kd, te)
        except SystemError as e:
            raise kernel_interruption(e) from None
        if bad >= 0:
            self._invalid(bad, ev, kd, te, actions)

    def _invalid(self, i: int, ev: np.ndarray, kd: np.ndarray, te: np.ndarray,
                 actions: list[Action] | tuple[Action, ...] | None) -> None:
        bad = actions[i] if actions is not None else _actions_of(ev[i:i + 1], te[i:i + 1], kd[i:i + 1])[0]
        raise ValueError(f"invalid action: {self.why_invalid(bad)}")

    def _run_compiled(self, ev: np.ndarray, kd: np.ndarray, te: np.ndarray, overcommit: bool,
                      actions: list[Action] | tuple[Action, ...] | None) -> SimResult:
        return self._compiled_result(self._simulate_compiled(ev, kd, te, overcommit, actions), ev, kd, te, actions)

    def _simulate_compiled(self, ev: np.ndarray, kd: np.ndarray, te: np.ndarray, overcommit: bool,
                           actions: list[Action] | tuple[Action, ...] | None) -> tuple:
        """:func:`compiled.simulate` of valid int64 action arrays (raises the reference's
        ``ValueError`` on the first invalid action)."""
        c, tables = self._kernel
        try:
            out = c.simulate(*tables, self.memory_limit, self._duplex, overcommit, ev, kd, te, self._pts,
                             self.points is not None, self.horizon)
        except SystemError as e:
            raise kernel_interruption(e) from None
        if out[0] >= 0:
            self._invalid(out[0], ev, kd, te, actions)
        return out

    def _ending(self, c: Any, s: list[int], f: list[float]) -> tuple[bool, bool, float]:
        """``(feasible, whole, makespan)`` from the compiled engine's (module ``c``) final state
        (``whole``: an overcommitted run that went to the end without fitting)."""
        if s[c.HALT]:
            return False, False, f[c.ST_TIME]
        makespan = self.compute_time + (f[c.CLOCK] - self._last_end) if self.index.n_ops else 0.0
        stuck = bool(s[c.STUCK])
        return not stuck, stuck, makespan

    def _compiled_result(self, out: tuple, ev: np.ndarray, kd: np.ndarray, te: np.ndarray,
                         actions: list[Action] | tuple[Action, ...] | None) -> SimResult:
        """The :class:`SimResult` of :meth:`_simulate_compiled`'s ``out``."""
        c = self._kernel[0]
        _bad, S, F, need, log = out
        s = S.tolist()
        f = F.tolist()
        n_rec, n_pf = s[c.REC_N], s[c.PLOG_N]
        rec_ops, plog_t, plog_k = log[:n_rec], log[n_rec:n_rec + n_pf], log[n_rec + n_pf:n_rec + 2 * n_pf]
        ignored = log[n_rec + 2 * n_pf:]
        ign = tuple(_actions_of(ev[ignored], te[ignored], kd[ignored])) if len(ignored) else ()
        infeasible = None
        if s[c.STUCK]:
            infeasible = Infeasibility(s[c.ST_OP], s[c.ST_NEEDED], s[c.ST_AVAIL],
                                       c.reason_text(s[c.ST_CODE], s[c.ST_ARG], self.trace))
        feasible, whole, makespan = self._ending(c, s, f)
        parts = _CompiledSchedule(self, ev, kd, te, plog_t, plog_k, s[c.MAX_PENDING])
        return make_result(feasible, whole, makespan, self.compute_time, f[c.ST_SWAP], f[c.ST_PF], f[c.ST_REC],
                           f[c.PH_STALL:c.PH_STALL + 3], s[c.BYTES_D2H], s[c.BYTES_H2D], s[c.PEAK],
                           s[c.PEAK_OP], self.memory_limit, self.lower_bound, infeasible, None, None, ign,
                           tuple(rec_ops.tolist()), need, parts)


class _CompiledSchedule:
    """The compiled engine's prefetch log, and its recompute groups (analysed again: the
    analysis is deterministic), turned into the reference's schedule parts when
    :attr:`SimResult.schedule` is first asked for."""

    __slots__ = ("sim", "arrays", "plog_t", "plog_k", "inflight")

    def __init__(self, sim: Simulator, ev: np.ndarray, kd: np.ndarray, te: np.ndarray, plog_t: np.ndarray,
                 plog_k: np.ndarray, inflight: int) -> None:
        self.sim, self.arrays, self.plog_t, self.plog_k, self.inflight = sim, (ev, kd, te), plog_t, plog_k, inflight

    def __call__(self) -> tuple:
        an = self.sim._compiled_analysis(*self.arrays)
        grp_n, grp_step_ptr, step_p = an[5], an[7], an[8]
        made_ptr, made_t, lr_ptr, lr_y, lr_p = an[12], an[13], an[14], an[15], an[16]
        prefetch = tuple(zip(self.plog_t.tolist(), self.plog_k.tolist()))
        sp, steps = grp_step_ptr.tolist(), step_p.tolist()
        mp, made = made_ptr.tolist(), made_t.tolist()
        lp, ly, lq = lr_ptr.tolist(), lr_y.tolist(), lr_p.tolist()
        sequences = {n: (steps[sp[g]:sp[g + 1]], set(made[mp[g]:mp[g + 1]]),
                         dict(zip(ly[lp[g]:lp[g + 1]], lq[lp[g]:lp[g + 1]])))
                     for g, n in enumerate(grp_n.tolist())}
        return prefetch, sequences, self.inflight, self.sim.lists.alloc


def _control_points(index: TraceIndex, points: Iterable[int] | None) -> tuple[np.ndarray | None, np.ndarray]:
    """``(mask, horizon)`` of :attr:`Simulator.points` and :attr:`Simulator.horizon` for op indices
    ``points`` (``None``: no gating, and a horizon of zeros)."""
    n = index.n_ops
    horizon = np.zeros(n + 1, dtype=np.float64)
    if points is None:
        return None, horizon
    at = np.asarray(points if isinstance(points, np.ndarray) else list(points), dtype=np.int64)
    mask = np.zeros(n, dtype=np.bool_)
    mask[at[(at >= 0) & (at < n)]] = True
    at = np.flatnonzero(mask)
    cum = np.concatenate([[0.0], np.cumsum(np.asarray(index.op_duration, dtype=np.float64))])
    j = np.searchsorted(at, np.arange(n), side="right")  # the first point after each op
    after = np.full(n, n, dtype=np.int64)  # none: to the end
    has = j < len(at)
    after[has] = at[j[has]]
    horizon[:n] = cum[after] - cum[:n]
    return mask, horizon


def _plan_arrays(events: np.ndarray, tensors: np.ndarray, kinds: np.ndarray) -> tuple[np.ndarray, ...]:
    """``(events, tensors, kinds)`` as int64 copies (a result's schedule is made from them when
    first asked for); ``ValueError`` unless they are 1-d and of one length."""
    ev, te, kd = np.array(events, dtype=np.int64), np.array(tensors, dtype=np.int64), np.array(kinds, dtype=np.int64)
    if not ev.shape == te.shape == kd.shape or ev.ndim != 1:
        raise ValueError(f"events, tensors and kinds must be 1-d arrays of one length, not of shapes "
                         f"{ev.shape}, {te.shape}, {kd.shape}")
    return ev, te, kd


_KERNELS_LOADED = False


def _load_kernels(sim: Simulator, kernel: tuple) -> None:
    """Load (or compile) the compiled kernels once per process, with SIGINT and SIGTERM held until
    they are ready, then acted on.

    Numba loads a kernel from its cache, or compiles it, on its first call, and treats an error
    raised meanwhile as a reason to compile again: a signal's exception arriving then would be
    lost and the command would go on.  So the first calls run with the signals noted
    (:func:`dqn_swap.stop.signals_noted`), on this simulator's own tables and an empty plan."""
    global _KERNELS_LOADED
    from ..stop import Stopped, signals_noted

    c, tables = kernel
    ev_tab, t_tab, op_tab, _tt, ok, in_ptr, in_idx, _dur, _initial = tables
    received: list[int] = []
    none = np.zeros(0, dtype=np.int64)
    with signals_noted(received):
        c.first_invalid(ev_tab[2], ok[0], ok[1], none, none, none)
        c.analyse(ev_tab[0], ev_tab[1], t_tab[0], t_tab[1], t_tab[2], t_tab[3], op_tab[0], op_tab[1],
                  in_ptr, in_idx, op_tab[4], none, none, none)
        c.simulate(*tables, sim.memory_limit, sim._duplex, False, none, none, none, sim._pts, sim.points is not None,
                   sim.horizon)
    _KERNELS_LOADED = True
    if received:
        raise Stopped(received[0])


def _actions_of(ev: np.ndarray, te: np.ndarray, kd: np.ndarray) -> list[Action]:
    return [Action(e, t, ActionKind(k) if k in (0, 1) else k) for e, t, k in zip(ev.tolist(), te.tolist(), kd.tolist())]


def schedule_plan(trace: Trace, plan: Plan, profile: DeviceProfile | None = None) -> Plan:
    """``plan`` with the :class:`~dqn_swap.plan.Schedule` the simulator decides for it (unchanged if
    it has one): what a version 1 plan file or a plan made by hand lacks for the runtime."""
    if plan.schedule is not None:
        return plan
    result = simulate(trace, plan, profile=profile)
    return plan.with_schedule(result.schedule)


def verify_plan(trace: Trace, plan: Plan, where: str | None = None) -> SimResult:
    """Simulate ``plan``, made for ``trace``, and check what its file can only claim: returns the
    simulation (whose ``feasible`` is the truth, whatever ``plan.figures`` says); raises
    :class:`~dqn_swap.pins.PinError` if it breaks the pins it records, and
    :class:`~dqn_swap.plan.PlanError` (one line) if the plan carries a schedule other than the one the
    simulator makes for its actions, limit and profile -- a file edited by hand, or made by another
    version -- since the runtime follows the schedule with memory no simulation checked."""
    from ..plan import PlanError

    from ..pins import check as check_pins

    check_pins(trace, plan, where)  # a plan that records pins and breaks them (an edited file)
    result = simulate(trace, plan)
    if plan.schedule is not None and result.feasible and result.schedule != plan.schedule:
        raise PlanError(f"{where or f'the plan of planner {plan.planner!r}'}: its schedule (prefetches and re-runs) "
                        "is not the one the simulator makes for its actions, limit and profile: an edited file, "
                        "or one made by another version of dqn-swap; re-plan with dqn-swap plan")
    return result


def _checked_plan(trace: Trace, plan: Plan, profile: DeviceProfile | None) -> DeviceProfile | None:
    """Check that ``plan`` matches ``trace`` and acts on each tensor at most once (``ValueError``);
    returns ``profile``, or the plan's own where none is given."""
    plan.check_trace(trace)
    tensors = [a.tensor for a in plan.actions]
    if len(set(tensors)) != len(tensors):
        dup = sorted({t for t in tensors if tensors.count(t) > 1})
        raise ValueError(f"plan has more than one action on tensor(s) {dup[:10]}; "
                         "a tensor is swapped or recomputed at most once")
    if profile is None and plan.profile:
        profile = profile_of(trace, plan.profile)
    return profile


def swap_out_ops(trace: Trace, plan: Plan,
                 profile: DeviceProfile | None = None) -> tuple[dict[int, int], dict[int, int]]:
    """Per swapped tensor of ``plan`` (for ``trace``): the op at whose end the simulation starts its copy
    to the host (its action's op, or the later op at whose end a holder outside autograd lets it go:
    ``Analysis.issues``), and the op from which it counts the tensor's bytes free: the first op to
    start at or after its copy ended (an op stalled for that copy starts when it ends, so it is that
    op), ``trace.n_ops`` for a copy that ended after the last op started.  One simulation for both.

    What a runtime on an asynchronous device follows so that its memory is the plan's: it starts
    each copy where the simulation does, and frees the bytes no later than the release op
    allocates, waiting for the copy where the device is behind (:mod:`dqn_swap.runtime.copies_out`).
    The simulation is the reference engine's, with its timeline, under the plan's limit and profile
    (or ``profile``)."""
    sim = Simulator(trace, plan.memory_limit, _checked_plan(trace, plan, profile))
    prep = sim.analyse(plan.actions)
    starts = {t: op for op, acted in prep.issues.items() for t, is_swap in acted if is_swap}
    result = run_reference(sim, prep, True, False)
    op_starts, ends = result.op_start, result.swap_out_end or {}
    assert op_starts is not None
    if not ends:
        return starts, {}
    tensors = np.fromiter(ends, dtype=np.int64, count=len(ends))
    ops = np.searchsorted(op_starts, np.fromiter(ends.values(), dtype=np.float64, count=len(ends)), side="left")
    ops[ops >= len(op_starts)] = trace.n_ops
    return starts, dict(zip(tensors.tolist(), ops.tolist()))


def instant_copy_peak(trace: Trace, plan: Plan, result: SimResult | None = None) -> int:
    """The peak a synchronous runtime (the CPU) holds when it follows ``plan``: the most of
    :meth:`Simulator.instant_copy_memory` under the plan's schedule (``result``: its simulation,
    when already at hand).  What measured CPU peaks are compared with."""
    schedule = (result if result is not None else simulate(trace, plan)).schedule
    return int(Simulator(trace, plan.memory_limit).instant_copy_memory(plan.actions, schedule).max())


def simulate(trace: Trace, plan_or_actions: Plan | Iterable[Action], memory_limit: int | None = None,
             profile: DeviceProfile | None = None, *, timeline: bool = False,
             overcommit: bool = False) -> SimResult:
    """Simulate a :class:`~dqn_swap.plan.Plan` (limit and profile from the plan unless given) or actions.

    A plan must match the trace (fingerprint) and carry at most one action per
    tensor (``ValueError`` otherwise); a plain iterable follows
    :meth:`Simulator.run` (later duplicates ignored and reported).
    """
    from ..checks import expect

    expect(trace, Trace, "trace")
    if isinstance(plan_or_actions, (str, bytes, os.PathLike)):
        raise TypeError("plan_or_actions must be a dqn_swap Plan (Plan.load(path) reads a file) or actions, "
                        f"not {type(plan_or_actions).__name__}")
    if isinstance(plan_or_actions, Plan):
        plan = plan_or_actions
        profile = _checked_plan(trace, plan, profile)
        if memory_limit is None:
            memory_limit = plan.memory_limit
        actions: Iterable[Action] = plan.actions
    else:
        actions = plan_or_actions
    if memory_limit is None:
        raise ValueError("memory_limit is required when simulating bare actions")
    return Simulator(trace, memory_limit, profile).run(actions, timeline=timeline, overcommit=overcommit)
