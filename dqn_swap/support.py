"""Training setups dqn-swap can record and follow plans in, and the ones it refuses.

A plan is a decision per saved activation of one eager iteration of a model.  Supported
beside plain training: ``DistributedDataParallel`` (record the unwrapped module, follow the
plan with the wrapped one) and **FSDP2** (``torch.distributed.fsdp.fully_shard`` on a
one-dimensional mesh, ``docs/fsdp.md``): each rank records its own iteration with FSDP's
memory in it -- the parameters all-gathered before each sharded module's forward and
backward and freed after, the collectives' buffers, the reduce-scattered gradients -- and
plans its saved activations with that memory fixed.  The helpers here read FSDP's state
(:func:`fsdp_param_groups`, :func:`unsharded_storages`) and see through its ``DTensor``
parameters (:func:`local_tensor`).

Refused with one line, by the recorder and the runtime alike, instead of failing later with
an obscure error:

* FSDP2 compositions whose memory the recorder does not follow: a two-dimensional mesh
  (HSDP), parameters that are ``DTensor`` with placements other than FSDP's one ``Shard``
  (tensor parallelism), ``reshard_after_forward`` given as an int (resharding to a smaller
  mesh after forward), CPU offloading of the sharded parameters;
* FSDP1 (``FullyShardedDataParallel``): flat parameters gathered outside the dispatcher;
* **torch.compile**: a compiled graph saves other tensors for backward than the eager
  model does (and the runtime's hooks would silently stop compilation); record and train
  the eager model.
"""

from __future__ import annotations

from typing import Any

import torch


#: The wrappers whose ``forward`` only calls the wrapped module's: their calls are not the model's.
DATA_PARALLEL_WRAPPERS = (torch.nn.parallel.DistributedDataParallel, torch.nn.DataParallel)


def _fsdp2_module_class() -> Any:
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # pragma: no cover - older torch, or no distributed build
        return None
    return FSDPModule


def _dtensor_class() -> Any:
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # pragma: no cover - no distributed build
        return None
    return DTensor


_DTENSOR = _dtensor_class()


def local_tensor(t: torch.Tensor) -> torch.Tensor:
    """``t``'s local shard when it is a ``DTensor`` (FSDP2's sharded parameters, their gradients,
    the optimizer's state of them), else ``t``: the memory this rank holds."""
    if _DTENSOR is not None and isinstance(t, _DTENSOR):
        return t._local_tensor
    return t


def fsdp_param_groups(model: torch.nn.Module | None) -> list[Any]:
    """FSDP2's parameter groups of ``model`` (one per ``fully_shard`` call that was given
    parameters), in module order; empty for a model without ``fully_shard``."""
    cls = _fsdp2_module_class()
    if model is None or cls is None:
        return []
    groups: list[Any] = []
    for m in model.modules():
        if isinstance(m, cls):
            state = m._get_fsdp_state()
            found = getattr(state, "_fsdp_param_groups", None)
            if found is None:  # pragma: no cover - torch versions with a single group per state
                found = [g for g in (getattr(state, "_fsdp_param_group", None),) if g is not None]
            groups.extend(g for g in found if g not in groups)
    return groups


def unsharded_storages(model: torch.nn.Module | None) -> list[torch.UntypedStorage]:
    """The storages FSDP2 all-gathers ``model``'s parameters into: allocated (``resize_`` to their
    size) before a sharded module's forward or backward, freed (``resize_(0)``) when it reshards.
    Neither is a dispatched allocation; the recorder follows their sizes (:mod:`dqn_swap.recorder`).
    They exist once FSDP ran an iteration (its lazy initialisation makes them)."""
    out: dict[int, torch.UntypedStorage] = {}
    for group in fsdp_param_groups(model):
        for p in group.fsdp_params:
            for t in (*p.all_gather_outputs, *getattr(p, "_unsharded_inner_tensors", ())):
                s = t.untyped_storage()
                out.setdefault(s._cdata, s)
    return list(out.values())


def sharded_parameters(model: torch.nn.Module | None) -> list[torch.Tensor]:
    """The local shards of FSDP2's sharded parameters of ``model``: the memory every rank holds
    throughout, whether the module's parameters are sharded or gathered at the moment (while
    gathered, ``model.parameters()`` yields the unsharded ones)."""
    return [local_tensor(p.sharded_param) for group in fsdp_param_groups(model) for p in group.fsdp_params]


def unsharded_gradients(model: torch.nn.Module | None) -> list[torch.Tensor]:
    """The unsharded gradients FSDP2 keeps between the micro-batches of gradient accumulation
    without synchronisation (``set_requires_gradient_sync(False)``): the unsharded parameters'
    ``grad``, or the gradient FSDP upcast to its reduce dtype (``unsharded_accumulated_grad``);
    reduce-scattered and freed by the backward of the micro-batch that synchronises."""
    out: list[torch.Tensor] = []
    for group in fsdp_param_groups(model):
        for p in group.fsdp_params:
            unsharded = getattr(p, "_unsharded_param", None)
            for g in (getattr(unsharded, "grad", None), getattr(p, "unsharded_accumulated_grad", None)):
                if g is not None:
                    out.append(local_tensor(g))
    return out


def set_micro_batch(model: torch.nn.Module, last: bool) -> None:
    """FSDP2's gradient accumulation, as its documentation recommends: on every micro-batch but the
    last, no reduce-scatter (``set_requires_gradient_sync(False)``) and the gathered parameters kept
    after backward (``set_reshard_after_backward(False)``); on the last, both back on.  Every
    ``fully_shard`` module of ``model`` is switched; a model without FSDP2 is left as it is."""
    cls = _fsdp2_module_class()
    for m in model.modules() if cls is not None else ():
        if isinstance(m, cls):
            m.set_requires_gradient_sync(last, recurse=False)
            m.set_reshard_after_backward(last, recurse=False)


def _fsdp_reason(where: str, module: torch.nn.Module) -> str | None:
    """Why the FSDP2 setup of ``module`` cannot be followed, or None."""
    state = module._get_fsdp_state()
    groups = getattr(state, "_fsdp_param_groups", None)
    if groups is None:  # pragma: no cover - torch versions with a single group per state
        groups = [g for g in (getattr(state, "_fsdp_param_group", None),) if g is not None]
    for g in groups:
        mesh = g.mesh_info.mesh
        if mesh.ndim != 1:
            return (f"{where} is sharded with FSDP2 (fully_shard) on a {mesh.ndim}-dimensional mesh (HSDP: "
                    "replicated and sharded); dqn-swap records FSDP2 on a one-dimensional mesh only: shard "
                    "over one mesh dimension")
        if g.post_forward_mesh_info is not None and g.post_forward_mesh_info is not g.mesh_info:
            return (f"{where} is sharded with FSDP2 with reshard_after_forward given as an int (resharding to a "
                    "smaller mesh after forward); dqn-swap follows reshard_after_forward True or False only")
        for p in g.fsdp_params:
            if p.offload_to_cpu:
                return (f"{where} is sharded with FSDP2 with CPUOffloadPolicy (sharded parameters on the host); "
                        "dqn-swap records parameters on the device: drop the offload policy")
    return None


def unsupported_reason(model: torch.nn.Module | None) -> str | None:
    """Why ``model`` cannot be recorded or trained under a plan, or None."""
    if model is None:
        return None
    fsdp2 = _fsdp2_module_class()
    try:
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP1
    except ImportError:  # pragma: no cover - no distributed build
        FSDP1 = None  # noqa: N806
    from torch._dynamo.eval_frame import OptimizedModule

    for name, m in model.named_modules():
        where = f"module {name!r}" if name else "the model"
        if FSDP1 is not None and isinstance(m, FSDP1):
            return (f"{where} is wrapped in FullyShardedDataParallel (FSDP1), whose flat parameters are gathered "
                    "outside the dispatcher; shard it with FSDP2 (torch.distributed.fsdp.fully_shard) instead")
        if fsdp2 is not None and isinstance(m, fsdp2):
            reason = _fsdp_reason(where, m)
            if reason is not None:
                return reason
        if isinstance(m, OptimizedModule) or getattr(m, "_compiled_call_impl", None) is not None:
            return (f"{where} is compiled with torch.compile, whose graphs save other tensors for backward than "
                    "the eager model; record and follow the plan with the eager model (drop torch.compile)")
    if _DTENSOR is not None:
        for pname, p in model.named_parameters():
            if isinstance(p, _DTENSOR):
                placements = p.placements
                fsdp_owned = fsdp2 is not None and len(placements) == 1 and placements[0].is_shard()
                if not fsdp_owned or p.device_mesh.ndim != 1:
                    return (f"parameter {pname!r} is a DTensor placed {tuple(map(str, placements))} on a "
                            f"{p.device_mesh.ndim}-dimensional mesh (tensor parallelism?); dqn-swap follows "
                            "plain parameters and FSDP2's one-dimensional sharding only")
    return None


def under_torch_compile() -> bool:
    """Whether this code runs inside a function compiled with ``torch.compile``: traced by dynamo,
    or run eagerly by it after a graph break (its frame callback is then still installed)."""
    if torch.compiler.is_compiling():
        return True
    try:
        from torch._C._dynamo.eval_frame import get_eval_frame_callback
    except ImportError:  # pragma: no cover - builds without dynamo
        return False
    return get_eval_frame_callback() not in (None, False)


COMPILED_STEP = ("a planned iteration cannot run inside a function compiled with torch.compile (its graphs save "
                 "other tensors for backward than the eager model the trace recorded): compile neither the model "
                 "nor the training step that holds the `with` block")

__all__ = ["COMPILED_STEP", "fsdp_param_groups", "local_tensor", "set_micro_batch", "sharded_parameters",
           "under_torch_compile", "unsharded_gradients", "unsharded_storages", "unsupported_reason"]
