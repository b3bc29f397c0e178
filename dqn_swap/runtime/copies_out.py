"""When a planned iteration's copies out start and when their device bytes go: :class:`CopiesOut` is
mixed into the runtime's iteration (:mod:`.iteration`), whose state it reads.

On an asynchronous device the simulation starts a swapped tensor's copy out when the op of the
plan's action ends (its last forward reader, or the op at whose end a holder outside autograd lets
it go), and counts its bytes free from the op by which that copy has ended
(:func:`dqn_swap.simulator.swap_out_ops`).  The runtime learns where the iteration is only at
its points of control (packs, unpacks, and ops while its dispatch mode numbers them), so it starts
each copy at the first of them once the op before the action's op has run, and waits for each copy
out at the last of them before the op that counts on its bytes.
"""

from __future__ import annotations

import heapq
import time

import torch

from .index import NO_OP
from .swap import SwapGroup


class CopiesOut:
    """The iteration's copies out and releases (mixed into ``_Iteration``; see the module docstring)."""

    def start_due_copies(self, issued: int) -> None:
        """Start the held-back copies out whose op is next or done (``issued`` ops have been queued on
        the compute stream): each begins once the op before its own has run, beside its op, at most
        that op's time before the simulation starts it, and they go onto the link in the simulation's
        order.  (Waiting for the next point of control after the op instead, which may come many ops
        later, kept 367 of the virtual-clock benchmark's 404 plans within 2 % of their makespan, where
        this kept 386: ``benchmarks/bench_runtime.py clock``.)  A copy a release was due on before it started is waited for now
        (``late_releases``)."""
        queue = self.copy_queue
        paused, self.paused = self.paused, True  # the copies are the runtime's own ops, not the model's
        try:
            while queue and queue[0][0] <= issued:
                group = heapq.heappop(queue)[2]
                self.swapper.start_copy(group)
                if group.tid in self.late_releases and self.wait_copy_out(group):
                    self.stats.released_after_copy += self.swapper.poll()
        finally:
            self.paused = paused
        self.copy_next = queue[0][0] if queue else NO_OP

    def release_before(self, op: int) -> None:
        """Op ``op`` of the forward pass is about to run (the dispatch mode numbers every op): the
        releases due by then are done now, not at the point of control before it.

        Sync: as in :meth:`enforce_releases`, but exactly where the simulator has the op wait for
        the bytes, so the ops in between have been issued (on CUDA, queued) before the host waits."""
        self.paused = True
        try:
            with torch.no_grad():
                self.enforce_releases(op)
        finally:
            self.paused = False

    def enforce_releases(self, horizon: int) -> None:
        """Free now the device bytes of every swapped tensor the simulation counts as free by op
        ``horizon`` (:func:`dqn_swap.simulator.swap_out_ops`), waiting on the host for copies
        out still running.

        Sync: the plan's memory is the simulator's, in which a swapped tensor's bytes are free once
        its copy out has ended and an op that needs them waits for that.  The caching allocator
        counts on the host's timeline, and a host that runs ahead of the device (CUDA queues kernels
        and returns) would allocate for later ops while the copies still hold their sources: the
        peak would be the unplanned one, whatever the plan.  So the host waits here, at the last
        point of control before the op that counts on the bytes (the horizon, index.with_releases).
        A tensor whose copy out has not started yet (saved later than the simulator swaps it) is
        waited for right after its copy starts (``late_releases``).
        """
        ops, tids = self.index.release_ops, self.index.release_tids
        i, n = self.release_ptr, len(ops)
        waited = False
        while i < n and ops[i] <= horizon:
            groups = self.groups_by_tid.get(tids[i])
            if groups is None or any(g.source is not None and g.d2h_event is None for g in groups):
                self.late_releases.add(tids[i])  # its copy out has not started
            for g in groups or ():
                waited |= self.wait_copy_out(g)
            i += 1
        self.release_ptr = i
        self.release_next = ops[i] if i < n else NO_OP
        if waited:
            self.stats.released_after_copy += self.swapper.poll()

    def wait_copy_out(self, g: SwapGroup) -> bool:
        """Block the host until ``g``'s copy out has ended (see :meth:`enforce_releases`); returns
        whether its device bytes are now ready to be released."""
        if g.source is None or g.d2h_event is None:
            return False
        if not g.d2h_event.query():
            start = time.perf_counter()
            g.d2h_event.synchronize()
            self.stats.release_waits += 1
            self.stats.release_wait_seconds += time.perf_counter() - start
        return True


__all__ = ["CopiesOut"]
