""":func:`record_trace`: the warm-up and the recorded iteration, then what the recording leaves to
settle (collective times, state, held outputs, scratch, roles)."""

from __future__ import annotations

import contextlib
import copy
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ..cost import DEFAULT_PROFILE, DeviceProfile, get_profile
from ..meter import AllocatorTimeline, gradient_bytes
from ..ops import SCRATCH_MODELS
from ..threads import module_call_hooks
from ..support import (DATA_PARALLEL_WRAPPERS, local_tensor, set_micro_batch, sharded_parameters, unsharded_gradients,
                       unsharded_storages, unsupported_reason)
from ..trace import Phase, Role, Trace, TraceBuilder
from .hooks import _DeviceGuard, _ModuleTracker
from .mode import _Recorder
from .vocabulary import LossFn, OptimizerArg, RecordingError


def _make_optimizer(optimizer: OptimizerArg, model: torch.nn.Module) -> torch.optim.Optimizer | None:
    if optimizer is None or isinstance(optimizer, torch.optim.Optimizer):
        return optimizer
    return optimizer(model.parameters())


def _iteration(model: torch.nn.Module, inputs: tuple, loss_fn: LossFn | None,
               opt: torch.optim.Optimizer | None, recorder: _Recorder | None, *, zero_grad: bool = True,
               step: bool = True) -> None:
    """One training iteration (or one micro-batch of gradient accumulation: the first resets the
    gradients, the last steps); with a recorder, phases are marked as they begin."""
    if zero_grad:
        if opt is not None:
            opt.zero_grad(set_to_none=True)
        else:
            model.zero_grad(set_to_none=True)
    if recorder is None:
        out = model(*inputs)
        if loss_fn is not None:
            loss_fn(out).backward()
        if opt is not None and step:
            opt.step()
        return
    def module_call(module: torch.nn.Module, args: Any) -> None:
        # Where a module's forward begins no op is under way: the runtime's anchors.
        if recorder.active and recorder.phase == Phase.FORWARD and not isinstance(module, DATA_PARALLEL_WRAPPERS):
            recorder.b.mark_module_call()

    calls = module_call_hooks(module_call)
    with _ModuleTracker() as tracker, recorder, torch.autograd.graph.saved_tensors_hooks(
            recorder.pack, recorder.unpack), contextlib.closing(calls):
        recorder.tracker = tracker
        recorder.phase = Phase.FORWARD
        out = model(*inputs)
        if loss_fn is not None:
            loss = loss_fn(out)
            recorder.phase = Phase.BACKWARD
            loss.backward()
            del loss
        recorder.phase = Phase.OPTIMIZER
        if opt is not None and step:
            opt.step()
        del out  # the output dies at the end of the iteration, as in a training loop


def _micro_batch(model: torch.nn.Module, inputs: tuple, loss_fn: LossFn | None, opt: torch.optim.Optimizer | None,
                 recorder: _Recorder | None, k: int, accumulation: int) -> None:
    """Micro-batch ``k`` of an optimizer step accumulating gradients over ``accumulation`` of them
    (one is plain training): FSDP2's switches set for it (:func:`dqn_swap.support.set_micro_batch`),
    the gradients reset before the first, the optimizer's step after the last."""
    last = k == accumulation - 1
    if accumulation > 1:
        set_micro_batch(model, last)
    _iteration(model, inputs, loss_fn, opt, recorder, zero_grad=k == 0, step=last)


@contextlib.contextmanager
def _recording_failure() -> Any:
    """The model's own exception while recording, as one :class:`RecordingError`."""
    try:
        yield
    except RecordingError:
        raise
    except Exception as e:
        raise RecordingError(f"the model failed while recording: {type(e).__name__}: {e}") from e


def record_trace(model: torch.nn.Module, example_inputs: Any, loss_fn: LossFn | None = None,
                 optimizer: OptimizerArg = None, *, device: str | torch.device | None = None,
                 profile: str | DeviceProfile | None = None, iterations: int = 5,
                 meta: dict[str, Any] | None = None, kernels: str = "cuda", inputs: str = "held",
                 accumulation: int = 1, micro_batch: int | None = None) -> Trace:
    """Record one training iteration of ``model`` as a :class:`~dqn_swap.trace.Trace`.

    Args:
        model: any module.  It is trained for real: a warm-up iteration and the
            recorded one(s) update its weights.  If ``device`` differs from the
            model's, a copy is moved there and the original is left untouched.
        example_inputs: a tensor or a tuple of positional arguments.
        loss_fn: maps the model's output to a scalar loss (targets closed over);
            ``None`` records a forward-only iteration (K-means).
        optimizer: an optimizer over ``model``'s parameters, a factory
            ``params -> optimizer`` (required when the model is copied to
            another device), or ``None`` for no optimizer step.
        device: ``"meta"`` (no memory, times from ``profile``), ``"cpu"`` or
            ``"cuda"`` (times measured with CUDA events).
        profile: device profile for op times and, later, transfers.
        iterations: on CUDA, timed iterations whose median op time is kept.
        meta: extra fields stored in the trace's metadata.
        kernels: on ``meta``, whose kernels' scratch memory to estimate: ``"cuda"``
            (the default; what the device profiles stand for) or ``"cpu"``
            (:func:`dqn_swap.ops.estimate_scratch`).
        inputs: ``"held"`` (the default: the training loop keeps its batch through the
            iteration, as ``for x, y in loader`` does, so no plan may count on moving it) or
            ``"released"`` (the loop hands the batch to the model and keeps no reference until
            backward is over, as in the papers, where the runtime owns the batch: a plan may then
            swap an input autograd saves, :attr:`Trace.movable`).
        accumulation: micro-batches per optimizer step (gradient accumulation; 1: plain
            training).  The loop is ``zero_grad``, ``accumulation`` times forward and
            backward (``loss_fn`` as the loop computes it, scaled or not), the optimizer's
            step; under FSDP2 every micro-batch but the last runs without reduce-scatter and
            keeps its gathered parameters after backward, as FSDP2's documentation recommends
            (:func:`dqn_swap.support.set_micro_batch`, which the training loop calls too).
        micro_batch: which micro-batch is the recorded iteration (default: the last, the one
            with the optimizer's step).  Micro-batches differ in memory (the first starts
            without gradients, those after it with the accumulated ones; under FSDP2 only the
            last reduce-scatters and reshards after backward), so each kind has its own trace
            and plan: for two micro-batches, record ``micro_batch=0`` and ``micro_batch=1``.
            The warm-up is a whole optimizer step, and the micro-batches around the recorded
            one run unrecorded, so the recorded one starts from the state it has in training
            (the gradients and gathered parameters it finds are state alive before it).

    Returns:
        The trace of the last recorded iteration.

    Raises:
        RecordingError: the model raised; the message names the op or step.
    """
    model, example_inputs, device, profile, recorded = _checked(
        model, example_inputs, loss_fn, optimizer, device, profile, meta, kernels, inputs, accumulation, micro_batch)
    opt = _make_optimizer(optimizer, model)
    model.train()
    _warm_up(model, example_inputs, loss_fn, opt, device, accumulation)
    run = _record_iterations(model, example_inputs, loss_fn, opt, device, kernels, accumulation, recorded,
                             iterations if device.type == "cuda" else 1)
    recorder = run.recorder
    trace = _built(recorder, {
        "device": device.type, "profile": profile.name, "profile_params": profile.to_dict(),
        "recorded_iterations": run.runs, "scratch": "estimated" if device.type == "meta" else "measured",
        **({"scratch_kernels": kernels} if device.type == "meta" else {}),
        "record_seconds": run.seconds, "torch": torch.__version__,
        **({"inputs_released": True} if inputs == "released" else {}),
        **({"accumulation": {"micro_batches": accumulation, "micro_batch": recorded}} if accumulation > 1 else {}),
        **(meta or {})}, profile)
    if device.type == "cuda":
        if len({len(d) for d in run.durations}) == 1:
            measured = np.median(np.stack(run.durations), axis=0)
        else:  # the graph changed between iterations (stochastic depth): keep the last one's times
            measured = run.durations[-1]
        return trace.with_durations(_collective_times(measured, recorder, profile), timing="cuda-events",
                                    max_memory_allocated=recorder.iteration_peak,
                                    outside_bytes=max(0, run.allocated_at_start - trace.initial_bytes),
                                    outside_blocks=run.outside_blocks)
    times = profile.compute_time(trace.op_flops, trace.op_bytes, trace.op_flops > 0)
    return trace.with_durations(_collective_times(times, recorder, profile), timing="roofline")


def _checked(model: torch.nn.Module, example_inputs: Any, loss_fn: LossFn | None, optimizer: OptimizerArg,
             device: str | torch.device | None, profile: str | DeviceProfile | None, meta: dict[str, Any] | None,
             kernels: str, inputs: str, accumulation: int, micro_batch: int | None
             ) -> tuple[torch.nn.Module, tuple, torch.device, DeviceProfile, int]:
    """:func:`record_trace`'s arguments checked (one line each) and resolved: the model (a copy on
    ``device`` where it is elsewhere), the inputs as a tuple there, the device, the profile and the
    index of the recorded micro-batch."""
    from ..checks import expect, expect_callable

    expect(model, torch.nn.Module, "model", what="a torch.nn.Module")
    expect_callable(loss_fn, "loss_fn", none=True)
    if optimizer is not None and not isinstance(optimizer, torch.optim.Optimizer):
        expect_callable(optimizer, "optimizer (an optimizer, or a function of the parameters that makes one)")
    expect(meta, dict, "meta", none=True)
    reason = unsupported_reason(model)
    if reason is not None:
        raise RecordingError(reason)
    if inputs not in ("held", "released"):
        raise RecordingError(f"unknown inputs {inputs!r}: 'held' or 'released'")
    if kernels not in SCRATCH_MODELS:
        raise RecordingError(f"unknown kernels {kernels!r}: one of {', '.join(SCRATCH_MODELS)}")
    expect(accumulation, int, "accumulation")
    expect(micro_batch, int, "micro_batch", none=True)
    if accumulation < 1:
        raise ValueError(f"accumulation must be at least 1 (micro-batches per optimizer step), not {accumulation}")
    recorded = accumulation - 1 if micro_batch is None else micro_batch
    if not 0 <= recorded < accumulation:
        raise ValueError(f"micro_batch must be in 0..{accumulation - 1} (accumulation {accumulation}), "
                         f"not {micro_batch}")
    params = list(model.parameters()) + list(model.buffers())
    model_device = params[0].device if params else torch.device("cpu")
    try:
        device = torch.device(device) if device is not None else model_device
    except (RuntimeError, TypeError) as e:
        raise RecordingError(f"device {device!r}: {str(e).splitlines()[0]}") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise RecordingError("device 'cuda' requested but no CUDA GPU is available")
    if not isinstance(example_inputs, tuple):
        example_inputs = (example_inputs,)
    if device != model_device:
        if isinstance(optimizer, torch.optim.Optimizer):
            raise RecordingError("to record on another device, pass the optimizer as a factory "
                                 "(params -> optimizer), not an instance bound to the original model")
        model = copy.deepcopy(model).to(device)
        example_inputs = tuple(x.to(device) if isinstance(x, torch.Tensor) else x for x in example_inputs)
    if profile is None or isinstance(profile, str):
        profile = get_profile(profile or DEFAULT_PROFILE)
    return model, example_inputs, device, profile, recorded


def _warm_up(model: torch.nn.Module, example_inputs: tuple, loss_fn: LossFn | None,
             opt: torch.optim.Optimizer | None, device: torch.device, accumulation: int) -> None:
    """A whole optimizer step, unrecorded: lazily made state (optimizer moments, workspaces) appears."""
    guard = _DeviceGuard(device.type) if device.type == "meta" else contextlib.nullcontext()
    try:
        with guard:
            for k in range(accumulation):
                _micro_batch(model, example_inputs, loss_fn, opt, None, k, accumulation)
    except RecordingError:
        raise
    except Exception as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise RecordingError(f"the model failed in its warm-up iteration: {type(e).__name__}: {first}") from e


@dataclass
class _Run:
    """What the recorded iterations left: the last one's recorder, how many ran, the op times of each
    (CUDA), what the device held as the last began, and the seconds they took."""

    recorder: _Recorder
    runs: int
    durations: list[np.ndarray]
    allocated_at_start: int
    outside_blocks: list[int]
    seconds: float


def _record_iterations(model: torch.nn.Module, example_inputs: tuple, loss_fn: LossFn | None,
                       opt: torch.optim.Optimizer | None, device: torch.device, kernels: str, accumulation: int,
                       recorded: int, runs: int) -> _Run:
    """Record micro-batch ``recorded`` of an optimizer step ``runs`` times (on CUDA several, whose op
    times are kept; the last is the trace), the step's other micro-batches running unrecorded around it."""
    time_ops = device.type == "cuda"
    durations: list[np.ndarray] = []
    outside_blocks: list[int] = []
    allocated_at_start = 0
    recorder = None
    timeline: Any = None
    t0 = time.perf_counter()
    for run in range(runs):
        builder = TraceBuilder()
        last = run == runs - 1  # the kept iteration: its scratch is measured
        with _recording_failure():
            for k in range(recorded):  # the micro-batches before the recorded one
                _micro_batch(model, example_inputs, loss_fn, opt, None, k, accumulation)
            if accumulation > 1:
                set_micro_batch(model, recorded == accumulation - 1)
        recorder = _Recorder(builder, device, time_ops, measure_scratch=last, kernels=kernels)
        _register_state(recorder, model, opt, example_inputs, gradients=recorded > 0)
        if time_ops:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats(device)
            # What the process holds on the device as the iteration starts: the trace's state
            # (``initial_bytes``), the last iteration's gradients where the iteration's zero_grad drops
            # them (outside the trace: gone before its first op), and whatever else lives there
            # (another model, a caller's tensors, cuBLAS's workspaces), which the allocator's peak
            # counts and the trace does not.
            allocated_at_start = int(torch.cuda.memory_allocated(device))
            if recorded == 0:
                allocated_at_start -= gradient_bytes(model, "cuda")
            if last:  # what those other bytes are, by their blocks' sizes (Trace.outside_bytes)
                try:
                    outside_blocks = _outside_blocks(torch.cuda.memory_snapshot(),
                                                     _state_pointers(model, opt, example_inputs))
                except (RuntimeError, KeyError, TypeError, ValueError):  # a description only: never fail for it
                    outside_blocks = []
        timeline = AllocatorTimeline() if last and device.type == "cpu" else contextlib.nullcontext()
        with _recording_failure(), timeline:
            _iteration(model, example_inputs, loss_fn, opt, recorder, zero_grad=recorded == 0,
                       step=recorded == accumulation - 1)
        _end_iteration(recorder, model, opt)
        recorder.active = False  # tensors dying after the iteration are not part of it
        if time_ops:
            torch.cuda.synchronize()  # events must have completed before reading them
            durations.append(np.array([s.elapsed_time(e) * 1e-3 for s, e in recorder.events]))
        with _recording_failure():
            for k in range(recorded + 1, accumulation):  # the rest of the optimizer step
                _micro_batch(model, example_inputs, loss_fn, opt, None, k, accumulation)
    assert recorder is not None
    _end_scratch(recorder, timeline if isinstance(timeline, AllocatorTimeline) else None)
    return _Run(recorder, runs, durations, allocated_at_start, outside_blocks, time.perf_counter() - t0)


def _built(recorder: _Recorder, trace_meta: dict[str, Any], profile: DeviceProfile) -> Trace:
    """The recorder's trace, with ``trace_meta`` and what the recorder saw of collectives, FSDP2 and
    ops that write what their schema does not say; an iteration that cannot be one is refused,
    saying why, in one line."""
    if recorder.collectives:
        trace_meta["collectives"] = {"ops": len(recorder.collectives), "bytes_sent": sum(recorder.collectives.values()),
                                     "interconnect_bandwidth": profile.interconnect_bandwidth}
    if recorder.unsharded:
        import torch.distributed as dist

        trace_meta["fsdp"] = {"rank": dist.get_rank(), "world_size": dist.get_world_size(),
                              "unsharded_storages": len(recorder.unsharded)}
    if recorder.unannotated:
        trace_meta["unannotated_writes"] = {k: sorted(v) for k, v in sorted(recorder.unannotated.items())}
    b = recorder.b
    try:
        return b.build(trace_meta)
    except ValueError as e:
        unallocated = [t for t, a in enumerate(b.t_alloc) if a == -2]
        made_by = sorted({recorder.declared_by.get(t, "an unknown op") for t in unallocated})
        why = (f"{len(unallocated)} storages seen in outputs of {', '.join(made_by)} were never allocated by an op "
               "the recorder saw (an aten call outside the dispatcher's view)" if unallocated else str(e))
        raise RecordingError(f"this iteration cannot be made a trace: {why}; a plan of it would be wrong, so "
                             "none is made: train it unplanned, or with dqn_swap.autoplan, which runs such an "
                             "iteration in safe mode (saved activations on the host)") from None


def _collective_times(durations: np.ndarray, recorder: _Recorder, profile: DeviceProfile) -> np.ndarray:
    """``durations`` with every collective priced by its bytes at the profile's interconnect
    bandwidth (:meth:`DeviceProfile.collective_time`), on the compute stream.

    Departure: NCCL runs FSDP2's collectives on streams of their own, overlapping compute (FSDP2
    prefetches the next module's all-gather for that).  The simulator has one compute stream, so a
    collective is an op there, as long as its transfer: an iteration's time is over-estimated by the
    collectives that real training hides, never under-estimated; memory, which is what a plan is
    held to, is exact either way (a collective's buffers live from its op's start to their frees, as
    FSDP holds them).  CUDA events around a collective launched on another stream would time its
    launch, not its transfer, so the measured durations are replaced too."""
    if not recorder.collectives:
        return durations
    out = np.array(durations, dtype=np.float64, copy=True)
    ops = np.fromiter(recorder.collectives.keys(), dtype=np.int64)
    wire = np.fromiter(recorder.collectives.values(), dtype=np.float64)
    out[ops] = profile.collective_time(wire)
    return out


def _state_pointers(model: torch.nn.Module, opt: torch.optim.Optimizer | None, inputs: tuple) -> set[int]:
    """Device addresses of the storages a recording knows as it begins: parameters, buffers,
    gradients, optimizer state, inputs."""
    tensors = [*model.parameters(), *model.buffers(), *(p.grad for p in model.parameters() if p.grad is not None),
               *(t for st in (opt.state.values() if opt is not None else ()) for t in st.values()), *inputs]
    return {t.untyped_storage().data_ptr() for t in tensors if isinstance(t, torch.Tensor)}


def _outside_blocks(segments: list[dict[str, Any]], known: set[int], most: int = 8) -> list[int]:
    """The sizes of the largest allocated blocks of a CUDA memory snapshot
    (:func:`torch.cuda.memory_snapshot`) at none of the ``known`` addresses, largest first: what
    the device held beside the recorded iteration (cuBLAS's workspaces, a caller's tensors), as
    ``trace.meta["outside_blocks"]`` says it."""
    sizes = [int(b["size"]) for seg in segments for b in seg.get("blocks", ())
             if b.get("state") == "active_allocated" and int(b["address"]) not in known]
    return sorted(sizes, reverse=True)[:most]


def _register_state(recorder: _Recorder, model: torch.nn.Module, opt: torch.optim.Optimizer | None,
                    inputs: tuple, gradients: bool = False) -> None:
    """Declare the storages alive before the iteration, with their roles; with ``gradients`` (a
    micro-batch of gradient accumulation after the first) the gradients accumulated so far too,
    FSDP2's unsharded ones included."""
    recorder.watch_unsharded(unsharded_storages(model))
    for p in recorder.on_device([*model.parameters(), *sharded_parameters(model), *model.buffers()]):
        recorder.tid_of(p, Role.PARAMETER)
    recorder.buffers = {b.untyped_storage()._cdata for b in recorder.on_device(list(model.buffers()))}
    if opt is not None:
        for state in opt.state.values():
            for t in recorder.on_device(state):
                recorder.tid_of(t, Role.OPTIMIZER_STATE)
    for t in recorder.on_device(inputs):
        recorder.tid_of(t, Role.INPUT)
    if gradients:
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        for t in recorder.on_device([*grads, *unsharded_gradients(model)]):
            recorder.tid_of(t, Role.GRADIENT)


def _end_iteration(recorder: _Recorder, model: torch.nn.Module, opt: torch.optim.Optimizer | None) -> None:
    """What is known once the recorded iteration is over (its recorder still active): tensors still
    held, constants folded into the ops that read them, roles, gradient sums made in place.  One
    place for :func:`record_trace` and the recording in the user's loop (:mod:`dqn_swap.integrations`)."""
    recorder.resolve_numbers()
    if recorder.unsharded:
        recorder.poll_unsharded()  # FSDP resharded after the last op
    recorder.mark_still_held()
    recorder.fold_constants()
    _assign_roles(recorder, model, opt)
    recorder.accumulate_in_place(recorder.fill_in_place())


def _held_by_outputs(recorder: _Recorder, outputs: list[torch.Tensor]) -> tuple[set[int], set[int]]:
    """What the model's ``outputs`` (still held by the loop as the iteration ends) keep: the tensor
    ids of their storages and of their autograd graph's leaves and the leaves' gradients (made in
    the iteration), and apart the iteration's input storages among those leaves.  A leaf made from
    the batch sits in the graph's ``AccumulateGrad`` node: wav2vec2's feature encoder sets
    ``requires_grad`` on a view of its input so that checkpointing works, and a held ``out.loss``
    then keeps the previous step's batch, and the gradient made for that view, alive into the next
    step."""
    b = recorder.b
    made: set[int] = set()
    inputs: set[int] = set()

    def note(t: Any) -> None:
        if isinstance(t, torch.Tensor):
            tid = recorder.live.get(local_tensor(t).untyped_storage()._cdata)
            if tid is not None:
                (inputs if b.t_alloc[tid] < 0 and b.t_role[tid] == Role.INPUT else made).add(tid)

    seen: set[int] = set()
    stack = []
    for t in outputs:
        note(t)
        if isinstance(t, torch.Tensor) and t.grad_fn is not None:
            stack.append(t.grad_fn)
    while stack:
        fn = stack.pop()
        if fn is None or id(fn) in seen:
            continue
        seen.add(id(fn))
        var = getattr(fn, "variable", None)  # AccumulateGrad's leaf
        if isinstance(var, torch.Tensor):
            note(var)
            note(var.grad)
        stack.extend(f for f, _ in fn.next_functions)
    return made, inputs


def carry_held_outputs(recorder: _Recorder, released_at: int, outputs: list[torch.Tensor] | None = None) -> int:
    """Storages made in the recorded iteration that the training loop still holds when it ends
    (``out = model(**batch)`` kept past ``optimizer.step()``): in a loop, the previous step's
    held outputs are alive when the next step begins, until the name holding them is bound again
    once the model returns.  The trace is one steady-state step, so it starts with a storage of
    their bytes (:attr:`Role.HIDDEN`: no plan moves it), freed at the end of op ``released_at``
    (the forward pass's last op); the iteration's own held outputs outlive it.  Gradients and
    optimizer state are the model's state, not outputs.  Returns the bytes carried (0: none held).

    With ``outputs`` (the model's output tensors, :func:`_held_by_outputs`), only what they keep
    is let go where the model returns, the batch their graph keeps included; whatever else the
    loop holds (a clipped gradient norm, a running loss: a Hugging Face ``Trainer`` keeps both) is
    bound again somewhere later in the next step, so it is carried to the step's end.

    Held outputs that are not let go at the next call (kept in a list) make every step begin
    with more bytes than the trace: :mod:`dqn_swap.integrations` sees that at the step's start."""
    b = recorder.b
    n = len(b.ops)
    state = (Role.GRADIENT, Role.OPTIMIZER_STATE, Role.PARAMETER, Role.HIDDEN)
    held = [t for t in range(len(b.t_nbytes))
            if b.t_alloc[t] >= 0 and b.t_free[t] == -1 and b.t_held[t] == n and b.t_role[t] not in state]
    if not held:
        return 0
    early, late = held, []
    inputs: set[int] = set()
    if outputs is not None:
        made, inputs = _held_by_outputs(recorder, outputs)
        early, late = [t for t in held if t in made], [t for t in held if t not in made]
    carried_early = sum(b.t_nbytes[t] for t in early) + sum(b.t_nbytes[t] for t in inputs)
    carried_late = sum(b.t_nbytes[t] for t in late)
    if carried_early and 0 <= released_at < n:
        t = b.tensor(carried_early, Role.HIDDEN, preexisting=True)
        b.free_at(t, released_at)
    if carried_late and n:
        t = b.tensor(carried_late, Role.HIDDEN, preexisting=True)
        b.free_at(t, n - 1)
    return int(carried_early + carried_late)


def _end_scratch(recorder: _Recorder, timeline: AllocatorTimeline | None) -> None:
    """Every op's scratch, once the recorder is inactive: the cpu's from the allocator's timeline."""
    if timeline is not None:
        recorder.scratch_from(timeline)
    recorder.finish_scratch()


def _assign_roles(recorder: _Recorder, model: torch.nn.Module, opt: torch.optim.Optimizer | None) -> None:
    """Gradients are known once backward ran; packed temporaries are saved activations."""
    b = recorder.b
    grads = [p.grad for p in model.parameters() if p.grad is not None] + unsharded_gradients(model)
    for g in grads:
        if g is not None:
            tid = recorder.live.get(local_tensor(g).untyped_storage()._cdata)
            if tid is not None and b.t_alloc[tid] != -1:
                b.set_role(tid, Role.GRADIENT)
    for tid in b.saved:
        if b.t_role[tid] == Role.TEMPORARY and tid not in recorder.unsharded_tids:
            b.set_role(tid, Role.SAVED)
