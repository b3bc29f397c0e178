"""Facts about aten operators that their schemas do not state, kept in one place.

Two things the recorder, the simulator's inputs and the runtime need to know
about an op beyond its schema:

* **Which arguments it writes.**  A schema marks an argument written in place
  with an alias annotation (``Tensor(a!)``).  The batch-norm family updates its
  running statistics without one: ``native_batch_norm(Tensor input, Tensor?
  weight, Tensor? bias, Tensor? running_mean, Tensor? running_var, ...)``
  writes ``running_mean`` and ``running_var`` in training mode, and bumps no
  version counter.  :data:`UNANNOTATED_WRITES` lists such arguments by name;
  :func:`written_positions` joins them to the annotated ones.  The recorder
  also checks, on cpu and cuda, every op that reads a module buffer and adds
  what it finds to the trace (``meta["unannotated_writes"]``), so an op missing
  from this table is still caught where it can be observed.
* **How much scratch memory its kernel allocates** for itself while it runs
  (:func:`estimate_scratch`, for CUDA or CPU kernels), for traces recorded on
  ``meta`` where nothing is allocated.  On cpu and cuda the recorder measures it instead.

Every name is an overload packet as the trace stores it (``"aten.native_batch_norm"``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

#: op -> names of the arguments it writes without an alias annotation in its schema.
UNANNOTATED_WRITES: dict[str, tuple[str, ...]] = {
    "aten.native_batch_norm": ("running_mean", "running_var"),
    "aten.cudnn_batch_norm": ("running_mean", "running_var"),
    "aten.miopen_batch_norm": ("running_mean", "running_var"),
}

#: ops whose written arguments are optional statistics that, in training mode, no output reads:
#: a re-run may pass None for them (the outputs are the same) instead of a copy to write.
STATISTICS_ONLY: dict[str, str] = {"aten.native_batch_norm": "training", "aten.cudnn_batch_norm": "training",
                                   "aten.miopen_batch_norm": "training"}

_POSITIONS: dict[tuple[torch._ops.OpOverload, tuple[tuple[str, tuple[str, ...]], ...]], tuple[int, ...]] = {}


def op_name(func: torch._ops.OpOverload) -> str:
    """The name the trace gives ``func``: its overload packet, e.g. ``"aten.convolution"``."""
    return str(func._overloadpacket)


def written_positions(func: torch._ops.OpOverload,
                      extra: Mapping[str, Sequence[str]] | None = None) -> tuple[int, ...]:
    """Schema positions of the arguments ``func`` writes in place.

    The annotated ones (``Tensor(a!)``), those of :data:`UNANNOTATED_WRITES`,
    and those named for this op in ``extra`` (a trace's ``meta["unannotated_writes"]``).
    """
    key = (func, tuple(sorted((k, tuple(v)) for k, v in (extra or {}).items())))
    cached = _POSITIONS.get(key)
    if cached is not None:
        return cached
    name = op_name(func)
    names = set(UNANNOTATED_WRITES.get(name, ())) | set((extra or {}).get(name, ()))
    out = tuple(i for i, a in enumerate(func._schema.arguments)
                if (a.alias_info is not None and a.alias_info.is_write) or a.name in names)
    _POSITIONS[key] = out
    return out


def argument(func: torch._ops.OpOverload, args: Sequence[Any], kwargs: Mapping[str, Any], pos: int) -> Any:
    """The value passed for schema argument ``pos`` (positional or keyword; None if absent)."""
    if pos < len(args):
        return args[pos]
    return kwargs.get(func._schema.arguments[pos].name)


# --------------------------------------------------------------------------- scratch
def _nbytes(x: Any) -> int:
    if isinstance(x, torch.Tensor):
        return int(x.numel() * x.element_size())
    if isinstance(x, (list, tuple)):
        return sum(_nbytes(y) for y in x)
    return 0


#: Kernel families a meta trace's scratch can be estimated for (:func:`estimate_scratch`).
SCRATCH_MODELS = ("cuda", "cpu")


def estimate_scratch(func: torch._ops.OpOverload, args: Sequence[Any], kwargs: Mapping[str, Any],
                     out: Any, kernels: str = "cuda") -> int:
    """Scratch bytes ``func`` is expected to allocate for itself (a trace recorded on ``meta``).

    ``kernels="cuda"`` (the default: every device profile is a GPU) models PyTorch's
    CUDA kernels.  cuDNN convolutions take workspace per algorithm, but PyTorch tries
    the algorithms in order and moves to the next when the workspace cannot be
    allocated (``try_all`` in ``aten/src/ATen/native/cudnn/Conv_v7.cpp`` catches the
    out-of-memory error; ``Conv_v8.cpp`` halves the workspace and drops the plans that
    need more), down to implicit-GEMM algorithms that need none; so under
    a memory limit a convolution needs no scratch, at some cost in speed the roofline
    does not see.  cuDNN batch norm keeps its workspace in the reserve tensor it
    returns; elementwise kernels, GEMMs and reductions write into their outputs.
    Every op: none.

    ``kernels="cpu"`` models PyTorch's CPU kernels (oneDNN convolutions reorder
    their operands into blocked layouts; batch norm's backward keeps a temporary
    of its input's size), fitted to what the allocator shows on the CPU
    (``tests/test_recorder.py`` checks it against measured traces):

    * ``convolution``: the larger of input and output, plus the weight;
    * ``convolution_backward``: the input plus the larger of input and gradient
      of the output, plus the weight;
    * ``native_batch_norm_backward``: the input;
    * every other op: none.

    A trace recorded on cpu or cuda measures scratch instead.
    """
    if kernels not in SCRATCH_MODELS:
        raise ValueError(f"unknown kernels {kernels!r}: one of {', '.join(SCRATCH_MODELS)}")
    if kernels == "cuda":
        return 0
    name = op_name(func)
    if name == "aten.convolution":
        return max(_nbytes(args[0]), _nbytes(out)) + _nbytes(args[1])
    if name == "aten.convolution_backward":
        return _nbytes(args[1]) + max(_nbytes(args[0]), _nbytes(args[1])) + _nbytes(args[2])
    if name == "aten.native_batch_norm_backward":
        return _nbytes(args[1])
    return 0


__all__ = ["SCRATCH_MODELS", "UNANNOTATED_WRITES", "argument", "estimate_scratch", "node_name", "op_name", "written_positions"]


#: Autograd nodes of one view made by different aten ops depending on whether a Python dispatch mode
#: is on: ``reshape`` makes ``_reshape_alias`` without one and ``view`` under one (as the recorder's
#: mode is while recording, and the runtime's while it records re-runs).  They are one node to the
#: live check.
_SAME_NODE = {"ReshapeAliasBackward0": "ViewBackward0", "UnsafeViewBackward0": "ViewBackward0"}


def node_name(t: torch.Tensor) -> str:
    """The autograd node that made ``t``, as the live check compares it (``""`` for none: a leaf)."""
    node = t.grad_fn
    if node is None:
        return ""
    name = type(node).__name__
    return _SAME_NODE.get(name, name)

