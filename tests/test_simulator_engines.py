"""The compiled engine agrees with the reference engine exactly: every figure (floats compared
with ``==``), the schedule, the memory need and the ignored actions, on random traces and
plans (swaps, recomputes, mixed; tight, loose and infeasible limits; duplex and simplex copy
engines; overcommit on and off).  ``benchmarks/bench_engines.py`` runs the same comparison on
10,000 pairs."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dqn_swap.plan import Action, ActionKind
from dqn_swap.simulator import SimResult, Simulator, simulate
from dqn_swap.trace import EventKind
from tests.test_simulator import event_of, figure4_trace, profile, random_plan, random_profile, random_trace

# Every SimResult field both engines fill (the timeline and op starts come from the reference only).
FIELDS = ("feasible", "makespan", "compute_time", "overhead", "stall", "stall_by_phase", "recompute_time",
          "bytes_d2h", "bytes_h2d", "peak_bytes", "peak_op", "memory_limit", "lower_bound",
          "makespan_over_lower_bound", "infeasible", "ignored_actions", "recompute_ops")


def differences(a: SimResult, b: SimResult) -> list[str]:
    """Names of what differs between two results (exact comparison, floats included)."""
    out = [f for f in FIELDS if getattr(a, f) != getattr(b, f)]
    for f in ("makespan", "overhead"):  # the same float, bit for bit (== would let 0.0 match -0.0)
        if math.copysign(1.0, getattr(a, f)) != math.copysign(1.0, getattr(b, f)):
            out.append(f"{f} sign")
    if not np.array_equal(a.memory_need, b.memory_need) or a.memory_need.dtype != b.memory_need.dtype:
        out.append("memory_need")
    if a.schedule != b.schedule:
        out.append("schedule")
    return out


def random_pair(seed: int) -> tuple[Simulator, Simulator, list[Action], bool]:
    """A random (trace, plan) and both engines' simulators: ``(compiled, python, actions, overcommit)``.

    The plan swaps, removes or mixes (a third each); the limit is random (often infeasible) or
    the plan's own need plus 0-3 bytes (feasible and tight); profiles duplex or single-engine; half
    the pairs gated (prefetches issued only at random points, ``Simulator.points``)."""
    rng = np.random.default_rng(seed)
    trace = random_trace(seed, max_layers=int(rng.choice([3, 7, 12])))
    prng = np.random.default_rng(seed + 1_000_003)  # apart, so that the other draws stay as they were
    points = np.flatnonzero(prng.random(trace.n_ops) < prng.choice([0.1, 0.3, 0.7])) if prng.random() < 0.5 else None
    prof = random_profile(rng)
    lo = max(trace.persistent_bytes, int(trace.minimum_memory * 0.9))
    limit = int(rng.integers(lo, max(int(trace.peak_bytes * 1.1) + 1, lo + 1)))
    sim = Simulator(trace, limit, prof, engine="compiled", points=points)
    actions = random_plan(sim, rng, float(rng.choice([0.2, 0.5, 0.9])))
    mode = int(rng.integers(3))
    if mode < 2:  # swaps only, removals only
        actions = [a for a in actions if a.kind == mode]
    if rng.random() < 0.4:
        limit = max(int(sim.memory_need(actions).max(initial=0)), trace.initial_bytes) + int(rng.integers(0, 4))
        sim = Simulator(trace, limit, prof, engine="compiled", index=sim.index, points=points)
    ref = Simulator(trace, limit, prof, engine="python", index=sim.index, points=points)
    return sim, ref, actions, bool(rng.random() < 0.5)


def check_pair(seed: int) -> list[str]:
    """Differences between the engines on pair ``seed`` (empty: they agree)."""
    sim, ref, actions, overcommit = random_pair(seed)
    a = ref.run(actions, overcommit=overcommit)
    b = sim.run(actions, overcommit=overcommit)
    diff = differences(a, b)
    if not np.array_equal(sim.memory_need(actions), ref.memory_need(actions)):
        diff.append("Simulator.memory_need")
    return diff


def test_engines_agree_on_random_pairs() -> None:
    bad = {seed: d for seed in range(300) if (d := check_pair(seed))}
    assert not bad, f"engines disagree: {dict(list(bad.items())[:5])}"


@pytest.mark.slow
def test_engines_agree_on_ten_thousand_pairs() -> None:
    bad = {seed: d for seed in range(10_000) if (d := check_pair(seed))}
    assert not bad, f"{len(bad)} disagreements: {dict(list(bad.items())[:5])}"


def test_the_pairs_cover_every_kind_of_run() -> None:
    """The generator makes feasible and infeasible runs, swaps and re-runs, stuck and overcommitted."""
    seen = set()
    for seed in range(300):
        sim, _, actions, overcommit = random_pair(seed)
        r = sim.run(actions, overcommit=overcommit)
        seen.add(("feasible" if r.feasible else "whole" if overcommit else "stuck",
                  bool(r.bytes_h2d), bool(r.recompute_ops), bool(sim.profile.duplex), bool(r.ignored_actions),
                  sim.points is not None))
    for i, what in enumerate(("feasible", "prefetch", "recompute", "duplex", "ignored", "gated")):
        assert {s[i] for s in seen} >= ({"feasible", "whole", "stuck"} if i == 0 else {True, False}), what


def test_run_arrays_and_timeline_runs_agree() -> None:
    for seed in range(40):
        sim, ref, actions, overcommit = random_pair(seed)
        a = sim.run(actions, overcommit=overcommit)
        ev, te, kd = (np.array([getattr(x, f) for x in actions], dtype=np.int64) for f in ("event", "tensor", "kind"))
        assert differences(a, sim.run_arrays(ev, te, kd, overcommit=overcommit)) == []
        assert differences(a, ref.run_arrays(ev, te, kd, overcommit=overcommit)) == []
        t = sim.run(actions, overcommit=overcommit, timeline=True)  # the reference, with its timeline
        assert differences(a, t) == [] and t.timeline is not None and a.timeline is None


def test_run_summary_is_the_run_arrays_result() -> None:
    """Both engines: the summary's figures are its result's, and its result is run_arrays' (made
    later from the same run: the arrays given may change meanwhile)."""
    for seed in range(60):
        sim, ref, actions, overcommit = random_pair(seed)
        ev, te, kd = (np.array([getattr(x, f) for x in actions], dtype=np.int64) for f in ("event", "tensor", "kind"))
        for s in (sim, ref):
            expected = s.run_arrays(ev, te, kd, overcommit=overcommit)
            summary = s.run_summary(ev, te, kd, overcommit=overcommit)
            inf = expected.infeasible
            assert (summary.feasible, summary.peak_bytes, summary.peak_op) == \
                (expected.feasible, expected.peak_bytes, expected.peak_op)
            assert math.copysign(1.0, summary.overhead) == math.copysign(1.0, expected.overhead)
            assert summary.overhead == expected.overhead
            assert summary.stuck_op == (-1 if inf is None else inf.op)
            assert summary.shortfall == (0 if inf is None else inf.needed - inf.available)
            assert np.array_equal(summary.memory_need, expected.memory_need)
            ev[:], te[:] = 0, 0  # the summary keeps copies
            assert differences(summary.result, expected) == [] and summary.result is summary.result
            ev, te, kd = (np.array([getattr(x, f) for x in actions], dtype=np.int64)
                          for f in ("event", "tensor", "kind"))


def test_run_summary_refuses_bad_arrays() -> None:
    trace, ids = figure4_trace()
    sim = Simulator(trace, 4, profile(bw=2.0))
    with pytest.raises(ValueError, match="invalid action: "):
        sim.run_summary(np.array([10**6]), np.array([0]), np.array([0]))
    with pytest.raises(ValueError, match="1-d arrays of one length"):
        sim.run_summary(np.array([1, 2]), np.array([0]), np.array([0]))


def test_invalid_actions_raise_the_same_message() -> None:
    trace, ids = figure4_trace()
    prof = profile(bw=2.0)
    sims = [Simulator(trace, 4, prof, engine=e) for e in ("compiled", "python")]
    e = event_of(trace, 1, ids["x0"])
    good = Action(e, ids["x0"], ActionKind.SWAP)
    for bad in (Action(10**6, 0, ActionKind.SWAP), Action(e, ids["x1"], ActionKind.SWAP),
                Action(event_of(trace, 0, ids["x0"], EventKind.MALLOC), ids["x0"], ActionKind.SWAP),
                Action(e, ids["x0"], 7), Action(float(e), ids["x0"], ActionKind.SWAP)):
        messages = []
        for sim in sims:
            with pytest.raises(ValueError) as err:
                sim.run([good, bad])
            messages.append(str(err.value))
        assert messages[0] == messages[1] and messages[0].startswith("invalid action: ")
    with pytest.raises(ValueError, match="invalid action"):
        sims[0].run_arrays(np.array([10**6]), np.array([0]), np.array([0]))


def test_engine_choice(monkeypatch: pytest.MonkeyPatch) -> None:
    trace, _ = figure4_trace()
    assert Simulator(trace, 4, profile()).engine == "compiled"
    monkeypatch.setenv("DQN_SWAP_ENGINE", "python")
    assert Simulator(trace, 4, profile()).engine == "python"
    assert simulate(trace, [], 7, profile()).feasible
    monkeypatch.setenv("DQN_SWAP_ENGINE", "fortran")
    with pytest.raises(ValueError, match="DQN_SWAP_ENGINE must be one of compiled, python"):
        Simulator(trace, 4, profile())
    with pytest.raises(ValueError, match="engine must be one of compiled, python, not 'c'"):
        Simulator(trace, 4, profile(), engine="c")


def test_a_read_only_install_still_finds_a_cache_for_the_kernels(monkeypatch, tmp_path) -> None:
    """Where neither the kernels' folder nor the user's cache folder can be written, Numba is pointed at
    a folder under the temporary directory instead of failing with "no locator available"."""
    import os

    import numba.core.config

    from dqn_swap.simulator import numba_cache

    monkeypatch.delenv("NUMBA_CACHE_DIR", raising=False)
    monkeypatch.setattr(numba.core.config, "CACHE_DIR", numba.core.config.CACHE_DIR)  # restored after the test
    monkeypatch.setattr(numba_cache.tempfile, "gettempdir", lambda: str(tmp_path))
    writable = numba_cache._writable
    (tmp_path / "file").write_text("x")
    assert writable(tmp_path / "new" / "deeper") and not writable(tmp_path / "file" / "x")  # under a file: never
    monkeypatch.setattr(numba_cache, "_writable", lambda folder: False)
    folder = numba_cache.ensure_cache_dir(numba_cache.__file__)
    assert folder is not None and folder.startswith(str(tmp_path)) and os.environ["NUMBA_CACHE_DIR"] == folder
    assert numba.core.config.CACHE_DIR == folder  # Numba already imported: told too
    assert numba_cache.ensure_cache_dir(numba_cache.__file__) is None  # a folder already set is kept
    monkeypatch.setattr(numba_cache, "_writable", lambda folder: True)
    monkeypatch.delenv("NUMBA_CACHE_DIR")
    assert numba_cache.ensure_cache_dir(numba_cache.__file__) is None  # a writable install: nothing set
