"""The dispatch mode that records: :class:`_Recorder` sees every aten op of the iteration and
writes its memory operations into a :class:`~dqn_swap.trace.TraceBuilder` (what it records is
described in :mod:`dqn_swap.recorder`)."""

from __future__ import annotations

import weakref
from typing import Any

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import flop_registry
from torch.utils.module_tracker import ModuleTracker
from torch.utils.weak import WeakIdKeyDictionary

from ..meter import AllocatorTimeline
from ..ops import UNANNOTATED_WRITES, estimate_scratch, node_name, op_name
from ..support import local_tensor
from ..trace import EventKind, Phase, Role, TraceBuilder
from .in_place import InPlaceRewrites
from .vocabulary import (_COLLECTIVES, _CUDA_BLOCK, _WRAPPED_BYTES, _ZERO_FILL, RecordingError, _mutated_args, _tensor_slots,
                         _tensors, _wire_bytes)


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


class _Recorder(InPlaceRewrites, TorchDispatchMode):
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

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
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
        out, peak_during, timing = self.run_op(func, args, kwargs, d)
        for arg_name, x, copy_before in watched:
            if not torch.equal(x, copy_before):  # written without a schema annotation
                self.unannotated.setdefault(op_name(func), set()).add(arg_name)
        outputs = self.on_device(out)
        if not inputs and not outputs:  # host-side bookkeeping (optimizer step counters)
            return out
        if func.is_view or func in (torch.ops.aten.detach.default, torch.ops.aten.lift_fresh.default):
            self.view_outputs(func, outputs)
            return out
        self.record_op(func, args, kwargs, inputs, outputs, out, peak_during, d)
        if timing is not None:
            self.events.append(timing)
        return out

    def run_op(self, func: torch._ops.OpOverload, args: tuple, kwargs: dict, d: int
               ) -> tuple[Any, int | None, tuple | None]:
        """Run ``func`` (the ``d``-th op dispatched), measured as asked: its output, the CUDA
        allocator's peak during it above what was allocated before (``None`` off CUDA or unasked),
        and its pair of CUDA timing events (``None`` unless ops are timed).  On the CPU the
        allocator's timeline marks it, for :meth:`scratch_from`.

        Raises:
            RecordingError: ``func`` failed; the message names it, where in the model, and the phase.
        """
        cuda_peak = self.measure_scratch and self.device_type == "cuda"
        if cuda_peak:
            torch.cuda.reset_peak_memory_stats(self.device)
            before = torch.cuda.memory_allocated(self.device)
        timing = None
        if self.time_ops:
            timing = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            timing[0].record()
        try:
            if self.measure_scratch and self.device_type == "cpu":
                with AllocatorTimeline.mark(str(d)):
                    out = func(*args, **kwargs)
            else:
                out = func(*args, **kwargs)
        except Exception as e:
            self.error_op = f"{func} in {self.module_path() or 'the model'} ({self.phase.name.lower()})"
            raise RecordingError(f"{self.error_op} failed: {type(e).__name__}: {e}") from e
        if timing is not None:
            timing[1].record()
        if not cuda_peak:
            return out, None, timing
        peak = torch.cuda.max_memory_allocated(self.device)
        self.iteration_peak = max(self.iteration_peak, int(peak))
        return out, peak - before, timing

    def view_outputs(self, func: torch._ops.OpOverload, outputs: list[torch.Tensor]) -> None:
        """A view (or ``detach``, ``lift_fresh``) makes no storage: its outputs hold their base alive."""
        for o in outputs:
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

    def record_op(self, func: torch._ops.OpOverload, args: tuple, kwargs: dict, inputs: list[torch.Tensor],  # noqa: C901
                  outputs: list[torch.Tensor], out: Any, peak_during: int | None, d: int) -> None:
        """Write the op ``func`` ran (the ``d``-th dispatched) into the trace: what it read, wrote and
        made, its flops, bytes and scratch; and note what later passes over the trace need (numbers
        autograd saves, gradient accumulations, zero fills, the CPU scratch marks)."""
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
        if peak_during is not None:
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
