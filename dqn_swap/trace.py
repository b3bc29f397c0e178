"""The trace: one training iteration as a sequence of GPU memory operations.

Section 3 and 4.2 of the DQN paper (Chen, "GPU memory management for neural
networks using deep Q-network") describe an iteration as a sequence of memory
operations ``malloc``, ``write``, ``read`` and ``free``, each on one variable,
with its size and the time it begins.  A :class:`Trace` holds exactly that, in
three column tables, so that 200k events load and simulate quickly:

* **ops** -- the aten operations in execution order: name, phase (forward,
  backward, optimizer), module path, FLOPs, bytes moved and duration (seconds,
  from a device profile or measured with CUDA events).
* **tensors** -- one row per storage (views share their base storage): bytes,
  role (parameter, gradient, optimizer state, input, saved activation,
  temporary, hidden: bytes no tensor of the program shows, such as a Python
  number autograd saved for backward), the op that allocated it (``-1`` when it existed before the
  iteration), the op after which it was freed (``-1`` when it outlives the
  iteration) and its first index in autograd's saved-tensor packing order
  (``-1`` when never saved for backward).
* **events** -- the memory operations: kind, op, tensor.  Within an op the
  order is malloc of outputs, read of inputs, write of outputs, then frees
  that happened when the op finished.  Event times derive from op durations:
  ``malloc`` and ``read`` at the op's start, ``write`` and ``free`` at its end.

A separate table ``saved`` lists, in packing order, the tensor packed by every
``pack_hook`` call of ``torch.autograd.graph.saved_tensors_hooks``; the runtime
uses that order to find the same tensor in a live iteration.  Beside it,
``saved_op`` gives, for every pack, how many ops had run when it happened (the
runtime knows there how far the forward pass has come), ``saved_unpack_op`` how many
ops had run when backward first unpacked it (an autograd node unpacks all its saved
tensors right before its first op: the tensor is needed from there on, and the runtime
knows there how far backward has come), and ``module_call_op``
gives, for every call of a module's ``forward`` in the forward pass, how many
ops had run when it began: the points where no op is under way, at which the
runtime starts numbering ops, so that it only watches the ops a plan re-runs.

``op_scratch`` is the memory a kernel allocates for itself while it runs and
frees before it returns (workspaces, format conversions, im2col buffers): bytes
above its inputs and outputs at the op's own peak.  The recorder measures it
on cpu (the allocator's timeline) and cuda (the allocator's peak statistics)
and estimates it on meta (:mod:`dqn_swap.scratch`).  :attr:`Trace.op_memory`,
and with it every peak, limit and plan, includes it.

File format (``.trace``, version 2): a NumPy ``.npz`` archive (zip), loaded
with ``allow_pickle=False``, so a trace received from elsewhere cannot run
code.  It holds the column arrays named in :data:`_ARRAYS` and ``meta``, a
UTF-8 JSON document (format, version, op and module name tables, recording
details).  Version 1 files (without ``op_scratch``, ``saved_op`` and
``module_call_op``) are read with no scratch and no anchors; any other version
is refused.  ``saved_dtype``, ``saved_ndim`` and ``saved_dims`` (each pack's dtype
and shape, for the runtime's check of a live iteration) are optional within
version 2: files without them load, and the runtime then checks storage sizes only.
"""

from __future__ import annotations

import enum
import hashlib
import io
import json
import os
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from .errors import DqnSwapInputError
from .files import not_a_regular_file, other_kind, write_atomically
# Sizes (dqn_swap.units) are re-exported here too: the simulator, the runtime and users' code import them from here.
from .units import MAX_BYTES, format_bytes, parse_bytes  # noqa: F401

FORMAT = "dqn-swap-trace"
VERSION = 2
#: Versions :meth:`Trace.load` reads (version 1 lacks the optional columns of version 2).
READ_VERSIONS = (1, 2)


class EventKind(enum.IntEnum):
    MALLOC = 0
    WRITE = 1
    READ = 2
    FREE = 3


class Phase(enum.IntEnum):
    FORWARD = 0
    BACKWARD = 1
    OPTIMIZER = 2


class Role(enum.IntEnum):
    PARAMETER = 0
    GRADIENT = 1
    OPTIMIZER_STATE = 2
    INPUT = 3
    SAVED = 4  # an activation autograd saved for backward
    TEMPORARY = 5
    # Bytes no tensor of the program shows: a Python number an op was given where its schema wants a
    # Tensor, wrapped by PyTorch in a tensor of its own, that autograd saved for backward (``x * 0.5``
    # saves the 0.5).  Allocated by the op that read it, freed when autograd releases the node that
    # saved it; no op of the trace reads it, no plan can move it (the runtime never sees it).
    HIDDEN = 6


#: Roles a plan may move (swap or remove): what autograd saves for backward.  The runtime
#: acts through the saved-tensor hooks, so a plan naming anything else could not be followed.
#: An input that autograd saves (the batch a first convolution reads) may be swapped too
#: (:attr:`Trace.movable`): the runtime borrows its storage for the iteration.
MOVABLE_ROLES = (Role.SAVED,)


#: Seconds one iteration may claim (a year): a corrupt file says more, and the sum of its ops then overflows.
MAX_SECONDS = 365 * 24 * 3600.0


class TraceError(DqnSwapInputError):
    """A trace file that cannot be used; the message is one line naming the file."""


# name -> dtype of every column array in the file.
_ARRAYS: dict[str, np.dtype] = {
    "op_name": np.dtype(np.int32),
    "op_phase": np.dtype(np.int8),
    "op_module": np.dtype(np.int32),
    "op_flops": np.dtype(np.float64),
    "op_bytes": np.dtype(np.float64),
    "op_duration": np.dtype(np.float64),
    "tensor_nbytes": np.dtype(np.int64),
    "tensor_role": np.dtype(np.int8),
    "tensor_alloc_op": np.dtype(np.int32),
    "tensor_free_op": np.dtype(np.int32),
    "tensor_saved_index": np.dtype(np.int32),
    "event_kind": np.dtype(np.int8),
    "event_op": np.dtype(np.int32),
    "event_tensor": np.dtype(np.int32),
    "saved": np.dtype(np.int32),
}
# Columns added in version 2, with the value meaning "unknown" in older files: kernel scratch
# bytes per op (0) and the number of ops recorded before each pack (-1).  They enter the
# fingerprint only when they carry information, so version 1 traces keep their fingerprint.
_OPTIONAL: dict[str, tuple[np.dtype, int, str]] = {
    "op_scratch": (np.dtype(np.int64), 0, "op_"),
    "saved_op": (np.dtype(np.int32), -1, "saved"),
    # Per pack, how many ops had run when backward first unpacked it (-1: unknown, or never
    # unpacked): an autograd node unpacks all its saved tensors right before its first op, so a
    # saved tensor is needed from there, which may be an op before the first that reads it
    # (:attr:`Trace.action_window`); and the runtime learns how far backward has come there.
    "saved_unpack_op": (np.dtype(np.int32), -1, "saved"),
    # Per pack, 1 when it happened inside op ``saved_op - 1``: after that op's kernel, before the
    # frees at its end (an autograd node saving the op's output), so that the inputs the op frees are
    # still allocated; 0 after them; -1 unknown (older files).  :attr:`Trace.pack_progress_op`.
    "saved_in_op": (np.dtype(np.int8), -1, "saved"),
    "module_call_op": (np.dtype(np.int32), -1, ""),  # its own length (empty when unknown)
    # Per tensor, the op at whose end the last holder outside autograd let it go (n_ops: held to
    # the end), -1: unknown (older files) or never held; :attr:`Trace.movable`.
    "tensor_held_op": (np.dtype(np.int32), -1, "tensor_"),
    # What every pack held (its dtype, :data:`SAVED_DTYPES` code, and its shape: ``saved_ndim``
    # dimensions per pack, flattened into ``saved_dims``), so that the runtime can check a live
    # iteration against the trace at every pack.  -1: unknown (older files; the runtime then
    # checks storage sizes only).  They describe the same memory operations, so they do not
    # enter the fingerprint.
    "saved_dtype": (np.dtype(np.int8), -1, "saved"),
    "saved_ndim": (np.dtype(np.int16), -1, "saved"),
    "saved_dims": (np.dtype(np.int64), -1, ""),  # its own length: the sum of the known saved_ndim
    # Per pack, the autograd node that made the packed tensor (``type(t.grad_fn).__name__``, an
    # index into ``meta["saved_nodes"]``; the empty name for a tensor without one, a parameter or
    # the batch), so that the runtime's live check sees which op made what it saves, not only its
    # shape: a plan made for a GELU network is not followed on a tanh one of the same shapes.
    # -1: unknown (older files).
    "saved_node": (np.dtype(np.int32), -1, "saved"),
}
_UNHASHED = frozenset({"saved_dtype", "saved_ndim", "saved_dims", "saved_node"})

#: dtype names (``str(torch dtype)`` without ``torch.``) by their ``saved_dtype`` code; append only.
SAVED_DTYPES = ("float32", "float64", "float16", "bfloat16", "complex32", "complex64", "complex128", "uint8",
                "int8", "int16", "int32", "int64", "bool", "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz",
                "float8_e5m2fnuz", "uint16", "uint32", "uint64", "qint8", "quint8", "qint32", "quint4x2")
_DTYPE_CODE = {name: i for i, name in enumerate(SAVED_DTYPES)}


@dataclass(eq=False)
class Trace:
    """One recorded training iteration; see the module docstring for the tables."""

    op_name: np.ndarray
    op_phase: np.ndarray
    op_module: np.ndarray
    op_flops: np.ndarray
    op_bytes: np.ndarray
    op_duration: np.ndarray
    tensor_nbytes: np.ndarray
    tensor_role: np.ndarray
    tensor_alloc_op: np.ndarray
    tensor_free_op: np.ndarray
    tensor_saved_index: np.ndarray
    event_kind: np.ndarray
    event_op: np.ndarray
    event_tensor: np.ndarray
    saved: np.ndarray
    op_scratch: np.ndarray | None = None
    saved_op: np.ndarray | None = None
    saved_unpack_op: np.ndarray | None = None
    saved_in_op: np.ndarray | None = None
    module_call_op: np.ndarray | None = None
    tensor_held_op: np.ndarray | None = None
    saved_dtype: np.ndarray | None = None
    saved_ndim: np.ndarray | None = None
    saved_dims: np.ndarray | None = None
    saved_node: np.ndarray | None = None
    op_names: list[str] = field(default_factory=list)
    module_names: list[str] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name, dtype in _ARRAYS.items():
            setattr(self, name, np.ascontiguousarray(getattr(self, name), dtype=dtype))
        for name, (dtype, missing, rows) in _OPTIONAL.items():
            n = (len(self.op_name) if rows == "op_" else len(self.saved) if rows == "saved"
                 else len(self.tensor_nbytes) if rows == "tensor_" else 0)
            value = getattr(self, name)
            if value is None and name == "saved_dims":
                value = np.zeros(0, dtype=dtype)  # no known shapes: no dimensions
            value = np.full(n, missing, dtype=dtype) if value is None else value
            setattr(self, name, np.ascontiguousarray(value, dtype=dtype))

    # ------------------------------------------------------------------ sizes
    @property
    def n_ops(self) -> int:
        return len(self.op_name)

    @property
    def n_tensors(self) -> int:
        return len(self.tensor_nbytes)

    @property
    def n_events(self) -> int:
        return len(self.event_kind)

    # ----------------------------------------------------------------- timing
    @cached_property
    def op_start(self) -> np.ndarray:
        """Start time of every op when nothing is swapped or recomputed."""
        start = np.zeros(self.n_ops, dtype=np.float64)
        np.cumsum(self.op_duration[:-1], out=start[1:])
        return start

    @property
    def compute_time(self) -> float:
        return float(self.op_duration.sum())

    @cached_property
    def event_time(self) -> np.ndarray:
        """Time of every event: malloc/read at the op's start, write/free at its end."""
        start = self.op_start[self.event_op]
        at_end = (self.event_kind == EventKind.WRITE) | (self.event_kind == EventKind.FREE)
        return start + np.where(at_end, self.op_duration[self.event_op], 0.0)

    # ----------------------------------------------------------------- memory
    @cached_property
    def initial_bytes(self) -> int:
        """Bytes alive before the first op (parameters, optimizer state, inputs)."""
        return int(self.tensor_nbytes[self.tensor_alloc_op < 0].sum())

    @cached_property
    def memory_after_event(self) -> np.ndarray:
        """Bytes allocated right after each event, without any plan."""
        sign = np.zeros(self.n_events, dtype=np.int64)
        sign[self.event_kind == EventKind.MALLOC] = 1
        sign[self.event_kind == EventKind.FREE] = -1
        return self.initial_bytes + np.cumsum(sign * self.tensor_nbytes[self.event_tensor])

    @cached_property
    def op_malloc_bytes(self) -> np.ndarray:
        """Bytes each op allocates when it starts: its outputs (its ``malloc`` events); int64 per op."""
        return self._bytes_per_op(EventKind.MALLOC)

    @cached_property
    def op_free_bytes(self) -> np.ndarray:
        """Bytes each op releases when it ends (its ``free`` events); int64 per op."""
        return self._bytes_per_op(EventKind.FREE)

    def _bytes_per_op(self, kind: EventKind) -> np.ndarray:
        sel = self.event_kind == kind
        # float sums of ints < 2**53 are exact (MAX_BYTES keeps every total below that)
        return np.bincount(self.event_op[sel], weights=self.tensor_nbytes[self.event_tensor[sel]],
                           minlength=self.n_ops).astype(np.int64)

    @cached_property
    def op_memory(self) -> np.ndarray:
        """Peak bytes allocated while each op runs: inputs and outputs both alive, plus the
        kernel's own scratch (``op_scratch``).

        The memory model of :mod:`dqn_swap.simulator`: op ``k`` allocates all its outputs when
        it starts (:attr:`op_malloc_bytes`) and releases its frees when it ends
        (:attr:`op_free_bytes`), so during ``k`` the allocated bytes are what is allocated after
        it plus what it frees: ``initial + cumsum(malloc - free)[k] + free[k] + scratch[k]``.
        """
        after = self.initial_bytes + np.cumsum(self.op_malloc_bytes - self.op_free_bytes)
        return after + self.op_free_bytes + self.op_scratch.astype(np.int64)

    @property
    def peak_bytes(self) -> int:
        return int(self.op_memory.max()) if self.n_ops else self.initial_bytes

    @property
    def outside_bytes(self) -> int:
        """Device bytes held outside the traced iteration as it was recorded on a GPU.

        cuBLAS's and cuBLASLt's workspaces (made at the first matrix product and
        kept), another model, a caller's tensors: the allocator counts them, the
        trace does not.  0 for traces recorded on the CPU or the ``meta`` device.
        A limit in bytes, or a multiple of the measured peak, is the device's:
        :meth:`dqn_swap.limits.MemoryLimit.resolve` takes these bytes off it.
        """
        return max(0, int(self.meta.get("outside_bytes", 0) or 0))

    @property
    def peak_op(self) -> int:
        return int(self.op_memory.argmax()) if self.n_ops else -1

    @cached_property
    def persistent_bytes(self) -> int:
        """Bytes no plan can move: parameters, gradients and optimizer state.

        Inputs count too, except those a plan may swap (:attr:`movable`).  Gradients
        are written in backward and live through the optimizer step.
        """
        keep = np.isin(self.tensor_role, [Role.PARAMETER, Role.OPTIMIZER_STATE, Role.INPUT]) & ~self.movable
        return int(self.tensor_nbytes[keep].sum())

    @cached_property
    def movable(self) -> np.ndarray:
        """Per tensor, whether a plan may act on it: a saved activation (:data:`MOVABLE_ROLES`), or
        an input that autograd saves for backward, unless the user pinned it to stay
        (``meta["pinned_keep"]``, tensor ids: :mod:`dqn_swap.pins`; the fingerprint leaves meta out,
        so a plan made on such a view is a plan of the trace).
        """
        movable = self._movable_by_role()
        pinned = self.meta.get("pinned_keep")
        if pinned:
            movable = movable.copy()
            movable[np.asarray(pinned, dtype=np.int64)] = False
        return movable

    def _movable_by_role(self) -> np.ndarray:
        """:attr:`movable` before the user's pins.

        The input batch is held by the training loop, not by autograd, so freeing autograd's
        reference frees nothing.  Most loops keep holding it (the loop variable, a batch dict):
        then no plan may count on moving it.  A loop that hands the batch over (recorded with
        ``record_trace(..., inputs="released")``, as in the papers, where the runtime owns the
        batch) lets the runtime copy the input out and empty its
        storage until the copy back (:mod:`dqn_swap.runtime.swap`, "borrowed storages"), and the
        caller's tensor holds the same bytes again after backward.  Only swapping applies to it:
        nothing recomputes what existed before the iteration.  (The window paper keeps inputs
        resident; at ResNet-50 batch 1440 the 0.81 GiB input is what stands between the trace's
        minimum and 16 GiB.)
        """
        movable = np.isin(self.tensor_role, MOVABLE_ROLES)
        # A saved activation something outside autograd still holds after its last forward use (a
        # local of a function still running, a module attribute, autocast's cache of weight casts:
        # ``tensor_held_op``) stays where it is whatever the runtime does with autograd's reference,
        # until that holder lets it go (:attr:`action_window`); one held until its next use cannot
        # leave at all (a copy brought back would be a second one).
        movable &= ~(self.tensor_held_op >= self._first_use_after_forward)
        if not self.meta.get("inputs_released"):
            # The usual loop holds its batch through the iteration (``for x, y in loader``, a
            # Hugging Face ``batch`` dict, :func:`dqn_swap.autoplan`): moving it would free nothing.
            # Only a trace recorded with ``inputs="released"`` says that the loop hands it over.
            return movable
        first_pack = self.tensor_saved_index
        inputs = np.flatnonzero((self.tensor_role == Role.INPUT) & (first_pack >= 0))
        if not len(inputs) or not len(self.saved) or self.saved_op[0] < 0:
            return movable  # a version-1 trace: no pack positions
        # Pack k happens while op saved_op[k] runs: before its kernel for the op's inputs, after it
        # for its outputs.  The runtime empties an input's storage at the first point after the op
        # that packed it where it knows that op is over: a module's forward beginning or ending, or
        # the next pack.  An input qualifies when that op is its last forward use and such a point
        # comes before the next op's kernel (a module begins there, or the next op packs one of its
        # inputs), so it leaves right after its last forward use, as a plan assumes.
        before_kernel = np.zeros(self.n_ops + 1, dtype=bool)
        before_kernel[self.module_call_op[(self.module_call_op >= 0) & (self.module_call_op <= self.n_ops)]] = True
        packed_input = self.tensor_alloc_op[self.saved] != self.saved_op
        before_kernel[self.saved_op[packed_input & (self.saved_op >= 0)]] = True
        p = self.saved_op[first_pack[inputs]]
        ok = (p >= 0) & (self._last_forward_use[inputs] == p) & before_kernel[np.minimum(p + 1, self.n_ops)]
        movable[inputs[ok]] = True
        return movable

    @cached_property
    def _last_forward_use(self) -> np.ndarray:
        """Per tensor, the last forward op that reads or writes it (-1: none)."""
        last = np.full(self.n_tensors, -1, dtype=np.int64)
        fwd = (self.event_kind != EventKind.FREE) & (self.op_phase[self.event_op] == Phase.FORWARD)
        np.maximum.at(last, self.event_tensor[fwd], self.event_op[fwd].astype(np.int64))
        return last

    @cached_property
    def action_window(self) -> tuple[np.ndarray, np.ndarray]:
        """Where a plan may keep each tensor off the device: ``(action_op, return_op)`` per tensor.

        A plan acts on a saved activation (:attr:`movable`) right after
        its last forward use ``action_op`` -- the runtime moves tensors through
        autograd's saved-tensor hooks, and forward code holds a tensor until its
        last forward use -- and must have it back for ``return_op``, its first use
        after that (in backward).  Both are ``-1`` for a tensor no plan can move
        (another role, no forward use, or never used again).
        """
        action = self._last_forward_use
        ret = self._first_use_after_forward
        movable = self.movable & (action >= 0) & (ret >= 0)
        return np.where(movable, action, -1), np.where(movable, ret, -1)

    @cached_property
    def _first_use_after_forward(self) -> np.ndarray:
        """Per tensor, its first use after its last forward use (-1: none).

        Backward's first unpack of a saved tensor counts as a use (``saved_unpack_op``): an
        autograd node unpacks every tensor it saved right before its first op runs, so a tensor
        that the node's second op reads (a linear layer's input, for the weight's gradient) is
        needed, and must be back on the device, one op before that op reads it."""
        ret = np.full(self.n_tensors, -1, dtype=np.int64)
        use = self.event_kind != EventKind.FREE
        action = self._last_forward_use
        # Uses sorted by (tensor, op), the next one per tensor.
        t, op = self.event_tensor[use].astype(np.int64), self.event_op[use].astype(np.int64)
        order = np.lexsort((op, t))
        t, op = t[order], op[order]
        after = op > action[t]
        first = np.flatnonzero(after & np.concatenate([[True], ~(after[:-1] & (t[1:] == t[:-1]))]))
        ret[t[first]] = op[first]
        known = self.saved_unpack_op >= 0
        if np.any(known):
            tid = self.saved[known].astype(np.int64)
            unpack = self.saved_unpack_op[known].astype(np.int64)
            later = (unpack > action[tid]) & (ret[tid] >= 0)
            np.minimum.at(ret, tid[later], unpack[later])
        return ret

    @cached_property
    def pack_progress_op(self) -> np.ndarray:
        """Per pack, the op whose memory is allocated when it happens: ``saved_op``, the op about to
        run, or the op before it where the pack happened inside that op, after its kernel and before
        its frees (``saved_in_op``: an autograd node saving an output of the op it wraps); int64,
        non-decreasing, -1 where ``saved_op`` is unknown.  A prefetch the runtime starts at a pack
        is allocated beside that op's memory."""
        op = self.saved_op.astype(np.int64) - (self.saved_in_op == 1)
        op[self.saved_op < 0] = -1
        return np.maximum.accumulate(op) if len(op) else op

    @cached_property
    def progress_ops(self) -> np.ndarray | None:
        """The ops at which the runtime learns how far the iteration has come, so that a prefetch
        can start there (sorted): every pack's :attr:`pack_progress_op` (the forward pass) and every
        first unpack's ``saved_unpack_op`` (an autograd node beginning in backward).  Between two
        of them the runtime has no control (a node's ops run back to back), so a prefetch the
        schedule starts at op ``p`` starts at the first of them at or after ``p``.  ``None`` for a
        trace that does not know its unpacks (older files)."""
        if not len(self.saved) or not np.any(self.saved_unpack_op >= 0) or self.saved_op[0] < 0:
            return None
        packs = self.pack_progress_op
        points = np.concatenate([packs[packs >= 0], self.saved_unpack_op[self.saved_unpack_op >= 0]])
        return np.unique(points.astype(np.int64))

    @cached_property
    def held_op(self) -> np.ndarray:
        """Per tensor, the op until which something outside autograd holds it (``tensor_held_op``,
        -1: nothing does); in a trace recorded with ``inputs="released"``, an input until the last
        forward op at least: the model call holds its arguments until it returns, and the runtime
        empties a handed-over batch once it knows the call is over, at the latest when backward
        begins (:mod:`dqn_swap.runtime.swap`)."""
        held = self.tensor_held_op.astype(np.int64)
        if self.meta.get("inputs_released") and self.n_ops:
            forward = np.flatnonzero(self.op_phase == Phase.FORWARD)
            last = int(forward[-1]) if len(forward) else -1
            inputs = self.tensor_role == Role.INPUT
            held = held.copy()
            held[inputs] = np.maximum(held[inputs], last)
        return held

    @cached_property
    def leave_op(self) -> np.ndarray:
        """Per tensor, the op after which a plan's action on it frees its memory: its action op
        (:attr:`action_window`), or later where a holder outside autograd keeps it until then
        (:attr:`held_op`: the runtime drops autograd's reference, the storage goes when that
        holder lets it go).  -1 for a tensor no plan can move."""
        action, _ = self.action_window
        return np.where(action >= 0, np.maximum(action, self.held_op), -1)

    @cached_property
    def minimum_memory_per_op(self) -> np.ndarray:
        """Per op, the bytes that stay on the device while it runs whatever the plan
        (:attr:`minimum_memory` is their largest)."""
        if self.n_ops == 0:
            return np.zeros(0, dtype=np.int64)
        _, ret = self.action_window
        action = self.leave_op
        gap = np.flatnonzero(ret > action + 1)  # an op runs while the tensor is away
        away = np.zeros(self.n_ops + 1, dtype=np.int64)
        size = self.tensor_nbytes[gap]
        np.add.at(away, action[gap] + 1, size)
        np.add.at(away, ret[gap], -size)
        return self.op_memory - np.cumsum(away)[:-1]

    @cached_property
    def minimum_memory(self) -> int:
        """A lower bound on the memory any plan needs: the 0% of percentage limits.

        A plan can keep a saved activation away from the device only inside its
        :attr:`action_window`: after its last forward use, until its first use
        after that.  So during op ``j`` at least ``op_memory[j]`` minus the saved
        activations whose window strictly contains ``j`` stays allocated,
        whatever the plan; the bound is the largest such amount.  It includes
        every op's whole working set, its kernels' scratch and the persistent
        state (parameters, gradients, optimizer state, inputs, temporaries).
        """
        if self.n_ops == 0:
            return self.initial_bytes
        return int(self.minimum_memory_per_op.max())

    @cached_property
    def minimum_memory_op(self) -> int:
        """The op at which :attr:`minimum_memory` is reached (-1 for a trace without ops)."""
        return int(self.minimum_memory_per_op.argmax()) if self.n_ops else -1

    @cached_property
    def saved_bytes(self) -> int:
        return int(self.tensor_nbytes[self.tensor_role == Role.SAVED].sum())

    # ------------------------------------------------------------- identity
    @cached_property
    def fingerprint(self) -> str:
        """Hash of the structure and costs of the trace; plans carry it."""
        h = hashlib.sha256()
        for name in _ARRAYS:
            h.update(name.encode())
            h.update(getattr(self, name).tobytes())
        for name, (_, missing, _) in _OPTIONAL.items():
            value = getattr(self, name)
            if name in _UNHASHED:
                continue
            if len(value) and np.any(value != missing):  # absent (version 1) and "unknown" hash alike
                h.update(name.encode())
                h.update(value.tobytes())
        h.update(json.dumps([self.op_names, self.module_names]).encode())
        return h.hexdigest()[:16]

    @cached_property
    def saved_signatures(self) -> list[tuple[str | None, tuple[int, ...] | None]]:
        """Per pack, the dtype name and shape of the tensor autograd saved (``None`` where the
        trace does not know them: files written before these columns existed)."""
        ends = np.cumsum(np.maximum(self.saved_ndim, 0))
        dims = self.saved_dims.tolist()
        out: list[tuple[str | None, tuple[int, ...] | None]] = []
        for k, (code, ndim) in enumerate(zip(self.saved_dtype.tolist(), self.saved_ndim.tolist())):
            name = SAVED_DTYPES[code] if 0 <= code < len(SAVED_DTYPES) else None
            shape = tuple(dims[ends[k] - ndim:ends[k]]) if ndim >= 0 else None
            out.append((name, shape))
        return out

    @cached_property
    def saved_nodes(self) -> list[str | None]:
        """Per pack, the name of the autograd node that made the saved tensor (``""``: none, a leaf;
        ``None``: unknown, a file written before the column existed)."""
        names = self.meta.get("saved_nodes") or []
        return [names[c] if 0 <= c < len(names) else None for c in self.saved_node.tolist()]

    def op_label(self, op: int) -> str:
        """Human-readable name of an op, e.g. ``#12 aten.convolution (layer1.0.conv1, forward)``."""
        module = self.module_names[self.op_module[op]] or "<top>"
        return f"#{op} {self.op_names[self.op_name[op]]} ({module}, {Phase(self.op_phase[op]).name.lower()})"

    def with_durations(self, durations: np.ndarray, **meta: Any) -> "Trace":
        """The same trace with other op durations (another device profile)."""
        return self.replace(op_duration=np.asarray(durations, dtype=np.float64), meta={**self.meta, **meta})

    def replace(self, **columns: Any) -> "Trace":
        """A copy with some columns (or ``meta``, ``op_names``, ``module_names``) replaced."""
        fields = {name: getattr(self, name) for name in (*_ARRAYS, *_OPTIONAL)}
        fields.update(op_names=self.op_names, module_names=self.module_names, meta=self.meta)
        unknown = set(columns) - set(fields)
        if unknown:
            raise TypeError(f"Trace has no column {sorted(unknown)[0]!r}")
        fields.update(columns)
        return Trace(**fields)

    # ----------------------------------------------------------------- files
    def save(self, path: str | os.PathLike[str], *, overwrite: bool = False) -> Path:
        """Write the trace; refuses to replace an existing file unless ``overwrite``."""
        path = Path(path)
        if path.exists() and not overwrite:
            raise FileExistsError(f"{path}: already exists (pass overwrite=True / --force to replace it)")
        meta = {"format": FORMAT, "version": VERSION, "op_names": self.op_names,
                "module_names": self.module_names, **self.meta}
        meta_bytes = np.frombuffer(json.dumps(meta).encode("utf-8"), dtype=np.uint8)
        buf = io.BytesIO()
        np.savez_compressed(buf, meta=meta_bytes, **{n: getattr(self, n) for n in (*_ARRAYS, *_OPTIONAL)})
        return write_atomically(path, buf.getvalue(), overwrite=overwrite)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> "Trace":
        """Read a trace file.

        Raises:
            TraceError: the file is missing, not a trace, damaged or of another format version; the
                message is one line.
        """
        from .checks import expect_path

        path = Path(expect_path(path, "path"))
        special = not_a_regular_file(path)
        if special:
            raise TraceError(special)
        try:
            with open(path, "rb") as f:
                magic = f.read(4)
            if magic != b"PK\x03\x04":  # every .npz is a zip archive
                raise TraceError(other_kind(path, "trace") or f"{path}: not a dqn-swap trace file"
                                 + (" (empty file)" if not magic else ""))
            with np.load(path, allow_pickle=False) as z:
                if "meta" not in z.files:
                    raise TraceError(other_kind(path, "trace") or f"{path}: not a dqn-swap trace (no metadata)")
                meta = json.loads(bytes(z["meta"]).decode("utf-8"))
                if not isinstance(meta, dict) or meta.get("format") != FORMAT:
                    raise TraceError(f"{path}: not a dqn-swap trace")
                if meta.get("version") not in READ_VERSIONS:
                    raise TraceError(f"{path}: trace format version {meta.get('version')} is not supported "
                                     f"(this dqn-swap reads versions {', '.join(map(str, READ_VERSIONS))})")
                missing = [n for n in _ARRAYS if n not in z.files]
                if missing:
                    raise TraceError(f"{path}: corrupt trace, missing arrays {', '.join(missing)}")
                arrays = {n: z[n] for n in _ARRAYS}
                arrays.update({n: z[n] for n in _OPTIONAL if n in z.files})
                for name, array in arrays.items():
                    dtype = _ARRAYS[name] if name in _ARRAYS else _OPTIONAL[name][0]
                    if array.ndim != 1 or array.dtype.kind != dtype.kind:
                        raise TraceError(f"{path}: corrupt trace, column {name} is not a 1-d {dtype} array")
                    if dtype.kind == "i" and array.size and array.dtype.itemsize > dtype.itemsize:
                        info = np.iinfo(dtype)  # check before the cast, which would wrap silently
                        if array.min() < info.min or array.max() > info.max:
                            raise TraceError(f"{path}: corrupt trace, column {name} holds {int(array.max())} "
                                             f"or {int(array.min())}, outside {dtype}")
        except TraceError:
            raise
        except FileNotFoundError:
            raise TraceError(f"{path}: no such file") from None
        except IsADirectoryError:
            raise TraceError(f"{path}: is a directory, not a trace file") from None
        except PermissionError:
            raise TraceError(f"{path}: permission denied") from None
        except MemoryError as e:  # an .npy header that claims more rows than the machine can hold
            raise TraceError(f"{path}: corrupt trace file, or one too large for this machine: an array in it "
                             f"needs more memory than there is ({str(e)[:120]})") from None
        except Exception as e:  # noqa: BLE001
            # A damaged archive fails in many ways below zipfile and numpy (BadZipFile, zlib.error,
            # an .npy header numpy cannot parse, a compression method or flag zipfile refuses, ...):
            # any failure to decode the file is the file's, and gets one line.
            first = str(e).strip().splitlines()[0][:160] if str(e).strip() else ""
            raise TraceError(f"{path}: corrupt or truncated trace file ({type(e).__name__}: {first})") from None
        op_names = meta.pop("op_names", [])
        module_names = meta.pop("module_names", [])
        meta.pop("format"), meta.pop("version")
        trace = cls(**arrays, op_names=op_names, module_names=module_names, meta=meta)
        trace.validate(str(path))
        return trace

    def validate(self, where: str = "trace") -> None:
        """Check the tables agree with each other; raises :class:`TraceError`."""
        def bad(msg: str) -> TraceError:
            return TraceError(f"{where}: corrupt trace, {msg}")

        self._validate_meta(bad)
        n_ops, n_t, n_e = self.n_ops, self.n_tensors, self.n_events
        if n_ops == 0:
            raise bad("no ops (a trace records at least one)")
        for prefix, n in (("op_", n_ops), ("tensor_", n_t), ("event_", n_e)):
            for name in (*_ARRAYS, *_OPTIONAL):
                if name.startswith(prefix) and len(getattr(self, name)) != n:
                    raise bad(f"column {name} has {len(getattr(self, name))} rows, expected {n}")
        if len(self.saved_op) != len(self.saved):
            raise bad(f"column saved_op has {len(self.saved_op)} rows, expected {len(self.saved)}")
        for name in ("saved_dtype", "saved_ndim", "saved_node"):
            if len(getattr(self, name)) != len(self.saved):
                raise bad(f"column {name} has {len(getattr(self, name))} rows, expected {len(self.saved)}")
        if len(self.saved) and (self.saved_dtype.min() < -1 or self.saved_dtype.max() >= len(SAVED_DTYPES)):
            raise bad("unknown dtype code in column saved_dtype")
        if len(self.saved) and (self.saved_ndim.min() < -1 or self.saved_ndim.max() > 64):
            raise bad("a saved tensor's number of dimensions (saved_ndim) is out of range")
        nodes = self.meta.get("saved_nodes", [])
        if not isinstance(nodes, list) or not all(isinstance(x, str) for x in nodes):
            raise bad("metadata saved_nodes is not a list of strings")
        if len(self.saved) and (self.saved_node.min() < -1 or self.saved_node.max() >= len(nodes)):
            raise bad("column saved_node refers to a node name out of range")
        n_dims = int(np.maximum(self.saved_ndim, 0).sum()) if len(self.saved) else 0
        if len(self.saved_dims) != n_dims:
            raise bad(f"column saved_dims has {len(self.saved_dims)} rows, expected {n_dims} (the sum of saved_ndim)")
        if n_dims and self.saved_dims.min() < 0:
            raise bad("negative dimension in column saved_dims")
        if np.any(self.op_scratch < 0):
            raise bad("negative scratch bytes")
        if n_t and (self.tensor_held_op.min() < -1 or self.tensor_held_op.max() > n_ops):
            raise bad("tensor_held_op refers to an op out of range")
        if len(self.saved) and (self.saved_in_op.min() < -1 or self.saved_in_op.max() > 1):
            raise bad("column saved_in_op holds a value other than -1, 0 and 1")
        if len(self.saved_unpack_op) != len(self.saved):
            raise bad(f"column saved_unpack_op has {len(self.saved_unpack_op)} rows, expected {len(self.saved)}")
        if len(self.saved) and (self.saved_unpack_op.min() < -1 or self.saved_unpack_op.max() > n_ops):
            raise bad("saved_unpack_op refers to an op out of range")
        for name in ("saved_op", "module_call_op"):
            anchors = getattr(self, name)
            if len(anchors) and (np.any(np.diff(anchors) < 0) or anchors.max() > n_ops or anchors.min() < -1):
                raise bad(f"anchors ({name}) out of order or beyond the last op")
        if n_e and (self.event_op.min() < 0 or self.event_op.max() >= n_ops):
            raise bad("event refers to an op out of range")
        if n_e and (self.event_tensor.min() < 0 or self.event_tensor.max() >= n_t):
            raise bad("event refers to a tensor out of range")
        if n_e and np.any(np.diff(self.event_op) < 0):
            raise bad("events are not in op order")
        if n_ops and (self.op_name.min() < 0 or self.op_name.max() >= len(self.op_names)):
            raise bad("op name index out of range")
        if n_ops and (self.op_module.min() < 0 or self.op_module.max() >= len(self.module_names)):
            raise bad("module index out of range")
        for name in ("op_duration", "op_flops", "op_bytes"):
            values = getattr(self, name)
            if not np.all(np.isfinite(values)):
                raise bad(f"{name} is not finite at op {int(np.flatnonzero(~np.isfinite(values))[0])}")
        if np.any(self.tensor_nbytes < 0) or np.any(self.op_duration < 0):
            raise bad("negative size or duration")
        if n_t and self.tensor_nbytes.max() > MAX_BYTES:
            raise bad(f"tensor {int(self.tensor_nbytes.argmax())} claims {int(self.tensor_nbytes.max())} bytes, "
                      f"beyond any device ({format_bytes(MAX_BYTES)} at most)")
        if n_ops and self.op_scratch.max() > MAX_BYTES:
            raise bad("a kernel's scratch claims more bytes than any device has")
        for name, enum_type in (("event_kind", EventKind), ("op_phase", Phase), ("tensor_role", Role)):
            values = getattr(self, name)
            known = np.isin(values, [int(v) for v in enum_type])
            if not np.all(known):
                raise bad(f"unknown {name.split('_', 1)[1]} {int(values[~known][0])} in column {name}")
        if n_t and (self.tensor_alloc_op.min() < -1 or self.tensor_alloc_op.max() >= n_ops
                    or self.tensor_free_op.min() < -1 or self.tensor_free_op.max() >= n_ops):
            raise bad("a tensor's allocating or freeing op is out of range")
        if len(self.saved) and (self.saved.min() < 0 or self.saved.max() >= n_t):
            raise bad("saved-tensor table refers to a tensor out of range")
        self._validate_structure(bad)

    def _validate_structure(self, bad: Any) -> None:
        """What an iteration can be: each tensor's events in order, phases in order, packs in forward,
        every saved index where the saved table says, totals that no sum overflows.

        Per tensor, in event order: its malloc first (and only when it is allocated in the
        iteration, at its allocating op), then reads and writes, then at most one free (at its
        freeing op, the last event).  Ops run forward, then backward, then the optimizer, and
        every event's op is at or after its tensor's allocation: the graph of producers is
        then ordered by op, so it has no cycle.
        """
        n_t = self.n_tensors
        kind, op, tensor = self.event_kind, self.event_op, self.event_tensor
        order = np.lexsort((np.arange(len(tensor)), tensor))  # events grouped by tensor, in order
        ts, ks = tensor[order], kind[order]
        first = np.r_[True, ts[1:] != ts[:-1]] if len(ts) else np.zeros(0, bool)
        last = np.r_[ts[1:] != ts[:-1], True] if len(ts) else np.zeros(0, bool)
        alloc, free = self.tensor_alloc_op, self.tensor_free_op
        is_malloc, is_free = kind == EventKind.MALLOC, kind == EventKind.FREE
        mallocs = np.bincount(tensor[is_malloc], minlength=n_t)
        frees = np.bincount(tensor[is_free], minlength=n_t)

        def first_of(mask: np.ndarray) -> int:
            return int(np.flatnonzero(mask)[0])

        wrong = mallocs != (alloc >= 0)
        if wrong.any():
            t = first_of(wrong)
            raise bad(f"tensor {t} has {int(mallocs[t])} malloc events but its allocating op is {int(alloc[t])} "
                      "(one malloc for a tensor allocated in the iteration, none for one that existed before)")
        wrong = frees != (free >= 0)
        if wrong.any():
            t = first_of(wrong)
            raise bad(f"tensor {t} has {int(frees[t])} free events but its freeing op is {int(free[t])} "
                      "(one free for a tensor freed in the iteration, none for one that outlives it)")
        wrong = (ks == EventKind.MALLOC) & ~first
        if wrong.any():
            t = int(ts[first_of(wrong)])
            raise bad(f"tensor {t} is used before its malloc (op {int(alloc[t])})")
        wrong = (ks == EventKind.FREE) & ~last
        if wrong.any():
            t = int(ts[first_of(wrong)])
            raise bad(f"tensor {t} is used after its free (op {int(free[t])})")
        wrong = is_malloc & (op != alloc[tensor])
        if wrong.any():
            e = first_of(wrong)
            raise bad(f"tensor {int(tensor[e])}'s malloc event is at op {int(op[e])} but its allocating op is "
                      f"{int(alloc[tensor[e]])}")
        wrong = is_free & (op != free[tensor])
        if wrong.any():
            e = first_of(wrong)
            raise bad(f"tensor {int(tensor[e])}'s free event is at op {int(op[e])} but its freeing op is "
                      f"{int(free[tensor[e]])}")
        roles = self.tensor_role
        # A saved activation the training loop still holds when the iteration ends (the output object
        # kept past ``optimizer.step()``: ``tensor_held_op`` is the last op) outlives it; no plan moves it.
        leak = (alloc >= 0) & (free < 0) & (roles == Role.SAVED) & (self.tensor_held_op != self.n_ops)
        if leak.any():
            t = first_of(leak)
            raise bad(f"tensor {t} (saved for backward) is allocated at op {int(alloc[t])} and never freed "
                      "(backward frees what forward saved)")
        phase = self.op_phase.astype(np.int64)
        if np.any(np.diff(phase) < 0):
            o = int(np.flatnonzero(np.diff(phase) < 0)[0]) + 1
            raise bad(f"op {o} is {Phase(int(phase[o])).name.lower()} after a {Phase(int(phase[o - 1])).name.lower()}"
                      " op (an iteration runs forward, then backward, then the optimizer)")
        if len(self.saved):
            if phase[0] != Phase.FORWARD:
                raise bad("tensors are saved for backward but no op runs forward")
            known = self.saved_op[self.saved_op >= 0]
            n_forward = int(np.sum(phase == Phase.FORWARD))
            if len(known) and known.max() > n_forward:
                raise bad(f"a pack happens after op {int(known.max())}, past the forward pass ({n_forward} ops)")
        # The saved index of a tensor is its first position in the saved table, and only saved tensors have one.
        index = self.tensor_saved_index
        expected = np.full(n_t, -1, dtype=np.int64)
        positions = np.arange(len(self.saved), dtype=np.int64)
        expected[self.saved[::-1]] = positions[::-1]  # the first position wins
        wrong = index != expected
        if wrong.any():
            t = first_of(wrong)
            raise bad(f"tensor {t}'s saved index is {int(index[t])} but the saved table puts it at "
                      f"{int(expected[t])} (-1: never saved)")
        # Totals: every tensor alive at once, and the whole iteration's time, stay within bounds,
        # so no sum of them overflows and no plan is made for a machine that cannot exist.
        size = self.tensor_nbytes.astype(np.float64)
        if size.sum() + float(self.op_scratch.max(initial=0)) > MAX_BYTES:
            # Sums in float: the int64 ones of op_memory could overflow on a file that says too much.
            delta = np.where(is_malloc, size[tensor], 0.0) - np.where(is_free, size[tensor], 0.0)
            alive = float(size[alloc < 0].sum()) + np.cumsum(delta)
            peak = float(np.max(alive, initial=0.0)) + float(self.op_scratch.max(initial=0))
            if peak > MAX_BYTES:
                raise bad(f"the iteration needs about {format_bytes(peak)} at its peak, beyond any device "
                          f"({format_bytes(MAX_BYTES)} at most)")
        for name in ("op_duration", "op_flops", "op_bytes"):
            values = getattr(self, name)
            with np.errstate(over="ignore"):
                total_f = float(values.sum())
            if not np.isfinite(total_f) or (name == "op_duration" and total_f > MAX_SECONDS):
                raise bad(f"{name} sums to {total_f:.3g}"
                          + (f", beyond {MAX_SECONDS:.0f} s for one iteration" if name == "op_duration" else ""))

    def _validate_meta(self, bad: Any) -> None:
        """The name tables and the metadata the planners read have the right types."""
        for name in ("op_names", "module_names"):
            table = getattr(self, name)
            if not isinstance(table, list) or not all(isinstance(x, str) for x in table):
                raise bad(f"{name} is not a list of strings")
        if not isinstance(self.meta, dict):
            raise bad("metadata is not a JSON object")
        for key, types in (("profile", (str,)), ("profile_params", (dict,)), ("model", (str,)),
                           ("device", (str,)), ("inputs_released", (bool,)), ("batch_size", (int,))):
            value = self.meta.get(key)
            if value is not None and (not isinstance(value, types) or isinstance(value, bool) != (bool in types)):
                raise bad(f"metadata {key} is {value!r}, not a {types[0].__name__}")
        name, params = self.meta.get("profile"), self.meta.get("profile_params")
        if name is not None or params is not None:
            from .cost import PROFILES, profile_of

            try:
                profile = profile_of(self)
            except (ValueError, TypeError, KeyError) as e:
                raise bad(f"metadata profile: {str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
            if name is not None and name != profile.name:
                raise bad(f"metadata profile {name!r} disagrees with its profile_params ({profile.name!r})")
            if params is None and name not in PROFILES:
                raise bad(f"metadata profile {name!r} is unknown and has no profile_params")

    # -------------------------------------------------------------- summary
    def summary(self) -> dict[str, Any]:
        """The figures ``dqn-swap inspect`` prints."""
        peak_op = self.peak_op
        return {
            "model": self.meta.get("model"),
            "batch_size": self.meta.get("batch_size"),
            "device": self.meta.get("device"),
            "profile": self.meta.get("profile"),
            "fingerprint": self.fingerprint,
            "events": self.n_events,
            "ops": self.n_ops,
            "tensors": self.n_tensors,
            "ops_per_phase": {p.name.lower(): int((self.op_phase == p).sum()) for p in Phase},
            "peak_bytes": self.peak_bytes,
            "peak_op": self.op_label(peak_op) if peak_op >= 0 else None,
            "compute_time_s": self.compute_time,
            "saved_activation_bytes": self.saved_bytes,
            "persistent_bytes": self.persistent_bytes,
            "minimum_memory_bytes": self.minimum_memory,
            "minimum_memory_op": self.op_label(self.minimum_memory_op) if self.n_ops else None,
            "max_op_scratch_bytes": int(self.op_scratch.max()) if self.n_ops else 0,
            "scratch": self.meta.get("scratch", "none"),
        }


class TraceBuilder:
    """Builds a :class:`Trace` op by op; used by the recorder and by tests.

    >>> b = TraceBuilder()
    >>> w = b.tensor(64, Role.PARAMETER, preexisting=True)
    >>> x = b.tensor(32, Role.INPUT, preexisting=True)
    >>> y = b.op("aten.mm", Phase.FORWARD, reads=[x, w], outputs=[b.tensor(16, Role.SAVED)], duration=1.0)
    """

    def __init__(self) -> None:
        self._names: dict[str, int] = {}
        self._modules: dict[str, int] = {"": 0}
        self.ops: list[tuple[int, int, int, float, float, float]] = []
        self.scratch: list[int] = []
        self.t_nbytes: list[int] = []
        self.t_role: list[int] = []
        self.t_alloc: list[int] = []
        self.t_free: list[int] = []
        self.t_saved: list[int] = []
        self.t_held: list[int] = []  # op at whose end the last holder outside autograd let go (-1: none)
        self.events: list[tuple[int, int, int]] = []
        self.saved: list[int] = []
        self.saved_op: list[int] = []
        self.saved_unpack_op: list[int] = []
        self._saved_events: list[int] = []  # per pack, the events recorded before it
        self.saved_dtype: list[int] = []
        self.saved_ndim: list[int] = []
        self.saved_dims: list[int] = []
        self.saved_node: list[int] = []
        self._node_names: dict[str, int] = {}
        self.module_call_op: list[int] = []
        self._pending_free: list[int] = []
        self._merged: dict[int, tuple[int, int]] = {}  # tensor -> (op, tensor it became): write_in_place

    def tensor(self, nbytes: int, role: Role = Role.TEMPORARY, *, preexisting: bool = False) -> int:
        """Declare a storage; a preexisting one is alive before the first op."""
        self.t_nbytes.append(int(nbytes))
        self.t_role.append(int(role))
        self.t_alloc.append(-1 if preexisting else -2)  # -2: not yet allocated
        self.t_free.append(-1)
        self.t_saved.append(-1)
        self.t_held.append(-1)
        return len(self.t_nbytes) - 1

    def op(self, name: str, phase: Phase, *, reads: "list[int] | tuple[int, ...]" = (),
           outputs: "list[int] | tuple[int, ...]" = (), writes: "list[int] | tuple[int, ...]" = (),
           frees: "list[int] | tuple[int, ...]" = (), duration: float = 0.0, flops: float = 0.0,
           bytes_moved: float = 0.0, module: str = "", scratch: int = 0) -> int:
        """Append an op: malloc+write ``outputs``, read ``reads``, write ``writes`` (in place),
        then free ``frees`` and any frees queued with :meth:`free`; ``scratch``: the kernel's own
        transient bytes."""
        i = len(self.ops)
        name_id = self._names.setdefault(name, len(self._names))
        module_id = self._modules.setdefault(module, len(self._modules))
        self.ops.append((name_id, int(phase), module_id, float(flops), float(bytes_moved), float(duration)))
        self.scratch.append(int(scratch))
        for t in outputs:
            if self.t_alloc[t] != -2:
                raise ValueError(f"tensor {t} allocated twice")
            self.t_alloc[t] = i
            self.events.append((EventKind.MALLOC, i, t))
        for t in dict.fromkeys(reads):
            self.events.append((EventKind.READ, i, t))
        for t in dict.fromkeys([*outputs, *writes]):
            self.events.append((EventKind.WRITE, i, t))
        self._pending_free.extend(frees)
        self.flush_frees()
        return i

    def hidden(self, op: int, nbytes: int) -> int:
        """Declare a :attr:`Role.HIDDEN` storage of ``nbytes`` allocated by op ``op`` (already
        appended): its malloc is the first event of ``op``, so it counts at the op's peak."""
        t = self.tensor(nbytes, Role.HIDDEN)
        self.t_alloc[t] = op
        at = len(self.events)
        while at > 0 and self.events[at - 1][1] >= op:
            at -= 1
        self.events.insert(at, (EventKind.MALLOC, op, t))
        return t

    def free(self, t: int) -> None:
        """Free ``t`` at the end of the last op (or of the next one, if none yet)."""
        self._pending_free.append(t)
        if self.ops:
            self.flush_frees()

    def flush_frees(self) -> None:
        i = len(self.ops) - 1
        for t in self._pending_free:
            if self.t_free[t] != -1:
                continue
            self.t_free[t] = i
            self.events.append((EventKind.FREE, i, t))
        self._pending_free.clear()

    def mark_saved(self, t: int, shape: "tuple[int, ...] | None" = None, dtype: str | None = None,
                   node: str | None = None) -> int:
        """Record that autograd packed ``t`` (after the ops so far); returns its packing index.
        ``shape``, ``dtype`` (a name such as ``float32``) and ``node`` (the autograd node that made
        it, ``""`` for none): what the packed tensor was, for the runtime's check of a live
        iteration (``Trace.saved_signatures``, ``Trace.saved_nodes``)."""
        self.saved.append(t)
        self.saved_node.append(-1 if node is None else self._node_names.setdefault(node, len(self._node_names)))
        self.saved_op.append(len(self.ops))
        self.saved_unpack_op.append(-1)
        self._saved_events.append(len(self.events))
        self.saved_dtype.append(_DTYPE_CODE.get(dtype, -1) if dtype is not None else -1)
        if shape is None:
            self.saved_ndim.append(-1)
        else:
            self.saved_ndim.append(len(shape))
            self.saved_dims.extend(int(d) for d in shape)
        if self.t_saved[t] < 0:
            self.t_saved[t] = len(self.saved) - 1
        return len(self.saved) - 1

    def mark_unpacked(self, k: int) -> None:
        """Record that backward unpacked pack ``k`` (after the ops so far); only its first unpack counts."""
        if self.saved_unpack_op[k] < 0:
            self.saved_unpack_op[k] = len(self.ops)

    def held_until(self, t: int, op: int) -> None:
        """Record that the last holder of ``t`` outside autograd let it go at the end of op ``op``
        (``len(ops)``: it is still held when the iteration ends)."""
        self.t_held[t] = int(op)

    def free_at(self, t: int, op: int) -> None:
        """Free ``t`` at the end of op ``op`` (already recorded): its free event goes after that op's
        other events."""
        if self.t_free[t] != -1:
            raise ValueError(f"tensor {t} is freed already")
        at = len(self.events)
        while at > 0 and self.events[at - 1][1] > op:
            at -= 1
        self.events.insert(at, (EventKind.FREE, op, t))
        self.t_free[t] = int(op)

    def mark_module_call(self) -> None:
        """Record that a module's forward begins (after the ops so far)."""
        self.module_call_op.append(len(self.ops))

    def set_role(self, t: int, role: Role) -> None:
        self.t_role[t] = int(role)

    def write_in_place(self, op: int, out: int, into: int) -> None:
        """Rewrite op ``op`` to write ``into`` instead of allocating ``out``: ``out`` becomes
        ``into`` from there on.  ``into`` must be freed by ``op`` (the op held its last use) and
        ``out`` allocated by it; what ``out`` later was (its reads, free, role, packs) passes to
        ``into``.  The recorder uses it for autograd's gradient accumulation (see
        :mod:`dqn_swap.recorder`).  The events are rewritten, and tensor ids compacted, in one
        pass when the trace is built."""
        if self.t_alloc[out] != op or self.t_free[into] != op:
            raise ValueError(f"op {op} does not allocate tensor {out} and free tensor {into}")
        self._merged[out] = (op, into)
        self.t_free[into] = self.t_free[out]
        self.t_role[into] = self.t_role[out]
        if self.t_saved[into] < 0:
            self.t_saved[into] = self.t_saved[out]
        self.t_alloc[out] = -3  # merged: dropped when built

    def _apply_merges(self) -> None:
        """Rewrite the events of :meth:`write_in_place` and drop the merged tensors, renumbering the rest."""
        if not self._merged:
            return
        into_of = {out: into for out, (_, into) in self._merged.items()}
        # The merged op allocates nothing, and the tensor it writes lives on (its free is the one
        # ``out`` had): drop that op's malloc of ``out`` and its free of ``into`` -- which may
        # have been recorded under an earlier merged name of ``into``, so compare after renaming.
        no_malloc = {(op, out) for out, (op, _) in self._merged.items()}
        no_free = {(op, into) for _, (op, into) in self._merged.items()}
        keep = [t for t, a in enumerate(self.t_alloc) if a != -3]
        new_id = {t: k for k, t in enumerate(keep)}
        events = []
        for kind, i, t in self.events:
            named = into_of.get(t, t)
            if (kind == EventKind.MALLOC and (i, t) in no_malloc) or (kind == EventKind.FREE and (i, named) in no_free):
                continue
            events.append((kind, i, new_id[named]))
        self.events = events
        self.saved = [new_id[into_of.get(t, t)] for t in self.saved]
        for name in ("t_nbytes", "t_role", "t_alloc", "t_free", "t_saved", "t_held"):
            column = getattr(self, name)
            setattr(self, name, [column[t] for t in keep])
        self._merged.clear()

    def _saved_in_op(self) -> list[int]:
        """Per pack, 1 when frees of op ``saved_op - 1`` were recorded after it (it happened inside
        that op, before its end), else 0; read before :meth:`_apply_merges` renumbers events."""
        out = []
        for at, op in zip(self._saved_events, self.saved_op):
            nxt = self.events[at] if at < len(self.events) else None
            out.append(int(nxt is not None and nxt[0] == EventKind.FREE and nxt[1] == op - 1))
        return out

    def build(self, meta: "dict[str, Any] | None" = None) -> Trace:
        saved_in_op = self._saved_in_op()
        self._apply_merges()
        ops = np.array(self.ops, dtype=np.float64).reshape(-1, 6)
        ev = np.array(self.events, dtype=np.int64).reshape(-1, 3)
        alloc = np.array(self.t_alloc, dtype=np.int32)
        if np.any(alloc == -2):
            raise ValueError("tensors declared but never allocated: "
                             f"{np.flatnonzero(alloc == -2)[:10].tolist()}")
        trace = Trace(
            op_name=ops[:, 0], op_phase=ops[:, 1], op_module=ops[:, 2], op_flops=ops[:, 3],
            op_bytes=ops[:, 4], op_duration=ops[:, 5],
            tensor_nbytes=self.t_nbytes, tensor_role=self.t_role, tensor_alloc_op=alloc,
            tensor_free_op=self.t_free, tensor_saved_index=self.t_saved, tensor_held_op=self.t_held,
            event_kind=ev[:, 0], event_op=ev[:, 1], event_tensor=ev[:, 2], saved=self.saved,
            op_scratch=self.scratch, saved_op=self.saved_op, saved_unpack_op=self.saved_unpack_op, saved_in_op=saved_in_op, saved_dtype=self.saved_dtype, saved_ndim=self.saved_ndim,
            saved_dims=self.saved_dims, saved_node=self.saved_node, module_call_op=self.module_call_op,
            op_names=list(self._names), module_names=list(self._modules),
            meta={**(meta or {}), "saved_nodes": list(self._node_names)},
        )
        trace.validate("built trace")
        return trace


def resolve_memory_limit(trace: Trace, text: "str | int | Any") -> int:
    """A memory limit in bytes from any of its forms (``"50%"``, ``"0.5x"``, ``"8GiB"``, bytes):
    :func:`dqn_swap.limits.resolve_limit`, where the forms and the minimum check are defined."""
    from .limits import resolve_limit

    return resolve_limit(trace, text)


# The columns that say what an iteration does (its ops, tensors, events and packs), and those that
# say how big it is.  Two recordings of one iteration on other shapes (a bucket of shapes: another
# sequence length, another graph of the same op sequence) differ only in the second.
_STRUCTURE_COLUMNS = ("op_name", "op_phase", "op_module", "tensor_role", "tensor_alloc_op", "tensor_free_op",
                      "tensor_saved_index", "event_kind", "event_op", "event_tensor", "saved", "saved_op",
                      "saved_unpack_op", "saved_in_op", "module_call_op", "tensor_held_op", "saved_dtype",
                      "saved_ndim", "saved_node")
_SIZE_COLUMNS = ("tensor_nbytes", "op_scratch", "op_duration", "op_flops", "op_bytes", "saved_dims")


def same_structure(a: Trace, b: Trace) -> bool:
    """Whether ``a`` and ``b`` record the same iteration up to sizes: the same ops in the same
    order, the same tensors made, saved and freed at the same ops, the same packs of the same
    dtypes, ranks and nodes.  Only bytes, shapes' extents, op costs and scratch may differ."""
    if (a.op_names != b.op_names or a.module_names != b.module_names
            or a.meta.get("saved_nodes") != b.meta.get("saved_nodes")):
        return False
    for name in _STRUCTURE_COLUMNS:
        x, y = getattr(a, name), getattr(b, name)
        if (x is None) != (y is None) or (x is not None and not np.array_equal(x, y)):
            return False
    return all(getattr(a, n) is None or getattr(a, n).shape == getattr(b, n).shape for n in _SIZE_COLUMNS)


def envelope(a: Trace, b: Trace) -> Trace:
    """The iteration of ``a`` and ``b`` (:func:`same_structure`) at the larger of their sizes, column
    by column: every tensor's bytes and every pack's extents, every op's scratch and cost.  A plan
    made for it holds, under its schedule, at most its bytes when followed on either, or on any
    recording of the same structure whose sizes are all at most its own (a bucket's smaller
    members; ``PlannedExecution(..., shapes="bounded")`` checks that at every pack)."""
    if not same_structure(a, b):
        raise ValueError("an envelope is of two recordings of one iteration (same_structure)")
    sizes = {n: np.maximum(getattr(a, n), getattr(b, n)) for n in _SIZE_COLUMNS if getattr(a, n) is not None}
    return a.replace(**sizes, meta={**a.meta, "envelope_of": int(a.meta.get("envelope_of", 1))
                                    + int(b.meta.get("envelope_of", 1))})


def dominates(a: Trace, b: Trace) -> bool:
    """Whether ``a`` is at least ``b`` in every size (both of one structure): ``envelope(a, b)`` is ``a``."""
    return same_structure(a, b) and all(
        getattr(a, n) is None or bool(np.all(getattr(a, n) >= getattr(b, n))) for n in _SIZE_COLUMNS)
