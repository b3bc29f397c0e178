"""The :class:`Trace` itself: the column tables of one iteration and what is derived from them
(peaks, windows, the minimum memory, the fingerprint); the tables are described in
:mod:`dqn_swap.trace`."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np

from .schema import _ARRAYS, _OPTIONAL, _UNHASHED, MOVABLE_ROLES, SAVED_DTYPES, EventKind, Phase, Role
from .storage import TraceFile
from .validation import TraceChecks


@dataclass(eq=False)
class Trace(TraceFile, TraceChecks):
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


def resolve_memory_limit(trace: Trace, text: "str | int | Any") -> int:
    """A memory limit in bytes from any of its forms (``"50%"``, ``"0.5x"``, ``"8GiB"``, bytes):
    :func:`dqn_swap.limits.resolve_limit`, where the forms and the minimum check are defined."""
    from ..limits import resolve_limit

    return resolve_limit(trace, text)
