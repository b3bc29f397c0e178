"""The runtime's asynchronous code path on a stand-in device (no CUDA needed).

:class:`~dqn_swap.runtime.standin.StandInBackend` runs copies late on worker threads and
checks, in the manner of PyTorch's CUDA sanitizer, that no op reads a storage a copy is
still writing, that no buffer is reused before the copy that uses it has finished, and
that nothing a pending copy touches is freed.  The runtime must produce exactly the
unplanned training with zero violations: with late copies, a prefetch falling due while
its tensor is still being copied out, a forward pass whose graph is dropped without a
backward pass, many copies in flight, and random delays.  The last tests show the
checker catching each kind of mistake.
"""

from __future__ import annotations

import gc
from functools import lru_cache

import pytest
import torch

from dqn_swap.planners import manual_plan, saved_activations
from dqn_swap.recorder import record_trace
from dqn_swap.runtime import PlannedExecution
from dqn_swap.runtime.execution import _Iteration
from dqn_swap.runtime.standin import Gate, StandInBackend
from dqn_swap.runtime.swap import SwapGroup, Swapper

from ..runtime_support import MODELS, _zoo, assert_same_training, hand_plan, trace_of, train


def train_on(backend: StandInBackend, name: str, plan, **kwargs):  # noqa: ANN001, ANN201
    with backend.checking():
        got = train(name, plan, backend=backend, **kwargs)
    backend.synchronize()
    return got


@pytest.mark.parametrize("name,kind", [("resnet_tiny", "swap"), ("gpt_tiny", "mixed"), ("bn_inplace", "mixed")])
def test_late_copies_are_exact_and_clean(name: str, kind: str) -> None:
    backend = StandInBackend(delay=0.004)
    got = train_on(backend, name, hand_plan(name, kind))
    assert_same_training(name, got)
    assert backend.violations == [] and backend.copies > 0
    backend.close()


@pytest.mark.parametrize("seed", range(4))
def test_random_delays(seed: int) -> None:
    name = ["resnet_tiny", "gpt_tiny", "views_residual", "dropout"][seed]
    backend = StandInBackend(delay=(0.0, 0.006), seed=seed)
    got = train_on(backend, name, hand_plan(name, "mixed"))
    assert_same_training(name, got)
    assert backend.violations == []
    backend.close()


def test_a_prefetch_due_while_its_copy_out_runs_is_deferred_not_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    """Copies out take long and the limit is generous: every prefetch falls due at once, before the
    copies out have completed.  They wait at the head of the queue and start later.  (The host
    waits for no copy out here: with the plan's releases enforced it would wait for them all
    before any prefetch falls due, and this path would not run.)"""
    import dqn_swap.simulator

    ops = dqn_swap.simulator.swap_out_ops
    monkeypatch.setattr(dqn_swap.simulator, "swap_out_ops", lambda trace, plan: (ops(trace, plan)[0], {}))
    name = "resnet_tiny"
    trace = trace_of(name)
    plan = manual_plan(trace, swap=saved_activations(trace), memory_limit=trace.peak_bytes)
    # Copies out are held until a prefetch has been deferred, however quick or slow the host is.
    backend = StandInBackend(delay=0.0, gate=Gate(streams=(0,)))
    issue = _Iteration.issue_prefetches

    def issue_then_open(self: _Iteration) -> None:
        issue(self)
        if self.stats.deferred_prefetches:
            backend.gate.open()

    monkeypatch.setattr(_Iteration, "issue_prefetches", issue_then_open)
    got = train_on(backend, name, plan, steps=1)
    stats = got.runtime.stats
    assert_same_training_steps = train(name, steps=1)
    assert [torch.equal(a, b) for a, b in zip(got.losses, assert_same_training_steps.losses)] == [True]
    assert stats.deferred_prefetches > 0
    assert stats.prefetches > 0
    assert stats.prefetches + stats.on_demand_fetches + stats.read_before_copied_out >= plan.n_swap
    assert backend.violations == []
    backend.close()


def copies_back_held() -> StandInBackend:
    """Copies out (the first side stream) at once, copies back (the second) held at a gate."""
    return StandInBackend(delay=0.0, gate=Gate(streams=(1,)))


def forward_then_drop(backend: StandInBackend) -> PlannedExecution:
    """Forward passes whose prefetches start in forward, then graphs dropped without backward.

    The backend's gate, if it has one, holds the first pass's copies back until its graph has
    gone, so that they are still running when it goes, however loaded the machine."""
    name = "resnet_tiny"
    trace = trace_of(name)
    plan = manual_plan(trace, swap=saved_activations(trace), memory_limit=trace.peak_bytes)
    b0 = int((trace.op_phase == 0).sum())
    assert min(op for _, op in plan.schedule.prefetch) < b0  # the schedule prefetches during forward
    w = MODELS[name]()
    rt = PlannedExecution(w.model, plan, trace, backend=backend)
    with backend.checking():
        for _ in range(2):
            with rt:
                loss = w.loss_fn(w.model(*w.inputs))
            del loss  # no backward: autograd frees the graph and the runtime's handles
            gc.collect()
            if backend.gate is not None:
                backend.gate.open()
    return rt


def test_forward_without_backward_keeps_buffers_until_their_copies_end() -> None:
    backend = copies_back_held()
    rt = forward_then_drop(backend)
    assert rt.swapper.kept_for_copies > 0  # copies back were still running when the graph went
    rt.synchronize()
    assert not rt.swapper.graveyard and rt.swapper.held_bytes == 0
    assert backend.violations == []
    backend.close()


def test_a_dropped_graph_returns_a_swapped_input_only_after_its_copy_back() -> None:
    """A swapped input (a borrowed storage) refilled by a prefetch whose copy back still runs when its
    graph goes: the caller's next op on its batch must wait for that copy (CI caught this race in
    the test above, in about half of its runs, before the wait existed)."""
    backend = StandInBackend(delay=lambda stream: 0.0 if stream.index == 0 else 0.2)
    swapper = Swapper(backend, max_inflight_bytes=1 << 20)
    with backend.checking():
        torch.zeros(1) + 1  # the checker's first op is slow (a second); warm it up before the race
    batch = torch.arange(256, dtype=torch.float32)
    expected = batch.clone()
    storage = batch.untyped_storage()
    del batch  # handed over: a storage the caller still holds a tensor on is never emptied
    group = SwapGroup(swapper, tid=0, version=0, nbytes=storage.nbytes())
    group.remaining = 1  # backward would read it once
    swapper.swap_out(group, storage, borrowed=True)
    group.d2h_event.synchronize()
    group.op_done = True
    swapper.poll()
    assert group.emptied and storage.nbytes() == 0
    swapper.fetch(group)  # the prefetch: refilled in place by a copy back that takes 0.2 s
    swapper.retire(group)  # the graph goes without backward
    batch = torch.empty(0).set_(storage, 0, (256,), (1,))  # the caller's tensor on it again
    with backend.checking():
        again = batch * 1  # the training loop's next forward reads its batch
    assert backend.violations == []
    assert torch.equal(again, expected) and torch.equal(batch, expected)
    backend.close()


@lru_cache(maxsize=None)
def _zoo_trace(name: str, batch: int):  # noqa: ANN202
    w = _zoo(name, batch)()
    return record_trace(w.model, w.inputs, w.loss_fn, w.make_optimizer, device="cpu")


def late_copy_peak(name: str, planner: str, limit: str, releases: bool = True, batch: int | None = None
                   ) -> tuple[int, int, int, object]:
    """The measured peak (the CPU allocator's timeline, steady state) of ``planner``'s plan at ``limit``
    on a stand-in device whose copies take 20 ms each: far behind the host, as a GPU's copies are
    behind a host that queues kernels and returns; with the plan's releases enforced or not.
    ``batch``: the zoo network ``name`` at that batch size instead of the test model ``name``."""
    import dqn_swap.simulator as sim
    from dqn_swap.agents import get_planner
    from dqn_swap.integrations.experiment import measured_cpu_peak
    from dqn_swap.trace import resolve_memory_limit

    trace = trace_of(name) if batch is None else _zoo_trace(name, batch)
    plan = get_planner(planner).plan(trace, resolve_memory_limit(trace, limit))
    w = MODELS[name]() if batch is None else _zoo(name, batch)()
    opt = w.make_optimizer(w.model.parameters())
    backend = StandInBackend(delay=0.02)
    find = sim.swap_out_ops
    try:
        if not releases:
            sim.swap_out_ops = lambda trace, plan: (find(trace, plan)[0], {})
        rt = PlannedExecution(w.model, plan, trace, backend=backend)
    finally:
        sim.swap_out_ops = find
    measured = measured_cpu_peak(w.model, w.inputs, w.loss_fn, opt, rt, trace.initial_bytes)
    backend.close()
    assert backend.violations == []
    return measured, plan.memory_limit, sim.simulate(trace, plan).peak_bytes, rt.stats


@pytest.mark.parametrize("name,planner,limit,batch", [("resnet_tiny", "greedy", "50%", None),
                                                      ("gpt_tiny", "greedy", "30%", 4),
                                                      ("resnet_tiny", "lru", "30%", None)])
def test_late_copies_keep_the_plans_peak(name: str, planner: str, limit: str, batch: int | None) -> None:
    """The host waits for the copies out that the plan counts as done: the measured peak is the
    simulated one, under the limit, however late the copies run."""
    measured, limit_bytes, simulated, stats = late_copy_peak(name, planner, limit, batch=batch)
    assert measured <= simulated <= limit_bytes
    assert stats.release_waits > 0  # the copies were late: the host had to wait


@pytest.mark.parametrize("name,planner,limit", [("gpt_tiny", "vdnn", "30%"), ("resnet_tiny", "window", "30%"),
                                                ("gpt_tiny", "greedy", "30%")])
def test_every_release_has_a_point_of_control_before_its_op(name: str, planner: str, limit: str) -> None:
    """Each copy out the plan counts as done by op ``r`` is waited for at a pack or unpack that comes to
    the runtime before ``r`` allocates and whose horizon reaches ``r``: every pack in forward, and in
    backward the unpacks of packs the runtime acts on or marked for it (``index.with_releases``)."""
    from dqn_swap.agents import get_planner
    from dqn_swap.runtime.index import NO_OP
    from dqn_swap.trace import resolve_memory_limit

    trace = trace_of(name)
    plan = get_planner(planner).plan(trace, resolve_memory_limit(trace, limit))
    rt = PlannedExecution(None, plan, trace, backend=StandInBackend())
    ix = rt.index
    assert ix.release_ops
    if name == "gpt_tiny":
        assert max(ix.release_ops) >= ix.first_backward_op  # some are due in backward
    # (point, its horizon, whether it comes before its own op allocates: an unpack, or a pack of that
    # op's inputs; such a point may do the releases due at its op itself)
    points = [(p, h, bool(trace.saved_in_op[k] == 0 and trace.saved_op[k] == p))
              for k, (p, h) in enumerate(zip(ix.pack_position, ix.pack_horizon)) if p >= 0]
    points += [(u, h, True) for u, h, f in zip(ix.unpack_position, ix.unpack_horizon, ix.pack_flags)
               if f and u != NO_OP]
    for r in ix.release_ops:
        assert any(p < r <= h or (p == r <= h and before) for p, h, before in points), r
    assert any(p == r <= h for p, h, _ in points for r in ix.release_ops)  # some are done at their own op


def test_without_the_releases_late_copies_break_the_limit() -> None:
    """The control: a host that never waits for a copy out holds the sources of late copies while it
    allocates for the next ops, and the peak goes above the limit (what an H100 showed)."""
    measured, limit_bytes, _, stats = late_copy_peak("resnet_tiny", "greedy", "50%", releases=False)
    assert measured > limit_bytes and stats.release_waits == 0


class _FullDevice(StandInBackend):
    """A stand-in whose allocator reports a gigabyte beside the model's state (another model, library
    workspaces) and nothing else."""

    def __init__(self, base: int, **kwargs) -> None:  # noqa: ANN003
        super().__init__(**kwargs)
        self.base = base

    def memory_allocated(self) -> int:
        return self.base + 2**30


def test_memory_outside_the_trace_does_not_hold_prefetches_back() -> None:
    """The prefetch check counts the trace's bytes against the limit: what the device held outside
    the trace as the iteration began is taken out, so prefetches start as on a device without it."""
    name = "resnet_tiny"
    trace = trace_of(name)
    plan = manual_plan(trace, swap=saved_activations(trace), memory_limit=trace.peak_bytes)
    empty, busy = StandInBackend(delay=0.0), _FullDevice(trace.initial_bytes, delay=0.0)
    plain = train_on(empty, name, plan, steps=2).runtime.stats
    full = train_on(busy, name, plan, steps=2).runtime.stats
    assert full.prefetches == plain.prefetches > 0
    assert full.on_demand_fetches == plain.on_demand_fetches
    empty.close(), busy.close()


def test_many_copies_in_flight_are_bounded() -> None:
    name = "gpt_tiny"
    trace = trace_of(name)
    plan = manual_plan(trace, swap=saved_activations(trace))
    largest = max(int(trace.tensor_nbytes[a.tensor]) for a in plan.actions)
    bound = 2 * largest
    backend = StandInBackend(delay=0.01)
    got = train_on(backend, name, plan, steps=1, max_inflight_bytes=bound)
    swapper = got.runtime.swapper
    assert swapper.max_inflight_seen <= bound and swapper.bound_waits > 0
    assert backend.violations == []
    unbounded = StandInBackend(delay=0.01)
    loose = train_on(unbounded, name, plan, steps=1, max_inflight_bytes=10**12)
    assert loose.runtime.swapper.max_inflight_seen > bound  # without the bound they pile up
    backend.close(), unbounded.close()


def test_the_default_bound_is_the_simulators() -> None:
    trace = trace_of("gpt_tiny")
    plan = manual_plan(trace, swap=saved_activations(trace))
    rt = PlannedExecution(None, plan, trace, backend=StandInBackend())
    largest = max(int(trace.tensor_nbytes[a.tensor]) for a in plan.actions)
    assert rt.swapper.max_inflight_bytes == max(plan.schedule.max_inflight_d2h_bytes, largest)


# --------------------------------------------------------------------------- the checker
def held_copies() -> StandInBackend:
    """Copies on the first side stream held until the test opens the gate."""
    return StandInBackend(delay=0.0, gate=Gate(streams=(0,)))


def test_the_checker_catches_a_read_without_a_wait() -> None:
    backend = held_copies()
    stream = backend.new_stream()
    src, dst = torch.randn(1000), torch.empty(1000)
    with backend.checking():
        backend.copy(dst, src, stream)
        _ = dst + 1  # the copy into dst has not run yet
    backend.gate.open()
    backend.synchronize()
    assert any("still writing" in v for v in backend.violations)
    backend.close()


def test_the_checker_catches_a_freed_source() -> None:
    backend = held_copies()
    stream = backend.new_stream()
    dst = torch.empty(1000)
    src = torch.randn(1000)
    backend.copy(dst, src, stream)
    del src  # nobody keeps the source of the pending copy
    gc.collect()
    backend.gate.open()
    backend.synchronize()
    assert any("freed before the copy ran" in v for v in backend.violations)
    backend.close()


def test_the_checker_catches_a_buffer_reused_before_its_copy() -> None:
    backend = held_copies()
    s1, s2 = backend.new_stream(), backend.new_stream()
    host, a, b = torch.empty(1000), torch.randn(1000), torch.empty(1000)
    backend.copy(b, host, s1)  # reads host (held)
    backend.copy(host, a, s2)  # overwrites host without waiting for the first copy's event
    done = backend.record_event(s2)
    done.synchronize()  # the second copy has run while the first was held
    backend.gate.open()
    backend.synchronize()
    assert any("had not finished with the same buffer" in v for v in backend.violations)
    backend.close()


def test_dropping_buffers_early_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """A runtime that frees a dropped graph's device buffers at once (the old behaviour) is caught."""
    def retire_at_once(self: Swapper, g) -> None:  # noqa: ANN001
        self.give_back(g)  # a swapped input's bytes (not what this test is about)
        if g.dev is not None:
            g.dev = None
            self.held_bytes -= g.nbytes
        if g.host is not None:
            self.pool.release(g.host, g.h2d_event if g.h2d_event is not None else g.d2h_event)
            g.host = None

    monkeypatch.setattr(Swapper, "retire", retire_at_once)
    backend = copies_back_held()
    rt = forward_then_drop(backend)
    rt.synchronize()
    backend.synchronize()
    assert any("freed before the copy ran" in v for v in backend.violations)
    backend.close()
