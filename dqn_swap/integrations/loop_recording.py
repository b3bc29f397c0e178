"""Recording a step of the user's own loop as it trains (:class:`LoopRecording`, mixed into
:class:`~dqn_swap.integrations.planned_loop.AutoPlan`): the recorder of a live step, the copies that
keep a recorded step's saved tensors off the device, and what a recording keeps."""

from __future__ import annotations

import contextlib
import sys
import weakref
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import _disable_current_modes
from torch.utils._pytree import tree_flatten
from torch.utils.module_tracker import ModuleTracker

from ..meter import AllocatorTimeline
from ..plan import Plan
from ..recorder.hooks import _ModuleTracker
from ..recorder.mode import _Recorder, _Saved
from ..recorder.record import _end_iteration, _end_scratch, _register_state, carry_held_outputs
from ..trace import Phase, Trace, TraceBuilder
from ..threads import module_call_hooks
from ..units import format_bytes

from .settings import AutoPlanError, _RECORDED, _RECORDING
from .signature import _same_iteration, batch_size_of, optimizer_layout

# --------------------------------------------------------------------------- host copies
class _HostCopy:
    """A saved activation's whole storage on the host, and how to view it again."""

    __slots__ = ("host", "nbytes", "dtype", "size", "stride", "offset", "tid", "device")

    def __init__(self, t: torch.Tensor, tid: int, host: torch.Tensor) -> None:
        self.host, self.tid, self.device = host, tid, t.device
        self.nbytes = t.untyped_storage().nbytes()
        self.dtype, self.size, self.stride, self.offset = t.dtype, t.size(), t.stride(), t.storage_offset()


def _copy_out(t: torch.Tensor, tid: int) -> _HostCopy:
    from ..runtime import host_buffer

    storage = t.untyped_storage()
    src = torch.empty(0, dtype=torch.uint8, device=t.device).set_(storage)
    host = host_buffer(storage.nbytes(), t.device)
    host.copy_(src)
    return _HostCopy(t, tid, host)


def _copy_back(h: _HostCopy) -> torch.Tensor:
    dev = torch.empty(h.nbytes, dtype=torch.uint8, device=h.device)
    dev.copy_(h.host)
    return torch.empty(0, dtype=h.dtype, device=h.device).set_(dev.untyped_storage(), h.offset, h.size, h.stride)


def _offloadable(t: torch.Tensor, persistent: set[int]) -> bool:
    return (t.device.type != "meta" and not isinstance(t, torch.nn.Parameter)
            and t.untyped_storage()._cdata not in persistent)


class _StepRecorder(_Recorder):
    """The recorder with saved activations kept on the host until backward needs them.

    The recorder's holder of a saved tensor (:class:`~dqn_swap.recorder.mode._Saved`) stays its
    holder, so the trace keeps the tensor alive until autograd releases it, as in training
    without the copies; the device storage itself may go earlier.  A weak reference to every
    storage sent out keeps its address from being reused by a later storage while the
    recorder identifies storages by address.  One host copy per storage and version; the
    storage brought back in backward is registered as the same tensor, and shared by every
    view of it unpacked while it lives.  Autograd's engine runs the backward pass of the
    user's ``loss.backward()``: ops run inside it (a graph task is current) are backward ops.
    """

    def __init__(self, *args: Any, persistent: set[int], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.persistent = persistent
        self.sent: list[StorageWeakRef] = []
        self.host: dict[tuple[int, int], _HostCopy] = {}  # (tensor id, version) -> its host copy
        self.back: dict[tuple[int, int], StorageWeakRef] = {}  # -> the storage brought back, while alive

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        if self.phase == Phase.FORWARD and torch._C._current_graph_task_id() != -1:
            self.phase = Phase.BACKWARD
        return super().__torch_dispatch__(func, types, args, kwargs)

    def pack(self, t: torch.Tensor) -> Any:
        holder = super().pack(t)
        if not isinstance(holder, _Saved) or not _offloadable(t, self.persistent):
            return holder
        tid = self.seen.get(t)
        if tid is None or self.b.t_alloc[tid] < 0:  # existed before the iteration: stays
            return holder
        key = (tid, t._version)
        with _disable_current_modes(), torch.no_grad():
            host = self.host.get(key)
            if host is None:
                self.sent.append(StorageWeakRef(t.untyped_storage()))
                host = self.host[key] = _copy_out(t, tid)
            holder.tensor = _View(host, key, t)
        return holder

    def unpack(self, holder: Any) -> torch.Tensor:  # type: ignore[override]
        # The recorder marks the node's first unpack (Trace.saved_unpack_op): where the runtime
        # gets control in backward and a prefetch can start (Trace.progress_ops).
        x = super().unpack(holder)
        if not isinstance(x, _View):
            return x
        ref = self.back.get(x.key)
        with _disable_current_modes(), torch.no_grad():
            if ref is not None and not ref.expired():
                storage = torch.UntypedStorage._new_with_weak_ptr(ref.cdata)
                return torch.empty(0, dtype=x.dtype, device=x.host.device).set_(storage, x.offset, x.size, x.stride)
            restored = _copy_back(x.host)
            storage = restored.untyped_storage()
            self.back[x.key] = StorageWeakRef(storage)
            self.sent.append(self.back[x.key])  # its address stays its own until the recording ends
            view = torch.empty(0, dtype=x.dtype, device=x.host.device).set_(storage, x.offset, x.size, x.stride)
        key = storage._cdata
        self.live[key] = x.key[0]
        self.hold(view, x.key[0], key)
        return view


class _View:
    """A saved tensor as a view of its storage's host copy."""

    __slots__ = ("host", "key", "dtype", "size", "stride", "offset")

    def __init__(self, host: _HostCopy, key: tuple[int, int], t: torch.Tensor) -> None:
        self.host, self.key = host, key
        self.dtype, self.size, self.stride, self.offset = t.dtype, t.size(), t.stride(), t.storage_offset()


@contextlib.contextmanager
def _rng_untouched(device: torch.device) -> Iterator[None]:
    """Run planning without moving the training loop's random generators: torch's (cpu, and the
    device's), NumPy's and Python's.  A planner that samples (the DQN) would otherwise change
    the dropout masks of every later step, and planned training would no longer be unplanned
    training's bit for bit."""
    import random

    py, npy = random.getstate(), np.random.get_state()
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else [], device_type=device.type
                               if device.type == "cuda" else "cuda"):
        yield
    random.setstate(py)
    np.random.set_state(npy)


# --------------------------------------------------------------------------- entries
@dataclass
class Entry:
    """The trace and plan of one signature, and the runtime that follows the plan."""

    key: str
    description: str
    trace: Trace
    plan: Plan
    runtime: Any = None  # PlannedExecution, made on first use
    signature_key: str = ""  # the signature it is a variant of ("": key)
    variant: int = 0  # its number among the signature's variants
    followed: int = 0  # steps that followed it to the end
    diverged: int = 0  # steps that left it (and ran on in safe mode)


@dataclass
class _Recording:
    recorder: _StepRecorder
    key: str
    description: str
    tracker: ModuleTracker
    timeline: Any
    start_bytes: int
    batch_size: int | None = None  # batch_size_of the call; None where it is ambiguous
    forward_end: int = -1  # the forward pass's last op: where the root module returned
    layout: tuple = ()  # the optimizer's layout as the recorded step began (optimizer_layout)
    outputs: list = field(default_factory=list)  # weak references to the model's output tensors
    step: int = -1  # the step recorded (AutoPlan.steps as it began)
    deferred: bool = False  # the optimizer's step is recorded; the trace is built as the next step begins
    discard: bool = False  # not a steady-state iteration: closed without a trace
    stack: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)
    fb: contextlib.ExitStack | None = None  # forward and backward: hooks and the dispatch mode
    opt: contextlib.ExitStack | None = None  # the optimizer's step


@dataclass
class _StepState:
    # None until the model is called: "planned", "warmup", "record", "safe", "waiting" (for its plan)
    kind: str | None = None
    entry: Entry | None = None
    offload: contextlib.ExitStack | None = None


class _Handle:
    def __init__(self, handle: Any) -> None:
        self.handle = handle

    def close(self) -> None:
        self.handle.remove()


class LoopRecording:
    """The recording side of :class:`~dqn_swap.integrations.planned_loop.AutoPlan` (whose state it uses)."""

    def _start_recording(self, module: torch.nn.Module, args: tuple, kwargs: dict, key: str, desc: str) -> None:
        dev = self.device
        cuda = dev.type == "cuda"
        recorder = _StepRecorder(TraceBuilder(), dev, time_ops=False, measure_scratch=True,
                                 persistent=self._persistent())
        _register_state(recorder, self.model, self.optimizer, (args, kwargs))
        timeline = AllocatorTimeline() if dev.type == "cpu" else None
        start = 0
        if cuda:
            torch.cuda.synchronize(dev)
            torch.cuda.reset_peak_memory_stats(dev)
            start = torch.cuda.memory_allocated(dev)
        rec = _Recording(recorder, key, desc, _ModuleTracker(), timeline, start, batch_size=batch_size_of(args, kwargs),
                         layout=optimizer_layout(self.optimizer), step=self.steps)
        if timeline is not None:
            rec.stack.enter_context(timeline)
            AllocatorTimeline.instant(_RECORDING)

        def returned(mod: torch.nn.Module, args: Any, kwargs: Any, out: Any) -> None:
            if rec.forward_end < 0:  # where the loop's name for the previous step's outputs is bound again
                rec.forward_end = len(recorder.b.ops) - 1
                # weakly: whether the loop still holds them as the step ends is what carry_held_outputs asks
                rec.outputs = [weakref.ref(t) for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]

        rec.stack.enter_context(contextlib.closing(_Handle(module.register_forward_hook(returned, with_kwargs=True))))
        self._recording = rec
        self._enter_forward_backward(rec)
        rec.tracker._fw_pre_hook(module, args)  # the root's call: the tracker's hook came after it
        recorder.b.mark_module_call()

    def _enter_forward_backward(self, rec: _Recording) -> None:
        recorder = rec.recorder
        fb = contextlib.ExitStack()

        def module_call(module: torch.nn.Module, args: Any) -> None:
            if recorder.active and recorder.phase == Phase.FORWARD:
                recorder.b.mark_module_call()

        fb.enter_context(contextlib.closing(module_call_hooks(module_call)))
        recorder.tracker = fb.enter_context(rec.tracker)
        fb.enter_context(recorder)
        # ``loss.backward()`` makes the loss's gradient (ones) before autograd's engine starts:
        # from the call on, ops are backward ops (the recorder marks them so in record_trace too).
        backward = torch.autograd.backward

        def marked_backward(*args: Any, **kwargs: Any) -> Any:
            if recorder.active and recorder.phase == Phase.FORWARD:
                recorder.phase = Phase.BACKWARD
            return backward(*args, **kwargs)

        torch.autograd.backward = marked_backward
        fb.callback(setattr, torch.autograd, "backward", backward)
        fb.enter_context(torch.autograd.graph.saved_tensors_hooks(recorder.pack, recorder.unpack))
        recorder.phase = Phase.FORWARD
        rec.fb = fb

    def _stop_forward_backward(self, rec: _Recording) -> None:
        if rec.fb is not None:
            rec.fb.close()
            rec.fb = None

    def _optimizer_pre(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        rec = self._pending
        if rec is None or rec.deferred or optimizer is not self.optimizer:
            return
        rec.recorder.phase = Phase.OPTIMIZER
        rec.opt = contextlib.ExitStack()
        rec.opt.enter_context(rec.recorder)

    def _optimizer_post(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if optimizer is not self.optimizer:  # a deep copy of the optimizer carries the hook: not ours
            return
        if self._warm_pending:
            self._warm, self._warm_pending = True, False
        rec = self._pending
        if rec is None or rec.opt is None or rec.deferred:
            return
        rec.opt.close()
        if optimizer_layout(self.optimizer) != rec.layout:
            # Not a steady-state iteration: the optimizer made state in it (a parameter group added, or
            # parameters stepped for the first time), so every later step begins with more bytes than
            # this one.  The next step, of the new layout, is recorded instead.
            rec.discard = True
            rec.recorder.active = False
            self._note(f"step {self.steps - 1}: the optimizer made new state in the recorded step (parameters it "
                       "had not stepped before): the next step is recorded instead")
        if rec.timeline is not None and rec.timeline.nested and not rec.timeline.ended:
            # The recording's allocator timeline runs inside another (a benchmark measuring the whole
            # run): closing it switches profiler sessions, which must not happen inside the profiler
            # range Optimizer.step is in (meter's module docstring).  The next step, or save(), builds
            # the trace; the peak is read up to this mark.
            AllocatorTimeline.instant(_RECORDED)
            rec.deferred = True
            return
        self._settle()

    def _settle(self) -> None:
        """The recording waiting for its end: discarded, or built into a trace and planned."""
        rec = self._pending
        if rec is None:
            return
        if rec.discard:
            self._pending = None
            self._close(rec)
            return
        self._finish_recording()

    def _close(self, rec: _Recording) -> None:
        rec.recorder.active = False
        rec.stack.close()

    def _abandon(self, state: _StepState) -> None:
        """Undo what the step turned on (an error inside the model's pre-hook)."""
        if state.kind == "record" and self._recording is not None:
            self._stop_forward_backward(self._recording)
            self._close(self._recording)
            self._recording = None
        elif state.kind in ("warmup", "safe", "waiting") and state.offload is not None:
            state.offload.close()
        elif state.kind == "planned" and state.entry is not None:
            state.entry.runtime.__exit__(None, None, None)
        state.kind = "abandoned"

    def _finish_recording(self) -> None:
        """The recorded step as a trace, then as a plan: a new variant of its signature, one found
        again, or a bucket's envelope grown (planned inline or in the background)."""
        rec, self._pending = self._pending, None
        assert rec is not None
        trace = self._recorded_trace(rec)
        if trace is None:
            return
        variants = self.variants.setdefault(rec.key, [])
        tries = self._record_next.pop(rec.key, 1) - 1
        self._recordings[rec.key] = self._recordings.get(rec.key, 0) + 1
        grown = self._grow(variants, trace, rec) if self.buckets else None
        if grown is not None:
            if grown == "covered" and tries > 0:  # still looking for the kind that left the plan
                self._record_next[rec.key] = tries
            return
        same = next((e for e in variants if _same_iteration(e.trace, trace)), None)
        if same is not None and same.key in self._regrow:
            # Recorded again because more was alive as a step began: the same iteration, planned for
            # the bytes now beside it.
            self._regrow.discard(same.key)
            self.recorded[rec.step] = same.key

            def regrown(plan: Plan) -> None:
                same.trace, same.plan, same.runtime = trace, plan, None
                self.replans += 1
                self._note(f"variant {same.variant} of {rec.description} planned again for "
                           f"{format_bytes(trace.outside_bytes)} beside it")
            self._plan_then(rec.key, trace, rec.description, regrown)
            return
        if same is not None:
            self.recorded[rec.step] = same.key
            if tries > 0:
                self._record_next[rec.key] = tries
            self._note(f"the recorded step is variant {same.variant} of {rec.description} again: no new plan"
                       + (f" ({tries} more to record)" if tries > 0 else ""))
            return
        def new_variant(plan: Plan) -> None:
            n = len(variants)
            entry = Entry(rec.key if n == 0 else f"{rec.key}~{n}", rec.description, trace, plan,
                          signature_key=rec.key, variant=n)
            if n:
                self._note(f"variant {n} of {rec.description}: another iteration of the same signature "
                           f"({len(trace.saved)} saved tensors, {trace.n_ops} ops)")
            variants.append(entry)
            self.entries[entry.key] = entry
            self.recorded[rec.step] = entry.key
            if self.cache is not None:
                self._save_entry(entry, self.cache)
        self._plan_then(rec.key, trace, rec.description, new_variant)

    def _recorded_trace(self, rec: _Recording) -> Trace | None:
        """The trace of the step ``rec`` recorded, its peak noted; None where the step cannot be one
        (its signature then runs in safe mode, said in the log)."""
        recorder = rec.recorder
        peak = None
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            # The recorder resets the peak statistics at every op (scratch); it keeps their maximum.
            peak = max(int(recorder.iteration_peak), int(torch.cuda.max_memory_allocated(self.device))) \
                - rec.start_bytes
        _end_iteration(recorder, self.model, self.optimizer)
        outputs = [t for t in (r() for r in rec.outputs) if t is not None]
        carried = carry_held_outputs(recorder, rec.forward_end, outputs)
        del outputs
        self._close(rec)
        _end_scratch(recorder, rec.timeline)
        if rec.timeline is not None:
            peak = (rec.timeline.between(_RECORDING, _RECORDED)[1] if _RECORDED in rec.timeline.marks
                    else int(rec.timeline.peak))
        if peak is not None:
            self.record_peaks[rec.key] = peak
        meta = {"device": self.device.type, "profile": self.profile.name, "profile_params": self.profile.to_dict(),
                "recorded_iterations": 1, "scratch": "measured", "recorded_by": "autoplan",
                "model": type(self.model).__name__, "signature": rec.description,
                "torch": torch.__version__}
        if rec.batch_size is not None:
            meta["batch_size"] = rec.batch_size
        if carried:
            meta["held_outputs_bytes"] = carried
        if recorder.unannotated:
            meta["unannotated_writes"] = {k: sorted(v) for k, v in sorted(recorder.unannotated.items())}
        try:
            trace = recorder.b.build(meta)
        except ValueError as e:
            # Training goes on: safe mode holds any limit a plan can meet without a trace.
            self._safe_only.add(rec.key)
            self._note(f"the recorded step of {rec.description} could not be made a trace ({e}): its steps run in "
                       "safe mode from now on (saved activations on the host: under any limit a plan can meet, "
                       "slower by the copies); dqn_swap.record_trace on the same model and batch names the op")
            return None
        # On a GPU, what the device held beside the step's own state as it began (cuBLAS's workspaces,
        # the caller's tensors): a limit in bytes is the device's, these bytes come off it
        # (Trace.outside_bytes, MemoryLimit.resolve).
        outside = {"outside_bytes": max(0, int(rec.start_bytes) - trace.initial_bytes)} if self.device.type == "cuda" \
            else {}
        trace = trace.with_durations(self.profile.compute_time(trace.op_flops, trace.op_bytes, trace.op_flops > 0),
                                     timing="roofline", **outside)
        if trace.n_ops == 0 or not len(trace.saved):
            raise AutoPlanError("the step recorded no op that saves anything for backward: call the model and "
                                "loss.backward() inside `with planned.step():`")
        return trace

    def _grow(self, variants: list[Entry], trace: Trace, rec: _Recording) -> str | None:
        """``shapes="bucket"``: a recording of a variant's structure on other sizes is covered by the
        variant's trace (``"covered"``: nothing to do), or widens it to their envelope, planned
        again (``"widened"``).  None when no variant has its structure (a new variant)."""
        from ..trace import dominates, envelope, same_structure

        entry = next((e for e in variants if same_structure(e.trace, trace)), None)
        if entry is None:
            return None
        self.recorded[rec.step] = entry.key
        if dominates(entry.trace, trace):
            self._note(f"the recorded step is covered by variant {entry.variant} of {rec.description}: no new plan")
            return "covered"
        wide = envelope(entry.trace, trace)
        if self.verbose:
            print(f"dqn-swap: a step of {rec.description} was larger than its plan's trace: planning the envelope",
                  file=sys.stderr, flush=True)
        def widened(plan: Plan) -> None:
            entry.trace, entry.plan, entry.runtime = wide, plan, None
            self.replans += 1
            self._note(f"variant {entry.variant} of {rec.description} widened to the envelope of "
                       f"{wide.meta.get('envelope_of', 2)} recordings and planned again")
            if self.cache is not None:
                self._note("the cache keeps a bucket's first plan; the widened one is this run's")
        self._plan_then(rec.key, wide, rec.description, widened)
        return "widened"
