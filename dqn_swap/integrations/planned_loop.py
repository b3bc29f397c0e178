"""Planned training in the user's own loop, turned on with one line: :func:`autoplan`
(``dqn_swap.autoplan``).

::

    planned = dqn_swap.autoplan(model, "50%", optimizer=optimizer)
    for batch in loader:
        with planned.step():
            loss = model(**batch).loss
            loss.backward()
        optimizer.step(); optimizer.zero_grad()

What happens in the steps
-------------------------
Nothing is given but the model and a limit, so the first steps learn the iteration:

1. **Warm-up** (only with an ``optimizer`` that has not stepped yet): the step runs as the
   user wrote it, every activation autograd saves kept on the host (as
   :func:`torch.autograd.graph.save_on_cpu` does, parameters and inputs excepted), so that the
   optimizer creates its lazy state (Adam's moments) before the iteration is recorded: a
   recorded iteration must be a steady-state one.
2. **Recording**: the next step is recorded as the user makes it (:mod:`dqn_swap.recorder`:
   the model's positional and keyword arguments, whatever it returns, data-dependent calls
   such as ``.item()`` inside the library's code all run for real), again with the saved
   activations on the host, and the optimizer's ``step()`` that follows it joins the trace
   through the optimizer's step hooks.  The trace is planned at once
   (:func:`dqn_swap.get_planner`).
3. **Planned steps** follow the plan (:class:`~dqn_swap.runtime.PlannedExecution`) with the
   runtime's live check of every saved tensor against the trace.

**How the first steps stay under the limit.**  An unplanned step needs the trace's peak,
which is what does not fit.  Warm-up and recording keep every saved activation on the host
from the moment autograd saves it until backward needs it (one copy out and one back each),
so the device holds the model state, the op under way and its inputs and outputs: the
"0 %" minimum of :mod:`dqn_swap.limits` or less, below every limit a plan can meet.  (The
trace itself records the iteration as it is without the copies: the recorder counts
autograd's holder of a saved tensor as alive until backward releases it.)  They are slower
by those copies; :attr:`AutoPlan.log` says which steps were which, and
:attr:`AutoPlan.record_peaks` holds the recording's measured peak (allocated bytes above the
step's start, on cpu from the allocator's timeline, on cuda from its peak statistics).

**Shapes.**  A plan is made for one *signature*: the shapes, dtypes and devices of the
tensors the model is called with (keyword arguments included), its other arguments, whether
gradients already exist (the micro-steps of gradient accumulation after the first hold
them), training mode, autocast and the parameters' shapes.  A step whose signature has no
plan yet is recorded and planned (a short last batch, another sequence length), and the
decision is logged with one line (``new_shapes="plan"``, the default); ``new_shapes="refuse"``
raises instead.  A plan of another signature is never followed.

**Planning off the training thread.**  ``planning="background"`` plans each recorded
iteration on a worker thread while training goes on: until its plan is ready, the steps of
that signature run in safe mode (saved activations on the host, as in the recording: under
the limit, slower by the copies), and the first step after it is ready follows it.  The
default, ``"inline"``, plans on the training thread at the end of the recorded step (the
default planner takes 4-25 s).  The planner is built on the training thread; on the worker it
leaves the process's random generators and torch's thread count alone (both are shared with
the training thread, whose dropout masks and float sums depend on them).
:meth:`AutoPlan.wait_for_plans` waits for the plans under way.

**Files.**  ``cache=DIR`` keeps every trace and plan in ``DIR`` (one pair per signature,
``index.json`` naming them); the next run starts planned from its first step.  Nothing
there is overwritten: a signature already in the folder is read, never written again.

The planners live on the agents' side of the package; :func:`autoplan` reaches them
through :func:`dqn_swap.get_planner`, lazily, as the command line does.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import sys
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from ..cost import DEFAULT_PROFILE, DeviceProfile, get_profile
from ..limits import LimitSpec
from ..planners import DEFAULT_PLANNER
from ..units import format_bytes

from .settings import ATTACHED, AutoPlanError, attached, GROWTH_SLACK, MAX_VARIANTS, NEW_SHAPES, PLANNING, RECORD_TRIES, SHAPES
from .signature import signature
from .loop_recording import Entry, LoopRecording, _Recording, _StepState
from .loop_planning import LoopPlanning

log = logging.getLogger("dqn_swap.autoplan")


class AutoPlan(LoopRecording, LoopPlanning):
    """Planned training in the user's own loop (:func:`autoplan`; module docstring).

    Attributes:
        entries: signature key -> :class:`Entry` (trace, plan, runtime).
        log: one line per decision (warm-up, recording, new plan, planned step counts).
        record_peaks: per recorded signature, the device bytes the recording step allocated
            above its start at its peak (the allocator's timeline on cpu, peak statistics on cuda).
        recorded: per recorded step (its number among the steps), the key of the entry it was
            planned as, or of the variant it was found to be again.
        step_signatures: per step, the key of its signature (``variants`` holds its plans).
        last: the kind of the last step: ``"warmup"``, ``"record"``, ``"planned"``, ``"safe"`` (a
            signature whose recording made no valid trace runs in safe mode), or ``"waiting"`` (in
            safe mode while its plan is made on the worker thread, ``planning="background"``).
        last_entry: the :class:`Entry` the last planned step followed.
    """

    def __init__(self, model: torch.nn.Module, memory_limit: LimitSpec, *, planner: Any = DEFAULT_PLANNER,
                 optimizer: torch.optim.Optimizer | None = None, cache: str | Path | None = None,
                 allow_infeasible: bool = False, new_shapes: str = "plan",
                 profile: str | DeviceProfile | None = None, planner_options: dict[str, Any] | None = None,
                 verbose: bool = True, runtime_options: dict[str, Any] | None = None,
                 max_variants: int = MAX_VARIANTS, shapes: str = "bucket",
                 tensorboard: str | Path | None = None, log_every: int = 10, planning: str = "inline") -> None:
        planner, given_planner = _checked_arguments(model, planner, optimizer, cache, planner_options, runtime_options,
                                                    allow_infeasible, tensorboard, log_every, max_variants,
                                                    new_shapes, shapes, planning)
        from ..limits import MemoryLimit

        MemoryLimit.parse(memory_limit)  # a malformed limit is refused now, not at the first step
        self.model = model
        self.memory_limit = memory_limit
        self.planner_name = planner
        self.planner_options = dict(planner_options or {})
        self.optimizer = optimizer
        self.allow_infeasible = allow_infeasible
        self.new_shapes = new_shapes
        self.verbose = verbose
        self.runtime_options = dict(runtime_options or {})
        self.profile = get_profile(profile or DEFAULT_PROFILE) if not isinstance(profile, DeviceProfile) else profile
        params = list(model.parameters())
        self.device = params[0].device if params else torch.device("cpu")
        if self.device.type == "meta":
            raise AutoPlanError("autoplan trains for real: the model is on 'meta'; move it to its device "
                                "(record on meta with dqn_swap.record_trace instead)")
        self.max_variants = max_variants
        self.buckets = shapes == "bucket"
        self.replans = 0  # plans made again for a bucket's envelope (shapes="bucket")
        self.planning_seconds = 0.0  # CPU seconds (this thread) spent planning
        # Every input of a plan but the iteration itself: the limit, the planner and its options, the
        # profile, and whether shapes go by bucket (a bucket's plan is made for the largest of its members
        # so far).  Part of every entry's key, so that a cache made for one limit is never read for another.
        # (a planner object is known by its class and name: a cache keeps its plans under those)
        who = planner if given_planner is None else f"{type(given_planner).__module__}.{type(given_planner).__qualname__}:{planner}"
        inputs = (str(memory_limit), who, sorted(self.planner_options.items()), sorted(self.profile.to_dict().items()))
        self.plan_key = hashlib.sha256(repr(inputs + (("bucket",) if shapes == "bucket" else ())).encode()
                                       ).hexdigest()[:8]
        self.entries: dict[str, Entry] = {}
        self.variants: dict[str, list[Entry]] = {}  # signature key -> its variants, in the order planned
        self.safe_steps = 0  # planned steps that left their plan and ran on in safe mode
        # signature key -> steps still to record since one of its steps left its plan (RECORD_TRIES)
        self._record_next: dict[str, int] = {}
        self._recordings: dict[str, int] = {}  # signature key -> recordings made of it
        self._gave_up: set[str] = set()  # signatures whose iterations keep changing (said once)
        self._regrow: set[str] = set()  # entries recorded again because more was alive at a step's start
        self._safe_only: set[str] = set()  # signatures whose recording made no valid trace: safe mode
        self.log: list[str] = []
        self.record_peaks: dict[str, int] = {}
        self.recorded: dict[int, str] = {}  # recorded step -> the entry it was planned as, or found again
        self.step_signatures: dict[int, str] = {}  # step -> the key of the signature it was called with
        self.last: str | None = None
        self.last_entry: Entry | None = None
        self.steps = 0
        self._planner: Any = given_planner
        self._shapes: set[str] = set()  # shape keys of the calls seen in planned.step()
        self._warm = optimizer is None
        self._warm_pending = False
        self._state: _StepState | None = None
        self._recording: _Recording | None = None
        self._pending: _Recording | None = None  # forward and backward recorded, optimizer step to come
        self.cache = Path(cache) if cache is not None else None
        if self.cache is not None:
            self._load_cache()
        from ..scalars import ScalarLog

        self.log_every = log_every
        self._scalars = ScalarLog(tensorboard) if tensorboard is not None else None
        self.background = planning == "background"
        self._worker: Any = None  # the planning thread (a one-worker executor), made at its first plan
        self._jobs: dict[str, tuple[Any, str, Any]] = {}  # signature key -> (future, description, install)
        self.waiting_steps = 0  # steps run in safe mode while their signature's plan was being made
        self._root_hook = model.register_forward_pre_hook(self._root_call, with_kwargs=True, prepend=True)
        ATTACHED[model] = weakref.ref(self)
        self._opt_hooks = ((optimizer.register_step_pre_hook(self._optimizer_pre),
                            optimizer.register_step_post_hook(self._optimizer_post))
                           if optimizer is not None else ())

    # ------------------------------------------------------------------ the step
    @contextlib.contextmanager
    def step(self) -> Iterator["AutoPlan"]:
        """One forward and backward pass of the model, planned (module docstring)."""
        if self._state is not None:
            raise AutoPlanError("planned.step() is already active: one `with planned.step():` per iteration, "
                                "not nested")
        from ..runtime import STEP_OWNER, UnsupportedTrainingError

        try:
            STEP_OWNER.enter()
        except UnsupportedTrainingError as e:
            raise AutoPlanError(str(e)) from None
        try:
            if self._pending is not None:
                self._settle()  # no optimizer step came after it (gradient accumulation), or deferred
            state = self._state = _StepState()
            ok = False
            try:
                yield self
                ok = True
            finally:
                self._state = None
                self._end_step(state, ok)
        finally:
            STEP_OWNER.exit()

    def __deepcopy__(self, memo: dict) -> "AutoPlan":
        """A deep copy of the model (or of its optimizer) shares this planner, whose hooks it carries: the
        planner plans its own model only, so the copy (an EMA or evaluation model, say) runs unplanned."""
        return self

    def _root_call(self, module: torch.nn.Module, args: tuple, kwargs: dict) -> None:
        state = self._state
        if state is None or module is not self.model:
            return None  # a call outside planned.step() (evaluation), or of a copy of the model: untouched
        if state.kind is not None:
            self._abandon(state)
            raise AutoPlanError("the model was called twice in one planned.step(): one step holds one forward "
                                "pass (and its backward); use one `with planned.step():` per call")
        key, desc = signature(module, args, kwargs, optimizer=self.optimizer, buckets=self.buckets)
        key += self.plan_key
        self.step_signatures[self.steps] = key
        if self._jobs:
            self._collect()
        if key in self._jobs:  # its plan is being made on the worker: this step in safe mode
            state.kind = "waiting"
            state.offload = self._host_offload()
            return None
        variants = self.variants.get(key)
        if variants and self.new_shapes == "refuse":
            self._shapes.add(signature(module, args, kwargs, shapes_only=True)[0])
        if variants and key in self._record_next and self._warm:
            state.kind = "record"  # a step left its plan: record this one, a variant perhaps
            self._note(f"step {self.steps}: recording the iteration for {desc} again (a step left its plan; "
                       "saved activations on the host)")
            self._start_recording(module, args, kwargs, key, desc)
            return None
        if variants:
            # The variant most steps followed to the end (the first planned, between equals).
            entry = max(variants, key=lambda e: (e.followed, -e.variant))
            grown = self._growth(entry)
            if grown > 0 and self._warm:
                # More is alive as the step begins than when its plan was made (a cache the loop
                # keeps, another model's tensors): the plan's budget is off by that much.  Recorded
                # again, the trace holds the new bytes beside it and its plan is made for them.
                state.kind = "record"
                self._regrow.add(entry.key)
                self._note(f"step {self.steps}: {format_bytes(grown)} more alive as the step begins than when the "
                           f"plan of {desc} was made: recording it again")
                self._start_recording(module, args, kwargs, key, desc)
                return None
            state.kind, state.entry = "planned", entry
            rt = self._runtime(entry)
            rt.__enter__()
            it = rt._it
            if rt._hook is not None and it is not None:
                it.module_call(module, args)  # the root's call: the runtime's own hook came after it
            return None
        shapes = signature(module, args, kwargs, shapes_only=True)[0]
        if self._shapes and shapes not in self._shapes and self.new_shapes == "refuse":
            raise AutoPlanError(f"this step calls the model with {desc}, which has no plan "
                                f"(planned: {'; '.join(e.description for e in self.entries.values())}); "
                                "new_shapes='plan' records and plans it")
        self._shapes.add(shapes)
        if not self._warm or key in self._safe_only:
            state.kind = "warmup" if not self._warm else "safe"
            if state.kind == "warmup":
                self._note(f"step {self.steps}: warm-up ({desc}): saved activations on the host while the "
                           "optimizer creates its state")
            state.offload = self._host_offload()
            return None
        state.kind = "record"
        self._note(f"step {self.steps}: recording the iteration for {desc} (saved activations on the host)")
        self._start_recording(module, args, kwargs, key, desc)
        return None

    def _host_offload(self) -> contextlib.ExitStack:
        """Every saved activation to the host until backward needs it (warm-up, safe mode)."""
        from ..runtime import HostOffload

        stack = contextlib.ExitStack()
        hooks = HostOffload(self.device, self._persistent())
        stack.enter_context(torch.autograd.graph.saved_tensors_hooks(hooks.pack, hooks.unpack))
        return stack

    def _end_step(self, state: _StepState, ok: bool) -> None:
        self.steps += 1
        self.last = state.kind
        self.last_entry = state.entry
        if self._scalars is not None and self.steps % self.log_every == 0:
            self._scalars.write(self.figures(), self.steps)
        if state.kind == "planned":
            assert state.entry is not None
            rt = state.entry.runtime
            exc = sys.exc_info()
            rt.__exit__(*exc) if not ok else rt.__exit__(None, None, None)
            if ok:
                self._count(state.entry, rt.stats)
        elif state.kind in ("warmup", "safe", "waiting"):
            assert state.offload is not None
            state.offload.close()
            if ok and state.kind == "warmup":
                self._warm_pending = True
            elif ok and state.kind == "waiting":
                self.waiting_steps += 1
            elif ok:
                self.safe_steps += 1
        elif state.kind == "record":
            rec = self._recording
            assert rec is not None
            self._recording = None
            self._stop_forward_backward(rec)
            if not ok:
                self._close(rec)
                return
            self._pending = rec
            if self.optimizer is None:
                self._finish_recording()

    def _count(self, entry: Entry, stats: Any) -> None:
        """A planned step ended: it followed ``entry`` to the end, or left it and ran on in safe mode.
        Then the signature's next step is recorded, and planned if it is a new variant."""
        if stats is None or not stats.diverged:
            entry.followed += 1
            return
        entry.diverged += 1
        self.safe_steps += 1
        sig = entry.signature_key or entry.key
        self._note(f"step {self.steps - 1}: left the plan of {entry.description} (variant {entry.variant}): "
                   f"{stats.divergence}; ran on in safe mode from saved tensor #{stats.diverged_at}")
        if len(self.variants.get(sig, ())) >= self.max_variants or sig in self._gave_up:
            return
        if self._recordings.get(sig, 0) >= 3 * self.max_variants:
            self._gave_up.add(sig)
            self._note(f"{entry.description}: its iterations keep changing ({self._recordings[sig]} recordings, "
                       f"{len(self.variants[sig])} variants): steps that leave a plan run in safe mode from there")
            return
        self._record_next.setdefault(sig, RECORD_TRIES)

    def _growth(self, entry: Entry) -> int:
        """Bytes alive on the device as a step begins beyond what ``entry``'s plan was made for (its
        trace's state and the bytes beside it), past :data:`GROWTH_SLACK`; 0 where the device does
        not say (the cpu: no allocator statistics; there the signature, the optimizer's layout and
        the outputs held are what changes memory between steps)."""
        if self.device.type != "cuda":
            return 0
        alive = torch.cuda.memory_allocated(self.device)
        grown = alive - entry.trace.initial_bytes - entry.trace.outside_bytes
        return grown if grown > max(GROWTH_SLACK, entry.trace.initial_bytes // 100) else 0

    # ---------------------------------------------------------------- recording
    def _persistent(self) -> set[int]:
        keys = {p.untyped_storage()._cdata for p in self.model.parameters()}
        keys |= {b.untyped_storage()._cdata for b in self.model.buffers()}
        return keys

    def _runtime(self, entry: Entry) -> Any:
        if entry.runtime is None:
            from ..runtime import PlannedExecution
            from ..simulator import schedule_plan

            entry.plan = schedule_plan(entry.trace, entry.plan)  # a version 1 plan file has none
            opts = dict(self.runtime_options)
            if self.allow_infeasible:
                opts.setdefault("allow_infeasible", True)
            opts.setdefault("on_mismatch", "safe")
            if self.buckets:
                opts.setdefault("shapes", "bounded")
            entry.runtime = PlannedExecution(self.model, entry.plan, entry.trace, **opts)
        return entry.runtime

    def _note(self, line: str) -> None:
        self.log.append(line)
        log.info(line)
        if self.verbose:
            print(f"dqn-swap: {line}", file=sys.stderr, flush=True)

    @property
    def stats(self) -> Any:
        """The last planned step's :class:`~dqn_swap.runtime.IterationStats` (None before one ran)."""
        done = [e.runtime for e in self.entries.values() if e.runtime is not None and e.runtime.stats is not None]
        return done[-1].stats if done else None

    def figures(self) -> dict[str, float | int]:
        """What planned training reports where users look (the Trainer's logs, TensorBoard): the
        steps, plans and signatures so far, steps in safe mode, the CPU seconds spent planning; for
        the plan the last planned step followed, its limit, its simulated peak and its predicted
        overhead (time over unplanned, minus 1); on CUDA, the device's peak allocated so far."""
        out: dict[str, float | int] = {
            "dqn_swap/steps": self.steps, "dqn_swap/plans": len(self.entries),
            "dqn_swap/signatures": len(self.variants), "dqn_swap/safe_steps": self.safe_steps,
            "dqn_swap/plans_under_way": len(self._jobs), "dqn_swap/waiting_steps": self.waiting_steps,
            "dqn_swap/planning_seconds": round(self.planning_seconds, 3)}
        entries = [e for e in self.entries.values() if e.followed or e.diverged]
        entry = self.last_entry or (entries[-1] if entries else None)
        if entry is not None:
            out["dqn_swap/memory_limit_bytes"] = int(entry.plan.memory_limit)
            peak, overhead = entry.plan.figures.get("peak_bytes"), entry.plan.figures.get("overhead")
            if isinstance(peak, (int, float)):
                out["dqn_swap/planned_peak_bytes"] = int(peak)
            if isinstance(overhead, (int, float)):
                out["dqn_swap/predicted_overhead"] = float(overhead)
        if self.device.type == "cuda":
            out["dqn_swap/device_peak_bytes"] = int(torch.cuda.max_memory_allocated(self.device))
        return out

    def summary(self) -> dict[str, Any]:
        return {"steps": self.steps, "planner": self.planner_name, "last": self.last, "log": list(self.log),
                "record_peaks": dict(self.record_peaks), "safe_steps": self.safe_steps, "replans": self.replans,
                "waiting_steps": self.waiting_steps,
                "planning_seconds": round(self.planning_seconds, 3),
                "variants": {k: len(v) for k, v in self.variants.items()},
                "plans": {k: {"signature": e.description, "variant": e.variant, "followed": e.followed,
                              "diverged": e.diverged, "swaps": e.plan.n_swap, "recomputes": e.plan.n_recompute,
                              "memory_limit": e.plan.memory_limit, "overhead": e.plan.figures.get("overhead")}
                          for k, e in self.entries.items()}}


def autoplan(model: torch.nn.Module, memory_limit: LimitSpec, *, planner: Any = DEFAULT_PLANNER,
             optimizer: torch.optim.Optimizer | None = None, cache: str | Path | None = None,
             allow_infeasible: bool = False, new_shapes: str = "plan", shapes: str = "bucket",
             **options: Any) -> AutoPlan:
    """Turn on planned training in your own loop: ``with planned.step():`` around each forward and
    backward (:mod:`dqn_swap.autoplan`).

    Args:
        model: the module the loop calls (any call: positional, keyword, Hugging Face outputs).
        memory_limit: any form of :mod:`dqn_swap.limits` (``"50%"``, ``"0.5x"``, ``"8GiB"``);
            a percentage is of each recorded iteration's own range.
        planner: a planner of :func:`dqn_swap.get_planner` (default ``auto``: the fastest plan of
            ``dqn-search`` and of the quick baselines polished by local search, in a few seconds;
            ``dqn`` for the agent alone, a baseline by its name, a name given to
            :func:`dqn_swap.planners.register`), or the user's own planner object: anything with
            ``plan(trace, memory_limit, profile=None) -> Plan``.
        optimizer: the optimizer the loop steps; its state and its step join the trace.  Without
            it the trace holds forward and backward alone.
        cache: a folder keeping traces and plans across runs (read first, then added to).
        allow_infeasible: follow a plan the simulator found over the limit (refused otherwise).
        new_shapes: ``"plan"`` (record and plan a call of a new signature) or ``"refuse"``.
        shapes: ``"bucket"`` (default): calls whose extents fall in the same buckets
            (:func:`bucket`, four per doubling) share a plan, made for the envelope of the
            recordings of the bucket so far and followed by every smaller member (shapes that
            never repeat: neighbour-sampled graphs, unpadded sequences, a short last batch);
            ``"exact"``: a plan per set of shapes.
        **options: ``profile`` (device profile for op times), ``planner_options``,
            ``runtime_options`` (for :class:`~dqn_swap.runtime.PlannedExecution`), ``verbose``,
            ``planning`` (``"inline"``, or ``"background"``: plans made on a worker thread while
            the steps waiting for them run in safe mode; module docstring),
            ``tensorboard`` (a folder: :meth:`AutoPlan.figures` written there as TensorBoard scalars
            every ``log_every`` steps, default 10, and when the hooks come off).

    Returns:
        The :class:`AutoPlan` handle: ``planned.step()``, ``figures()``, ``summary()``, ``remove()``.

    Raises:
        MemoryLimitError: ``memory_limit`` is not a limit, or (at the first step) is below the least
            memory any plan of the recorded iteration needs.
        AutoPlanError: an option is unknown, or ``optimizer`` does not hold ``model``'s parameters;
            later, a step misused (nested, two forward passes), a signature refused, or no planner
            found a plan under the limit (with ``allow_infeasible`` off).
        RecordingError: the model's iteration cannot be recorded (the message says why).

    All of them are :class:`~dqn_swap.errors.DqnSwapError`.

    Example::

        planned = dqn_swap.autoplan(model, "50%", optimizer=opt)
        for batch in loader:
            with planned.step():
                model(**batch).loss.backward()
            opt.step()
            opt.zero_grad()
    """
    return AutoPlan(model, memory_limit, planner=planner, optimizer=optimizer, cache=cache,
                    allow_infeasible=allow_infeasible, new_shapes=new_shapes, shapes=shapes, **options)


def _checked_arguments(model: Any, planner: Any, optimizer: Any, cache: Any, planner_options: Any, runtime_options: Any,
                       allow_infeasible: Any, tensorboard: Any, log_every: Any, max_variants: Any, new_shapes: str,
                       shapes: str, planning: str) -> tuple[str, Any]:
    """:class:`AutoPlan`'s arguments checked, each refused in one line: the planner's name, and the
    user's planner object where one was given (else None)."""
    from ..support import fsdp_param_groups, unsupported_reason

    if not isinstance(model, torch.nn.Module):
        raise AutoPlanError(f"autoplan needs a torch.nn.Module, got {type(model).__name__}")
    if attached(model) is not None:
        raise AutoPlanError("this model already has dqn_swap.autoplan attached: keep using that one, or call "
                            "its remove() before attaching another")
    reason = unsupported_reason(model)
    if reason is None and fsdp_param_groups(model):
        reason = ("autoplan does not learn an FSDP2 (fully_shard) iteration in the user's loop (its first steps "
                  "keep saved activations on the host, FSDP's gathered parameters included): record each rank's "
                  "iteration with dqn_swap.record_trace, plan it, and follow the plan with PlannedExecution "
                  "(docs/fsdp.md)")
    if reason is not None:
        raise AutoPlanError(reason)
    from ..checks import expect, expect_one_of, expect_path

    expect_one_of(new_shapes, NEW_SHAPES, "new_shapes", AutoPlanError)
    expect_one_of(shapes, SHAPES, "shapes", AutoPlanError)
    expect_one_of(planning, PLANNING, "planning", AutoPlanError)
    if optimizer is not None and not isinstance(optimizer, torch.optim.Optimizer):
        raise AutoPlanError(f"optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}")

    expect_path(cache, "cache", none=True)
    expect(planner_options, dict, "planner_options", none=True)
    expect(runtime_options, dict, "runtime_options", none=True)
    expect(allow_infeasible, bool, "allow_infeasible")
    expect_path(tensorboard, "tensorboard", none=True)
    if isinstance(log_every, bool) or not isinstance(log_every, int) or log_every < 1:
        raise AutoPlanError(f"log_every={log_every!r}: a whole number of steps, at least 1")
    if isinstance(max_variants, bool) or not isinstance(max_variants, int) or max_variants < 1:
        raise AutoPlanError(f"max_variants={max_variants!r}: a whole number of plans per signature, at least 1")
    if optimizer is not None:
        mine = {id(p) for p in model.parameters()}
        theirs = [p for g in optimizer.param_groups for p in g["params"]]
        if theirs and not any(id(p) in mine for p in theirs):
            raise AutoPlanError("the optimizer holds none of the model's parameters: pass the optimizer that "
                                "steps this model")
    given_planner: Any = None
    if isinstance(planner, str):
        from ..agents import check_planner_name

        try:
            check_planner_name(planner)
        except ValueError as e:
            raise AutoPlanError(str(e)) from None
    elif callable(getattr(planner, "plan", None)) and not isinstance(planner, type):
        if planner_options:
            raise AutoPlanError("planner_options go with a planner's name; a planner object comes built")
        given_planner = planner  # the user's own planner object (registered or not)
        planner = str(getattr(planner, "name", "") or type(planner).__qualname__)
    else:
        raise TypeError(f"planner must be str (a planner's name) or an object with plan(trace, memory_limit, "
                        f"profile), not {type(planner).__name__}")
    return planner, given_planner
