"""The recorder against a trace written down by hand, and its invariants on real models."""

import numpy as np
import pytest
import torch

from dqn_swap.recorder import RecordingError, record_trace
from dqn_swap.trace import EventKind, Phase, Role, Trace

from .conftest import TinyMLP, record_mlp

M, W, R, F = "MALLOC", "WRITE", "READ", "FREE"


def labelled_events(trace, labels):
    return [(EventKind(k).name, trace.op_names[trace.op_name[o]], labels.get(int(t), int(t)))
            for k, o, t in zip(trace.event_kind, trace.event_op, trace.event_tensor)]


def test_mlp_forward_events_by_hand(mlp_trace):
    t = mlp_trace
    # Tensors declared before the iteration: fc1.weight, fc1.bias, fc2.weight, fc2.bias,
    # four momentum buffers, then the input; ids in that order.
    assert t.tensor_nbytes[:9].tolist() == [512, 64, 256, 16, 512, 64, 256, 16, 64]
    assert t.tensor_role[:9].tolist() == [Role.PARAMETER] * 4 + [Role.OPTIMIZER_STATE] * 4 + [Role.INPUT]
    assert (t.tensor_alloc_op[:9] == -1).all()
    labels = {0: "w1", 1: "b1", 2: "w2", 3: "b2", 8: "x", 9: "h", 10: "a", 11: "y", 12: "y2", 13: "loss"}
    fwd = [e for e, op in zip(labelled_events(t, labels), t.event_op) if t.op_phase[op] == Phase.FORWARD]
    assert fwd == [
        (M, "aten.addmm", "h"), (R, "aten.addmm", "b1"), (R, "aten.addmm", "x"), (R, "aten.addmm", "w1"),
        (W, "aten.addmm", "h"),
        (M, "aten.relu", "a"), (R, "aten.relu", "h"), (W, "aten.relu", "a"),
        (F, "aten.relu", "h"),  # relu saves its output, not its input
        (M, "aten.addmm", "y"), (R, "aten.addmm", "b2"), (R, "aten.addmm", "a"), (R, "aten.addmm", "w2"),
        (W, "aten.addmm", "y"),
        (M, "aten.pow", "y2"), (R, "aten.pow", "y"), (W, "aten.pow", "y2"),
        (M, "aten.mean", "loss"), (R, "aten.mean", "y2"), (W, "aten.mean", "loss"),
        (F, "aten.mean", "y2"),  # mean keeps only the input's shape
    ]
    sizes = {"h": 128, "a": 128, "y": 32, "y2": 32, "loss": 4}
    for tid, name in labels.items():
        if name in sizes:
            assert t.tensor_nbytes[tid] == sizes[name], name
    # Saved for backward, in packing order: x (fc1 weight grad), a (relu), a and w2 (fc2), y (pow).
    assert t.saved.tolist() == [8, 10, 10, 2, 11]
    assert t.tensor_role[10] == Role.SAVED and t.tensor_role[11] == Role.SAVED
    assert t.tensor_saved_index[[8, 10, 2, 11]].tolist() == [0, 1, 3, 4]
    assert t.op_module[t.event_op[0]] == t.module_names.index("fc1")


def test_unpacks_and_packs_inside_an_op(mlp_trace):
    """An autograd node unpacks all its saved tensors right before its first op: fc2's AddmmBackward0
    unpacks the ReLU output ``a`` with fc2's weight before its first mm (#10, the input's gradient)
    though only its second (#11, the weight's gradient) reads ``a``, so ``a`` must be back from #10
    (its return op) and the runtime learns there that backward has reached #10, not #11.  ReLU saves
    its output inside its op, after the kernel and before ``h`` is freed: the pack is op #1's, not #2's."""
    t = mlp_trace
    names = [t.op_names[i] for i in t.op_name]
    assert names[10:12] == ["aten.mm", "aten.mm"] and t.op_phase[10] == Phase.BACKWARD
    # packs: x (fc1), a (relu's output), a and w2 (fc2), y (pow)
    assert t.saved_unpack_op.tolist() == [14, 13, 10, 10, 7]
    a = 10
    reads = t.event_op[(t.event_tensor == a) & (t.event_kind == EventKind.READ)]
    assert reads[reads > 2].min() == 11 and t.action_window[1][a] == 10
    assert t.saved_in_op.tolist() == [0, 1, 0, 0, 0] and t.tensor_free_op[9] == 1  # h, freed by relu
    assert t.pack_progress_op.tolist() == [0, 1, 2, 2, 3]
    assert t.progress_ops.tolist() == [0, 1, 2, 3, 7, 10, 13, 14]


def test_mlp_gradients_optimizer_and_memory(mlp_trace):
    t = mlp_trace
    grads = np.flatnonzero(t.tensor_role == Role.GRADIENT)
    assert sorted(t.tensor_nbytes[grads].tolist()) == [16, 64, 256, 512]
    assert (t.tensor_free_op[grads] == -1).all()  # gradients outlive the iteration
    opt_ops = np.flatnonzero(t.op_phase == Phase.OPTIMIZER)
    # SGD with momentum, foreach=False: mul_, add_ (buffer), add_ (parameter) per parameter.
    assert [t.op_names[t.op_name[i]] for i in opt_ops] == ["aten.mul_", "aten.add_", "aten.add_"] * 4
    params_written = {int(x) for x in t.event_tensor[np.isin(t.event_op, opt_ops) & (t.event_kind == EventKind.WRITE)]}
    assert {0, 1, 2, 3} <= params_written
    assert t.initial_bytes == 848 * 2 + 64
    # Peak: persistent state, grads of fc2, and the largest backward temporaries.
    assert t.peak_bytes == int(t.memory_after_event.max())
    assert t.memory_after_event.min() >= t.initial_bytes - 1
    # After the iteration: parameters, momentum, input and the four gradients remain.
    assert t.memory_after_event[-1] == 848 * 3 + 64


def test_meta_and_cpu_record_the_same_structure():
    cpu, meta = record_mlp("cpu"), record_mlp("meta")
    # Everything but the kernels' scratch (measured on the CPU, estimated on meta) is the same.
    def structure(t: Trace) -> str:
        return t.replace(op_scratch=np.zeros_like(t.op_scratch)).fingerprint

    assert structure(cpu) == structure(meta)
    assert cpu.meta["scratch"] == "measured" and meta.meta["scratch"] == "estimated"
    assert cpu.meta["device"] == "cpu" and meta.meta["device"] == "meta"


def test_every_allocation_is_freed_at_most_once(tiny_resnet_trace):
    t = tiny_resnet_trace
    mallocs = t.event_tensor[t.event_kind == EventKind.MALLOC]
    frees = t.event_tensor[t.event_kind == EventKind.FREE]
    assert len(np.unique(mallocs)) == len(mallocs)
    assert len(np.unique(frees)) == len(frees)
    # Only storages allocated in the iteration (or inputs of it) are freed, after their malloc.
    alloc = t.tensor_alloc_op[frees]
    assert (t.tensor_free_op[frees] >= alloc).all()
    assert (t.memory_after_event >= 0).all()
    # Saved activations are read in backward.
    saved = np.flatnonzero(t.tensor_role == Role.SAVED)
    bwd_reads = set(t.event_tensor[(t.event_kind == EventKind.READ) & (t.op_phase[t.event_op] == Phase.BACKWARD)].tolist())
    assert set(saved.tolist()) <= bwd_reads
    assert t.summary()["ops_per_phase"]["backward"] > 0


def test_views_share_storage_and_inplace_writes():
    class ViewModel(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = torch.nn.Linear(4, 4)

        def forward(self, x):
            y = self.fc(x).view(2, 2, 2)  # a view: no new storage
            return torch.relu_(y.clone()).sum()  # clone allocates; relu_ writes in place

    t = record_trace(ViewModel(), torch.randn(2, 4), lambda y: y, None, device="meta")
    names = [t.op_names[i] for i in t.op_name]
    assert "aten.view" not in names
    relu = names.index("aten.relu_")
    ev = t.event_op == relu
    assert EventKind.MALLOC not in t.event_kind[ev]
    assert EventKind.WRITE in t.event_kind[ev]


def test_a_model_that_raises_names_the_op():
    class Broken(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = torch.nn.Linear(4, 3)

        def forward(self, x):
            return self.fc(x) @ torch.ones(4, 4, device=x.device)  # shape mismatch

    with pytest.raises(RecordingError, match="failed"):
        record_trace(Broken(), torch.randn(2, 4), lambda y: y.sum(), None, device="meta")


def test_recording_on_another_device_leaves_the_model_alone():
    torch.manual_seed(0)
    model = TinyMLP()
    before = [p.detach().clone() for p in model.parameters()]
    record_trace(model, torch.randn(2, 8), lambda y: y.sum(), lambda p: torch.optim.SGD(p, lr=1.0),
                 device="meta")
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    with pytest.raises(RecordingError, match="factory"):
        record_trace(model, torch.randn(2, 8), lambda y: y.sum(), torch.optim.SGD(model.parameters(), lr=1.0),
                     device="meta")


def test_forward_only_iteration():
    from dqn_swap.models import build_workload

    w = build_workload("kmeans", 1, "meta")
    t = record_trace(w.model, w.example_inputs, w.loss_fn, w.make_optimizer, device="meta")
    assert set(np.unique(t.op_phase).tolist()) == {Phase.FORWARD}
    assert t.n_ops > 3


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("name,batch", [("resnet18", 32), ("gpt_tiny", 8)])
def test_cuda_peak_matches_max_memory_allocated(name, batch):
    from dqn_swap.models import build_workload

    w = build_workload(name, batch, "cuda")
    t = record_trace(w.model, w.example_inputs, w.loss_fn, w.make_optimizer, device="cuda", iterations=3)
    # The allocator's peak counts all the process holds on the device (cuBLAS's workspaces, tensors an
    # earlier test left there); the trace counts its own state and what the iteration makes.
    outside = t.meta["outside_bytes"]
    measured = t.meta["max_memory_allocated"] - outside
    assert abs(t.peak_bytes - measured) <= 0.05 * measured, (t.peak_bytes, measured, outside)
    assert t.meta["timing"] == "cuda-events" and (t.op_duration > 0).all()


# --------------------------------------------------------------------------- scratch, anchors, unannotated writes
def _record(name: str, batch: int, device: str, **kwargs):
    from dqn_swap.models import build_workload

    w = build_workload(name, batch, device, seed=0)
    return record_trace(w.model, w.example_inputs, w.loss_fn, w.make_optimizer, device=device, **kwargs)


def test_cpu_measures_the_kernels_scratch_and_meta_estimates_it():
    """Convolutions reorder their operands on the CPU: their scratch is measured there, estimated
    on meta for CPU kernels (dqn_swap.ops.estimate_scratch), and the estimate stays near the measurement."""
    cpu, meta = _record("resnet_tiny", 8, "cpu"), _record("resnet_tiny", 8, "meta", kernels="cpu")
    assert cpu.meta["scratch"] == "measured" and meta.meta["scratch"] == "estimated"
    assert meta.meta["scratch_kernels"] == "cpu"
    names = [cpu.op_names[i] for i in cpu.op_name]
    conv_bwd = [i for i, n in enumerate(names) if n == "aten.convolution_backward"]
    assert all(cpu.op_scratch[i] > 0 for i in conv_bwd)
    assert cpu.n_ops == meta.n_ops
    for i in conv_bwd + [i for i, n in enumerate(names) if n == "aten.convolution"]:
        assert 0.4 <= meta.op_scratch[i] / cpu.op_scratch[i] <= 2.5, (cpu.op_label(i), meta.op_scratch[i],
                                                                      cpu.op_scratch[i])
    assert abs(meta.peak_bytes / cpu.peak_bytes - 1) < 0.05


def test_pack_and_module_call_anchors():
    t = _record("resnet_tiny", 2, "cpu")
    assert len(t.saved_op) == len(t.saved) and np.all(np.diff(t.saved_op) >= 0)
    forward_ops = int((t.op_phase == Phase.FORWARD).sum())
    assert t.saved_op.max() <= forward_ops + 1
    assert t.module_call_op[0] == 0 and np.all(np.diff(t.module_call_op) >= 0)
    assert t.module_call_op.max() < forward_ops


def test_an_unannotated_write_to_a_buffer_is_detected_and_protected():
    """A custom op whose schema does not say it writes its second argument (as batch norm's running
    statistics are written): the recorder notices on the CPU, and a re-run writes a copy."""
    from dqn_swap.planners import manual_plan, recomputable_activations
    from dqn_swap.runtime import PlannedExecution

    lib = torch.library.Library("dqnswaptest", "DEF")  # noqa: TOR901
    lib.define("scale_and_count(Tensor x, Tensor counter) -> Tensor")

    def impl(x: torch.Tensor, counter: torch.Tensor) -> torch.Tensor:
        counter.add_(1)  # not in the schema
        return x * 2

    lib.impl("scale_and_count", impl, "CPU")
    lib.impl("scale_and_count", lambda x, counter: x * 2, "Meta")
    torch.library.register_autograd("dqnswaptest::scale_and_count",
                                    lambda ctx, g: (g * 2, None), setup_context=lambda ctx, inputs, output: None)

    class Counting(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = torch.nn.Linear(6, 6), torch.nn.Linear(6, 2)
            self.register_buffer("counter", torch.zeros(()))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.b(torch.ops.dqnswaptest.scale_and_count(torch.tanh(self.a(x)), self.counter))

    def run(plan=None, trace=None):  # noqa: ANN001, ANN202
        torch.manual_seed(0)
        model = Counting()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        rt = PlannedExecution(model, plan, trace) if plan is not None else None
        for _ in range(2):
            opt.zero_grad()
            with rt if rt is not None else torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t):
                model(torch.ones(4, 6)).sum().backward()
            opt.step()
        return model.state_dict()

    torch.manual_seed(0)
    trace = record_trace(Counting(), torch.ones(4, 6), lambda y: y.sum(), lambda p: torch.optim.SGD(p, lr=0.1))
    assert trace.meta["unannotated_writes"] == {"dqnswaptest.scale_and_count": ["counter"]}
    made = [t for t in recomputable_activations(trace)
            if trace.op_names[trace.op_name[trace.tensor_alloc_op[t]]] == "dqnswaptest.scale_and_count"]
    assert made
    ref, got = run(), run(manual_plan(trace, recompute=made), trace)
    assert torch.equal(ref["counter"], got["counter"]) and float(got["counter"]) == 2.0
    for key in ref:
        assert torch.equal(ref[key], got[key])


def test_meta_traces_model_cuda_kernels_by_default():
    """cuDNN falls back to workspace-free algorithms when its workspace cannot be allocated: a meta
    trace (the stand-in for a GPU) gives kernels no scratch unless told to model the CPU's."""
    cuda, cpu = _record("resnet_tiny", 8, "meta"), _record("resnet_tiny", 8, "meta", kernels="cpu")
    assert cuda.meta["scratch_kernels"] == "cuda" and not cuda.op_scratch.any()
    assert cpu.op_scratch.any() and cuda.peak_bytes < cpu.peak_bytes
    assert cuda.replace(op_scratch=cpu.op_scratch).fingerprint == cpu.fingerprint  # nothing else differs
    with pytest.raises(RecordingError, match="unknown kernels 'gpu'"):
        _record("resnet_tiny", 2, "meta", kernels="gpu")


class _Branches(torch.nn.Module):
    """``y`` feeds ``n`` branches: autograd sums their gradients of ``y`` in backward, each sum
    into the previous one (two branches: y, both gradients of y and their sum alive at once)."""

    def __init__(self, n: int = 2) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(64, 64)
        self.branches = ((lambda y: y * 2), (lambda y: y * 3), torch.sigmoid, torch.tanh)[:n]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.fc(x).relu()
        return sum(branch(y).sum() for branch in self.branches)


def test_chained_accumulations_write_one_buffer():
    t = record_trace(_Branches(4), torch.randn(32, 64), lambda out: out, device="meta")
    names = [t.op_names[i] for i in t.op_name]
    adds = [i for i, n in enumerate(names) if n == "aten.add" and t.op_phase[i] == Phase.BACKWARD]
    assert len(adds) == 3
    written = {int(x) for k, o, x in zip(t.event_kind, t.event_op, t.event_tensor) if o in adds and k == EventKind.WRITE}
    assert len(written) == 1  # one running sum, written three times
    (acc,) = written
    frees = [int(o) for k, o, x in zip(t.event_kind, t.event_op, t.event_tensor) if x == acc and k == EventKind.FREE]
    assert frees == [int(t.tensor_free_op[acc])] and frees[0] > adds[-1]
    assert not (t.event_kind[np.isin(t.event_op, adds)] == EventKind.MALLOC).any()


@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_gradient_accumulation_is_recorded_in_place(device):
    """Outside a dispatch mode the engine sums gradients with ``old.add_(new)``: the trace's backward
    ``aten.add`` writes its first operand and allocates nothing."""
    torch.manual_seed(0)
    t = record_trace(_Branches(2), torch.randn(256, 64), lambda out: out, device=device)
    names = [t.op_names[i] for i in t.op_name]
    adds = [i for i, n in enumerate(names) if n == "aten.add" and t.op_phase[i] == Phase.BACKWARD]
    assert len(adds) == 1
    (op,) = adds
    kinds = {(EventKind(k).name, int(x)) for k, o, x in zip(t.event_kind, t.event_op, t.event_tensor) if o == op}
    assert not any(k == "MALLOC" for k, _ in kinds)
    written = [x for k, x in kinds if k == "WRITE"]
    assert len(written) == 1 and ("READ", written[0]) in kinds  # reads and writes the running sum
    assert t.tensor_free_op[written[0]] > op  # the sum lives on to the next op


def test_in_place_accumulation_matches_the_allocator():
    """The trace's unplanned peak is what the CPU allocator shows for the same iteration run plainly
    (where the engine does add in place), within the kernels' scratch noise."""
    from dqn_swap.meter import AllocatorTimeline

    torch.manual_seed(0)
    model, x = _Branches(2), torch.randn(4096, 64)
    trace = record_trace(model, x, lambda out: out, device="cpu")
    model.zero_grad(set_to_none=True)
    with AllocatorTimeline() as timeline:
        model(x).backward()
    persistent = sum(p.numel() * 4 for p in model.parameters()) + x.numel() * 4
    assert abs((timeline.peak + persistent) / trace.peak_bytes - 1) < 0.02
    # Out of place the sum would be a fourth activation-sized tensor at the peak (5 with the input).
    activation = x.numel() * 4
    assert trace.peak_bytes < persistent + 3.5 * activation


@pytest.mark.subprocess
def test_a_trace_is_the_same_in_every_process():
    """Module attribution must not depend on string hashing (PYTHONHASHSEED): the same model
    recorded in two processes has one fingerprint, so a plan made from either applies to both."""
    import os
    import subprocess
    import sys

    code = ("from dqn_swap.models import build_workload; from dqn_swap.recorder import record_trace; "
            "w = build_workload('resnet18', 2); "
            "print(record_trace(w.model, w.example_inputs, w.loss_fn, w.make_optimizer, device='meta').fingerprint)")
    runs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                             env={**os.environ, "PYTHONHASHSEED": seed, "OMP_NUM_THREADS": "1"})
            for seed in ("1", "2", "3")]  # side by side: each is mostly one thread importing torch
    prints = {p.communicate(timeout=300)[0].strip() for p in runs}
    assert all(p.returncode == 0 for p in runs) and len(prints) == 1 and "" not in prints


def test_the_blocks_outside_a_recording_are_the_snapshots_unknown_allocated_ones() -> None:
    """What a CUDA recording says the device held beside the iteration, read from the allocator's
    snapshot: allocated blocks at none of the state's addresses, largest first (a stand-in snapshot
    in torch.cuda.memory_snapshot's layout)."""
    from dqn_swap.recorder.record import _outside_blocks, _state_pointers

    model = torch.nn.Linear(4, 4)
    opt = torch.optim.Adam(model.parameters())
    model(torch.ones(2, 4)).sum().backward()
    opt.step()
    x = torch.ones(3)
    known = _state_pointers(model, opt, (x, "not a tensor"))
    ptr = lambda t: t.untyped_storage().data_ptr()  # noqa: E731
    assert {ptr(model.weight), ptr(model.bias.grad), ptr(opt.state[model.weight]["exp_avg"]), ptr(x)} <= known
    segments = [{"blocks": [{"address": ptr(model.weight), "size": 512, "state": "active_allocated"},
                            {"address": 1, "size": 4096, "state": "active_allocated"},
                            {"address": 2, "size": 9999, "state": "inactive"}]},
                {"blocks": [{"address": 3, "size": 8192, "state": "active_allocated"}]}]
    assert _outside_blocks(segments, known) == [8192, 4096]
    assert _outside_blocks(segments, known, most=1) == [8192]
