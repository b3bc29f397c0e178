"""The trace's columns and codes: the kinds of memory operation, the phases, the roles of tensors,
the column arrays of the file with their dtypes, and the error a trace that cannot be used raises
(:mod:`dqn_swap.trace` describes the tables)."""

from __future__ import annotations

import enum

import numpy as np

from ..errors import DqnSwapInputError

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
