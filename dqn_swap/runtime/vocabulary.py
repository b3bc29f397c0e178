"""The runtime's vocabulary: its errors and warning, the modes a planned step may take, who owns the
step, the holders of saved tensors, and an iteration's statistics (:class:`IterationStats`)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TYPE_CHECKING

import torch
from torch.multiprocessing.reductions import StorageWeakRef

from ..errors import DqnSwapInputError, DqnSwapRuntimeError
from ..support import fsdp_param_groups, unsupported_reason

if TYPE_CHECKING:
    from .iteration import _Iteration


#: What a live iteration that is not the plan's trace does: stop (``TraceMismatchError``) or go on in
#: safe mode from there (:mod:`.offload`).
ON_MISMATCH = ("raise", "safe")
SHAPES = ("exact", "bounded")
CHECKS = ("ops", "packs")


class PlannedOutOfMemoryError(DqnSwapRuntimeError, torch.OutOfMemoryError):
    """An allocation failed under a plan; the message names the op, the plan and the memory in use."""


class UnsupportedTrainingError(DqnSwapRuntimeError):
    """The training setup is one the runtime cannot follow a plan in (the message says which and why)."""


class InfeasiblePlanError(DqnSwapInputError):
    """The plan's own figures say the simulator found it infeasible (``plan.figures["feasible"]`` false):
    following it would not stay under its limit.  ``PlannedExecution(..., allow_infeasible=True)`` runs it."""


class HeldInputWarning(UserWarning):
    """A swapped input stayed held by the training loop through the forward pass: the runtime
    left it on the device (nothing freed) and skips its copy in later iterations."""


def _describe(dtype: Any, shape: tuple[int, ...] | None, nbytes: int | None) -> str:
    """``float32[2, 4]``, with the storage's bytes where they are what differs."""
    name = str(dtype).removeprefix("torch.") if dtype is not None else "a tensor"
    dims = f"[{', '.join(map(str, shape))}]" if shape is not None else ""
    return f"{name}{dims}" + (f" in a storage of {nbytes} B" if nbytes is not None else "")


def enable_expandable_segments() -> bool:
    """Turn on the CUDA caching allocator's expandable segments (the counterpart of the window
    paper's virtual addressing: freed blocks coalesce, so swapping does not fragment memory).

    Affects segments allocated afterwards; returns whether it was applied.
    """
    if not torch.cuda.is_available():
        return False
    settings = getattr(torch._C, "_accelerator_setAllocatorSettings", None)  # torch >= 2.10; the old one warns
    (settings or torch.cuda.memory._set_allocator_settings)("expandable_segments:True")
    return True


def refuse_unsupported(model: torch.nn.Module | None) -> None:
    """Raise :class:`UnsupportedTrainingError` for models the runtime cannot follow a plan in
    (:mod:`dqn_swap.support`: torch.compile, FSDP1, FSDP2 compositions other than ``fully_shard``
    on a one-dimensional mesh)."""
    reason = unsupported_reason(model)
    if reason is not None:
        raise UnsupportedTrainingError(reason)


class _StepOwner:
    """The one thread that may run planned (or recorded) steps at a time, re-entrant within it.

    The hooks a planned step relies on are the process's: module forward hooks
    (``register_module_forward_pre_hook``, by which the runtime numbers ops and the recorder marks
    module calls) fire for every module in every thread, and recording in the user's loop marks
    ``torch.autograd.backward`` for the process.  A second thread's model would be numbered into
    the first's iteration.  So a step begun while another thread is inside one is refused with one
    line, instead of training wrongly or crashing."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.owner: int | None = None
        self.depth = 0

    def enter(self) -> None:
        me = threading.get_ident()
        with self.lock:
            if self.owner is not None and self.owner != me:
                raise UnsupportedTrainingError(
                    "another thread is inside a planned step: dqn-swap follows one planned step at a time per "
                    "process (its hooks are process-wide); run planned models one after the other, or in "
                    "separate processes")
            self.owner = me
            self.depth += 1

    def exit(self) -> None:
        with self.lock:
            self.depth -= 1
            if self.depth <= 0:
                self.owner, self.depth = None, 0


#: The process's :class:`_StepOwner` (``PlannedExecution`` and ``dqn_swap.autoplan`` steps).
STEP_OWNER = _StepOwner()


# --------------------------------------------------------------------------- handles
KEEP, SWAPPED, REMOVED = 0, 1, 2


class _Packed:
    """What autograd keeps instead of a saved tensor the runtime acts on or watches."""

    __slots__ = ("it", "kind", "ref", "tid", "index", "dtype", "size", "stride", "offset", "__weakref__")

    def __init__(self, it: "_Iteration", kind: int, ref: Any, tid: int, index: int, t: torch.Tensor) -> None:
        self.it, self.kind, self.ref, self.tid, self.index = it, kind, ref, tid, index
        self.dtype, self.size, self.stride, self.offset = t.dtype, t.size(), t.stride(), t.storage_offset()


class _Kept:
    """A saved tensor the plan keeps on the device, held for autograd where the step may leave its
    plan midway (``on_mismatch="safe"``): then it goes to the host (:meth:`_Iteration.evict_kept`),
    and comes back at its unpack."""

    __slots__ = ("t", "tid", "version", "__weakref__")

    def __init__(self, t: torch.Tensor, tid: int) -> None:
        self.t: Any = t
        self.tid, self.version = tid, t._version


class _RecomputeGroup:
    """One removed storage; the re-created storage is shared by the handles that have not unpacked."""

    __slots__ = ("tid", "remaining", "packs", "storage")

    def __init__(self, tid: int) -> None:
        self.tid, self.remaining, self.packs = tid, 0, 0
        self.storage: torch.UntypedStorage | None = None


class _FsdpFirstGather:
    """FSDP2's first all-gather into a parameter makes its unsharded storage with ``torch.empty``
    (``FSDPParam.init_all_gather_outputs``); later ones resize that storage, which is no op.  The
    trace is a steady-state iteration, so in an iteration where FSDP still has to make some, the
    op numbering pauses while it does (per parameter, an instance attribute shadowing the method,
    removed when the iteration ends): a model sharded and planned before its first step numbers
    its ops as the trace does."""

    def __init__(self, it: "_Iteration", model: torch.nn.Module | None) -> None:
        self.patched: list[Any] = []
        for group in fsdp_param_groups(model):
            for p in group.fsdp_params:
                if not p.all_gather_outputs:
                    p.init_all_gather_outputs = self._paused(it, p.init_all_gather_outputs)
                    self.patched.append(p)

    @staticmethod
    def _paused(it: "_Iteration", init: Callable[..., None]) -> Callable[..., None]:
        def run(*args: Any, **kwargs: Any) -> None:
            before, it.paused = it.paused, True
            try:
                init(*args, **kwargs)
            finally:
                it.paused = before

        return run

    def close(self) -> None:
        for p in self.patched:
            vars(p).pop("init_all_gather_outputs", None)
        self.patched.clear()


# --------------------------------------------------------------------------- statistics
@dataclass
class IterationStats:
    """Bookkeeping of one planned iteration (all byte counts are device bytes)."""

    packed: int = 0
    expected_packs: int = 0
    swapped: int = 0  # distinct storages copied out
    deferred_copies: int = 0  # of those, copies out started after their first save (PlanIndex.copy_out_after)
    swapped_bytes: int = 0
    borrowed_inputs: int = 0  # swapped inputs copied out: the caller's storages, emptied if nothing else holds them
    emptied_inputs: int = 0  # swapped inputs emptied until their copy back (nothing outside held them)
    released_after_copy: int = 0  # storages whose device reference the runtime dropped after the copy
    recompute_removed: int = 0  # distinct storages not saved
    recompute_removed_bytes: int = 0
    recomputed: int = 0  # removed storages re-created in backward
    sequences_run: int = 0  # schedule sequences re-run
    replayed_ops: int = 0
    replay_seconds: float = 0.0  # wall time of the re-runs (their kernels and the runtime's work around them)
    prefetches: int = 0
    on_demand_fetches: int = 0  # fetched at reuse: no prefetch had been issued
    read_before_copied_out: int = 0  # needed while its copy out still ran: read from the device bytes held
    deferred_prefetches: int = 0  # a prefetch waited for its copy out, or for device memory
    bound_waits: int = 0  # copies out that waited for older ones (the in-flight bound)
    release_waits: int = 0  # copies out the host waited for, to free their bytes where the plan does
    release_wait_seconds: float = 0.0  # host time spent in those waits
    hooks_off_after: int = -1  # an empty plan: the pack after which the hooks came off (else on throughout)
    held_inputs: int = 0  # swapped inputs the training loop held through the forward pass: not emptied
    held_inputs_skipped: int = 0  # swapped inputs not copied: held in an earlier iteration (HeldInputWarning)
    held_bytes: int = 0  # device bytes the runtime references at the end of the iteration
    peak_held_bytes: int = 0
    diverged_at: int = -1  # safe mode: the pack at which the live iteration left the trace (-1: it did not)
    safe_packs: int = 0  # packs made in safe mode (every one to the host until backward needs it)
    safe_bytes: int = 0  # bytes safe mode copied to the host
    evicted: int = 0  # saved tensors the plan kept on the device, sent to the host as the step left its plan
    evicted_bytes: int = 0  # their storages' bytes copied then
    divergence: str = ""  # what differed, in one line (empty: nothing)
    prefetch_log: list[tuple[int, int]] = field(default_factory=list)  # (tensor id, op reached) in issue order
    source_refs: list[StorageWeakRef] = field(default_factory=list)  # with track_storages: removed originals

    def as_dict(self) -> dict[str, int | float]:
        return {k: v for k, v in self.__dict__.items() if isinstance(v, (int, float))}

    @property
    def diverged(self) -> bool:
        """Whether the iteration left the plan's trace (and ran on in safe mode from there)."""
        return bool(self.divergence)
