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

The package's rooms: :mod:`.schema` (columns and codes), :mod:`.core` (the :class:`Trace` and what
derives from its tables), :mod:`.storage` (the file), :mod:`.validation` (what a trace can be),
:mod:`.builder` (:class:`TraceBuilder`) and :mod:`.compare` (recordings of one iteration on other
shapes).  Everything is imported from here.
"""

from __future__ import annotations

# Sizes (dqn_swap.units) are re-exported here too: the simulator, the runtime and users' code import them from here.
from ..units import MAX_BYTES, format_bytes, parse_bytes
from .builder import TraceBuilder
from .compare import dominates, envelope, same_structure
from .core import Trace, resolve_memory_limit
from .schema import (FORMAT, MAX_SECONDS, MOVABLE_ROLES, READ_VERSIONS, SAVED_DTYPES, VERSION, EventKind, Phase, Role,
                     TraceError)

__all__ = ["FORMAT", "MAX_BYTES", "MAX_SECONDS", "MOVABLE_ROLES", "READ_VERSIONS", "SAVED_DTYPES", "VERSION", "EventKind",
           "Phase", "Role", "Trace", "TraceBuilder", "TraceError", "dominates", "envelope", "format_bytes", "parse_bytes",
           "resolve_memory_limit", "same_structure"]
