"""The offloading paper's chain model, read off a trace.

Beaumont, Eyraud-Dubois and Shilova, "Optimal GPU-CPU offloading strategies
for DNN training" (Euro-Par 2020), section 3.1, model a network as a chain:
forward steps ``F_0 .. F_L``, where ``F_i`` reads activation ``x_i`` and
produces ``x_{i+1}``, and backward steps ``B_L .. B_0``, where ``B_i`` needs
``x_i`` and ``x_{i+1}``; ``u_F``/``u_B`` are step durations and ``ex_F``/``ex_B``
the memory a step needs besides the activations, so that ``F_i`` runs in
``ex_i^F + sum_{j <= i+1} |x_j|`` bytes.  Their section 6.1 turns torchvision
networks into such chains by grouping non-sequential parts into virtual
layers.  We map any trace onto the chain like this:

* ``x_1 .. x_L`` are the trace's forward activations (:class:`TraceFacts`),
  ordered by their first backward use, latest first, so that ``B_L, B_{L-1},
  ...`` meet them in the order the trace's backward pass does (``x_L`` is
  the first activation backward needs).  In a ResNet this puts a block's
  input before the block's inner activations, as production order does.
  ``x_0`` and ``x_{L+1}`` are empty placeholders (the input and the loss,
  which no plan may move).
* ``F_i`` is the run of forward ops after ``x_i`` became free to offload up
  to the op after which ``x_{i+1}`` is, where ``x_i`` is free to offload once
  forward no longer uses it nor any ``x_j, j < i`` (the paper's ordered
  offloading).  ``F_0`` starts at the first op and ``F_L`` ends with the
  forward phase.  So "``x_i`` is ready to be offloaded at the end of
  ``F_{i-1}``" (section 5.2.1) holds literally -- and ``F_i`` no longer reads
  ``x_i``: the offloading module (:mod:`.dynprog`) lets ``F_i`` wait for
  ``x_i``'s own transfer when ``x_i`` is offloaded.
* ``B_i`` starts at the first backward op that uses ``x_i`` and runs until
  ``B_{i-1}`` starts; ``B_L`` also takes the backward ops before it and ``B_1``
  the optimizer step.  ``B_0`` is empty.
* The paper's ``ex_i + |x_{i+1}|`` (and ``|y_i| + |y_{i+1}|`` backward) is
  ``need_f[i]`` / ``need_b[i]``: the step's largest unplanned memory
  (``Trace.op_memory``) minus the activations ``x_1 .. x_i`` alive then.
  Parameters, gradients, optimizer state, temporaries (activation
  gradients among them, so ``|y_i|`` is not separate), ``x_{i+1}`` when it
  is alive and activations later in the chain all count in it, so
  ``need + sum_{j <= i} |x_j|`` bounds the trace's memory from above.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .base import TraceFacts


@dataclass(frozen=True)
class Chain:
    """A chain of ``L`` activations; arrays are indexed by the paper's ``i``.

    Attributes:
        x: bytes of ``x_0 .. x_{L+1}`` (``L + 2`` values; the ends are 0).
        u_f, u_b: seconds of ``F_0 .. F_L`` and ``B_0 .. B_L``.
        need_f, need_b: bytes of each step besides ``x_1 .. x_i`` (the paper's ``ex_i + |x_{i+1}|``).
        members: position in :class:`TraceFacts`' activation order of ``x_1 .. x_L``.
    """

    x: np.ndarray
    u_f: np.ndarray
    u_b: np.ndarray
    need_f: np.ndarray
    need_b: np.ndarray
    members: np.ndarray


def build_chain(facts: TraceFacts) -> Chain:
    """The chain of ``facts.trace``; see the module docstring for the mapping."""
    tr = facts.trace
    n_act = facts.n_activations
    members = np.lexsort((facts.act_ready_op, -facts.act_need_op))  # needed last in backward first
    size = facts.act_bytes[members]
    tensors = facts.act_tensor[members]
    x = np.zeros(n_act + 2, dtype=np.int64)
    x[1:-1] = size
    # Forward step i covers ops [f_start[i], f_stop[i]); x_i is free to offload at f_start[i].
    f_stop = np.empty(n_act + 1, dtype=np.int64)
    f_stop[:-1] = np.maximum.accumulate(facts.act_ready_op[members] + 1)
    f_stop[-1] = facts.backward_start
    f_start = np.concatenate([[0], f_stop[:-1]])
    # Backward step i covers ops [b_start[i], b_stop[i]); b_start[0] = n_ops leaves B_0 empty.
    b_start = np.concatenate([[tr.n_ops], facts.act_need_op[members]])
    b_start[n_act] = facts.backward_start
    b_stop = np.concatenate([[tr.n_ops], b_start[:-1]])

    dur = np.concatenate([[0.0], np.cumsum(tr.op_duration)])
    alloc = tr.tensor_alloc_op[tensors]
    free = tr.tensor_free_op[tensors].astype(np.int64)
    free = np.where(free < 0, tr.n_ops, free)

    def need(i: int, start: int, stop: int) -> int:
        """Largest memory of ops ``[start, stop)`` besides ``x_1 .. x_i`` (0 for an empty step)."""
        if stop <= start:
            return 0
        ks = np.arange(start, stop)[:, None]
        alive = (alloc[None, :i] <= ks) & (ks <= free[None, :i])
        chain_bytes = (alive * size[None, :i]).sum(axis=1)
        return int(max(0, (tr.op_memory[start:stop] - chain_bytes).max()))

    steps = range(n_act + 1)
    return Chain(x=x, u_f=dur[f_stop] - dur[f_start], u_b=dur[b_stop] - dur[b_start],
                 need_f=np.array([need(i, f_start[i], f_stop[i]) for i in steps], dtype=np.int64),
                 need_b=np.array([need(i, b_start[i], b_stop[i]) for i in steps], dtype=np.int64),
                 members=members)
