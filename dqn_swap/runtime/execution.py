"""Follow a plan inside real PyTorch training: swap saved activations to host memory and
recompute the ones the plan removes, in every iteration, exactly as the plan's schedule says.

Usage (one iteration per ``with`` block; the object is reused across iterations)::

    runtime = PlannedExecution(model, plan, trace)
    for batch, target in loader:
        with runtime:
            loss = loss_fn(model(batch), target)
            loss.backward()
        optimizer.step()
        optimizer.zero_grad()

The runtime applies; it does not plan.  The simulator decided when each
prefetch starts and which re-runs happen before which op, and wrote it into
the plan (:class:`~dqn_swap.plan.Schedule`); :mod:`.index` says where in a
live iteration each decision applies.

How the live iteration is matched to the trace
----------------------------------------------
Autograd hands every tensor it saves for backward to the pack hook of
:func:`torch.autograd.graph.saved_tensors_hooks`.  The recorder numbered those
calls; the ``k``-th call of a live iteration therefore packs
``trace.saved[k]``.  Every pack is checked against what the recorder saw at
that pack (shape, dtype and storage size: exact for a trace recorded on the CPU
or ``meta``, in the allocator's 512-byte blocks for one recorded on CUDA;
storage sizes only for trace files written before shapes were recorded; the
same tensor id keeps the same storage), before the runtime acts on the tensor; so are the
number of packs (a pack beyond the trace's count, e.g. a second forward pass
in one block, at once; fewer at the block's end) and, with ``check="ops"`` (the
default), the name of every forward op the dispatch mode numbers from the module
calls, and the op count at every module call.  An op the trace does not have is
seen even where it saves nothing (``torch.tanh(x) + 1`` where the trace has
``tanh`` alone), and so is a mask or a layer that the data switches on: a plan
keeps its limit only on the iteration it was made for, whatever it does.  A
model that no longer matches its trace (another head, another batch size,
another model) raises :class:`TraceMismatchError` at the first difference, in
one line (or goes on in safe mode, ``on_mismatch="safe"``).  The hooks
therefore stay on for the whole block.  The op check costs the step a Python
dispatch per forward op (measured on the CPU, one thread: ``python
benchmarks/bench_runtime.py overhead``).  With ``check="packs"`` ops are numbered
only where a re-run needs them, and a plan without actions checks the first pack
only (the batch, usually) and then takes its hooks off.  Only tensors on the
runtime's device count, as in the recorder.  A pack the plan does nothing with
costs the check and a list lookup: the tensor itself is handed back to autograd.

A plan the simulator found infeasible (``plan.figures["feasible"]`` false) is
refused (:class:`InfeasiblePlanError`) unless ``allow_infeasible=True``.

Swap (:mod:`.swap`)
-------------------
The pack hook copies the whole storage into a pooled host buffer on a side
stream and returns a handle, so autograd no longer holds the device memory;
the runtime keeps the device bytes until the copy has completed, and bounds
the bytes in such copies at the most the simulator had.  The host waits for a
copy out where the simulation counts its bytes free
(:func:`dqn_swap.simulator.swap_out_ops`, the last pack or unpack before
that op): a host that ran ahead of the device would otherwise allocate for
later ops while the copies still hold their sources, and the caching
allocator's peak would be far above the plan's (on an H100, ResNet-50 at batch
64 planned for 2.59 GiB peaked at 4.60 GiB, unplanned 5.18; waiting, 2.48 GiB on
an H200).  A swapped input (the
batch, the labels) is the caller's storage: it is emptied only while nothing
outside autograd and the runtime holds it, so whatever the training loop reads
between forward and backward is whole; one the loop holds frees nothing (one
:class:`HeldInputWarning`; later iterations skip its copy).  Prefetches start, in
the schedule's order, at the first pack or unpack at or after their op
(progress through backward comes from the unpack hooks: every autograd node
unpacks its saved tensors right before it runs); the head of the queue waits
for its copy out to complete, as in the simulator.

Recompute (:mod:`.recompute`)
-----------------------------
A removed tensor is not saved.  The forward ops the schedule re-runs are
recorded by a dispatch mode that is on only around them; at the unpack of a
removed tensor the runtime re-runs the schedule's sequence for it, keeping
what it keeps and freeing what it frees.  Re-runs never change model state
(written arguments are copies, persistent tensors are read as the forward
pass read them) and draw the forward pass's random numbers.

Devices (:mod:`.backend`)
-------------------------
CUDA, the CPU (synchronous copies; exactness is tested on every machine) and
a stand-in device with late copies and a checker (:mod:`.standin`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar

import torch

from ..threads import module_call_hooks
from ..limits import LimitSpec, resolve_limit
from ..meter import gradient_bytes
from ..plan import Plan
from ..support import COMPILED_STEP, fsdp_param_groups, under_torch_compile
from ..trace import Trace, format_bytes
from .backend import Backend, backend_for
from .offload import HostOffload
from .index import SIZE_QUANTUM, PlanIndex, build_index, with_releases
from .recompute import RecomputeError, TraceMismatchError
from .swap import Swapper
from .iteration import _Iteration
from .vocabulary import (CHECKS, ON_MISMATCH, SHAPES, STEP_OWNER, HeldInputWarning, InfeasiblePlanError, IterationStats,
                         PlannedOutOfMemoryError, UnsupportedTrainingError, _FsdpFirstGather, enable_expandable_segments,
                         refuse_unsupported)

P = ParamSpec("P")
R = TypeVar("R")


# --------------------------------------------------------------------------- the runtime
class PlannedExecution:
    """Follow ``plan`` (made for ``trace``) in every iteration run inside ``with``.

    Args:
        model: the trained module (or its ``DistributedDataParallel`` wrapper); its parameters
            tell the device (``device`` overrides).  A model under FSDP2 (``fully_shard`` on a
            one-dimensional mesh) follows a plan made for its rank's trace (``docs/fsdp.md``);
            compiled models and other sharded setups are refused (:class:`UnsupportedTrainingError`).
        plan: the plan, with its schedule; its fingerprint must be the trace's (``check_plan``).  A
            plan without a schedule (a version 1 file) is refused (``ValueError``):
            :func:`dqn_swap.simulator.schedule_plan` adds it.
        trace: the trace the plan was made for, recorded on this model and batch size.
        device: where the model runs; default the model's parameters' device.
        backend: the device's streams and copies (:mod:`dqn_swap.runtime.backend`); default CUDA on
            a CUDA device, synchronous copies elsewhere.  Tests pass a
            :class:`~dqn_swap.runtime.standin.StandInBackend`.
        memory_limit: what the prefetches may fill on CUDA, any form of :mod:`dqn_swap.limits`;
            default ``plan.memory_limit``.
        max_inflight_bytes: bound on the device bytes held by copies to the host still running;
            default the most the simulator had (the plan's schedule), at least one tensor.
        expandable_segments: on CUDA, turn on the allocator's expandable segments (default).
        prefetch: issue prefetches ahead of reuse (otherwise every copy back is on demand).
        track_storages: keep weak references to every removed storage in
            ``stats.source_refs`` (tests check they were freed).
        check_plan: check the plan against the trace first, and simulate it: a plan the simulator
            finds infeasible, or whose schedule is not the one the simulator makes for its actions
            (a file edited by hand), is refused whatever its own figures say.  Off, the plan is
            followed as it is (tests force hand-written schedules this way).
        allow_infeasible: follow a plan the simulator finds infeasible (with ``check_plan`` off, one
            whose ``plan.figures["feasible"]`` is false); without it such a plan is refused
            (:class:`InfeasiblePlanError`).
        shapes: ``"exact"`` (default): every saved tensor has the shape the trace recorded;
            ``"bounded"``: a saved tensor may be smaller in any dimension (and its storage in
            bytes), as in a bucket of shapes whose trace is the bucket's envelope
            (:func:`dqn_swap.trace.envelope`): the same ops on smaller tensors, under the same
            schedule, hold at most the bytes the plan was made for.
        on_mismatch: ``"raise"`` (default): an iteration that is not the trace's stops with
            :class:`TraceMismatchError`; ``"safe"``: it goes on in safe mode from the point where it
            left the trace (every later saved tensor on the host until backward needs it,
            :mod:`.offload`, and what the plan kept on the device until then sent there too:
            ``stats.evicted``), and ``stats.divergence`` says what differed.
        check: ``"ops"`` (default) or ``"packs"``: what the live check compares (below).

    Every iteration is checked against the trace as it runs: at every pack of a saved tensor
    (the ``k``-th is ``trace.saved[k]``) its shape, dtype, storage size and the autograd node
    that made it must be what the recorder saw (storage sizes only, for a trace file written
    before shapes were recorded),
    and a block must pack exactly as many tensors as the trace; the first difference raises
    :class:`TraceMismatchError` (one line: the saved tensor, the op, what it was and is), before
    the runtime acts on that tensor.  The hooks stay on for the whole block, so a second forward
    pass in one block is refused at its first pack beyond the trace's count.

    ``check``: ``"ops"`` (default): besides the packs, every forward op's name is compared with
    the trace's, and the op count at every module call (module docstring); ``"packs"``: the
    saved tensors alone, and a plan without actions checks the first pack only and then runs
    exactly as without the runtime (cheaper by a Python dispatch per forward op, blind to ops
    that save nothing).

    Swapped inputs the training loop still holds are never emptied (:mod:`.swap`): reads of the
    batch or the labels between forward and backward see their bytes; the runtime then frees
    nothing for them, warns once (:class:`HeldInputWarning`, naming the input and the bytes the
    plan counted on) and skips their copy in later iterations.

    After each iteration ``stats`` holds its :class:`IterationStats`.
    """

    def __init__(self, model: torch.nn.Module | None, plan: Plan, trace: Trace, *,
                 device: str | torch.device | None = None, backend: Backend | None = None,
                 memory_limit: LimitSpec | None = None, max_inflight_bytes: int | None = None,
                 expandable_segments: bool = True, prefetch: bool = True, track_storages: bool = False,
                 check_plan: bool = True, allow_infeasible: bool = False, on_mismatch: str = "raise",
                 shapes: str = "exact", check: str = "ops") -> None:
        from ..checks import expect, expect_one_of

        expect_one_of(on_mismatch, ON_MISMATCH, "on_mismatch")
        expect_one_of(shapes, SHAPES, "shapes")
        expect_one_of(check, CHECKS, "check")
        self.bounded = shapes == "bounded"
        expect(model, torch.nn.Module, "model", none=True, what="a torch.nn.Module")
        expect(plan, Plan, "plan")
        expect(trace, Trace, "trace")
        refuse_unsupported(model)
        _check_feasible(trace, plan, check_plan, allow_infeasible)
        if plan.schedule is None:
            raise ValueError(f"the plan of planner {plan.planner!r} has no schedule (a version 1 file, or made "
                             "without the simulator): the runtime follows a schedule and makes none; "
                             "plan = dqn_swap.simulator.schedule_plan(trace, plan) adds it")
        if device is None:
            device = backend.device if backend is not None else None
        if device is None:
            params = list(model.parameters()) if model is not None else []
            device = params[0].device if params else torch.device("cpu")
        self.device = torch.device(device)
        if self.device.type == "cuda" and self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        self.cuda = self.device.type == "cuda"
        self.model = model
        self._root = model
        self.fsdp = bool(fsdp_param_groups(model))  # sharded with FSDP2 (fully_shard)
        self.plan = plan
        self.trace = trace
        self.memory_limit = (resolve_limit(trace, memory_limit) if memory_limit is not None
                             else int(plan.memory_limit))
        try:
            self.index: PlanIndex = build_index(trace, plan, check_ops=check == "ops")
        except ValueError as e:
            raise TraceMismatchError(str(e)) from None
        self.prefetch = prefetch
        self.track_storages = track_storages
        self.op_names = [trace.op_names[i] for i in trace.op_name.tolist()] if self.index.windows else []
        self.expandable_segments = bool(self.cuda and expandable_segments and enable_expandable_segments())
        self.backend: Backend = backend if backend is not None else backend_for(self.device)
        largest = max((int(trace.tensor_nbytes[t]) for t in self.index.swap), default=0)
        bound = max_inflight_bytes if max_inflight_bytes is not None else max(self.index.max_inflight_d2h_bytes,
                                                                              largest)
        self.swapper = Swapper(self.backend, bound)
        if self.backend.asynchronous and self.index.swap:
            from ..simulator import swap_out_ops

            # Where the simulation starts each copy out and frees the tensor's bytes (runtime.copies_out)
            with_releases(self.index, *swap_out_ops(trace, plan))
        self.expected = _expected_packs(trace, self.index)
        # Per pack, the autograd node that made the saved tensor (None: the trace does not say).
        nodes = trace.saved_nodes
        self.expected_nodes: list[str | None] | None = nodes if any(n is not None for n in nodes) else None
        self.safe_on_mismatch = on_mismatch == "safe"
        self.held_inputs: set[int] = set()  # swapped inputs the training loop held (HeldInputWarning)
        self._it: _Iteration | None = None
        self._hook: Any = None
        self.stats: IterationStats | None = None
        self.iterations = 0

    @property
    def pool(self) -> Any:
        """The pooled host buffers (:class:`~dqn_swap.runtime.swap.HostBufferPool`)."""
        return self.swapper.pool

    def plan_label(self) -> str:
        p = self.plan
        return (f"plan of planner {p.planner!r}: {p.n_swap} swaps, {p.n_recompute} recomputes, limit "
                f"{format_bytes(p.memory_limit)}, trace {p.trace_fingerprint}")

    # ------------------------------------------------------------ context
    def __enter__(self) -> "PlannedExecution":
        if self._it is not None:
            raise RuntimeError("PlannedExecution is already active: one `with` block per iteration, not nested")
        if under_torch_compile():
            raise UnsupportedTrainingError(COMPILED_STEP)
        STEP_OWNER.enter()
        self.swapper.poll()
        it = _Iteration(self)
        self._it = it
        allocated = self.backend.memory_allocated() if self.plan.actions else None
        if allocated is not None:
            # What the device holds beside the trace's own state as the iteration begins (cuBLAS's
            # workspaces, another model): the prefetch check compares the trace's bytes with the limit.
            # Gradients still alive are not counted as outside (the trace may not hold them): a
            # smaller estimate only makes the check stricter.
            grads = gradient_bytes(self.model, self.device.type) if self.model is not None else 0
            it.outside_bytes = max(0, allocated - self.trace.initial_bytes - grads)
        if not self.plan.actions:
            # nothing to do but check packs (check_pack): the saved tensors go to autograd
            if it.n_saved:
                torch._C._autograd._push_saved_tensors_default_hooks(it.check_pack, HostOffload.unpack)
                it.hooks_pushed = True
        else:
            torch._C._autograd._push_saved_tensors_default_hooks(it.pack, it.unpack)
            it.hooks_pushed = True
        if it.mode is not None:
            it.fsdp_first_gather = _FsdpFirstGather(it, self.model) if self.fsdp else None
            first = it.windows.get(-1)
            if first is not None and self._root is None:
                it.mode.start(first.start, first.end)  # no model to watch: the iteration starts here
            else:
                # Ops are numbered from the module calls of the forward pass (the trace's anchors);
                # a data-parallel wrapper's own work comes before the wrapped module's call.
                self._hook = module_call_hooks(it.module_call)
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: Any) -> None:
        it = self._it
        assert it is not None
        if self._hook is not None:
            self._hook.remove()
            self._hook = None
        try:
            it.finish()
        finally:
            if it.hooks_pushed:
                torch._C._autograd._pop_saved_tensors_default_hooks()
                it.hooks_pushed = False
            self._it = None
            STEP_OWNER.exit()
        self.iterations += 1
        self.stats = it.stats
        if exc is not None and isinstance(exc, torch.OutOfMemoryError) and not isinstance(exc, PlannedOutOfMemoryError):
            raise PlannedOutOfMemoryError(self.describe_oom(it, exc)) from exc
        if exc is None:
            it.check_count()

    def wrap(self, step: Callable[P, R]) -> Callable[P, R]:
        """``step`` (forward and backward of one iteration) run under this plan."""

        @functools.wraps(step)
        def planned(*args: P.args, **kwargs: P.kwargs) -> R:
            with self:
                return step(*args, **kwargs)

        return planned

    def synchronize(self) -> None:
        """Wait for every copy the runtime started (host buffers and device memory are then settled)."""
        self.swapper.synchronize()

    def describe_oom(self, it: _Iteration, exc: BaseException) -> str:
        if self.cuda:
            mem = (f"allocated {format_bytes(torch.cuda.memory_allocated(self.device))}, reserved "
                   f"{format_bytes(torch.cuda.memory_reserved(self.device))}")
        else:
            mem = "host memory"
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        return (f"out of memory in the {it.describe_position()}, following the {self.plan_label()}; {mem}, "
                f"of which the runtime holds {format_bytes(self.swapper.held_bytes)} (copies in flight, "
                f"prefetched); planned peak {format_bytes(self.plan.figures.get('peak_bytes', self.plan.memory_limit))}. "
                f"Cause: {first}")

    def summary(self) -> dict[str, Any]:
        """The plan as carried out and the last iteration's figures."""
        idx = self.index
        return {
            "plan": self.plan_label(),
            "device": str(self.device),
            "backend": type(self.backend).__name__,
            "swap_tensors": len(idx.swap),
            "recompute_tensors": len(idx.recompute),
            "recorded_ops": len(idx.record_ops),
            "max_inflight_bytes": self.swapper.max_inflight_bytes,
            "expandable_segments": self.expandable_segments,
            "pinned_pool_bytes": self.pool.allocated_bytes,
            "iterations": self.iterations,
            "last": self.stats.as_dict() if self.stats else None,
        }



def _check_feasible(trace: Trace, plan: Plan, check_plan: bool, allow_infeasible: bool) -> None:
    """Refuse, in one line naming where it runs out, a plan the simulator finds cannot run under its
    limit (its file's figures are not trusted with ``check_plan``), unless ``allow_infeasible``."""
    verdict = plan.figures
    if check_plan:
        plan.check_trace(trace)
        # A plan's figures and schedule are what its file says; the simulator says what they are.
        from ..simulator import verify_plan

        verdict = verify_plan(trace, plan).figures()
    if verdict.get("feasible") is False and not allow_infeasible:
        stuck = verdict.get("infeasible")
        where = ""
        if isinstance(stuck, dict) and isinstance(stuck.get("op"), int) and 0 <= stuck["op"] < trace.n_ops:
            needed, available = stuck.get("needed"), stuck.get("available")
            where = f" at {trace.op_label(stuck['op'])}"
            if isinstance(needed, (int, float)) and isinstance(available, (int, float)):
                where += f", which needs {format_bytes(needed)} with {format_bytes(available)} available"
        raise InfeasiblePlanError(
            f"the plan of planner {plan.planner!r} is infeasible: the simulator found it cannot run under its "
            f"limit of {format_bytes(plan.memory_limit)}{where}; re-plan with a higher limit, or pass "
            "allow_infeasible=True to follow it anyway")


def _expected_packs(trace: Trace, index: PlanIndex
                    ) -> list[tuple[torch.dtype | None, tuple[int, ...] | None, int, int]]:
    """Per pack of the trace, what the live check expects: dtype and shape (None: unknown) and the
    storage's bytes, ``below < nbytes <= size``."""
    # A trace recorded on CUDA stores sizes in the allocator's 512-byte blocks, one recorded on the
    # CPU or meta the storage's own bytes, compared exactly.
    exact = trace.meta.get("device") in ("cpu", "meta")
    sizes = (trace.tensor_nbytes[trace.saved] if exact else index.saved_sizes).tolist()
    dtypes = {d: getattr(torch, d) for d, _ in trace.saved_signatures
              if d is not None and isinstance(getattr(torch, d, None), torch.dtype)}
    return [
        (dtypes.get(d) if d is not None else None, shape, int(size), int(size) - (1 if exact else SIZE_QUANTUM))
        for (d, shape), size in zip(trace.saved_signatures, sizes)]


def prefetch_positions(trace: Trace, plan: Plan) -> dict[int, int]:
    """The op at which each swapped tensor's prefetch starts, by the plan's schedule (for inspection);
    ``ValueError`` for a plan without one (:func:`dqn_swap.simulator.schedule_plan` adds it)."""
    if plan.schedule is None:
        raise ValueError("the plan has no schedule; plan = dqn_swap.simulator.schedule_plan(trace, plan) adds it")
    return dict(plan.schedule.prefetch)


__all__ = ["HeldInputWarning", "InfeasiblePlanError", "IterationStats", "PlannedExecution",
           "PlannedOutOfMemoryError", "RecomputeError", "TraceMismatchError", "UnsupportedTrainingError",
           "enable_expandable_segments", "prefetch_positions", "refuse_unsupported"]
