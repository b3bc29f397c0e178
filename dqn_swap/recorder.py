"""Record one real training iteration as a trace of memory operations.

:func:`record_trace` runs forward, backward and the optimizer step of any
``torch.nn.Module`` under a :class:`~torch.utils._python_dispatch.TorchDispatchMode`
that sees every aten operation (section 3 of the DQN paper: the sequence of
malloc / write / read / free).  For each op it records:

* a ``read`` of every input storage, a ``malloc`` + ``write`` for every new
  output storage, a ``write`` for every storage the op mutates in place
  (from the op schema's alias annotations);
* the ``free`` of a storage when its last holder dies.  Holders are the
  Python tensor objects that refer to the storage (tracked with
  ``weakref.finalize``; PyTorch keeps a tensor's Python object alive as long
  as its C++ tensor lives) and the objects our
  ``saved_tensors_hooks`` pack hook returns, which are autograd's only
  reference to a saved activation;
* FLOPs from :data:`torch.utils.flop_counter.flop_registry`, bytes moved,
  phase, module path (:class:`torch.utils.module_tracker.ModuleTracker`),
  and the op's duration: the device profile's roofline, or on CUDA the median
  of CUDA-event timings over several iterations;
* the kernel's **scratch memory**, what it allocates for itself above its
  outputs and frees before it returns: on the CPU from the allocator's
  timeline (:class:`dqn_swap.meter.AllocatorTimeline`, a marker around every
  op), on CUDA from the allocator's peak statistics reset before every op, on
  ``meta`` estimated for CUDA kernels (:func:`dqn_swap.ops.estimate_scratch`);
* autograd's gradient accumulation as the in-place add it is in training
  (:meth:`_Recorder.accumulate_in_place`: under a dispatch mode the engine
  falls back to an out-of-place add);
* for every pack of a saved tensor, how many ops ran before it (the
  runtime's anchors, :attr:`Trace.saved_op`), whether it happened inside
  the op before, ahead of that op's frees (``saved_in_op``: an output saved
  by the op's autograd node), and how many ops ran before backward first
  unpacked it (``saved_unpack_op``: a node unpacks what it saved right before
  its first op).
* the Python numbers autograd saves for backward (``x * 0.5``, ``loss / 2``):
  tensors PyTorch makes where no dispatcher or saved-tensor hook sees them,
  recorded as hidden storages (:attr:`Role.HIDDEN`) from the op that read
  them until their autograd node ran (:meth:`_Recorder.resolve_numbers`).

Module paths come from :class:`torch.utils.module_tracker.ModuleTracker`, with
backward hooks that keep no gradient alive (:class:`_ModuleTracker`).

On cpu and cuda the recorder also watches every op that reads a module
buffer: one that changes it without its schema saying so (as the batch-norm
family does with its running statistics, :mod:`dqn_swap.ops`) is listed in
``trace.meta["unannotated_writes"]``, so that recomputation protects it.

Pure view ops (``view``, ``t``, ``detach`` ...) touch no memory and are not
recorded as ops.  Views share their base storage, so a tensor in the trace is
a storage.  One warm-up iteration runs first so that lazily created state
(optimizer moments, cuDNN workspaces) exists before the recorded one, as in a
steady-state training loop; gradients are reset with ``set_to_none`` before
the recorded iteration.

On the ``meta`` device nothing is allocated and nothing is computed, so
ResNet-1001 at batch 256 records on a laptop; only data-dependent ops
(``nonzero``, ``.item()``) cannot run there.
"""

from __future__ import annotations

import contextlib
import copy
import threading
import time
import weakref
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch._prims_common import is_non_overlapping_and_dense_or_false
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.flop_counter import flop_registry
from torch.utils.module_tracker import ModuleTracker
from torch.utils.weak import WeakIdKeyDictionary

from .cost import DEFAULT_PROFILE, DeviceProfile, get_profile
from .errors import DqnSwapRuntimeError
from .meter import AllocatorTimeline, gradient_bytes
from .ops import SCRATCH_MODELS, UNANNOTATED_WRITES, estimate_scratch, node_name, op_name
from .threads import module_call_hooks
from .support import (local_tensor, set_micro_batch, sharded_parameters, unsharded_gradients, unsharded_storages,
                      unsupported_reason)
from .trace import EventKind, Phase, Role, Trace, TraceBuilder

LossFn = Callable[[Any], torch.Tensor]
OptimizerArg = torch.optim.Optimizer | Callable[[Iterable[torch.nn.Parameter]], torch.optim.Optimizer] | None

# The CUDA caching allocator hands out blocks in multiples of 512 bytes.
_CUDA_BLOCK = 512


class RecordingError(DqnSwapRuntimeError):
    """The model could not be recorded; the message says which op or step failed."""


def _tensors(tree: Any) -> list[torch.Tensor]:
    return [x for x in tree_flatten(tree)[0] if isinstance(x, torch.Tensor)]


# Backward ops that make a zero-filled tensor a formula then fills (:meth:`_Recorder.fill_in_place`).
_ZERO_FILL = frozenset({"aten.new_zeros", "aten.zeros", "aten.zeros_like"})

# Bytes of the tensor PyTorch wraps a Python number in (``wrapped_scalar_tensor``: bool, int64,
# double, complex double) when it is given where an op's schema wants a Tensor.
_WRAPPED_BYTES = {bool: 1, int: 8, float: 8, complex: 16}


def _tensor_slots(func: torch._ops.OpOverload) -> tuple[int, ...]:
    """Positions of the schema arguments typed ``Tensor`` (or ``Tensor?``)."""
    out = []
    for i, a in enumerate(func._schema.arguments):
        t = a.type
        if isinstance(t, torch._C.OptionalType):
            t = t.getElementType()
        if isinstance(t, torch._C.TensorType):
            out.append(i)
    return tuple(out)


def _mutated_args(func: torch._ops.OpOverload) -> tuple[int, ...]:
    """Positions of the schema arguments an op writes in place (``Tensor(a!)``)."""
    return tuple(i for i, a in enumerate(func._schema.arguments)
                 if a.alias_info is not None and a.alias_info.is_write)


# c10d collectives (FSDP2's all-gathers and reduce-scatters, DDP's all-reduces) by the bytes one rank
# sends in the ring algorithm, per byte of the largest buffer: (w - 1) / w times this factor.
_COLLECTIVES = {
    "_allgather_base_": 1.0, "allgather_": 1.0, "allgather_into_tensor_coalesced_": 1.0,
    "allgather_coalesced_": 1.0, "_reduce_scatter_base_": 1.0, "reduce_scatter_": 1.0,
    "reduce_scatter_tensor_coalesced_": 1.0, "allreduce_": 2.0, "allreduce_coalesced_": 2.0,
    "broadcast_": None, "alltoall_base_": 1.0, "alltoall_": 1.0,
}


def _world_size(args: tuple) -> int:
    """The size of the process group a c10d op was given (the default group's if it cannot say)."""
    for a in args:
        size = getattr(a, "size", None)
        if callable(size) and not isinstance(a, torch.Tensor):
            try:
                n = size()
            except Exception:  # noqa: BLE001 - not a process group after all
                continue
            if isinstance(n, int) and n > 0:
                return n
    import torch.distributed as dist

    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def _wire_bytes(name: str, args: tuple, inputs: list[torch.Tensor], outputs: list[torch.Tensor]) -> float:
    """Bytes one rank sends in collective ``name`` (:data:`_COLLECTIVES`): for an all-gather or a
    reduce-scatter of a ``B``-byte buffer (the larger side) over ``w`` ranks ``B (w - 1) / w``, for
    an all-reduce twice that, for a broadcast ``B``."""
    tensors = [*inputs, *outputs]
    if not tensors:
        return 0.0
    if name.startswith("allreduce") or name.startswith("alltoall"):
        total = sum(t.numel() * t.element_size() for t in {id(t): t for t in inputs}.values())
    else:
        total = max(t.numel() * t.element_size() for t in tensors)
    factor = _COLLECTIVES[name]
    if factor is None:
        return float(total)
    w = _world_size(args)
    return factor * total * (w - 1) / w


class _Recorder(TorchDispatchMode):
    """Dispatch mode turning aten ops into trace events."""

    def __init__(self, builder: TraceBuilder, device: torch.device, time_ops: bool, measure_scratch: bool,
                 kernels: str = "cuda") -> None:
        super().__init__()
        self.kernels = kernels  # meta: whose kernels' scratch to estimate (dqn_swap.ops.estimate_scratch)
        self.b = builder
        self.device_type = device.type
        self.device = device
        self.block = _CUDA_BLOCK if device.type == "cuda" else 1
        self.time_ops = time_ops
        # Scratch: measured on cpu (timeline marks, read after the iteration) and cuda (peak
        # statistics around every op) when ``measure_scratch``; estimated on meta.
        self.measure_scratch = measure_scratch and device.type in ("cpu", "cuda")
        self.dispatched = 0  # ops seen, recorded or not (the timeline's marks are numbered by it)
        self.marked: list[tuple[int, int, int]] = []  # (dispatch index, trace op, bytes of new outputs)
        self.buffers: set[int] = set()  # storage keys of module buffers (watched for unannotated writes)
        self.unannotated: dict[str, set[str]] = {}
        self.iteration_peak = 0  # cuda: the allocator's peak over the iteration (its statistics are reset per op)
        self.current_op = ""  # the op being dispatched (named in errors)
        self.declared_by: dict[int, str] = {}
        self.phase = Phase.FORWARD
        self.tracker: ModuleTracker | None = None
        self.live: dict[int, int] = {}  # storage key -> tensor id of the live storage
        self.holders: dict[int, int] = {}  # tensor id -> number of live holders
        self.outside: dict[int, int] = {}  # tensor id -> live holders that are not autograd's (_Saved)
        self.seen: WeakIdKeyDictionary = WeakIdKeyDictionary()  # tensor object -> tensor id
        self.events: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []
        self.op_bytes: list[float] = []
        self.mutates: dict[torch._ops.OpOverload, tuple[int, ...]] = {}
        self.active = True
        self.error_op: str | None = None
        self.accumulations: list[tuple[int, int, int]] = []  # (op, first operand, result): see accumulate_in_place
        self.zero_filled: dict[int, int] = {}  # backward tensor made by a zero-fill factory -> its op
        self.fills: list[tuple[int, int, int]] = []  # (op, zero-filled first operand, result): see fill_in_place
        self.tensor_slots: dict[torch._ops.OpOverload, tuple[int, ...]] = {}
        # Bytes alive while an op runs that the dispatcher never shows as tensors (see wrapped_args and
        # fold_constants): added to the op's scratch once its kernel's own is known (finish_scratch).
        self.extra_scratch: dict[int, int] = {}
        self.constants: list[int] = []  # tensor ids of constants lift_fresh made during the iteration
        # Python numbers autograd may have saved (see saved_numbers): (op, its outputs, weakly, the
        # wrapped arguments' names and bytes), looked at once the op has returned through autograd.
        self.pending_numbers: list[tuple[int, list[weakref.ref], list[tuple[str, int]]]] = []
        # autograd node (its sequence number) -> the hidden storages of the numbers it saved, each with
        # a weak reference to the wrapped tensor's storage (see release_numbers)
        self.saved_numbers: dict[int, list[tuple[int, StorageWeakRef]]] = {}
        self.ran_nodes: list[int] = []  # nodes with saved numbers that ran since the last op (release_numbers)
        # FSDP2's unsharded parameter storages (see poll_unsharded): storage key -> storage, the tensor
        # ids they have had, and those allocated since the last recorded op (outputs of the next one).
        self.unsharded: dict[int, torch.UntypedStorage] = {}
        self.unsharded_tids: set[int] = set()
        self.pending_alloc: list[int] = []
        self.pending_free: list[int] = []  # allocated and freed again before an op recorded them
        self.collectives: dict[int, float] = {}  # op -> bytes one rank sends (cost.DeviceProfile.collective_time)

    # ------------------------------------------------------------ storages
    def on_device(self, tree: Any) -> list[torch.Tensor]:
        """Tensors of ``tree`` on the recorded device (host tensors use no GPU memory); a ``DTensor``
        (FSDP2's sharded parameters, their gradients and optimizer state) as its local shard, the
        memory this rank holds."""
        return [local_tensor(t) for t in _tensors(tree) if t.device.type == self.device_type]

    def nbytes(self, t: torch.Tensor) -> int:
        n = t.untyped_storage().nbytes()
        return -(-n // self.block) * self.block

    def tid_of(self, t: torch.Tensor, role: Role = Role.INPUT) -> int:
        """Tensor id of ``t``'s storage; an unknown storage existed before the iteration."""
        if self.unsharded:
            key = t.untyped_storage()._cdata
            if key in self.unsharded:
                # One storage, a new tensor id every time FSDP gathers into it: by its key, not by the
                # tensor object (the unsharded parameter outlives its storage's frees).
                tid = self.live.get(key)
                if tid is None:  # read while FSDP has it freed: no bytes
                    tid = self.b.tensor(0, Role.PARAMETER, preexisting=True)
                return tid
        tid = self.seen.get(t)
        if tid is not None:
            return tid
        key = t.untyped_storage()._cdata
        tid = self.live.get(key)
        if tid is None:
            tid = self.b.tensor(self.nbytes(t), role, preexisting=True)
            self.live[key] = tid
            self.holders[tid] = 0
        self.hold(t, tid, key)
        return tid

    def hold(self, obj: Any, tid: int, key: int) -> None:
        """Count ``obj`` as a holder of storage ``tid``; its death may free the storage.  (Not for
        FSDP's unsharded parameters: FSDP frees those, :meth:`poll_unsharded`.)"""
        if tid in self.unsharded_tids:
            return
        if isinstance(obj, torch.Tensor):
            self.seen[obj] = tid
        self.holders[tid] += 1
        self.outside[tid] = self.outside.get(tid, 0) + 1
        weakref.finalize(obj, self.release_held, tid, key)

    def release_held(self, tid: int, key: int) -> None:
        """A holder other than autograd's died: when it was the last one, only autograd keeps the
        storage from here on (``Trace.tensor_held_op``: a plan acting on it frees memory only then).

        A tensor object dies when neither Python nor C++ refers to it any more (PyTorch keeps
        the Python object of a tensor C++ still holds, such as autocast's cache of weight casts);
        autograd's holder refers to an alias (:class:`_Saved`), so the object's death is the end
        of every other holder: a local of a function still running, a module attribute, a cache."""
        self.outside[tid] -= 1
        if self.outside[tid] == 0 and self.active and self.b.t_held[tid] < 0 and self.b.t_alloc[tid] >= 0:
            self.b.held_until(tid, len(self.b.ops) - 1)
        self.release(tid, key)

    def mark_still_held(self) -> None:
        """At the end of the iteration: storages made in it that something other than autograd still
        holds.  (Storages from before the iteration are held by their owner throughout: the
        runtime borrows a swapped input's storage instead, :attr:`dqn_swap.trace.Trace.movable`.)"""
        for tid, n in self.outside.items():
            if n > 0 and self.b.t_held[tid] < 0 and self.b.t_alloc[tid] >= 0 and tid not in self.unsharded_tids:
                self.b.held_until(tid, len(self.b.ops))

    def release(self, tid: int, key: int) -> None:
        if tid in self.unsharded_tids:
            return
        self.holders[tid] -= 1
        if self.holders[tid] == 0 and self.active:
            self.b.free(tid)
            if self.live.get(key) == tid:
                del self.live[key]

    def watch_unsharded(self, storages: list[torch.UntypedStorage]) -> None:
        """Follow FSDP2's unsharded parameter storages (:func:`dqn_swap.support.unsharded_storages`);
        one allocated now existed before the iteration (gathered in an earlier one and not resharded)."""
        for s in storages:
            key = s._cdata
            self.unsharded[key] = s
            if s.nbytes() and key not in self.live:
                tid = self.b.tensor(self.nbytes_of(s), Role.PARAMETER, preexisting=True)
                self.live[key] = tid
                self.unsharded_tids.add(tid)

    def nbytes_of(self, s: torch.UntypedStorage) -> int:
        return -(-s.nbytes() // self.block) * self.block

    def poll_unsharded(self) -> None:
        """Note what FSDP2 did to its unsharded parameter storages since the last look.

        FSDP allocates them with ``untyped_storage().resize_(size)`` right before it copies the
        all-gathered bytes in (``fsdp.split_with_sizes_copy``, the next op), and frees them with
        ``resize_(0)`` when it reshards (after a module's forward, after its backward).  A storage
        resize is no dispatched op, so the recorder looks at their sizes before every op: one that
        grew is a new tensor, allocated by the next recorded op (which writes it); one that shrank
        to nothing is freed at the end of the last op.  Autograd's saved views of an unsharded
        parameter do not hold its bytes (FSDP gathers them again before backward reads them): the
        trace shows the memory FSDP holds.  Role :attr:`Role.PARAMETER`: no plan moves them, and
        no recomputation re-creates them (that would re-run a collective)."""
        if not self.active:
            return
        for key, s in self.unsharded.items():
            n = s.nbytes()
            tid = self.live.get(key)
            if n and tid is None:
                tid = self.b.tensor(self.nbytes_of(s), Role.PARAMETER)
                self.declared_by[tid] = "FSDP's all-gather (a storage resize)"
                self.live[key] = tid
                self.unsharded_tids.add(tid)
                self.pending_alloc.append(tid)
            elif not n and tid is not None:
                del self.live[key]
                if tid in self.pending_alloc:
                    self.pending_free.append(tid)
                else:
                    self.b.free(tid)

    def new_output(self, t: torch.Tensor) -> tuple[int, bool]:
        """Tensor id of an op output and whether its storage is new."""
        key = t.untyped_storage()._cdata
        tid = self.live.get(key)
        if tid is not None:
            if t not in self.seen:
                self.hold(t, tid, key)
            return tid, False
        tid = self.b.tensor(self.nbytes(t), Role.TEMPORARY)
        self.declared_by[tid] = self.current_op
        self.live[key] = tid
        self.holders[tid] = 0
        self.hold(t, tid, key)
        return tid, True

    # ------------------------------------------------------------- dispatch
    def module_path(self) -> str:
        if self.tracker is None:
            return ""
        names = [p for p in self.tracker.parents if p != "Global"]
        if not names:
            return ""
        # ``parents`` is a set: break ties between modules of one depth by name, not by the
        # set's order (which changes with the interpreter's string hashing between processes).
        deepest = max(names, key=lambda p: (p.count("."), p))
        return deepest.split(".", 1)[1] if "." in deepest else ""

    def watched_buffers(self, func: torch._ops.OpOverload, args: tuple, kwargs: dict) -> list[tuple[str, torch.Tensor,
                                                                                                  torch.Tensor]]:
        """Copies of the module buffers ``func`` reads and its schema does not say it writes."""
        if not self.buffers or func.is_view:
            return []
        if func not in self.mutates:
            self.mutates[func] = _mutated_args(func)
        known = set(UNANNOTATED_WRITES.get(op_name(func), ()))
        out = []
        for i, a in enumerate(func._schema.arguments):
            x = args[i] if i < len(args) else kwargs.get(a.name)
            if (isinstance(x, torch.Tensor) and i not in self.mutates[func] and a.name not in known
                    and x.device.type == self.device_type and x.untyped_storage()._cdata in self.buffers):
                out.append((a.name, x, x.clone()))
        return out

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, C901
        kwargs = kwargs or {}
        if self.pending_numbers:
            self.resolve_numbers()
        if self.ran_nodes:
            self.settle_numbers()
        if self.unsharded:
            self.poll_unsharded()
        inputs = self.on_device((args, kwargs))
        watched = self.watched_buffers(func, args, kwargs) if self.measure_scratch else []
        d = self.dispatched
        self.dispatched += 1
        self.current_op = str(func._overloadpacket)
        cuda_peak = self.measure_scratch and self.device_type == "cuda"
        if cuda_peak:
            torch.cuda.reset_peak_memory_stats(self.device)
            before = torch.cuda.memory_allocated(self.device)
        if self.time_ops:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
        try:
            if self.measure_scratch and self.device_type == "cpu":
                with AllocatorTimeline.mark(str(d)):
                    out = func(*args, **kwargs)
            else:
                out = func(*args, **kwargs)
        except Exception as e:
            self.error_op = f"{func} in {self.module_path() or 'the model'} ({self.phase.name.lower()})"
            raise RecordingError(f"{self.error_op} failed: {type(e).__name__}: {e}") from e
        if self.time_ops:
            end.record()
        if cuda_peak:
            peak = torch.cuda.max_memory_allocated(self.device)
            self.iteration_peak = max(self.iteration_peak, int(peak))
            peak_during = peak - before
        for arg_name, x, copy_before in watched:
            if not torch.equal(x, copy_before):  # written without a schema annotation
                self.unannotated.setdefault(op_name(func), set()).add(arg_name)
        outputs = self.on_device(out)
        if not inputs and not outputs:  # host-side bookkeeping (optimizer step counters)
            return out
        if func.is_view or func in (torch.ops.aten.detach.default, torch.ops.aten.lift_fresh.default):
            for o in outputs:  # a view holds its base storage alive
                if o.untyped_storage()._cdata in self.unsharded:
                    continue  # FSDP's unsharded parameters: FSDP says when they live (poll_unsharded)
                if o.untyped_storage()._cdata in self.live:
                    self.new_output(o)
                else:
                    # A storage no op made: a constant built on the fly (`torch.tensor([])` in a
                    # Hugging Face cache, `x[..., 0] = 3`, lifted by lift_fresh) or a view of one;
                    # counted as there from the start, like a tensor the loss captured, unless it
                    # dies with the op that reads it (:meth:`fold_constants`).
                    fresh_constant = self.seen.get(o) is None and o.untyped_storage()._cdata not in self.live
                    tid = self.tid_of(o)
                    if fresh_constant and func is torch.ops.aten.lift_fresh.default and self.active:
                        self.constants.append(tid)
            return out
        reads = [self.tid_of(t) for t in inputs]
        if func not in self.mutates:
            self.mutates[func] = _mutated_args(func)
        written = []
        for i in self.mutates[func]:
            arg = args[i] if i < len(args) else kwargs.get(func._schema.arguments[i].name)
            written += [self.tid_of(t) for t in self.on_device(arg)]
        fresh = []
        for o in outputs:
            tid, new = self.new_output(o)
            (fresh if new else written).append(tid)
        if self.pending_alloc:  # FSDP's unsharded parameters, allocated for this op to write them
            made = set(self.pending_alloc)
            fresh = [*self.pending_alloc, *(t for t in fresh if t not in made)]
            written = [t for t in written if t not in made]
            reads = [t for t in reads if t not in made]
            self.pending_alloc = []
        flops = 0.0
        packet = func._overloadpacket
        if packet in flop_registry:
            flops = float(flop_registry[packet](*args, **kwargs, out_val=out))
        moved = sum(t.numel() * t.element_size() for t in (*inputs, *outputs))
        new_bytes = sum(self.b.t_nbytes[t] for t in fresh)
        if cuda_peak:
            scratch = max(0, int(peak_during) - new_bytes)
        elif self.device_type == "meta":
            scratch = estimate_scratch(func, args, kwargs, out, self.kernels)
        else:
            scratch = 0  # cpu: read from the timeline after the iteration (:meth:`scratch_from`)
        i = self.b.op(str(packet), self.phase, reads=reads, outputs=fresh, writes=written,
                      flops=flops, bytes_moved=moved, module=self.module_path(), scratch=scratch)
        if self.pending_free:
            for t in self.pending_free:
                self.b.free(t)
            self.pending_free = []
        if packet.__name__ in _COLLECTIVES and packet._qualified_op_name.startswith("c10d::"):
            self.collectives[i] = _wire_bytes(packet.__name__, args, inputs, outputs)
        wrapped = self.wrapped_args(func, args, kwargs)
        if wrapped:
            node = torch._C._current_autograd_node() if self.phase == Phase.BACKWARD else None
            # In backward, a node whose saved numbers are hidden storages reads them unpacked: nothing new.
            if node is None or node._sequence_nr() not in self.saved_numbers:
                self.extra_scratch[i] = self.extra_scratch.get(i, 0) + sum(n for _, n in wrapped)
                if node is None and self.active and torch.is_grad_enabled():
                    self.pending_numbers.append((i, [weakref.ref(o) for o in outputs], wrapped))
        if fresh and self.accumulation_candidate(func, args, kwargs, out):
            self.accumulations.append((i, reads[0], fresh[0]))
        if self.phase == Phase.BACKWARD and len(fresh) == 1:
            if str(packet) in _ZERO_FILL:
                self.zero_filled[fresh[0]] = i
            elif self.zero_filled and self.fill_candidate(func, args, out):
                self.fills.append((i, self.seen[args[0]], fresh[0]))
        if self.measure_scratch and self.device_type == "cpu":
            self.marked.append((d, i, new_bytes))
        if self.time_ops:
            self.events.append((start, end))
        return out

    def accumulation_candidate(self, func: torch._ops.OpOverload, args: tuple, kwargs: dict, out: Any) -> bool:
        """Whether ``func`` may be autograd summing two gradients of one tensor (``a + b``, in backward,
        into a dense result shaped like ``a``): see :meth:`accumulate_in_place`."""
        if self.phase != Phase.BACKWARD or func is not torch.ops.aten.add.Tensor or kwargs.get("alpha", 1) != 1:
            return False
        a = args[0]
        # The engine adds in place only into a tensor whose storage it holds alone
        # (``can_accumulate_inplace``: ``storage().use_count() == 1``): a view keeps its base alive,
        # so a gradient that is a view (a linear layer's weight gradient, ``mm(...).t()``) is summed
        # out of place, into a new tensor (measured: the allocator's timeline shows the new block).
        return (isinstance(a, torch.Tensor) and isinstance(out, torch.Tensor) and a.device.type == self.device_type
                and not a._is_view() and a.shape == out.shape and a.dtype == out.dtype and is_non_overlapping_and_dense_or_false(a)
                and a.untyped_storage().nbytes() == out.untyped_storage().nbytes())

    def fill_candidate(self, func: torch._ops.OpOverload, args: tuple, out: Any) -> bool:
        """Whether ``func`` may be the out-of-place form of an in-place write into a zero-filled tensor
        the same backward formula just made (``zeros(...).index_add(...)``): see :meth:`fill_in_place`."""
        a = args[0] if args else None
        if not (isinstance(a, torch.Tensor) and isinstance(out, torch.Tensor) and self.seen.get(a) in self.zero_filled):
            return False
        name = func._overloadpacket.__name__
        if not (name.endswith("_scatter") or hasattr(torch.ops.aten, name + "_")):
            return False
        return (a.dtype == out.dtype and a.shape == out.shape
                and a.untyped_storage().nbytes() == out.untyped_storage().nbytes())

    def fill_in_place(self) -> dict[int, int]:
        """Record the in-place writes that backward formulas make into a fresh zero-filled tensor as
        the in-place writes they are outside the recorder; returns the renamed tensors (result -> the
        tensor written).

        Several of autograd's formulas build a gradient by filling a fresh zero tensor in place
        (``grad.new_zeros(sizes).index_add_(dim, index, grad)`` for ``index_select``, ``scatter_add_``
        for ``gather``, ``index_put_`` for indexing, ``masked_scatter_`` for ``masked_select``) unless an
        operand is "tensor-subclass-like" (``at::areAnyTensorSubclassLike``), in which case they call the
        out-of-place form.  Under any ``TorchDispatchMode`` every tensor counts as subclass-like, so the
        recorder sees the out-of-place form: a second tensor of the gradient's size alive at once with
        the zeros (measured on the allocator's timeline: ``index_select``'s backward allocates one block
        outside the recorder, two under it).  A backward op whose first operand is a zero-filled tensor
        made in backward (``new_zeros``, ``zeros``, ``zeros_like``), read by nothing else, never saved and
        freed by that very op, whose result is shaped like it and which has an in-place form (``op_``, or
        is a ``*_scatter`` op, the functional form of a write into a view), writes that tensor instead
        of allocating a new one."""
        b = self.b
        merged: dict[int, int] = {}
        if not self.fills:
            return merged
        users: dict[int, set[int]] = {}
        wanted = {into for _, into, _ in self.fills}
        for kind, op, t in b.events:
            if t in wanted and kind != EventKind.FREE:
                users.setdefault(t, set()).add(op)
        for op, into, out in self.fills:
            alloc = b.t_alloc[into]
            if (b.t_free[into] == op and b.t_saved[into] < 0 and b.t_role[into] == Role.TEMPORARY
                    and self.zero_filled.get(into) == alloc and users.get(into, set()) <= {alloc, op}
                    and b.t_alloc[out] == op and b.t_nbytes[out] == b.t_nbytes[into]):
                b.write_in_place(op, out, into)
                merged[out] = into
        return merged

    def accumulate_in_place(self, merged: dict[int, int] | None = None) -> None:
        """Record autograd's gradient accumulation as the in-place add it is outside the recorder.

        The autograd engine sums two gradients of one tensor with ``old.add_(new)`` when it
        holds the last reference to ``old`` (``InputBuffer::accumulate`` in
        ``torch/csrc/autograd/input_buffer.cpp``), and with ``old + new`` otherwise.  Under any
        ``TorchDispatchMode`` every tensor has a Python object, so the reference count is never 1
        and the engine always takes the out-of-place path: a recorded trace would hold both sums
        at once at every residual junction (four activation-sized tensors instead of three in
        ResNet-50's backward).  A backward ``a + b`` whose ``a`` was a gradient made in backward,
        never saved and freed by that very op (the engine dropped it) is what the engine does in
        place in training: the trace writes ``a`` instead of allocating a new tensor.
        """
        b = self.b
        merged = dict(merged or {})  # tensors already renamed (fill_in_place): result -> the tensor it became
        for op, into, out in self.accumulations:
            into = merged.get(into, into)
            alloc = b.t_alloc[into]
            if (b.t_free[into] == op and b.t_saved[into] < 0 and b.t_role[into] == Role.TEMPORARY
                    and alloc >= 0 and b.ops[alloc][1] == Phase.BACKWARD and b.t_alloc[out] == op):
                b.write_in_place(op, out, into)
                merged[out] = into

    def scratch_from(self, timeline: AllocatorTimeline) -> None:
        """Each op's scratch on the CPU: its allocations' peak above the bytes of its new outputs."""
        for d, i, new_bytes in self.marked:
            if str(d) in timeline.marks:
                self.b.scratch[i] = max(0, timeline.window(str(d)).peak - new_bytes)

    def wrapped_args(self, func: torch._ops.OpOverload, args: tuple, kwargs: dict) -> list[tuple[str, int]]:
        """The Python numbers ``func`` was given where its schema wants a Tensor (``x + 1``, ``x * 0.5``),
        as (argument name, bytes): on the CPU the caller wrapped each in a tensor of its own
        (``wrapped_scalar_tensor``, 8 bytes for an int or a float) *before* the op reached the
        dispatcher, which shows it to the mode as the number again; it is freed after the op returns,
        unless autograd saved it (:meth:`resolve_numbers`).  So it sits outside the op's marks on the
        allocator's timeline but is alive while the op runs: part of the op's scratch.  (Measured:
        ``x + 1`` on the timeline is +8 before the op's mark, the output inside, -8 after.)  On cuda
        the wrapped number stays on the host and takes no device memory."""
        if self.device_type != "cpu":
            return []
        slots = self.tensor_slots.get(func)
        if slots is None:
            slots = self.tensor_slots[func] = _tensor_slots(func)
        schema = func._schema.arguments
        out = []
        for i in slots:
            x = args[i] if i < len(args) else kwargs.get(schema[i].name)
            if x is not None and not isinstance(x, torch.Tensor) and type(x) in _WRAPPED_BYTES:
                out.append((schema[i].name, _WRAPPED_BYTES[type(x)]))
        return out

    def resolve_numbers(self) -> None:
        """The Python numbers of the last op that autograd saved for backward: ``x * 0.5`` saves the
        0.5 (``MulBackward0._saved_other``), ``loss / 2`` the 2.  The wrapped tensor then lives on,
        unseen by the dispatcher and by the saved-tensor hooks (autograd packs no wrapped number), until
        the node that saved it is released in backward (the engine's ``release_variables`` right after
        the node ran; measured: -8 on the timeline after MulBackward0's last op).  It becomes a hidden
        storage (:attr:`Role.HIDDEN`) allocated by the op, instead of the op's scratch, freed after the
        node's last op (a post hook of the node); a node backward never runs keeps it to the end.

        Called before the next op is dispatched, when the op's outputs have their ``grad_fn``: the
        op is still the last one of the trace."""
        pending, self.pending_numbers = self.pending_numbers, []
        for op, refs, wrapped in pending:
            node = None
            for r in refs:
                o = r()
                if o is not None and o.grad_fn is not None:
                    node = o.grad_fn
                    break
            if node is None:  # no autograd node: the numbers died with the op (its scratch)
                continue
            hidden = []
            for name, nbytes in wrapped:
                try:
                    saved = getattr(node, "_saved_" + name, None)
                except RuntimeError:  # already released
                    saved = None
                if isinstance(saved, torch.Tensor) and saved.dim() == 0:
                    hidden.append((self.b.hidden(op, nbytes), StorageWeakRef(saved.untyped_storage())))
                    self.extra_scratch[op] -= nbytes
            if hidden:
                seq = node._sequence_nr()
                if seq not in self.saved_numbers:
                    node.register_hook(lambda grad_inputs, grad_outputs, seq=seq: self.release_numbers(seq))
                self.saved_numbers.setdefault(seq, []).extend(hidden)

    def release_numbers(self, seq: int) -> None:
        """Node ``seq`` ran in backward: the engine releases its saved numbers right after this hook,
        unless the backward pass keeps the graph (``retain_graph=True``: they live until a later pass
        releases it).  Which of the two is known at the next op (:meth:`settle_numbers`)."""
        if self.active and seq in self.saved_numbers:
            self.ran_nodes.append(seq)

    def settle_numbers(self) -> None:
        """The numbers of the nodes that ran since the last op whose storage is gone now were released
        after their node's last op: freed there (before the op being dispatched).  Those still alive
        belong to a graph a backward pass kept (``loss.backward(retain_graph=True)``; measured: a
        BART step with a second backward 16 bytes over its trace when freed at the first pass), and
        are freed when a later run of their node releases them."""
        ran, self.ran_nodes = self.ran_nodes, []
        for seq in ran:
            alive = []
            for t, ref in self.saved_numbers.get(seq, ()):
                if ref.expired():
                    self.b.free(t)
                else:
                    alive.append((t, ref))
            self.saved_numbers[seq] = alive

    def fold_constants(self) -> None:
        """A constant lift_fresh made during the iteration and freed by the op that reads it (``x[..., 0]
        = 3`` in T5's ``_shift_right``: an 8-byte int64 tensor filled into ``x``, dropped right after)
        lives from just before that op to its end: the op's scratch.  Counted as existing before the
        iteration, it was in ``initial_bytes`` though the iteration allocates it (measured: unplanned T5
        12 bytes over its trace, 8 of them this).  The tensor stays in the trace, read by the op (the
        runtime checks an op's reads against the trace), with no bytes of its own."""
        b = self.b
        readers: dict[int, list[int]] = {}
        wanted = set(self.constants)
        for kind, op, t in b.events:
            if t in wanted and kind != EventKind.FREE:
                readers.setdefault(t, []).append(op)
        for t in self.constants:
            ops = set(readers.get(t, ()))
            if len(ops) != 1 or b.t_saved[t] >= 0:
                continue
            (op,) = ops
            if b.t_free[t] != op or b.t_alloc[t] != -1:
                continue
            self.extra_scratch[op] = self.extra_scratch.get(op, 0) + b.t_nbytes[t]
            b.t_nbytes[t] = 0

    def finish_scratch(self) -> None:
        """Add to every op's scratch the bytes alive during it that no tensor of the trace holds."""
        for i, extra in self.extra_scratch.items():
            self.b.scratch[i] += extra

    # -------------------------------------------------- saved-tensor hooks
    def pack(self, t: torch.Tensor) -> "_Saved | torch.Tensor":
        if t.device.type != self.device_type:
            return t
        tid = self.tid_of(local_tensor(t))
        if self.phase != Phase.FORWARD:
            # A graph made and run inside backward (reentrant activation checkpointing recomputes
            # a block with gradients on and runs its backward there): what it saves lives as long as
            # autograd holds it, but it is no pack of the iteration's forward pass, which is all a
            # plan acts on (the runtime lets such packs pass).
            k = -1
        else:
            # what the pack held, for the runtime's check of a live iteration at the same pack
            k = self.b.mark_saved(tid, tuple(t.shape), str(t.dtype).removeprefix("torch."), node_name(t))
        holder = _Saved(t, k)
        if tid not in self.unsharded_tids:
            self.holders[tid] += 1
            weakref.finalize(holder, self.release, tid, t.untyped_storage()._cdata)
        return holder

    def unpack(self, holder: "_Saved | torch.Tensor") -> torch.Tensor:
        if not isinstance(holder, _Saved):
            return holder
        if self.active and holder.index >= 0:
            # A node unpacks all its saved tensors right before its first op: the ops so far have
            # run (``Trace.saved_unpack_op``).
            self.b.mark_unpacked(holder.index)
        return holder.tensor


def _multi_grad_hook(tensors: list[torch.Tensor], fn: Callable[[], None]) -> list[Any]:
    """``fn()`` once the gradients of all ``tensors`` that backward computes have been computed:
    ``register_multi_grad_hook(tensors, fn, mode="all")`` without keeping the gradients.  PyTorch's
    buffers every gradient until the last one arrives, to hand them all to ``fn``; under the
    recorder that would hold a gradient the engine has already dropped (measured: T5's 4-byte
    gradient of its loss output, kept by the module tracker until the gradient of the logits came,
    278 ops later), so the trace would not be the memory of training."""
    nodes = [torch.autograd.graph._get_grad_fn_or_grad_acc(t) for t in tensors]
    count: dict[int, int] = {}
    expected: dict[int, int] = {}

    def hook(grad: torch.Tensor) -> None:
        task = torch._C._current_graph_task_id()
        if task not in expected:
            expected[task] = sum(map(torch._C._will_engine_execute_node, nodes))
        count[task] = count.get(task, 0) + 1
        if count[task] == expected[task]:
            del count[task], expected[task]
            fn()

    return [t.register_hook(hook) for t in tensors]


class _ModuleTracker(ModuleTracker):
    """:class:`ModuleTracker` whose backward hooks keep no gradient alive (:func:`_multi_grad_hook`),
    and that hooks no gradient of a module called inside backward.

    Activation checkpointing (``torch.utils.checkpoint``, Hugging Face's
    ``gradient_checkpointing_enable()``) calls modules again in backward to recompute their
    activations; that graph is thrown away once they are recomputed.  A gradient hook on its
    tensors would hold its nodes (a hook refers to the nodes it waits for, and sits on one of
    them: a cycle through C++ the collector does not see), and the nodes the recomputed
    activations, until the recording ends.  Measured on four checkpointed MLP blocks: PyTorch's
    ``ModuleTracker`` raised training's peak from 1.32 to 2.30 MB, and the trace overstated the
    peak by 24 %.  Their ops are named by the module all the same (the forward hooks still mark
    it); their gradients never come."""

    def __enter__(self) -> "_ModuleTracker":
        self._thread = threading.get_ident()  # its forward hooks are the process's (dqn_swap.threads)
        return super().__enter__()

    def _fw_pre_hook(self, mod: torch.nn.Module, input: Any) -> None:  # noqa: A002
        if threading.get_ident() != getattr(self, "_thread", None):
            return  # a module called on another thread (a planner's network, planning meanwhile)
        name = self._get_mod_name(mod)
        self._get_append_fn(name, False)()
        if torch._C._current_graph_task_id() != -1:  # a recomputation inside backward
            return
        tensors = [a for a in tree_flatten(input)[0] if isinstance(a, torch.Tensor) and a.requires_grad]
        if tensors:
            self._hooks.extend(_multi_grad_hook(tensors, self._get_pop_fn(name, True)))

    def _fw_post_hook(self, mod: torch.nn.Module, input: Any, output: Any) -> None:  # noqa: A002
        if threading.get_ident() != getattr(self, "_thread", None):
            return
        name = self._get_mod_name(mod)
        self._get_pop_fn(name, False)()
        if torch._C._current_graph_task_id() != -1:
            return
        tensors = [a for a in tree_flatten(output)[0] if isinstance(a, torch.Tensor) and a.requires_grad]
        if tensors:
            self._hooks.extend(_multi_grad_hook(tensors, self._get_append_fn(name, True)))


class _DeviceGuard(TorchDispatchMode):
    """On ``meta``, an op mixing the model's tensors with another device's non-scalar ones reads a
    tensor the model or the loss captured from elsewhere (a loss target made on the CPU): name it."""

    _MOVES = (torch.ops.aten._to_copy.default, torch.ops.aten.copy_.default, torch.ops.aten.lift_fresh.default)

    def __init__(self, device_type: str) -> None:
        super().__init__()
        self.device_type = device_type

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        kwargs = kwargs or {}
        if func not in self._MOVES:
            tensors = _tensors((args, kwargs))
            if any(t.device.type == self.device_type for t in tensors):
                for t in tensors:
                    if t.device.type != self.device_type and t.dim() > 0:
                        raise RecordingError(
                            f"{func._overloadpacket} reads a {t.device.type} tensor of shape {tuple(t.shape)} "
                            f"({str(t.dtype).replace('torch.', '')}) while the model records on {self.device_type}: "
                            f"make it on {self.device_type} too (a target the loss function captured: create it "
                            "on the same device as the inputs)")
        return func(*args, **kwargs)


# Data-parallel wrappers: their forward only hands over to the wrapped module, whose calls count.
_WRAPPERS = (torch.nn.parallel.DistributedDataParallel, torch.nn.DataParallel)


class _Saved:
    """What autograd keeps for a saved tensor while recording."""

    __slots__ = ("tensor", "index", "__weakref__")

    def __init__(self, tensor: torch.Tensor, index: int) -> None:
        self.index = index  # its packing index
        # An alias of the same storage, made where the recorder does not see it: holding the
        # tensor object itself would keep it alive, and its death is how the recorder learns when
        # every holder outside autograd has let the storage go (:meth:`_Recorder.release_held`).
        with torch._C._DisableTorchDispatch():
            self.tensor = tensor.detach()


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
        if recorder.active and recorder.phase == Phase.FORWARD and not isinstance(module, _WRAPPERS):
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
    from .checks import expect, expect_callable

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
    opt = _make_optimizer(optimizer, model)
    model.train()

    time_ops = device.type == "cuda"
    guard = _DeviceGuard(device.type) if device.type == "meta" else contextlib.nullcontext()
    try:
        with guard:
            for k in range(accumulation):  # warm-up, a whole optimizer step: lazy state appears
                _micro_batch(model, example_inputs, loss_fn, opt, None, k, accumulation)
    except RecordingError:
        raise
    except Exception as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise RecordingError(f"the model failed in its warm-up iteration: {type(e).__name__}: {first}") from e
    runs = iterations if time_ops else 1
    durations: list[np.ndarray] = []
    outside_blocks: list[int] = []
    recorder = None
    timeline = None
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
    b = recorder.b
    record_seconds = time.perf_counter() - t0
    trace_meta = {"device": device.type, "profile": profile.name, "profile_params": profile.to_dict(),
                  "recorded_iterations": runs, "scratch": "estimated" if device.type == "meta" else "measured",
                  **({"scratch_kernels": kernels} if device.type == "meta" else {}),
                  "record_seconds": record_seconds, "torch": torch.__version__,
                  **({"inputs_released": True} if inputs == "released" else {}),
                  **({"accumulation": {"micro_batches": accumulation, "micro_batch": recorded}}
                     if accumulation > 1 else {}), **(meta or {})}
    if recorder.collectives:
        trace_meta["collectives"] = {"ops": len(recorder.collectives), "bytes_sent": sum(recorder.collectives.values()),
                                     "interconnect_bandwidth": profile.interconnect_bandwidth}
    if recorder.unsharded:
        import torch.distributed as dist

        trace_meta["fsdp"] = {"rank": dist.get_rank(), "world_size": dist.get_world_size(),
                              "unsharded_storages": len(recorder.unsharded)}
    if recorder.unannotated:
        trace_meta["unannotated_writes"] = {k: sorted(v) for k, v in sorted(recorder.unannotated.items())}
    try:
        trace = b.build(trace_meta)
    except ValueError as e:
        unallocated = [t for t, a in enumerate(b.t_alloc) if a == -2]
        made_by = sorted({recorder.declared_by.get(t, "an unknown op") for t in unallocated})
        why = (f"{len(unallocated)} storages seen in outputs of {', '.join(made_by)} were never allocated by an op "
               "the recorder saw (an aten call outside the dispatcher's view)" if unallocated else str(e))
        raise RecordingError(f"this iteration cannot be made a trace: {why}; a plan of it would be wrong, so "
                             "none is made: train it unplanned, or with dqn_swap.autoplan, which runs such an "
                             "iteration in safe mode (saved activations on the host)") from None
    if time_ops:
        if len({len(d) for d in durations}) == 1:
            measured = np.median(np.stack(durations), axis=0)
        else:  # the graph changed between iterations (stochastic depth): keep the last one's times
            measured = durations[-1]
        trace = trace.with_durations(_collective_times(measured, recorder, profile), timing="cuda-events",
                                     max_memory_allocated=recorder.iteration_peak,
                                     outside_bytes=max(0, allocated_at_start - trace.initial_bytes),
                                     outside_blocks=outside_blocks)
    else:
        times = profile.compute_time(trace.op_flops, trace.op_bytes, trace.op_flops > 0)
        trace = trace.with_durations(_collective_times(times, recorder, profile), timing="roofline")
    return trace


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
    place for :func:`record_trace` and the recording in the user's loop (:mod:`dqn_swap.user_loop`)."""
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
    with more bytes than the trace: :mod:`dqn_swap.user_loop` sees that at the step's start."""
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
