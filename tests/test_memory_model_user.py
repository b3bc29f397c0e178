"""The model of memory on models not the project's own: what holds a saved activation besides autograd.

A saved activation that a holder outside autograd still keeps after its last forward use (a
local of a function still running, a module's frame in PyTorch Geometric's message passing,
autocast's cache of weight casts) is not freed when the runtime drops autograd's reference:
the recorder records when that holder lets it go (``Trace.tensor_held_op``), a plan's action
frees it only then (``Trace.leave_op``), and one held until its next use is not movable.
Before this, acting on the dropout output of a GCN measured one tensor (100 KiB) above the
prediction: the copy brought back sat beside the original the model still held.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from dqn_swap.integrations.experiment import measured_cpu_peak
from dqn_swap.recorder import record_trace
from dqn_swap.planners import manual_plan, saved_activations
from dqn_swap.runtime import PlannedExecution
from dqn_swap.simulator import Simulator, instant_copy_peak, simulate
from dqn_swap.trace import Role, resolve_memory_limit


def assert_peak_matches(measured: int, trace_peak: int) -> None:
    """The measured peak is the trace's, or at most one 16-byte block below it.

    Run after run the two are equal; in three full test runs of one day (two of them on a clean
    clone, as CI runs), one of these comparisons found the trace 16 bytes above the measurement,
    and the test passed alone.  Holding the garbage collector still and a process of their own (a child
    ``pytest`` for these tests) did not remove it; where the block comes from is not known.
    Every error these tests were written against is caught still: the measurement 8 bytes above
    the trace, the trace 8,184 bytes, 49,152 bytes and 4 MiB above it."""
    assert 0 <= trace_peak - measured <= 16, (measured, trace_peak)


class Held(nn.Module):
    """``h`` is saved by ``fc2`` (its last forward use) but the frame keeps it through ``fc3``."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2, self.fc3, self.fc4 = nn.Linear(64, 256), nn.Linear(256, 256), nn.Linear(256, 256), nn.Linear(256, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.fc1(x))
        g = torch.tanh(self.fc2(h))
        g = torch.tanh(self.fc3(g))
        out = self.fc4(g)
        del h  # h's last holder outside autograd goes here, after fc3 and fc4
        return out


def _workload(model_cls, inputs_fn, loss_of):  # noqa: ANN001, ANN202
    def build():  # noqa: ANN202
        torch.manual_seed(0)
        model = model_cls()
        gen = torch.Generator().manual_seed(1)
        inputs, target = inputs_fn(gen)
        return model, inputs, (lambda out: loss_of(out, target)), (lambda p: torch.optim.SGD(p, lr=0.01))
    return build


def _gcn_cls():  # noqa: ANN202
    gcn_conv = pytest.importorskip("torch_geometric.nn").GCNConv

    class GCN(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.c1, self.c2, self.c3 = gcn_conv(32, 64), gcn_conv(64, 64), gcn_conv(64, 5)

        def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
            x = F.dropout(F.relu(self.c1(x, edge_index)), 0.5, self.training)
            x = F.dropout(F.relu(self.c2(x, edge_index)), 0.5, self.training)
            return self.c3(x, edge_index)
    return GCN


def _graph(gen: torch.Generator):  # noqa: ANN202
    n = 400
    x = torch.randn(n, 32, generator=gen)
    edges = torch.randint(0, n, (2, 2000), generator=gen)
    return (x, edges), torch.randint(0, 5, (n,), generator=gen)


def _held_inputs(gen: torch.Generator):  # noqa: ANN202
    return (torch.randn(128, 64, generator=gen),), torch.randint(0, 4, (128,), generator=gen)


def _measure(build, trace, plan) -> tuple[int, int]:  # noqa: ANN001
    result = simulate(trace, plan)
    predicted = instant_copy_peak(trace, plan, result)
    assert predicted <= result.peak_bytes <= plan.memory_limit
    model, inputs, loss_fn, make_opt = build()
    opt = make_opt(model.parameters())
    measured = measured_cpu_peak(model, inputs, loss_fn, opt, PlannedExecution(model, plan, trace), trace.initial_bytes)
    return measured, predicted


def test_a_local_holding_a_saved_activation_is_recorded() -> None:
    build = _workload(Held, _held_inputs, F.cross_entropy)
    model, inputs, loss_fn, make_opt = build()
    trace = record_trace(model, inputs, loss_fn, make_opt, device="cpu")
    # h: tanh's output saved by fc2's addmm (and by tanh's backward); the frame holds it to the end
    tanh_ops = [i for i in range(trace.n_ops) if trace.op_names[trace.op_name[i]] == "aten.tanh"]
    h = int(trace.event_tensor[(trace.event_op == tanh_ops[0]) & (trace.event_kind == 0)][0])
    assert trace.tensor_role[h] == Role.SAVED
    last_use = int(trace._last_forward_use[h])
    assert trace.tensor_held_op[h] > last_use  # held past its last forward use, by the local
    assert trace.leave_op[h] == trace.tensor_held_op[h]
    # a swap of h takes effect only then: the simulator keeps it on the device until the holder goes
    plan = manual_plan(trace, swap=[h])
    need = Simulator(trace, plan.memory_limit).memory_need(plan.actions)
    assert np.all(need[last_use + 1:trace.tensor_held_op[h] + 1] == trace.op_memory[last_use + 1:trace.tensor_held_op[h] + 1])


def test_a_swap_of_a_held_activation_frees_it_when_its_holder_lets_go() -> None:
    build = _workload(Held, _held_inputs, F.cross_entropy)
    model, inputs, loss_fn, make_opt = build()
    trace = record_trace(model, inputs, loss_fn, make_opt, device="cpu")
    for t in saved_activations(trace):
        plan = manual_plan(trace, swap=[t])
        measured, predicted = _measure(build, trace, plan)
        assert measured <= plan.memory_limit
        assert 0.95 * predicted <= measured <= predicted, (t, measured, predicted)


def test_gcn_dropout_output_swapped_alone_is_as_predicted() -> None:
    """The reported case: PyG's GCNConv, the dropout output of the first layer (held by the
    caller's frame until the second layer returns) swapped alone."""
    build = _workload(_gcn_cls(), _graph, F.cross_entropy)
    model, inputs, loss_fn, make_opt = build()
    trace = record_trace(model, inputs, loss_fn, make_opt, device="cpu")
    held = [t for t in saved_activations(trace) if trace.leave_op[t] > trace.action_window[0][t]]
    assert held, "the GCN's layer inputs are held by the caller past their last forward use"
    big = max(held, key=lambda t: trace.tensor_nbytes[t])
    measured, predicted = _measure(build, trace, manual_plan(trace, swap=[big]))
    assert 0.95 * predicted <= measured <= predicted, (measured, predicted)


@pytest.mark.parametrize("planner,limit", [("vdnn", "30%"), ("lru", "50%"), ("greedy", "70%")])
def test_gcn_plans_are_under_the_limit_and_as_predicted(planner: str, limit: str) -> None:
    from dqn_swap.agents import get_planner

    build = _workload(_gcn_cls(), _graph, F.cross_entropy)
    model, inputs, loss_fn, make_opt = build()
    trace = record_trace(model, inputs, loss_fn, make_opt, device="cpu")
    plan = get_planner(planner).plan(trace, resolve_memory_limit(trace, limit))
    assert plan.actions and plan.figures.get("feasible")
    measured, predicted = _measure(build, trace, plan)
    assert measured <= plan.memory_limit
    assert 0.95 * predicted <= measured <= predicted, (measured, predicted)


def test_older_traces_keep_their_model() -> None:
    """A trace without the column (older files) moves tensors at their last forward use, as before."""
    build = _workload(Held, _held_inputs, F.cross_entropy)
    model, inputs, loss_fn, make_opt = build()
    trace = record_trace(model, inputs, loss_fn, make_opt, device="cpu")
    old = trace.replace(tensor_held_op=np.full(trace.n_tensors, -1, dtype=np.int32))
    action, _ = old.action_window
    assert np.array_equal(old.leave_op, action)
    assert old.fingerprint != trace.fingerprint


# ----------------------------------------------------------------- gradient accumulation
class Unrolled(nn.Module):
    """One linear cell applied over 4 steps (an unrolled RNN): its weight gets 4 gradients, which
    autograd sums in its input buffer before adding them into ``.grad``."""

    def __init__(self) -> None:
        super().__init__()
        self.cell, self.out = nn.Linear(512, 512), nn.Linear(512, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x
        for _ in range(4):
            h = torch.tanh(self.cell(h))
        return self.out(h)


class _KeepGradients:
    """An accumulation micro-step after the first: ``zero_grad`` keeps the gradients, ``state``
    declares them alive before the iteration (as ``tests/user_models.AccumulationStep`` does)."""

    def __init__(self, params) -> None:  # noqa: ANN001
        self.params = list(params)
        self.sgd = torch.optim.SGD(self.params, lr=0.01)

    @property
    def state(self) -> dict:
        return {p: {"grad": p.grad} for p in self.params if p.grad is not None}

    def zero_grad(self, set_to_none: bool = True) -> None:
        pass

    def step(self) -> None:
        self.sgd.step()


def test_a_view_gradient_is_summed_out_of_place_as_in_training() -> None:
    """The engine sums two gradients in place only into one whose storage it holds alone; a linear
    layer's weight gradient is a view (``mm(...).t()``), so its first sum makes a new tensor.  The
    recorder wrote it in place (a weight-sized tensor too few): an unrolled LSTM measured 1.0462 of
    its trace with gradients present (the accumulating micro-step), 4 MiB over.  Now exact."""
    build = _workload(Unrolled, lambda gen: ((torch.randn(8, 512, generator=gen),),
                                             torch.randint(0, 4, (8,), generator=gen)), F.cross_entropy)
    model, inputs, loss_fn, _ = build()
    trace = record_trace(model, inputs, loss_fn, _KeepGradients, device="cpu")
    model, inputs, loss_fn, _ = build()
    opt = _KeepGradients(model.parameters())
    measured = measured_cpu_peak(model, inputs, loss_fn, opt, None, trace.initial_bytes)
    assert_peak_matches(measured, trace.peak_bytes)


# ----------------------------------------------------------------- bytes the dispatcher never shows
class Scalars(nn.Module):
    """Python numbers where ops want tensors (``h + 1.0``: wrapped in an 8-byte tensor before the op
    reaches the dispatcher) and a constant made in forward and dropped by the op that reads it
    (``ids[..., 0] = 3``, as T5's ``_shift_right`` does: ``lift_fresh`` of an 8-byte int64)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(64, 256), nn.Linear(256, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ids = torch.zeros(x.shape[0], 4, dtype=torch.long)
        ids[..., 0] = 3
        h = torch.tanh(self.fc1(x)) + 1.0  # add saves nothing: the wrapped 1.0 dies with the op
        return self.fc2(h - ids.sum())


def test_wrapped_numbers_and_constants_are_counted_where_they_live() -> None:
    """Before: the constant was counted as alive before the iteration (in ``initial_bytes``, and
    allocated again on the timeline) and every wrapped number was missing from its op: the
    measured peak of unplanned training was above the trace's.  Now the wrapped numbers are their
    ops' scratch and the constant is its reader's; the trace's peak is what is measured."""
    build = _workload(Scalars, _held_inputs, F.cross_entropy)
    # One recording first, so that whatever a process makes once on first use (and keeps) is made
    # before the recording and the measurement compared here: in a whole test session the earlier
    # tests may or may not have made it, and the two then differed by 16 bytes once.
    record_trace(*build(), device="cpu")
    model, inputs, loss_fn, make_opt = build()
    trace = record_trace(model, inputs, loss_fn, make_opt, device="cpu")
    fills = [i for i in range(trace.n_ops) if trace.op_names[trace.op_name[i]] == "aten.fill_"]
    assert fills and trace.op_scratch[fills[0]] >= 8  # the constant, alive while fill_ runs
    pre = trace.tensor_alloc_op < 0
    assert not np.any(pre & (trace.tensor_role == Role.INPUT) & (trace.tensor_nbytes == 8))
    adds = [i for i in range(trace.n_ops) if trace.op_names[trace.op_name[i]] == "aten.add"
            and trace.op_phase[i] == 0]
    assert adds and all(trace.op_scratch[i] >= 8 for i in adds)
    model, inputs, loss_fn, make_opt = build()
    opt = make_opt(model.parameters())
    measured = measured_cpu_peak(model, inputs, loss_fn, opt, None, trace.initial_bytes)
    assert_peak_matches(measured, trace.peak_bytes)


# ----------------------------------------------------------------- formulas that fill a zero tensor
class Gathers(nn.Module):
    """Message passing as PyTorch Geometric writes it: ``index_select`` of node features along the
    edges, ``gather``, and ``index_put`` (advanced indexing); their gradients are a zero tensor
    filled in place (``new_zeros(...).index_add_``, ``.scatter_add_``, ``.index_put_``)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(32, 256), nn.Linear(256, 4)

    def forward(self, x: torch.Tensor, edges: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.fc1(x))
        msg = h.index_select(0, edges[0]) + h.gather(0, edges[1, :, None].expand(-1, h.shape[1])) + h[edges[1]]
        return self.fc2(msg.relu())


def _edges(gen: torch.Generator):  # noqa: ANN202
    return (torch.randn(512, 32, generator=gen), torch.randint(0, 512, (2, 600), generator=gen)), \
        torch.randint(0, 4, (600,), generator=gen)


def test_a_zero_filled_gradient_is_filled_in_place_as_in_training() -> None:
    """Outside a dispatch mode these formulas fill the zero tensor in place; under one every tensor is
    "subclass-like" and they call the out-of-place form, which the recorder saw: one node-feature-sized
    tensor too many at each (GIN measured 49152 B, one [192, 64] fp32 tensor, below every planned
    prediction at the peak, ``index_add`` in its backward: 0.94).  Now the trace's op writes the zeros
    and the trace's peak is what is measured."""
    build = _workload(Gathers, _edges, F.cross_entropy)
    model, inputs, loss_fn, make_opt = build()
    trace = record_trace(model, inputs, loss_fn, make_opt, device="cpu")
    names = [trace.op_names[i] for i in trace.op_name]
    fills = [i for i, n in enumerate(names) if n in ("aten.index_add", "aten.scatter_add", "aten.index_put")
             and trace.op_phase[i] == 1]
    assert len(fills) == 3
    for op in fills:
        mine = trace.event_op == op
        assert not np.any(trace.event_kind[mine] == 0), names[op]  # no malloc: it writes the zeros
        (written,) = trace.event_tensor[mine & (trace.event_kind == 1)]
        assert names[trace.tensor_alloc_op[written]] in ("aten.new_zeros", "aten.zeros", "aten.zeros_like")
    model, inputs, loss_fn, make_opt = build()
    opt = make_opt(model.parameters())
    measured = measured_cpu_peak(model, inputs, loss_fn, opt, None, trace.initial_bytes)
    assert_peak_matches(measured, trace.peak_bytes)


class SavedScalars(nn.Module):
    """A Python number autograd saves for backward (``h * 0.5``: ``MulBackward0`` keeps the wrapped
    0.5, unseen by the dispatcher and by the saved-tensor hooks, until it runs in backward), and two
    outputs whose gradients come apart, as a Hugging Face model returning its loss beside its logits:
    the per-sample losses' gradient comes first and is used at once, the logits' comes from the
    softmax's backward, the peak (PyTorch's module tracker, with which the recorder names modules,
    held the first gradient until the last one came)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(64, 32), nn.Linear(32, 512)

    def forward(self, x: torch.Tensor, target: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits = self.fc2(torch.tanh(self.fc1(x)) * 0.5)
        return logits, F.cross_entropy(logits, target, reduction="none")


def _inputs_and_target(gen: torch.Generator):  # noqa: ANN202
    x, target = torch.randn(2048, 64, generator=gen), torch.randint(0, 512, (2048,), generator=gen)
    return (x, target), None


def _halved_mean(out: tuple[torch.Tensor, torch.Tensor], target: None) -> torch.Tensor:
    return out[1].mean() / 2  # the 2 is saved too, until DivBackward0 runs


def test_numbers_autograd_saves_live_until_backward_and_no_gradient_is_held_longer() -> None:
    """Before: the saved 0.5 and the ``/ 2`` were their ops' scratch only, so the measured peak (in
    backward, before ``MulBackward0`` ran) was 8 bytes above the trace's, and the per-sample losses'
    gradient (8 KiB) was held through that peak by the recorder's module tracker, which training
    does not do: the trace was 8184 bytes above what is measured.  Now each saved number is a hidden
    storage from its op until its node ran, no gradient is held longer, and the trace's peak is what
    is measured."""
    build = _workload(SavedScalars, _inputs_and_target, _halved_mean)
    model, inputs, loss_fn, make_opt = build()
    trace = record_trace(model, inputs, loss_fn, make_opt, device="cpu")
    hidden = np.flatnonzero(trace.tensor_role == Role.HIDDEN)
    names = [trace.op_names[trace.op_name[trace.tensor_alloc_op[t]]] for t in hidden]
    assert sorted(names) == ["aten.div", "aten.mul"] and np.all(trace.tensor_nbytes[hidden] == 8)
    freed = trace.tensor_free_op[hidden]
    assert np.all(trace.op_phase[freed] == 1)  # released when their node ran in backward
    assert trace.peak_op > freed.min() and trace.peak_op < freed.max()  # the 0.5 is alive at the peak
    model, inputs, loss_fn, make_opt = build()
    opt = make_opt(model.parameters())
    measured = measured_cpu_peak(model, inputs, loss_fn, opt, None, trace.initial_bytes)
    assert_peak_matches(measured, trace.peak_bytes)
    # no plan acts on a hidden storage, and the runtime does not look for one among the outputs of an
    # op it re-runs: recomputing the product re-runs the mul (its 0.5 is then the re-run's scratch)
    assert not trace.movable[hidden].any()
    muls = [i for i in range(trace.n_ops) if trace.op_names[trace.op_name[i]] == "aten.mul" and trace.op_phase[i] == 0]
    h = [t for t in np.flatnonzero(trace.tensor_alloc_op == muls[0]) if trace.tensor_role[t] == Role.SAVED]
    assert len(h) == 1
    measured, predicted = _measure(build, trace, manual_plan(trace, recompute=h))
    assert 0.95 * predicted <= measured <= predicted, (measured, predicted)


# ----------------------------------------------------------------- random ops re-run
class Dropped(nn.Module):
    """Dropout written by hand: the mask, saved by the multiply, is made from ``rand_like``'s
    numbers (a temporary); removing the mask re-runs ``rand_like`` in backward, with the
    generator's state the forward pass drew from."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2, self.fc3 = nn.Linear(64, 256), nn.Linear(256, 256), nn.Linear(256, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.fc1(x))
        keep = torch.rand_like(h) > 0.5
        return self.fc3(torch.tanh(self.fc2(h * keep * 2.0)))


def test_a_recomputed_random_op_holds_no_generator_state() -> None:
    """Before: the runtime kept the generator's state before every random op a plan re-runs as the
    tensor ``get_state`` returns -- on the CPU, 5056 bytes of the device's allocator -- from the
    forward pass to the end of the iteration, and took the current state the same way around each
    re-run: measured 5056 bytes per recorded random op above the prediction (Hugging Face Llama's
    and ViT's attention, a random op even at dropout 0).  Now the state is a generator clone, and
    the states a re-run sets are copied out of the allocator before the sequence starts."""
    build = _workload(Dropped, _held_inputs, F.cross_entropy)
    model, inputs, loss_fn, make_opt = build()
    trace = record_trace(model, inputs, loss_fn, make_opt, device="cpu")
    name = [trace.op_names[trace.op_name[i]] for i in range(trace.n_ops)]
    rand, gt = name.index("aten.rand_like"), name.index("aten.gt")
    mask = int(trace.event_tensor[(trace.event_op == gt) & (trace.event_kind == 0)][0])
    assert mask in saved_activations(trace)
    plan = manual_plan(trace, recompute=[mask])
    assert rand in simulate(trace, plan).recompute_ops
    measured, predicted = _measure(build, trace, plan)
    assert 0.95 * predicted <= measured <= predicted, (measured, predicted)
    # the re-run drew the forward pass's numbers: training is bit-identical to unplanned training
    runs = []
    for planned in (True, False):
        model, inputs, loss_fn, make_opt = build()
        rt = PlannedExecution(model, plan, trace) if planned else None
        torch.manual_seed(0)
        measured_cpu_peak(model, inputs, loss_fn, make_opt(model.parameters()), rt, trace.initial_bytes)
        runs.append((model.state_dict(), torch.rand(4)))  # the generator is where unplanned training left it
    (a, ra), (b, rb) = runs
    assert all(torch.equal(a[k], b[k]) for k in a) and torch.equal(ra, rb)


# ----------------------------------------------------------------- numbers a retained graph keeps
class ScaledEmbedding(nn.Module):
    """BART's ``BartScaledWordEmbedding``: the embedding times a Python float, which autograd saves
    (``MulBackward0._saved_other``, a wrapped 8-byte number)."""

    def __init__(self) -> None:
        super().__init__()
        self.emb, self.fc1, self.fc2 = nn.Embedding(50, 64), nn.Linear(64, 64), nn.Linear(64, 4)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.emb(ids) * 8.0
        return self.fc2(torch.tanh(self.fc1(h))).mean(1)


def test_numbers_of_a_retained_graph_live_until_its_last_backward() -> None:
    """``loss.backward(retain_graph=True)`` then ``loss.backward()``: the first pass keeps the graph,
    so a saved number lives on to the second pass, which releases it (before: freed in the trace
    at the first pass, and every step measured 8 bytes above its trace, over a limit at the trace's
    peak).  The trace's peak is the measured one, from one allocator timeline over the whole run."""
    from dqn_swap import autoplan
    from dqn_swap.meter import AllocatorTimeline

    timeline = AllocatorTimeline(own_blocks=True)
    with timeline:  # from before anything of the run exists: its peaks are every byte alive
        g = torch.Generator().manual_seed(0)
        ids, y = torch.randint(0, 50, (4, 16), generator=g), torch.randint(0, 4, (4,), generator=g)
        torch.manual_seed(0)
        model = ScaledEmbedding()
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        planned = autoplan(model, "100%", optimizer=opt, planner="none", verbose=False)
        for i in range(4):
            AllocatorTimeline.instant(f"s{i}<")
            with planned.step():
                loss = F.cross_entropy(model(ids), y)
                loss.backward(retain_graph=True)
                loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            del loss
            AllocatorTimeline.instant(f"s{i}>")
    (entry,) = planned.entries.values()
    assert planned.last == "planned" and entry.trace.tensor_role.tolist().count(int(Role.HIDDEN)) >= 1
    _, peak = timeline.between("s3<", "s3>")
    assert peak == entry.trace.peak_bytes
