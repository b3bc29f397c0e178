"""What a trace can be: the checks that its tables agree with each other and with an iteration
(:class:`TraceChecks`, the part of :class:`~dqn_swap.trace.Trace` that refuses a corrupt file or a
broken recording with one line)."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..units import MAX_BYTES, format_bytes
from .schema import _ARRAYS, _OPTIONAL, MAX_SECONDS, SAVED_DTYPES, EventKind, Phase, Role, TraceError


class TraceChecks:
    """Validation, mixed into :class:`~dqn_swap.trace.Trace` (whose columns it reads)."""

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

        first_of = _first_of
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
        self._validate_packs(bad, _first_of)
        self._validate_totals(bad)

    def _validate_packs(self, bad: Any, first_of: Any) -> None:
        """Nothing saved for backward outlives the iteration unless its loop holds it, phases run in
        order, packs happen in forward, and every saved index is where the saved table says."""
        n_t, alloc, free = self.n_tensors, self.tensor_alloc_op, self.tensor_free_op
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

    def _validate_totals(self, bad: Any) -> None:
        """Every tensor alive at once, and the whole iteration's time, stay within bounds, so no sum of
        them overflows and no plan is made for a machine that cannot exist."""
        kind, tensor, alloc = self.event_kind, self.event_tensor, self.tensor_alloc_op
        is_malloc, is_free = kind == EventKind.MALLOC, kind == EventKind.FREE
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
            from ..cost import PROFILES, profile_of

            try:
                profile = profile_of(self)
            except (ValueError, TypeError, KeyError) as e:
                raise bad(f"metadata profile: {str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
            if name is not None and name != profile.name:
                raise bad(f"metadata profile {name!r} disagrees with its profile_params ({profile.name!r})")
            if params is None and name not in PROFILES:
                raise bad(f"metadata profile {name!r} is unknown and has no profile_params")


def _first_of(mask: np.ndarray) -> int:
    """The first index where ``mask`` holds."""
    return int(np.flatnonzero(mask)[0])
