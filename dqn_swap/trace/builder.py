"""Building a trace op by op: :class:`TraceBuilder`, which the recorder (and tests writing a trace by
hand) feed with tensors, ops, frees and packs."""

from __future__ import annotations

from typing import Any

import numpy as np

from .core import Trace
from .schema import _DTYPE_CODE, EventKind, Phase, Role


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
