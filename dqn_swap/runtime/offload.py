"""Safe mode: every saved activation on the host from the moment autograd saves it until backward
needs it.

This is what :func:`torch.autograd.graph.save_on_cpu` does, with two differences that matter
for a memory limit: the host copy is made once per storage and version (a tensor autograd saves
for three nodes is copied once), and the storage brought back in backward is shared by every
view of it unpacked while it lives, so a storage is never on the device twice.

It is the mode in which a step runs where no plan is known to fit it: the steps before a plan
exists (:mod:`dqn_swap.integrations`), and the rest of a planned step from the point where the live
iteration leaves the plan's trace (:class:`~dqn_swap.runtime.PlannedExecution` with
``on_mismatch="safe"``).

Why it stays under any limit a plan can meet (``docs/memory.md``, "Safe mode"): a plan's limit
is at least the trace's minimum, which is what the device holds at the busiest op with every
saved activation away -- the model state, the op's inputs, outputs and scratch, and the
tensors the program itself holds.  In safe mode the device holds exactly that and nothing saved
for backward beyond the tensor being packed: a saved activation leaves at its pack (its device
bytes are freed once nothing else holds them), and in backward one node's saved tensors come
back right before it runs and are freed when it ends, which is what the minimum already counts
as that op's inputs.  A pack of a tensor something else still holds (the op's own output,
still in use; a module attribute) frees nothing, and nothing has to: that holder is in the
minimum too (:attr:`dqn_swap.trace.Trace.minimum_memory`; ``tests/runtime/test_variants.py``
measures a step in safe mode against it on the allocator's timeline).
"""

from __future__ import annotations

from typing import Any

import torch
from torch.multiprocessing.reductions import StorageWeakRef

from .backend import host_buffer


class HostStorage:
    """A device storage's bytes on the host, and the storage brought back while it lives."""

    __slots__ = ("host", "nbytes", "device", "back")

    def __init__(self, storage: torch.UntypedStorage, device: torch.device) -> None:
        self.nbytes = storage.nbytes()
        self.device = device
        src = torch.empty(0, dtype=torch.uint8, device=device).set_(storage)
        self.host = host_buffer(self.nbytes, device)
        # Sync: a blocking copy.  Safe mode frees the device bytes as soon as this returns, so the
        # copy must have read them by then; it is the slow path and makes no claim to overlap.
        self.host.copy_(src)
        self.back: StorageWeakRef | None = None

    def restore(self) -> torch.UntypedStorage:
        """The storage on the device again: the one already brought back while it lives, else a copy."""
        if self.back is not None and not self.back.expired():
            return torch.UntypedStorage._new_with_weak_ptr(self.back.cdata)
        dev = torch.empty(self.nbytes, dtype=torch.uint8, device=self.device)
        dev.copy_(self.host)
        storage = dev.untyped_storage()
        self.back = StorageWeakRef(storage)
        return storage


class Offloaded:
    """What autograd keeps for a saved tensor in safe mode: its storage's host copy and its view."""

    __slots__ = ("storage", "dtype", "size", "stride", "offset")

    def __init__(self, storage: HostStorage, t: torch.Tensor) -> None:
        self.storage = storage
        self.dtype, self.size, self.stride, self.offset = t.dtype, t.size(), t.stride(), t.storage_offset()

    def tensor(self) -> torch.Tensor:
        storage = self.storage.restore()
        return torch.empty(0, dtype=self.dtype, device=storage.device).set_(storage, self.offset, self.size,
                                                                            self.stride)


class HostOffload:
    """Saved-tensor hooks of safe mode (module docstring).

    Args:
        device: the device whose tensors go to the host; tensors elsewhere stay as they are.
        persistent: storage keys (``untyped_storage()._cdata``) that stay: parameters and buffers,
            whose bytes a copy would not free.

    Example::

        hooks = HostOffload(device, persistent_storages(model))
        with torch.autograd.graph.saved_tensors_hooks(hooks.pack, hooks.unpack):
            loss = model(x).sum()
        loss.backward()
    """

    def __init__(self, device: torch.device, persistent: set[int]) -> None:
        self.device, self.persistent = device, persistent
        # (storage key, version) -> (the device storage, weakly; its host copy): one copy per storage
        # and version while the device storage lives (its key cannot be reused before it dies).
        self.copies: dict[tuple[int, int], tuple[StorageWeakRef, HostStorage]] = {}
        self.packed = 0
        self.copied_bytes = 0

    def offloadable(self, t: torch.Tensor) -> bool:
        return (t.device == self.device and t.device.type != "meta" and not isinstance(t, torch.nn.Parameter)
                and t.untyped_storage()._cdata not in self.persistent)

    def pack(self, t: torch.Tensor) -> Any:
        if not self.offloadable(t):
            return t.detach() if t.requires_grad else t  # an alias: no reference cycle through grad_fn
        storage = t.untyped_storage()
        key = (storage._cdata, t._version)
        with torch.no_grad():
            found = self.copies.get(key)
            if found is None or found[0].expired():
                host = HostStorage(storage, t.device)
                self.copies[key] = (StorageWeakRef(storage), host)
                self.copied_bytes += host.nbytes
            else:
                host = found[1]
        self.packed += 1
        return Offloaded(host, t)

    @staticmethod
    def unpack(x: Any) -> torch.Tensor:
        if type(x) is Offloaded:
            with torch.no_grad():
                return x.tensor()
        return x


def persistent_storages(model: torch.nn.Module | None) -> set[int]:
    """Storage keys of a model's parameters and buffers (what safe mode leaves where it is)."""
    if model is None:
        return set()
    keys = {p.untyped_storage()._cdata for p in model.parameters()}
    keys |= {b.untyped_storage()._cdata for b in model.buffers()}
    return keys


__all__ = ["HostOffload", "HostStorage", "Offloaded", "host_buffer", "persistent_storages"]
