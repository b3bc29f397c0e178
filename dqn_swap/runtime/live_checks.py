"""The live checks of a planned iteration: each op and pack is compared with the trace the plan was
made for, and a step that leaves it stops with one line (``on_mismatch="raise"``) or goes on in safe
mode (``"safe"``); :class:`LiveChecks` is mixed into the runtime's iteration."""

from __future__ import annotations

from typing import Any

import torch

from ..ops import node_name
from .offload import HostOffload, persistent_storages
from .index import NO_OP
from .recompute import TraceMismatchError
from .swap import SwapGroup

from .vocabulary import _describe


class LiveChecks:
    """The iteration's checks against its trace (mixed into ``_Iteration``, whose state they read)."""

    def check(self, k: int, t: torch.Tensor) -> None:
        """The live check: what autograd saves at pack ``k`` must be what the recorder saw there
        (shape, dtype, storage size); the first difference stops the iteration (:meth:`mismatch`)."""
        dtype, shape, size, below = self.expected[k]
        if dtype is not None and t.dtype is not dtype:
            return self.mismatch(k, t)
        bounded = self.rt.bounded
        if shape is not None and t.shape != shape and not (
                bounded and len(t.shape) == len(shape) and all(a <= b for a, b in zip(t.shape, shape))):
            return self.mismatch(k, t)
        nbytes = t.untyped_storage().nbytes()
        if nbytes > size or (nbytes <= below and not bounded):
            return self.mismatch(k, t)
        nodes = self.rt.expected_nodes
        if nodes is not None:
            name = node_name(t)
            if name != nodes[k] and nodes[k] is not None:
                self.diverge(
                    f"{self.index.pack_label(k)} was made by {nodes[k] or 'no autograd node'} when the trace was "
                    f"recorded and by {name or 'no autograd node'} now: this iteration runs other ops than the "
                    "trace")

    def counted_pack(self, t: torch.Tensor) -> tuple[int, Any]:
        """The head of both pack hooks: ``(k, None)`` for the trace's ``k``-th pack, once its live
        check passed; ``(-1, what to return)`` for a tensor that is no pack of the trace's (another
        device, which the recorder neither counted nor tracked; a graph made inside backward, as
        reentrant checkpointing makes) and for a pack from which the step runs in safe mode."""
        if t.is_cuda is not self.cuda or torch._C._current_graph_task_id() != -1:
            return -1, t
        k = self.n_packed
        self.n_packed = k + 1
        if self.safe is None:
            if k >= self.n_saved:
                self.too_many_packs()
            else:
                self.check(k, t)  # the live check, before anything acts on this tensor
        if self.safe is not None:  # not the trace's iteration: safe mode from here
            return -1, self.safe_pack(t)
        return k, None

    def check_pack(self, t: torch.Tensor) -> torch.Tensor:
        """The pack hook of a plan without actions.  With ops checked (``check="ops"``) every pack
        is checked and the hooks stay on, so that an iteration that leaves the trace goes on in
        safe mode from there.  Otherwise the first pack alone (the batch, usually), then the hooks
        come off: checking every pack would cost an empty plan 3-5 % of a step (measured on the
        CPU).  Ours are on top: this runs in our pack hook."""
        k, packed = self.counted_pack(t)
        if k < 0:  # not the trace's pack, or safe mode from here: the hooks stay on
            return packed
        if self.mode is not None:  # ops checked: the hooks stay on (docstring)
            if k == self.n_saved - 1:
                self.end_of_forward()
            return t.detach() if t.requires_grad else t
        torch._C._autograd._pop_saved_tensors_default_hooks()
        self.hooks_pushed = False
        self.stats.hooks_off_after = k
        # Not ``t`` itself: an output its own node saves would then hold that node through its
        # ``grad_fn``, a reference cycle through C++ that no collector sees, and a graph dropped
        # without backward (an exception, a forward pass only) would never be freed.  The alias
        # shares storage and version counter and holds no graph.
        return t.detach() if t.requires_grad else t

    def too_many_packs(self) -> None:
        self.diverge(f"autograd saved more than the {self.n_saved} tensors the trace recorded for one iteration "
                     "(a second forward pass in one `with` block, or other ops than the trace's)",
                     "run one forward and backward per block, or record the trace again")

    def diverge(self, what: str, advice: str = "record the trace again and re-plan") -> None:
        """The live iteration is not the plan's trace (``what`` says where and how).  Without
        ``on_mismatch="safe"`` that stops it (:class:`TraceMismatchError`); with it, the iteration
        goes on in safe mode (:meth:`enter_safe`)."""
        if self.safe is not None:
            return
        if not self.rt.safe_on_mismatch:
            raise TraceMismatchError(f"{what} ({self.rt.plan_label()}); {advice}")
        self.enter_safe(what)

    def enter_safe(self, what: str) -> None:
        """From here on, every saved tensor goes to the host until backward needs it
        (:mod:`.offload`); whatever the plan did before is carried out as planned: swapped tensors
        come back on demand at their unpack, removed ones are re-run from the ops recorded before
        this point.

        Nothing is prefetched any more (a prefetch would bring bytes back before they are needed),
        and the copies out still running are waited for, so that their device bytes are free when
        the unknown part of the iteration runs.  A removed tensor whose re-run needs an op not
        recorded by now cannot be re-created: that stops the iteration (its bytes are gone).
        """
        it_stats = self.stats
        it_stats.divergence = what
        it_stats.diverged_at = self.n_packed - 1
        recorder = self.recorder
        for tid, rg in self.rec_groups.items():
            if rg.remaining <= 0:
                continue
            seq = self.index.sequence_of.get(tid)
            steps = self.index.sequences[seq][1] if seq is not None else ()
            missing = [s.op for s in steps if recorder is None or s.op not in recorder.ops]
            if seq is None or missing:
                raise TraceMismatchError(
                    f"{what}; the plan had already removed {self.index.tensor_label(tid)}, whose re-run needs "
                    f"{self.index.trace.op_label(missing[0]) if missing else 'a schedule entry'} from past that "
                    f"point, so the iteration cannot go on ({self.rt.plan_label()}); record the trace again")
        if self.mode is not None:
            self.mode.stop()
        # Sync: the plan's copies out still running hold their sources' device bytes; the rest of the
        # iteration is not the trace, so the simulator's point of release no longer applies: they are
        # released now, before the unknown ops allocate.
        self.swapper.synchronize()
        self.stats.released_after_copy += self.swapper.poll()
        self.release_ptr = len(self.index.release_ops)
        self.release_next = NO_OP
        self.prefetch_ptr = len(self.index.prefetch)
        self.safe = HostOffload(self.rt.device, persistent_storages(self.rt.model))
        self.evict_kept()

    def safe_pack(self, t: torch.Tensor) -> Any:
        assert self.safe is not None
        if self.mode is not None and self.mode.pushed:
            self.mode.stop()  # diverged inside the mode's own dispatch: it comes off here
        before = self.safe.copied_bytes
        with torch.no_grad():
            packed = self.safe.pack(t)
        self.stats.safe_packs += 1
        self.stats.safe_bytes += self.safe.copied_bytes - before
        return packed

    def mismatch(self, k: int, t: torch.Tensor) -> None:
        """Pack ``k`` is not what the recorder saw there: stop before the runtime acts on it."""
        dtype, shape, size, _ = self.expected[k]
        nbytes = t.untyped_storage().nbytes()
        same_kind = (shape is None or t.shape == shape) and (dtype is None or t.dtype is dtype)
        was = _describe(dtype, shape, size if same_kind else None)
        now = _describe(t.dtype, tuple(t.shape) if shape is not None else None, nbytes if same_kind else None)
        self.diverge(f"{self.index.pack_label(k)} was {was} when the trace was recorded and is {now} now: the "
                     "batch or the model differs from the recorded iteration")

    def check_unmodified(self, g: SwapGroup) -> None:
        """A swapped input the caller kept (not emptied) is read in place by backward: as autograd
        does for what it saves, refuse one modified in place since the forward pass saved it."""
        x = g.watch()
        if x is not None and x._version != g.version:
            raise RuntimeError(
                "one of the variables needed for gradient computation has been modified by an inplace "
                f"operation: the input {self.index.tensor_label(g.tid)} is at version {x._version}, the forward "
                f"pass saved version {g.version} ({self.rt.plan_label()})")

    def check_count(self) -> None:
        if self.n_packed and self.stats.hooks_off_after < 0 and self.n_packed != self.n_saved and self.safe is None:
            what = (f"autograd saved {self.n_packed} tensors in this iteration, the trace recorded {self.n_saved}: "
                    "the batch or the model differs from the recorded iteration")
            if not self.rt.safe_on_mismatch:
                raise TraceMismatchError(f"{what} ({self.rt.plan_label()}); record the trace again")
            # Fewer packs than planned: what the plan would have done to the rest never happened, and
            # a step that does less holds less.  Reported as a divergence all the same.
            self.stats.divergence = what
            self.stats.diverged_at = self.n_packed

    def describe_position(self) -> str:
        kind, k = self.where
        index = self.index
        if k < 0:
            return "at the start of the iteration"
        tid = int(index.saved_tids[min(k, index.n_saved - 1)])
        phase = "forward pass, saving" if kind == "pack" else "backward pass, restoring"
        near = f"the {phase} saved tensor #{k}: {index.tensor_label(tid)}"
        if self.position >= 0 and kind != "pack" and self.position < index.trace.n_ops:
            near += f"; backward has reached {index.trace.op_label(self.position)}"
        return near
