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
  (:meth:`.in_place.InPlaceRewrites.accumulate_in_place`: under a dispatch mode the engine
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
  them until their autograd node ran (:meth:`.mode._Recorder.resolve_numbers`).

Module paths come from :class:`torch.utils.module_tracker.ModuleTracker`, with
backward hooks that keep no gradient alive (:class:`.hooks._ModuleTracker`).

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

The package's rooms: :mod:`.vocabulary` (the error, and what an op's arguments hold), :mod:`.mode`
(the dispatch mode that records), :mod:`.hooks` (module paths and guards around the iteration) and
:mod:`.record` (:func:`record_trace` and what it settles after the iteration).
"""

from __future__ import annotations

from .record import record_trace
from .vocabulary import LossFn, OptimizerArg, RecordingError

__all__ = ["LossFn", "OptimizerArg", "RecordingError", "record_trace"]
