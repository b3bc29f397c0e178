"""Recomputation: record the forward ops a plan re-runs, and re-run them in backward as scheduled.

Recording
---------
:class:`RecordMode` is a :class:`TorchDispatchMode` that numbers aten ops as
the recorder did (views and host-only bookkeeping do not count) and records
the calls of the ops in :attr:`PlanIndex.record_ops
<dqn_swap.runtime.index.PlanIndex.record_ops>`: the function, its arguments
and, for random ops (dropout), the generator's state before the call, held
outside the device's allocator (:func:`rng_snapshot`).  It is on only where
the plan needs it: the runtime pushes it at an *anchor* -- a pack at which
the trace says how many ops have run (``Trace.saved_op``) -- and takes it off
once the last op of that window has been recorded, at the next pack (or at
the start of the forward pass, for ops before any pack).

Arguments are kept as

* :class:`Ref` for tensors made during the iteration: their storage (tensor
  id and version) and view, resolved at replay from the sequence's own
  outputs, autograd's saved tensors, prefetched swapped tensors, earlier
  re-runs, or the tensor itself while it is still alive;
* :class:`Const` for persistent tensors (parameters, buffers, inputs): the
  tensor and its version counter.  One the trace shows written during the
  forward pass is snapshotted before the op runs, so the re-run reads the
  value the forward pass read; any other must be unchanged when it is
  re-read, or :class:`RecomputeError` names it.

Replay
------
:func:`run_sequence` re-runs one :class:`~dqn_swap.plan.RecomputeStep`
sequence of the plan's schedule under ``no_grad``: each step's outputs in
``keep`` are kept, the others dropped at once, and after each step the
re-created inputs in ``release`` are dropped -- so the memory of a
recomputation is what the simulator charged for it.  Arguments the op writes
(annotated in its schema, or listed in :mod:`dqn_swap.ops` such as batch
norm's running statistics) are cloned first, so a re-run never changes model
state; random ops run with the recorded generator state, so dropout draws the
forward pass's mask.
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_map

from ..errors import DqnSwapRuntimeError
from ..ops import STATISTICS_ONLY, written_positions
from ..plan import RecomputeStep

_VIEW_LIKE = (torch.ops.aten.detach.default, torch.ops.aten.lift_fresh.default)


class TraceMismatchError(DqnSwapRuntimeError):
    """The live iteration does not match the trace the plan was made for."""


class RecomputeError(DqnSwapRuntimeError):
    """A tensor the plan removed could not be recomputed exactly."""


@dataclass(frozen=True)
class Ref:
    """A tensor argument made during the iteration: its storage (id and version) and view."""

    tid: int
    version: int
    dtype: torch.dtype
    size: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int


@dataclass(frozen=True)
class Const:
    """A persistent tensor argument (parameter, buffer, input): the tensor, its version when the
    forward pass read it, and a copy of its value then where the forward pass writes it later."""

    value: torch.Tensor
    version: int
    tid: int
    snapshot: torch.Tensor | None = None


@dataclass
class OpRecord:
    """One recorded forward op: call, argument specs, output tensor ids by flat position, RNG state."""

    func: torch._ops.OpOverload
    args: Any
    kwargs: Any
    outputs: dict[int, int]  # tensor id -> position among the flattened outputs
    rng: tuple[torch.Generator, torch.Generator | torch.Tensor] | None  # generator, rng_snapshot before the op
    live: dict[int, Any]  # tensor id -> weak reference to the live argument tensor (resolution fallback)


def _is_random(func: torch._ops.OpOverload) -> bool:
    return torch.Tag.nondeterministic_seeded in func.tags


def _generator_for(func: torch._ops.OpOverload, args: tuple, kwargs: dict, device: torch.device) -> torch.Generator:
    gen = kwargs.get("generator")
    if isinstance(gen, torch.Generator):
        return gen
    for a in args:
        if isinstance(a, torch.Generator):
            return a
    if device.type == "cuda":
        idx = device.index if device.index is not None else torch.cuda.current_device()
        return torch.cuda.default_generators[idx]
    return torch.default_generator


def rng_snapshot(gen: torch.Generator) -> torch.Generator | torch.Tensor:
    """The state of ``gen`` now, to replay a random op with, held without device memory.

    ``Generator.get_state`` returns the state as a tensor of the host allocator: on the CPU that
    is the device (a CPU generator's state is 5056 bytes), and a recorded random op would hold one
    from its forward run to the end of the iteration, memory no plan counts.  A CPU generator is
    cloned instead (``clone_state``: a generator object, outside the allocator); a CUDA generator's
    state tensor is host memory, not the device's, and is kept as it is.
    """
    if gen.device.type == "cpu":
        return gen.clone_state()
    return gen.get_state()


def rng_state(gen_or_state: torch.Generator | torch.Tensor) -> torch.Tensor:
    """A state for ``Generator.set_state`` from a generator or a state tensor, in host memory outside
    the allocator (a tensor over a ``bytearray``): the allocator's copy that ``get_state`` makes
    lives only inside this call, so re-running a random op holds no state while its kernel runs
    (``OpRecorder.run_sequence`` takes these before its first re-run allocates)."""
    state = gen_or_state.get_state() if isinstance(gen_or_state, torch.Generator) else gen_or_state
    if state.device.type != "cpu":
        return state
    return torch.frombuffer(bytearray(state.numpy().tobytes()), dtype=torch.uint8)


def _touches(x: Any, dev_type: str) -> bool:
    """Whether nested lists, tuples and dicts hold a tensor on a device of type ``dev_type``."""
    if isinstance(x, torch.Tensor):
        return x.device.type == dev_type
    if isinstance(x, (list, tuple)):
        return any(_touches(y, dev_type) for y in x)
    if isinstance(x, dict):
        return any(_touches(y, dev_type) for y in x.values())
    return False


def leaves(x: Any, out: list[Any] | None = None) -> list[Any]:
    """The leaves of nested lists, tuples and dicts in order (what ``tree_flatten`` gives for an op's
    arguments and results, without its cost on every op)."""
    if out is None:
        out = []
    if isinstance(x, (list, tuple)):
        for y in x:
            leaves(y, out)
    elif isinstance(x, dict):
        for y in x.values():
            leaves(y, out)
    else:
        out.append(x)
    return out


def view_of(storage: torch.UntypedStorage, dtype: torch.dtype, size: Sequence[int], stride: Sequence[int],
            offset: int) -> torch.Tensor:
    return torch.empty(0, dtype=dtype, device=storage.device).set_(storage, offset, size, stride)


class RecordMode(TorchDispatchMode):
    """Numbers forward ops from an anchor and records the ones the plan re-runs (module docstring)."""

    def __init__(self, it: Any) -> None:  # the iteration (iteration._Iteration) that owns this
        super().__init__()
        # A weak reference: the iteration owns this mode, and a cycle would keep both (and the swapped
        # tensors' host buffers) alive until the garbage collector runs, instead of until backward ends.
        self.it = weakref.proxy(it)
        self.op = 0  # index of the next counted op
        self.end = -1  # last op of the current window
        self.pushed = False
        self.dispatching = False  # inside __torch_dispatch__: the mode cannot be taken off there
        self.names: dict[torch._ops.OpOverload, str] = {}

    def start(self, op: int, end: int) -> None:
        """Count from ``op`` (the index of the next op) until ``end`` has been recorded."""
        if self.pushed and not self.finished and self.op != op:
            self.it.diverge(f"where the trace has {op} ops behind a module call, this iteration has {self.op}: "
                            "this iteration runs other ops than the trace")
            return
        self.op, self.end = op, end
        if not self.pushed:
            self.__enter__()
            self.pushed = True

    def stop(self) -> None:
        """Off; inside its own dispatch (a divergence found there) it only stops counting, and comes
        off at the runtime's next point of control."""
        if self.dispatching:
            self.end = -1
            return
        if self.pushed:
            self.pushed = False
            self.__exit__(None, None, None)

    @property
    def finished(self) -> bool:
        return self.op > self.end

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # Not wrapped in ``torch._disable_dynamo`` (as TorchDispatchMode subclasses are by default):
        # the wrapper cost about as much per op as the check itself (measured: 0.9 ms of a GPT-2
        # step's 2 ms of checking, 231 ops), and a planned step is never compiled (COMPILED_STEP).
        return False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        kwargs = kwargs or {}
        it = self.it
        if it.paused or self.op > self.end or func.is_view or func in _VIEW_LIKE:
            return func(*args, **kwargs)
        if it.copy_next <= self.op and it.safe is None:
            it.start_due_copies(self.op)  # copies out the simulation starts once the op before has run
        if it.release_next <= self.op and it.safe is None:
            it.release_before(self.op)  # copies out whose bytes this op counts on (before it allocates)
        self.dispatching = True
        try:
            return self._dispatch(func, args, kwargs)
        finally:
            self.dispatching = False

    def _dispatch(self, func: torch._ops.OpOverload, args: tuple, kwargs: dict) -> Any:
        it = self.it
        dev_type = it.rt.device.type
        i = self.op
        if i not in it.record_ops:  # the check alone: the op's name, where it touches the device
            out = func(*args, **kwargs)
            if it.safe is None and (_touches(args, dev_type) or _touches(kwargs, dev_type) or _touches(out, dev_type)):
                self._counted(i, func)
            return out  # (untouched: host-side bookkeeping, profiler marks, counters; the recorder skipped it too)
        flat_in = [x for x in leaves((args, kwargs)) if isinstance(x, torch.Tensor) and x.device.type == dev_type]
        rng = None
        if _is_random(func):
            # The state before the op: replaying it with this state draws the same numbers.
            gen = _generator_for(func, args, kwargs, it.rt.device)
            rng = (gen, rng_snapshot(gen))
        if flat_in:
            spec = it.recorder.spec_args(i, func, args, kwargs, flat_in)  # before it runs
            if it.safe is not None:
                return func(*args, **kwargs)
            out = func(*args, **kwargs)
        else:
            out = func(*args, **kwargs)
            if not _touches(out, dev_type):
                return out  # host-side bookkeeping (profiler marks, counters): the recorder skipped it too
            spec = it.recorder.spec_args(i, func, args, kwargs, flat_in)
            if it.safe is not None:
                return out
        if self._counted(i, func) and spec is not None:
            it.recorder.finish(i, func, spec, out, rng)
        return out

    def _counted(self, i: int, func: torch._ops.OpOverload) -> bool:
        """Op ``i`` ran: count it, and whether it is the op the trace has there (else the
        iteration diverges)."""
        self.op += 1
        name = self.names.get(func)
        if name is None:
            name = self.names[func] = str(func._overloadpacket)
        expected = self.it.expected_names[i] if i < len(self.it.expected_names) else "the end of the iteration"
        if name != expected:
            self.it.diverge(f"forward op #{i} is {name}, the trace recorded {expected}: this iteration runs other "
                            "ops than the trace")
            return False
        return True


class OpRecorder:
    """The recorded ops of one iteration, and their replay."""

    def __init__(self, it: Any) -> None:  # the iteration (iteration._Iteration) that owns this
        self.it = weakref.proxy(it)  # owned by the iteration (see RecordMode)
        self.index = it.index
        self.ops: dict[int, OpRecord] = {}
        self.extra_writes: Mapping[str, Sequence[str]] = it.index.trace.meta.get("unannotated_writes", {}) or {}
        self.held: dict[int, torch.Tensor] = {}  # inputs of re-runs only user code holds (PlanIndex.hold_inputs)

    # ------------------------------------------------------------ recording
    def spec_args(self, i: int, func: torch._ops.OpOverload, args: tuple, kwargs: dict,
                  flat_in: list[torch.Tensor]) -> tuple[Any, dict[int, int], dict[int, Any]]:
        """Argument specs of forward op ``i``, taken before it runs (versions, snapshots)."""
        info = self.index.forward_ops[i]
        keys: dict[int, int] = {}  # storage key -> tensor id, in the trace's read order
        for x in flat_in:
            key = x.untyped_storage()._cdata
            if key not in keys:
                keys[key] = -1
        if len(keys) != len(info.reads):
            self.it.diverge(f"forward op #{i} ({info.name}) reads {len(keys)} storages, the trace recorded "
                            f"{len(info.reads)}: this iteration runs other ops than the trace")
            return None
        for key, tid in zip(list(keys), info.reads):
            keys[key] = tid
        dev_type = self.it.rt.device.type
        index = self.index
        live: dict[int, Any] = {}

        def spec(x: Any) -> Any:
            if not isinstance(x, torch.Tensor) or x.device.type != dev_type:
                return x  # host tensors (scalars) are used as they are
            tid = keys[x.untyped_storage()._cdata]
            if index.is_persistent(tid):
                # The forward pass writes it later (a buffer updated in place): keep what this op read.
                snapshot = x.detach().clone() if tid in index.written_in_forward else None
                return Const(x, x._version, tid, snapshot)
            live.setdefault(tid, _weak(x))
            if tid in index.hold_inputs:
                self.held[tid] = x  # the simulator assumes it alive until its re-run: keep it so
            return Ref(tid, x._version, x.dtype, tuple(x.size()), tuple(x.stride()), x.storage_offset())

        sargs, skwargs = tree_map(spec, (args, kwargs))
        return (sargs, skwargs), keys, live

    def finish(self, i: int, func: torch._ops.OpOverload, spec: tuple[Any, dict[int, int], dict[int, Any]],
               out: Any, rng: tuple[torch.Generator, torch.Generator | torch.Tensor] | None) -> None:
        (sargs, skwargs), keys, live = spec
        info = self.index.forward_ops[i]
        dev_type = self.it.rt.device.type
        fresh: list[int] = []
        positions: dict[int, int] = {}
        for pos, x in enumerate(leaves(out)):
            if isinstance(x, torch.Tensor) and x.device.type == dev_type:
                key = x.untyped_storage()._cdata
                if key not in keys and key not in positions:
                    positions[key] = pos
                    fresh.append(key)
        if len(fresh) != len(info.fresh):
            self.it.diverge(f"forward op #{i} ({info.name}) created {len(fresh)} storages, the trace recorded "
                            f"{len(info.fresh)}: this iteration runs other ops than the trace")
            return
        outputs = {tid: positions[key] for key, tid in zip(fresh, info.fresh)}
        self.ops[i] = OpRecord(func, sargs, skwargs, outputs, rng, live)

    # ------------------------------------------------------------ replay
    def release_held(self, sequence: int) -> None:
        """Drop the held inputs whose last reader was sequence ``sequence``."""
        for tid in [t for t in self.held if self.index.hold_inputs[t] == sequence]:
            del self.held[tid]

    def run_sequence(self, steps: tuple[RecomputeStep, ...]) -> dict[int, torch.UntypedStorage]:
        """Re-run ``steps``; returns the storages they keep that are still alive at the end."""
        made: dict[int, torch.UntypedStorage] = {}
        # The RNG states the random re-runs set, and the ones they give back, taken now, before the
        # first re-run allocates: the allocator's copy ``get_state`` makes of each (rng_state) is then
        # a transient at the memory the sequence starts from, below the sequence's own peak unless its
        # re-runs allocate fewer bytes than one state.  Re-runs in between (this sequence's, nested
        # ones) restore what they set.
        replay_states: dict[int, torch.Tensor] = {}
        current: list[tuple[torch.Generator, torch.Tensor]] = []
        for step in steps:
            rec = self.ops.get(step.op)
            if rec is not None and rec.rng is not None:
                gen, snapshot = rec.rng
                if not any(g is gen for g, _ in current):
                    current.append((gen, rng_state(gen)))
                replay_states[step.op] = rng_state(snapshot)
        for step in steps:
            rec = self.ops.get(step.op)
            if rec is None:
                raise RecomputeError(
                    f"cannot re-run {self.index.trace.op_label(step.op)}: it was not seen in this iteration's "
                    f"forward pass ({self.it.rt.plan_label()})")
            args, kwargs = self._materialize(rec, made, step.op)
            if rec.rng is not None:
                gen = rec.rng[0]
                gen.set_state(replay_states.pop(step.op))  # the forward's RNG state: dropout draws the same mask
                try:
                    out = rec.func(*args, **kwargs)
                finally:
                    gen.set_state(next(state for g, state in current if g is gen))
            else:
                out = rec.func(*args, **kwargs)
            self.it.stats.replayed_ops += 1
            results = leaves(out)
            for tid in step.keep:
                made[tid] = results[rec.outputs[tid]].untyped_storage()
            del out, results, args, kwargs  # outputs not kept are freed here, as the simulator assumes
            for tid in step.release:
                made.pop(tid, None)
        return made

    def _materialize(self, rec: OpRecord, made: dict[int, torch.UntypedStorage], op: int) -> tuple[tuple, dict]:
        it = self.it

        def real(x: Any) -> Any:
            if isinstance(x, Ref):
                storage = made.get(x.tid)
                if storage is None:
                    storage = it.stored(x.tid, x.version)
                if storage is None and x.tid in self.held:
                    storage = self.held[x.tid].untyped_storage()
                if storage is None and x.tid in self.index.sequence_of:
                    # A removed tensor the schedule re-creates before an earlier op, which autograd has
                    # not asked for yet (one node unpacks all it saved before its first op): re-create it
                    # now, as the simulator has it resident by then.
                    it.recompute(x.tid)
                    storage = it.stored(x.tid, x.version)
                if storage is None:
                    storage = _resolve_weak(rec.live.get(x.tid), x.version)
                if storage is None:
                    raise RecomputeError(
                        f"re-running {self.index.trace.op_label(op)}: its input "
                        f"{self.index.tensor_label(x.tid)} is neither kept, swapped, re-created nor alive "
                        f"({it.rt.plan_label()})")
                return view_of(storage, x.dtype, x.size, x.stride, x.offset)
            if isinstance(x, Const):
                if x.snapshot is not None:
                    return x.snapshot
                if x.tid in it.groups_by_tid:
                    it.stored(x.tid, x.version)  # a swapped input: its borrowed storage is refilled first
                if x.value._version != x.version:
                    raise RecomputeError(
                        f"{self.index.tensor_label(x.tid)} was modified in place after the forward pass read "
                        f"it and before its recomputation, so re-running the op would give another value "
                        f"({it.rt.plan_label()}); do not change parameters or buffers between forward and "
                        "backward, or plan without recomputing it")
                return x.value
            return x

        args, kwargs = tree_map(real, (rec.args, rec.kwargs))
        positions = written_positions(rec.func, self.extra_writes)
        if positions:
            schema = rec.func._schema.arguments
            args = list(args)

            def at(pos: int) -> tuple[Any, Any]:
                return (args, pos) if pos < len(args) else (kwargs, schema[pos].name)

            # the written arguments are statistics no output reads (training mode)
            flag = STATISTICS_ONLY.get(str(rec.func._overloadpacket))
            unread = flag is not None and bool(next(
                args[i] if i < len(args) else kwargs.get(a.name) for i, a in enumerate(schema) if a.name == flag))
            for pos in positions:
                container, where = at(pos)
                if isinstance(container, dict) and where not in container:
                    continue
                arg = container[where]
                if isinstance(arg, torch.Tensor):
                    # A re-run must not change model state (batch norm's running statistics) nor the
                    # snapshots it reads.  Batch norm in training mode reads none of its running
                    # statistics for its outputs: it gets none, and updates none (a copy to write
                    # cost a clone per re-run that the simulator does not charge); any other op
                    # writes a copy.
                    container[where] = None if unread and schema[pos].type.kind() == "OptionalType" else arg.clone()
            args = tuple(args)
        return args, kwargs


def _weak(x: torch.Tensor) -> Any:
    return weakref.ref(x)


def _resolve_weak(ref: Any, version: int) -> torch.UntypedStorage | None:
    """The storage of a live argument tensor, if it is still alive and unchanged."""
    if ref is None:
        return None
    x = ref()
    if x is None or x._version != version:
        return None
    return x.untyped_storage()


__all__ = ["Const", "OpRecord", "OpRecorder", "RecomputeError", "Ref", "RecordMode", "TraceMismatchError",
           "rng_snapshot", "rng_state", "view_of"]
