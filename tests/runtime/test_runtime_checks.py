"""The runtime refuses every mismatch between the live iteration and its trace, refuses plans the
simulator found infeasible unless asked by name, and never empties what the training loop can
still read.

* Live check: at every pack of a saved tensor the runtime compares shape, dtype and storage size
  with what the recorder saw at that pack, before it acts on the tensor; a head with more
  classes, another batch size, another model and a second forward pass in one block raise
  :class:`TraceMismatchError` with one line (saved tensor, op, was, is, what to do).
* ``plan.figures["feasible"]`` false: refused, unless ``allow_infeasible=True``.
* Swapped inputs (the batch, the labels a loss inside the model saves) read between forward and
  backward: whole and right, training bit-identical to unplanned, one ``HeldInputWarning``.
"""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.multiprocessing.reductions import StorageWeakRef

from dqn_swap.plan import ActionKind, Plan, PlanError
from dqn_swap.recorder import record_trace
from dqn_swap.planners import manual_plan, saved_activations
from dqn_swap.runtime import PlannedExecution, TraceMismatchError
from dqn_swap.runtime.execution import HeldInputWarning, InfeasiblePlanError
from dqn_swap.trace import Trace, TraceError

from ..runtime_support import RELEASED

CLASSES, WIDTH, FEATURES = 4, 16, 8


def mlp(classes: int = CLASSES, width: int = WIDTH, seed: int = 0) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(FEATURES, width), nn.Tanh(), nn.Linear(width, width), nn.Tanh(),
                         nn.Linear(width, classes))


def batch(n: int, classes: int = CLASSES, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(n, FEATURES, generator=gen), torch.randint(0, classes, (n,), generator=gen)


def sgd(params):  # noqa: ANN001, ANN201
    return torch.optim.SGD(params, lr=0.1, momentum=0.9, foreach=False)


def record(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> Trace:
    return record_trace(model, (x,), lambda out: F.cross_entropy(out, y), sgd, device="cpu")


@pytest.fixture(scope="module")
def recorded() -> Trace:
    """The MLP's trace at batch 2 (recorded on an instance of its own: recording trains it)."""
    return record(mlp(), *batch(2))


def swap_plan(trace: Trace):  # noqa: ANN201
    return manual_plan(trace, swap=saved_activations(trace), planner="swap-all")


def step(rt: PlannedExecution, model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> None:
    with rt:
        F.cross_entropy(model(x), y).backward()


def refused(rt: PlannedExecution, model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> str:
    with pytest.raises(TraceMismatchError) as info:
        step(rt, model, x, y)
    msg = str(info.value)
    assert "\n" not in msg and "record the trace again" in msg and "saved tensor #" in msg
    return msg


# --------------------------------------------------------------------------- live check
def test_a_head_with_more_classes_is_refused_at_its_first_pack(recorded: Trace) -> None:
    plan = swap_plan(recorded)
    model = mlp()
    model[4] = nn.Linear(WIDTH, 2000)  # the head grew from 4 to 2,000 classes after recording
    rt = PlannedExecution(model, plan, recorded)
    x, y = batch(2, classes=2000)
    msg = refused(rt, model, x, y)
    # the head's addmm saves its weight (transposed) first: float32[16, 4] then, float32[16, 2000] now
    assert f"float32[{WIDTH}, {CLASSES}]" in msg and f"float32[{WIDTH}, 2000]" in msg
    assert "saved by #" in msg and "aten.addmm" in msg
    assert rt.stats is not None and rt.stats.packed < rt.stats.expected_packs  # stopped at that pack
    step(PlannedExecution(mlp(), plan, recorded), mlp(), *batch(2))  # the recorded model still runs


def test_an_empty_plan_checks_every_op(recorded: Trace) -> None:
    """A plan without actions acts on nothing, but its limit holds only for the trace's iteration:
    another head (more memory) is refused at its first saved tensor that differs."""
    model = mlp()
    model[4] = nn.Linear(WIDTH, 2000)
    rt = PlannedExecution(model, manual_plan(recorded), recorded)
    msg = refused(rt, model, *batch(2, classes=2000))
    assert "float32[16, 4]" in msg and "float32[16, 2000]" in msg


def test_check_packs_checks_the_first_pack_only(recorded: Trace) -> None:
    """``check="packs"``: a plan without actions checks the batch (the first pack), then runs as
    without the runtime (checking every pack costs it 3-5 % of a step on the CPU)."""
    model = mlp()
    model[4] = nn.Linear(WIDTH, 2000)
    rt = PlannedExecution(model, manual_plan(recorded), recorded, check="packs")
    step(rt, model, *batch(2, classes=2000))  # another head: not seen, and nothing acted on
    assert rt.stats is not None and rt.stats.hooks_off_after == 0 and rt.stats.packed == 1


def test_an_op_more_that_saves_nothing_is_refused(recorded: Trace) -> None:
    """Every forward op's name is checked, not only the saved tensors: the same network with one op
    more that saves nothing is not the trace's iteration, whatever the plan does."""
    class TanhPlusOne(nn.Module):  # one op more, which saves nothing: no saved tensor differs
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.tanh(x) + 1

    for plan in (manual_plan(recorded), swap_plan(recorded)):
        model = mlp()
        model[3] = TanhPlusOne()
        rt = PlannedExecution(model, plan, recorded)
        with pytest.raises(TraceMismatchError) as info:
            step(rt, model, *batch(2))
        msg = str(info.value)
        assert "\n" not in msg and "forward op #4 is aten.add, the trace recorded aten.addmm" in msg, msg
        with pytest.raises(ValueError, match="check="):
            PlannedExecution(model, plan, recorded, check="everything")


@pytest.mark.parametrize("empty", [False, True], ids=["swap-plan", "empty-plan"])
def test_another_batch_size_is_refused_before_anything_is_swapped(recorded: Trace, empty: bool) -> None:
    plan = manual_plan(recorded) if empty else swap_plan(recorded)
    model = mlp()
    rt = PlannedExecution(model, plan, recorded)
    x, y = batch(6)
    before = x.clone()
    msg = refused(rt, model, x, y)
    assert "saved tensor #0 " in msg and f"float32[2, {FEATURES}]" in msg and f"float32[6, {FEATURES}]" in msg
    assert rt.stats is not None and rt.stats.swapped == 0 and rt.stats.packed == 1  # stopped at the first pack
    assert x.untyped_storage().nbytes() == before.untyped_storage().nbytes() and torch.equal(x, before)


def test_another_models_trace_is_refused(recorded: Trace) -> None:
    torch.manual_seed(0)
    other = nn.Sequential(nn.Linear(FEATURES, 32), nn.ReLU(), nn.Linear(32, CLASSES))
    rt = PlannedExecution(other, swap_plan(recorded), recorded)
    with pytest.raises(TraceMismatchError, match=r"forward op #1 is aten\.relu, the trace recorded aten\.tanh"):
        step(rt, other, *batch(2))
    rt = PlannedExecution(other, swap_plan(recorded), recorded, check="packs")  # the saved tensors differ too
    msg = refused(rt, other, *batch(2))
    assert "was float32[" in msg and "is float32[" in msg


def test_two_forward_passes_in_one_block_are_refused(recorded: Trace) -> None:
    model = mlp()
    x, y = batch(2)
    for plan in (swap_plan(recorded), manual_plan(recorded, recompute=[saved_activations(recorded)[1]])):
        rt = PlannedExecution(model, plan, recorded)
        with pytest.raises(TraceMismatchError, match="second forward pass in one `with` block") as info:
            with rt:
                first = F.cross_entropy(model(x), y)
                second = F.cross_entropy(model(x), y)
                (first + second).backward()
        assert "\n" not in str(info.value)
        assert rt.stats is not None and rt.stats.packed == rt.stats.expected_packs + 1  # refused at once
    step(PlannedExecution(model, swap_plan(recorded), recorded), model, x, y)  # one pass per block runs


def test_fewer_packs_than_recorded_are_refused_at_the_end_of_the_block(recorded: Trace) -> None:
    model = mlp()
    rt = PlannedExecution(model, swap_plan(recorded), recorded)
    x, y = batch(2)
    with pytest.raises(TraceMismatchError, match="the trace recorded"):
        with rt:
            model[0](x).sum().backward()  # only the first layer: its packs match, then nothing more


def test_the_check_is_on_for_the_whole_forward_pass(recorded: Trace) -> None:
    """The hooks are not trimmed after the last pack the plan concerns: a change after it is seen."""
    first_only = [saved_activations(recorded)[0]]
    plan = manual_plan(recorded, swap=first_only)
    model = mlp()
    model[4] = nn.Linear(WIDTH, 2000)
    rt = PlannedExecution(model, plan, recorded)
    refused(rt, model, *batch(2, classes=2000))


def test_trace_files_carry_the_shapes_and_old_files_still_load(recorded: Trace, tmp_path) -> None:  # noqa: ANN001
    path = recorded.save(tmp_path / "a.trace")
    loaded = Trace.load(path)
    assert loaded.saved_signatures == recorded.saved_signatures
    assert loaded.saved_signatures[0] == ("float32", (2, FEATURES))
    assert loaded.fingerprint == recorded.fingerprint
    # a file written before the columns existed: sizes only, same fingerprint
    old = recorded.replace(saved_dtype=None, saved_ndim=None, saved_dims=None)
    old_path = old.save(tmp_path / "old.trace")
    with np.load(old_path) as z:
        assert all(np.all(z[n] == -1) for n in ("saved_dtype", "saved_ndim")) and len(z["saved_dims"]) == 0
    stripped = tmp_path / "stripped.trace"
    with np.load(path) as z:
        np.savez_compressed(stripped, **{n: z[n] for n in z.files if n not in ("saved_dtype", "saved_ndim",
                                                                                "saved_dims")})
    legacy = Trace.load(stripped.with_suffix(".trace.npz"))
    assert all(sig == (None, None) for sig in legacy.saved_signatures)
    assert legacy.fingerprint == recorded.fingerprint
    model = mlp()
    x, y = batch(6)
    with pytest.raises(TraceMismatchError, match="in a storage of 64 B .* in a storage of 192 B"):  # sizes only
        step(PlannedExecution(model, swap_plan(legacy), legacy), model, x, y)
    # corrupt columns: one line
    bad = tmp_path / "bad.trace"
    with np.load(path) as z:
        arrays = {n: z[n] for n in z.files}
    arrays["saved_ndim"] = arrays["saved_ndim"][:-1]
    np.savez_compressed(bad.with_suffix(""), **arrays)
    bad.with_suffix(".npz").rename(bad)
    with pytest.raises(TraceError, match="column saved_ndim has") as info:
        Trace.load(bad)
    assert "\n" not in str(info.value)


# --------------------------------------------------------------------------- infeasible plans
def test_an_infeasible_plan_is_refused_unless_asked_for_by_name(recorded: Trace) -> None:
    plan = manual_plan(recorded, swap=saved_activations(recorded), memory_limit=1024)
    assert plan.figures["feasible"] is False
    with pytest.raises(InfeasiblePlanError, match="allow_infeasible=True") as info:
        PlannedExecution(mlp(), plan, recorded)
    assert "\n" not in str(info.value) and "infeasible" in str(info.value)
    model = mlp()
    opt = sgd(model.parameters())
    rt = PlannedExecution(model, plan, recorded, allow_infeasible=True)
    ref = mlp()
    ref_opt = sgd(ref.parameters())
    x, y = batch(2)
    for _ in range(2):
        step(rt, model, x, y)
        opt.step()
        opt.zero_grad()
        F.cross_entropy(ref(x), y).backward()
        ref_opt.step()
        ref_opt.zero_grad()
    assert rt.stats is not None and rt.stats.swapped >= 1
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), ref.state_dict().values()))


def test_a_plan_file_edited_to_look_feasible_is_refused(recorded: Trace, tmp_path) -> None:  # noqa: ANN001
    """The figures a plan file carries are its own word: set ``feasible`` to true by hand, the runtime
    still refuses the plan, because the simulator finds it cannot run under its limit."""
    plan = manual_plan(recorded, swap=saved_activations(recorded), memory_limit=1024)
    data = plan.to_json()
    data["figures"]["feasible"], data["figures"]["infeasible"] = True, None
    path = tmp_path / "edited.json"
    path.write_text(json.dumps(data))
    edited = Plan.load(path, recorded)
    assert edited.figures["feasible"] is True
    with pytest.raises(InfeasiblePlanError, match="allow_infeasible=True") as info:
        PlannedExecution(mlp(), edited, recorded)
    assert "\n" not in str(info.value)


def test_a_plan_file_whose_schedule_was_edited_is_refused(recorded: Trace, tmp_path) -> None:  # noqa: ANN001
    """A prefetch moved by hand in the file: the runtime would follow a schedule whose memory the
    simulator never checked; it says so in one line instead."""
    plan = manual_plan(recorded, swap=saved_activations(recorded))
    assert plan.schedule is not None and plan.schedule.prefetch
    data = plan.to_json()
    tid, op = data["schedule"]["prefetch"][0]
    data["schedule"]["prefetch"][0] = [tid, op + 1 if op + 1 < recorded.n_ops else op - 1]
    path = tmp_path / "edited.json"
    path.write_text(json.dumps(data))
    with pytest.raises(PlanError, match="its schedule .* is not the one the simulator makes") as info:
        PlannedExecution(mlp(), Plan.load(path, recorded), recorded)
    assert "\n" not in str(info.value)
    PlannedExecution(mlp(), plan, recorded)  # the plan as made is accepted


# --------------------------------------------------------------------------- inputs the loop reads
class LossInside(nn.Module):
    """Returns its logits and its loss: ``cross_entropy`` inside the model saves the labels."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = mlp()

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out = self.net(x)
        return out, F.cross_entropy(out, y)


@pytest.fixture(scope="module")
def loss_inside() -> tuple[Trace, list[int]]:
    x, y = batch(8)
    # recorded as from a loop that hands its batch over (plans may swap inputs); the loops below that
    # hold it anyway are the misuse the runtime must survive
    trace = record_trace(LossInside(), (x, y), lambda out: out[1], sgd, device="cpu", **RELEASED)
    inputs = [t for t in saved_activations(trace) if trace.tensor_alloc_op[t] < 0]
    assert len(inputs) == 2  # the batch (the first Linear saves it) and the labels (nll_loss saves them)
    return trace, inputs


def run_loop(plan, trace: Trace, reads: bool, hand_over: bool = False, steps: int = 3):  # noqa: ANN001, ANN201
    model = LossInside()
    opt = sgd(model.parameters())
    rt = PlannedExecution(model, plan, trace) if plan is not None else None
    x, y = batch(8)
    x0, y0 = x.clone(), y.clone()
    seen = []
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        with rt if rt is not None else torch.enable_grad():
            if hand_over:
                out, loss = model(x.clone(), y.clone())
            else:
                out, loss = model(x, y)
            if reads:  # the training loop reads its batch and labels between forward and backward
                acc = (out.argmax(-1) == y).float().mean().item()
                seen.append((acc, float(x.sum()), int(y.sum()), y.tolist()))
                print(f"acc {acc:.3f} inputs {x.sum():.4f}")
            loss.backward()
        opt.step()
        assert torch.equal(x, x0) and torch.equal(y, y0)
    return model, opt, rt, seen


def assert_same(a, b) -> None:  # noqa: ANN001
    (ma, oa), (mb, ob) = a, b
    for (ka, va), (kb, vb) in zip(ma.state_dict().items(), mb.state_dict().items()):
        assert ka == kb and torch.equal(va, vb), ka
    sa, sb = oa.state_dict()["state"], ob.state_dict()["state"]
    assert sa.keys() == sb.keys()
    for k in sa:
        assert all(torch.equal(sa[k][n], sb[k][n]) for n in sa[k])


def test_inputs_and_labels_read_between_forward_and_backward(loss_inside, capsys) -> None:  # noqa: ANN001
    trace, inputs = loss_inside
    plan = manual_plan(trace, swap=inputs, planner="swap-inputs")
    assert plan.n_swap == 2 and all(a.kind == ActionKind.SWAP for a in plan.actions)
    ref_model, ref_opt, _, ref_seen = run_loop(None, trace, reads=True)
    with pytest.warns(HeldInputWarning) as caught:
        model, opt, rt, seen = run_loop(plan, trace, reads=True)
    # The labels stay the loop's (warned once, not once per iteration); the batch too, but the schedule
    # prefetches it back within the forward pass already (the limit is the unplanned peak), before the
    # runtime would have given up on it: nothing to report, nothing emptied.
    held = [w for w in caught if issubclass(w.category, HeldInputWarning)]
    assert len(held) == len(rt.held_inputs) >= 1
    for w in held:
        msg = str(w.message)
        assert "\n" not in msg and "input" in msg and " B during the iteration" in msg
    assert seen == ref_seen
    assert_same((model, opt), (ref_model, ref_opt))
    assert rt.stats.emptied_inputs == 0 and rt.stats.held_inputs_skipped == len(rt.held_inputs)  # no copy
    assert rt.held_inputs <= set(inputs)
    capsys.readouterr()


def test_a_held_input_is_never_emptied_even_when_backward_is_late(loss_inside) -> None:  # noqa: ANN001
    trace, inputs = loss_inside
    plan = manual_plan(trace, swap=inputs)
    model = LossInside()
    x, y = batch(8)
    rt = PlannedExecution(model, plan, trace, prefetch=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", HeldInputWarning)
        with rt:
            out, loss = model(x, y)
            assert x.untyped_storage().nbytes() == x.numel() * 4 and y.untyped_storage().nbytes() == y.numel() * 8
            labels = y.clone()
            hits = (out.argmax(-1) == y).sum()
            y.add_(0)  # an in-place op that changes nothing still bumps the version, as in autograd
            with pytest.raises(RuntimeError, match="modified by an inplace operation"):
                loss.backward()
    assert torch.equal(y, labels) and int(hits) >= 0


def test_a_handed_over_batch_is_emptied_and_training_is_unchanged(loss_inside) -> None:  # noqa: ANN001
    """Nothing outside the iteration holds the batch: the runtime frees it after its op, as planned."""
    trace, inputs = loss_inside
    plan = manual_plan(trace, swap=inputs)
    ref = run_loop(None, trace, reads=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error", HeldInputWarning)
        got = run_loop(plan, trace, reads=False, hand_over=True)
    assert_same(got[:2], ref[:2])
    rt = got[2]
    assert rt.stats.emptied_inputs >= 1 and rt.stats.held_inputs == 0 and not rt.held_inputs


def test_a_handed_over_batch_is_empty_between_forward_and_backward_and_whole_after(loss_inside) -> None:  # noqa: ANN001
    trace, inputs = loss_inside
    plan = manual_plan(trace, swap=inputs)
    model = LossInside()
    x, y = batch(8)
    holder = [x.clone()]
    ref = StorageWeakRef(holder[0].untyped_storage())
    rt = PlannedExecution(model, plan, trace, prefetch=False)

    during: list[torch.UntypedStorage] = []
    with rt:
        out, loss = model(holder.pop(), y)  # the batch is the model's alone
        # in backward, before the batch is read: a reference taken once it is empty keeps it for the test
        out.register_hook(lambda grad: during.append(torch.UntypedStorage._new_with_weak_ptr(ref.cdata)))
        with pytest.warns(HeldInputWarning, match="input"):  # the labels: held by the loop
            loss.backward()
    storage, = during
    assert rt.stats.emptied_inputs == 1 and rt.stats.on_demand_fetches >= 1
    assert storage.nbytes() == x.numel() * 4  # refilled by backward's read
    assert torch.equal(torch.empty(0).set_(storage, 0, x.shape, x.stride()), x)


def test_a_graph_dropped_without_backward_is_freed(recorded: Trace) -> None:
    """The hooks stay on for the whole forward pass: what they hand autograd must not hold the graph
    (an output its own node saves would, through its grad_fn: a cycle no collector sees)."""
    model = mlp()
    outputs: list[StorageWeakRef] = []
    hooks = [m.register_forward_hook(lambda m, i, o: outputs.append(StorageWeakRef(o.untyped_storage())))
             for m in model]
    rt = PlannedExecution(model, manual_plan(recorded, swap=[saved_activations(recorded)[0]]), recorded)
    x, y = batch(2)
    with rt:
        loss = F.cross_entropy(model(x), y)
    assert any(not r.expired() for r in outputs)  # saved for backward: alive with the graph
    del loss  # no backward: autograd frees the graph and every activation with it
    assert all(r.expired() for r in outputs)
    for h in hooks:
        h.remove()
