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
import json
import logging
import sys
import time
import weakref
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import _disable_current_modes
from torch.utils._pytree import tree_flatten, tree_flatten_with_path
from torch.utils.module_tracker import ModuleTracker

from .cost import DEFAULT_PROFILE, DeviceProfile, get_profile
from .errors import DqnSwapRuntimeError
from .files import is_plain_name, write_atomically
from .limits import LimitSpec, resolve_limit
from .meter import AllocatorTimeline
from .plan import Plan
from .planners import DEFAULT_PLANNER
from .recorder.hooks import _ModuleTracker
from .recorder.mode import _Recorder, _Saved
from .recorder.record import _end_iteration, _end_scratch, _register_state, carry_held_outputs
from .trace import Phase, Trace, TraceBuilder
from .threads import module_call_hooks
from .units import format_bytes

log = logging.getLogger("dqn_swap.autoplan")

NEW_SHAPES = ("plan", "refuse")
SHAPES = ("exact", "bucket")
PLANNING = ("inline", "background")
_RECORDING, _RECORDED = "autoplan.recording", "autoplan.recorded"  # allocator timeline marks
#: Steps recorded, one after the other, once a step has left its plan, until one is a new variant: the
#: step that left is over by then, and the next ones may be of the usual kind (a padded batch every
#: third step).  Each costs one step in safe mode.
RECORD_TRIES = 4
#: Variants planned per signature at most (``max_variants``): past them, a step that leaves every
#: plan runs in safe mode from there.
MAX_VARIANTS = 8
#: Planners tried, in order, where the chosen one finds no plan under the limit: a limit at or above
#: the minimum always has one, and a step that stops is worse than a plan of another planner.
FALLBACK_PLANNERS = ("greedy", "swap-all")
#: Bytes (or 1 % of the trace's state, the larger) more alive at a step's start than its plan was
#: made for, past which the step is recorded and planned again (``AutoPlan._growth``).
GROWTH_SLACK = 1 << 20


class AutoPlanError(DqnSwapRuntimeError):
    """Planned training cannot go on as asked; the message is one line saying why and what to do."""


# --------------------------------------------------------------------------- host copies
class _HostCopy:
    """A saved activation's whole storage on the host, and how to view it again."""

    __slots__ = ("host", "nbytes", "dtype", "size", "stride", "offset", "tid", "device")

    def __init__(self, t: torch.Tensor, tid: int, host: torch.Tensor) -> None:
        self.host, self.tid, self.device = host, tid, t.device
        self.nbytes = t.untyped_storage().nbytes()
        self.dtype, self.size, self.stride, self.offset = t.dtype, t.size(), t.stride(), t.storage_offset()


def _read_index(index: Path) -> dict[str, Any]:
    """An autoplan cache's ``index.json``: signature key -> {"trace": file, "plan": file, ...}."""
    try:
        entries = json.loads(index.read_text())
        if not isinstance(entries, dict) or not all(isinstance(v, dict) for v in entries.values()):
            raise ValueError("not an object of entries")
    except (OSError, ValueError, RecursionError) as e:  # RecursionError: nested past what json reads
        raise AutoPlanError(f"{index}: not a dqn-swap autoplan index ({e})") from None
    return entries


def _copy_out(t: torch.Tensor, tid: int) -> _HostCopy:
    from .runtime import host_buffer

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


# --------------------------------------------------------------------------- signatures
def bucket(n: int) -> int:
    """The upper end of ``n``'s bucket of sizes: ``n`` up to 8, above it four buckets per doubling
    (9-10, 11-12, ..., 17-20, 21-24, ..., 2049-2560, ...).  A plan is made for the largest size a
    bucket met (``shapes="bucket"``), at most 25 % above the sizes it is followed on."""
    if n <= 8:
        return n
    step = 1 << max(0, (n - 1).bit_length() - 3)
    return -(-n // step) * step


def _describe(x: Any, buckets: bool = False) -> Any:
    if isinstance(x, torch.Tensor):
        shape = tuple(bucket(d) for d in x.shape) if buckets else tuple(x.shape)
        return ("tensor", shape, str(x.dtype), x.device.type, bool(x.requires_grad))
    if x is None or isinstance(x, (bool, int, float, str)):
        return x
    return type(x).__name__


def _name(path: tuple) -> str:
    """``arg0``, ``input_ids``, ``batch['mask']``: a leaf's place in the call."""
    head, *rest = path[1:]
    name = f"arg{head.idx}" if path[0].idx == 0 else str(head.key)
    return name + torch.utils._pytree.keystr(tuple(rest))


def structure(model: torch.nn.Module) -> tuple:
    """The model as a plan depends on it: its module tree (names and classes), and its parameters'
    and buffers' names, shapes, dtypes and whether they train.  Another head, a module swapped for
    another class or a frozen layer is another structure; the weights' values are not part of it."""
    modules = tuple((n, type(m).__qualname__) for n, m in model.named_modules())
    params = tuple((n, tuple(p.shape), str(p.dtype), p.requires_grad) for n, p in model.named_parameters())
    buffers = tuple((n, tuple(b.shape), str(b.dtype)) for n, b in model.named_buffers())
    return modules, params, buffers


def optimizer_layout(optimizer: torch.optim.Optimizer | None, state: bool = True) -> tuple:
    """What an optimizer holds, as memory sees it: its parameter groups' sizes and, per parameter,
    the shapes and dtypes of its state.  A group added midway, or state made for parameters not
    stepped before, is another layout (and other bytes at every step's start).

    A plan's signature holds the groups alone (``state=False``): a step whose optimizer has not
    made all its state yet holds less than the trace that has it, so the plan is followed; a
    recorded step in which the optimizer makes state is not a steady-state one, and is recorded
    again (:mod:`dqn_swap.user_loop`)."""
    if optimizer is None:
        return ()
    groups = tuple(len(g["params"]) for g in optimizer.param_groups)
    if not state:
        return groups
    state = []
    for g in optimizer.param_groups:
        for p in g["params"]:
            st = optimizer.state.get(p)
            state.append(tuple(sorted((k, tuple(v.shape), str(v.dtype), v.device.type) for k, v in st.items()
                                      if isinstance(v, torch.Tensor))) if st else ())
    return groups, tuple(state)


def signature(model: torch.nn.Module, args: tuple, kwargs: dict, shapes_only: bool = False,
              optimizer: torch.optim.Optimizer | None = None, buckets: bool = False) -> tuple[str, str]:
    """(key, description) of a call of ``model``: what a plan is made for (module docstring).
    With ``shapes_only``, a key of the call's shapes and the parameters' alone; with ``buckets``,
    every extent of the call's tensors is its :func:`bucket`'s upper end."""
    leaves, _ = tree_flatten_with_path((args, kwargs))
    call = tuple((_name(p), _describe(x, buckets)) for p, x in leaves)
    seen = tuple((_name(p), _describe(x)) for p, x in leaves) if buckets else call
    params = tuple(tuple(p.shape) for p in model.parameters())
    # Which parameters hold a gradient as the call begins, not only whether any does: after a step
    # whose layerdrop skipped a layer, that layer's gradient is made (not accumulated into) in the
    # next micro-step, memory a plan made after another step did not count (wav2vec2 with
    # accumulation: 1.9 % over the limit).
    with_grad = [p.grad is not None for p in model.parameters() if p.requires_grad]  # (frozen ones never do)
    grads: bool | tuple[int, ...] = (False if not any(with_grad) else True if all(with_grad)
                                     else tuple(i for i, g in enumerate(with_grad) if g))
    dev = next((p.device.type for p in model.parameters()), "cpu")
    autocast = (torch.is_autocast_enabled(dev), str(torch.get_autocast_dtype(dev))) if dev in ("cpu", "cuda") else ()
    sig = (call, params, grads, model.training, torch.is_grad_enabled(), autocast, structure(model),
           optimizer_layout(optimizer, state=False))
    key = hashlib.sha256(repr(sig).encode()).hexdigest()[:16]
    if shapes_only:
        return hashlib.sha256(repr((call, params)).encode()).hexdigest()[:16], ""

    shapes = ", ".join(f"{p}={'x'.join(map(str, d[1])) or 'scalar'} {d[2].replace('torch.', '')}"
                       for p, d in seen if isinstance(d, tuple) and d and d[0] == "tensor")
    held = ", gradients present" if grads is True else \
        f", gradients on {len(grads)} of {len(with_grad)} parameters" if grads else ""
    desc = f"{shapes or 'no tensor arguments'}{held}"
    if autocast and autocast[0]:
        desc += f", autocast {autocast[1].replace('torch.', '')}"
    return key, desc


def batch_size_of(args: tuple, kwargs: dict) -> int | None:
    """The batch size of a call of the model: the leading dimension its tensor arguments (keyword
    ones and those nested in containers included) all share; ``None`` where it is ambiguous (no
    tensor with a dimension, or leading dimensions that differ)."""
    leaves, _ = tree_flatten_with_path((args, kwargs))
    dims = {int(x.shape[0]) for _, x in leaves if isinstance(x, torch.Tensor) and x.dim() > 0}
    return dims.pop() if len(dims) == 1 else None


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


class AutoPlan:
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
        from .support import fsdp_param_groups, unsupported_reason

        if not isinstance(model, torch.nn.Module):
            raise AutoPlanError(f"autoplan needs a torch.nn.Module, got {type(model).__name__}")
        reason = unsupported_reason(model)
        if reason is None and fsdp_param_groups(model):
            reason = ("autoplan does not learn an FSDP2 (fully_shard) iteration in the user's loop (its first steps "
                      "keep saved activations on the host, FSDP's gathered parameters included): record each rank's "
                      "iteration with dqn_swap.record_trace, plan it, and follow the plan with PlannedExecution "
                      "(docs/fsdp.md)")
        if reason is not None:
            raise AutoPlanError(reason)
        if new_shapes not in NEW_SHAPES:
            raise AutoPlanError(f"new_shapes={new_shapes!r}: one of {', '.join(NEW_SHAPES)}")
        if shapes not in SHAPES:
            raise AutoPlanError(f"shapes={shapes!r}: one of {', '.join(SHAPES)}")
        if planning not in PLANNING:
            raise AutoPlanError(f"planning={planning!r}: one of {', '.join(PLANNING)}")
        if optimizer is not None and not isinstance(optimizer, torch.optim.Optimizer):
            raise AutoPlanError(f"optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}")
        from .checks import expect, expect_path

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
            from .agents import check_planner_name

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
        from .limits import MemoryLimit

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
        from .scalars import ScalarLog

        self.log_every = log_every
        self._scalars = ScalarLog(tensorboard) if tensorboard is not None else None
        self.background = planning == "background"
        self._worker: Any = None  # the planning thread (a one-worker executor), made at its first plan
        self._jobs: dict[str, tuple[Any, str, Any]] = {}  # signature key -> (future, description, install)
        self.waiting_steps = 0  # steps run in safe mode while their signature's plan was being made
        self._root_hook = model.register_forward_pre_hook(self._root_call, with_kwargs=True, prepend=True)
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
        from .runtime import STEP_OWNER, UnsupportedTrainingError

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
        from .runtime import HostOffload

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
        rec, self._pending = self._pending, None
        assert rec is not None
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
            return
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

    def _grow(self, variants: list[Entry], trace: Trace, rec: _Recording) -> str | None:
        """``shapes="bucket"``: a recording of a variant's structure on other sizes is covered by the
        variant's trace (``"covered"``: nothing to do), or widens it to their envelope, planned
        again (``"widened"``).  None when no variant has its structure (a new variant)."""
        from .trace import dominates, envelope, same_structure

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

    # ------------------------------------------------------------------ planning
    def _plan_then(self, key: str, trace: Trace, desc: str, install: Any) -> None:
        """Plan ``trace`` and ``install`` the plan: now, or (``planning="background"``) on the worker
        thread, installed at the first step after it is ready (:meth:`_collect`)."""
        if not self.background:
            install(self._make_plan(trace, desc))
            return
        with self._planning(worker=False):  # as inline: the user's random streams, the timeline's window
            self._build_planner()  # here, not on the worker: building the DQN's network draws weights
        if self._worker is None:
            from concurrent.futures import ThreadPoolExecutor

            self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="dqn-swap-planner")
        self._note(f"step {self.steps}: planning {desc} in the background; its steps run in safe mode until the "
                   "plan is ready")
        self._jobs[key] = (self._worker.submit(self._make_plan, trace, desc, True), desc, install)

    def _collect(self, wait: bool = False) -> None:
        """Install the plans the worker has finished (all of them, waiting, with ``wait``); a planning
        error is raised here, on the training thread."""
        for key, (future, desc, install) in list(self._jobs.items()):
            if not (wait or future.done()):
                continue
            del self._jobs[key]
            install(future.result())

    def wait_for_plans(self) -> None:
        """Wait for the plans being made on the worker thread (``planning="background"``) and install
        them; nothing to do otherwise."""
        self._collect(wait=True)

    def _build_planner(self) -> Any:
        if self._planner is None:
            from . import get_planner

            self._planner = get_planner(self.planner_name, **self.planner_options)
        return self._planner

    @contextlib.contextmanager
    def _planning(self, worker: bool) -> Iterator[None]:
        """Where a planner runs on the training thread: the user's random streams untouched (a planner
        that samples would change later dropout masks) and its tensors set aside from the allocator's
        timeline (host memory beside the device).  On the worker thread neither: both are the
        process's, shared with the training thread (module docstring)."""
        if worker:
            yield
            return
        with _rng_untouched(self.device), AllocatorTimeline.aside():
            yield

    def _make_plan(self, trace: Trace, desc: str, worker: bool = False) -> Plan:
        limit = resolve_limit(trace, self.memory_limit)
        if self.verbose:
            print(f"dqn-swap: planning {desc} with {self.planner_name!r} at {format_bytes(limit)} ...",
                  file=sys.stderr, flush=True)
        # (on the worker the planner was built before, on the training thread: _plan_then)
        with self._planning(worker):
            planner = self._build_planner()
            start = time.thread_time()
            plan = planner.plan(trace, limit)
            self.planning_seconds += time.thread_time() - start
        feasible = bool(plan.figures.get("feasible", True))
        self._note(f"planned {desc} with {self.planner_name!r} at {format_bytes(limit)}: {plan.n_swap} swaps, "
                   f"{plan.n_recompute} recomputes, simulated overhead "
                   f"{100 * float(plan.figures.get('overhead', 0.0)):.1f} %"
                   + ("" if feasible else " (INFEASIBLE)"))
        if not feasible and not self.allow_infeasible:
            fallback = self._fallback_plan(trace, limit, desc, worker)
            if fallback is not None:
                return fallback
            from .simulator import simulate

            result = simulate(trace, plan)
            why = result.infeasible.message(trace) if result.infeasible is not None else "over the limit"
            method = plan.settings.get("limitation") if isinstance(plan.settings, dict) else None
            pinned = (" with the pins, which keep some activations on the device (fewer pins may fit)"
                      if self.planner_options.get("pins") else "")
            raise AutoPlanError(f"planner {self.planner_name!r} found no plan under {format_bytes(limit)}{pinned} for "
                                f"{desc}: {why}{f' ({method})' if method else ''}; try another planner or a "
                                "higher limit, or pass allow_infeasible=True to run it anyway")
        return plan

    def _fallback_plan(self, trace: Trace, limit: int, desc: str, worker: bool = False) -> Plan | None:
        """A feasible plan of another planner where the chosen one found none (:data:`FALLBACK_PLANNERS`,
        in order), so that training goes on under the limit; None when none of them finds one.  The
        user's pins (``planner_options["pins"]``) bind them too."""
        from . import get_planner

        pins = self.planner_options.get("pins")
        for name in FALLBACK_PLANNERS:
            if name == self.planner_name:
                continue
            with self._planning(worker):
                start = time.thread_time()
                plan = get_planner(name, pins=pins).plan(trace, limit)
                self.planning_seconds += time.thread_time() - start
            if bool(plan.figures.get("feasible", True)):
                self._note(f"planner {self.planner_name!r} found no plan under {format_bytes(limit)} for {desc}; "
                           f"{name!r} did ({plan.n_swap} swaps, {plan.n_recompute} recomputes, simulated overhead "
                           f"{100 * float(plan.figures.get('overhead', 0.0)):.1f} %): followed instead")
                return plan
        return None

    def _runtime(self, entry: Entry) -> Any:
        if entry.runtime is None:
            from .runtime import PlannedExecution
            from .simulator import schedule_plan

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

    # ------------------------------------------------------------------ files
    def _load_cache(self) -> None:
        assert self.cache is not None
        index = self.cache / "index.json"
        if not index.exists():
            return
        for key, item in _read_index(index).items():
            try:
                names = [item["trace"], item["plan"]]
                if not all(is_plain_name(n) for n in names):
                    raise TypeError("the trace and plan must be file names in the index's folder")
                if not key.partition("~")[0].endswith(self.plan_key):
                    continue  # made for another limit, planner or profile
                trace = Trace.load(self.cache / names[0])
                plan = Plan.load(self.cache / names[1], trace)
            except (KeyError, TypeError) as e:
                raise AutoPlanError(f"{index}: entry {key!r} is malformed ({e})") from None
            sig, _, n = key.partition("~")
            entry = Entry(key, str(item.get("signature", key)), trace, plan, signature_key=sig,
                          variant=int(n) if n.isdigit() else 0)
            self.entries[key] = entry
            self.variants.setdefault(sig, []).append(entry)
        for variants in self.variants.values():
            variants.sort(key=lambda e: e.variant)
        self._warm = True  # planned from the first step; the optimizer's state appears in the first one
        self._note(f"loaded {len(self.entries)} plan(s) from {self.cache}")

    def _save_entry(self, entry: Entry, folder: Path) -> None:
        """Write ``entry``'s trace and plan into ``folder`` and name them in its index; files already
        there are kept as they are (a signature's trace and plan are written once)."""
        folder.mkdir(parents=True, exist_ok=True)
        names = {"trace": f"{entry.key}.trace", "plan": f"{entry.key}.plan.json", "signature": entry.description}
        if not (folder / names["trace"]).exists():
            entry.trace.save(folder / names["trace"])
        if not (folder / names["plan"]).exists():
            entry.plan.save(folder / names["plan"])
        index = folder / "index.json"
        current = _read_index(index) if index.exists() else {}
        if entry.key not in current:
            current[entry.key] = names
            write_atomically(index, (json.dumps(current, indent=1) + "\n").encode(), overwrite=True)

    def save(self, directory: str | Path) -> Path:
        """Write every trace and plan made so far into ``directory`` (``cache=`` reads them back); plans
        still being made on the worker thread are waited for."""
        self.wait_for_plans()
        if self._pending is not None and self._pending.deferred:
            self._settle()
        for entry in self.entries.values():
            self._save_entry(entry, Path(directory))
        return Path(directory)

    # ------------------------------------------------------------------ misc
    def remove(self) -> None:
        """Take autoplan's hooks off the model and optimizer: later steps run unplanned."""
        if self._pending is not None and self._pending.deferred:
            self._settle()
        if self._worker is not None:
            self.wait_for_plans()
            self._worker.shutdown()
            self._worker = None
        self._root_hook.remove()
        for h in self._opt_hooks:
            h.remove()
        if self._scalars is not None:
            self._scalars.write(self.figures(), self.steps)
            self._scalars.close()

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


def _same_iteration(a: Trace, b: Trace) -> bool:
    """Whether two recordings are the same iteration as the runtime sees it: the same ops, tensors
    and saved tensors (their shapes, dtypes and the nodes that made them)."""
    return (a.n_ops == b.n_ops and len(a.saved) == len(b.saved) and a.n_tensors == b.n_tensors
            and [a.op_names[i] for i in a.op_name] == [b.op_names[i] for i in b.op_name]
            and np.array_equal(a.tensor_nbytes, b.tensor_nbytes) and a.saved_signatures == b.saved_signatures
            and a.saved_nodes == b.saved_nodes)


class _Handle:
    def __init__(self, handle: Any) -> None:
        self.handle = handle

    def close(self) -> None:
        self.handle.remove()


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


__all__ = ["AutoPlan", "AutoPlanError", "Entry", "autoplan", "batch_size_of", "signature"]
