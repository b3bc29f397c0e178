"""The environment's per-step bookkeeping, compiled with Numba: the valid-action mask and the
observation's dynamic columns, changed in place after each simulation.

What :meth:`dqn_swap.env.SwapRecomputeEnv.state` and ``node_features`` define, done in one call
instead of a dozen NumPy operations on node arrays (each costs about a microsecond at the sizes
of a step).  The one transcendental function, ``log1p`` of the time-to-violation feature, is
left to NumPy (:func:`numpy.log1p`, which may use other code than the C library's ``log1p``)
so that the features are the same bit for bit as NumPy computes them from scratch.

Compiled on first use with ``cache=True`` (a second process loads the machine code).
"""

from __future__ import annotations

from dqn_swap.simulator.numba_cache import ensure_cache_dir

ensure_cache_dir(__file__)  # before Numba reads its settings: a read-only install still caches its kernels

import numba  # noqa: E402
import numpy as np  # noqa: E402


@numba.njit(cache=True, nogil=True)
def refresh(x: np.ndarray, valid: np.ndarray, avail: np.ndarray, event_op: np.ndarray, reuse_op: np.ndarray,
            event_time: np.ndarray, node_op: np.ndarray, tv_nodes: np.ndarray, n_tv: int, op: int,
            t_viol: float, time_scale: float, prev_cur: int, f_valid: int, f_exec: int, f_tviol: int,
            tv_arg: np.ndarray) -> tuple[int, int]:
    """Bring the mask and the observation's columns to the decision op ``op`` (-1: the plan fits).

    ``valid[i] = avail[i] and event_op[i] < op < reuse_op[i]`` (all false when the plan fits;
    node 0, *do nothing*, alone when none is); column ``f_valid`` of ``x`` becomes ``valid``;
    the node under execution (the last node whose op is before ``op``, 0 when the plan fits)
    gets 1 in column ``f_exec`` and ``prev_cur`` 0; the ``n_tv`` nodes in ``tv_nodes`` get 0
    in column ``f_tviol`` and the valid nodes (when the plan does not fit) are written to
    ``tv_nodes``, each with ``max(t_viol - event_time, 0) / time_scale`` in ``tv_arg`` (the
    caller writes its ``log1p`` to column ``f_tviol``).  Returns ``(current node, number of
    valid nodes written)``."""
    n = len(valid)
    for j in range(n_tv):
        x[tv_nodes[j], f_tviol] = 0.0
    any_valid = False
    if op < 0:
        for i in range(n):
            valid[i] = False
    else:
        for i in range(n):
            v = avail[i] and event_op[i] < op and reuse_op[i] > op
            valid[i] = v
            any_valid |= v
    if not any_valid:
        valid[0] = True  # nothing to do, or nothing can help: only "do nothing"
    for i in range(n):
        x[i, f_valid] = 1.0 if valid[i] else 0.0
    cur = 0
    k = 0
    if op >= 0:
        cur = np.searchsorted(node_op, op) - 1
        if cur < 0:
            cur = 0
        for i in range(n):
            if valid[i]:
                d = t_viol - event_time[i]
                if d < 0.0:
                    d = 0.0
                tv_nodes[k] = i
                tv_arg[k] = d / time_scale
                k += 1
    x[prev_cur, f_exec] = 0.0
    x[cur, f_exec] = 1.0
    return cur, k
