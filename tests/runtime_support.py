"""What the runtime tests share: small models, a training loop, the whole-state comparison, plans.

The models beside the zoo's tiny ones exercise what breaks a swap/recompute runtime:
batch norm (running statistics written by an op whose schema does not say so) with
in-place ReLU, views and a residual add, dropout (random numbers re-drawn on recompute),
and a buffer read in forward and updated in place later in the same forward pass.
"""

from __future__ import annotations

import importlib.util
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from dqn_swap.models import build_workload
from dqn_swap.models.names import HF_NAMES
from dqn_swap.plan import Plan
from dqn_swap.recorder import record_trace
from dqn_swap.planners import manual_plan, recomputable_activations, saved_activations
from dqn_swap.runtime import PlannedExecution
from dqn_swap.runtime.recompute import leaves
from dqn_swap.trace import Trace

STEPS = 3


class BNNet(nn.Module):
    """Conv-BN-ReLU(inplace) twice, a pooled linear head: batch norm's running statistics."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(inplace=True),
                                  nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(inplace=True))
        self.head = nn.Linear(8, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x).mean(dim=(2, 3)))


class ViewResidualNet(nn.Module):
    """Views (reshape, transpose, narrow, split) and residual adds."""

    def __init__(self, width: int = 32, depth: int = 3) -> None:
        super().__init__()
        self.up = nn.ModuleList(nn.Linear(width, 2 * width) for _ in range(depth))
        self.mix = nn.ModuleList(nn.Linear(width, width) for _ in range(depth))
        self.head = nn.Linear(width, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, w = x.shape
        for up, mix in zip(self.up, self.mix):
            left, right = torch.tanh(up(x)).split(w, dim=1)  # views of one storage
            t = left.reshape(n, 4, w // 4).transpose(1, 2).reshape(n, w)
            x = mix(t) + right.narrow(1, 0, w) + x  # residual adds of views
        return self.head(torch.sigmoid(x))


class DropoutNet(nn.Module):
    """Dropout as a module, and as the one random op CUDA runs (``native_dropout``; the CPU's
    ``F.dropout`` decomposes into a mask op and a product): a re-run must draw the forward pass's mask."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2, self.fc3 = nn.Linear(12, 24), nn.Linear(24, 24), nn.Linear(24, 3)
        self.drop = nn.Dropout(0.3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.drop(F.gelu(self.fc1(x)))
        h = torch.relu(self.fc2(h))
        if self.training:
            h, _ = torch.ops.aten.native_dropout(h, 0.2, True)
        return self.fc3(h)


class ScaledNet(nn.Module):
    """A buffer read by ``x + shift`` and updated in place later in the same forward pass."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(10, 20), nn.Linear(20, 2)
        self.register_buffer("shift", torch.zeros(20))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.fc1(x)) + self.shift  # fc2 saves h: a re-run of the add reads `shift`
        out = self.fc2(h)
        if self.training:
            with torch.no_grad():
                self.shift.add_(0.01)  # the next read of `shift` sees another value
        return out


@dataclass(frozen=True)
class Workload:
    model: nn.Module
    inputs: tuple
    loss_fn: Callable[[Any], torch.Tensor]
    make_optimizer: Callable[[Any], torch.optim.Optimizer]


def _custom(model_cls: type[nn.Module], shape: tuple[int, ...], classes: int, adam: bool = False
            ) -> Callable[[], Workload]:
    def build() -> Workload:
        torch.manual_seed(0)
        model = model_cls()
        gen = torch.Generator().manual_seed(1)
        x = torch.randn(*shape, generator=gen)
        y = torch.randint(0, classes, (shape[0],), generator=gen)
        opt = ((lambda p: torch.optim.Adam(p, lr=1e-2, foreach=False)) if adam
               else (lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, foreach=False)))
        return Workload(model, (x,), lambda out: F.cross_entropy(out, y), opt)

    return build


def _zoo(name: str, batch: int) -> Callable[[], Workload]:
    def build() -> Workload:
        w = build_workload(name, batch, "cpu", seed=0)
        assert w.loss_fn is not None and w.make_optimizer is not None
        return Workload(w.model, w.example_inputs, w.loss_fn, w.make_optimizer)

    return build


MODELS: dict[str, Callable[[], Workload]] = {
    "mlp_tiny": _zoo("mlp_tiny", 4),
    "resnet_tiny": _zoo("resnet_tiny", 2),
    "gpt_tiny": _zoo("gpt_tiny", 2),
    "lstm_short": _zoo("lstm_short", 1),
    "bn_inplace": _custom(BNNet, (4, 3, 8, 8), 5),
    "views_residual": _custom(ViewResidualNet, (64, 32), 4),
    "dropout": _custom(DropoutNet, (64, 12), 3, adam=True),
    "scaled_buffer": _custom(ScaledNet, (64, 10), 2),
}
if importlib.util.find_spec("transformers") is not None:  # the ``hf`` extra: its models are cases too,
    # whichever test file is collected first (a file run alone has them as the whole suite does)
    MODELS.update({name: _zoo(name, 2) for name in HF_NAMES})


@lru_cache(maxsize=None)
def trace_of(name: str) -> Trace:
    """The trace of ``name`` recorded on the CPU on a separate instance (recording trains it)."""
    w = MODELS[name]()
    return record_trace(w.model, w.inputs, w.loss_fn, w.make_optimizer, device="cpu", meta={"model": name})


#: ``record_trace(..., inputs="released")`` where the recorder has it: a trace whose plans may swap
#: the inputs (the loop says it hands its batch over); older recorders allowed that by default.
RELEASED = {"inputs": "released"} if "inputs" in inspect.signature(record_trace).parameters else {}


@lru_cache(maxsize=None)
def released_trace_of(name: str) -> Trace:
    """:func:`trace_of` recorded as from a loop that hands its batch over: plans may swap inputs."""
    w = MODELS[name]()
    return record_trace(w.model, w.inputs, w.loss_fn, w.make_optimizer, device="cpu", meta={"model": name},
                        **RELEASED)


@dataclass
class Trained:
    """What a few steps of training leave: everything a run must reproduce."""

    losses: list[torch.Tensor]
    state: dict[str, torch.Tensor]
    optimizer: dict[str, Any]
    eval_output: list[torch.Tensor]
    runtime: PlannedExecution | None


def train(name: str, plan: Plan | None = None, steps: int = STEPS, hand_over: bool = False,
          trace: Trace | None = None, **runtime_kwargs: Any) -> Trained:
    """``steps`` steps of ``name`` from the same initial state, planned (``plan``) or not.

    ``hand_over``: every step passes the model a fresh copy of the batch that nothing else holds
    (the loader's way), so the runtime may empty a swapped input during the iteration; otherwise
    the loop holds its batch and a swapped input stays (``HeldInputWarning``)."""
    w = MODELS[name]()
    opt = w.make_optimizer(w.model.parameters())
    trace = trace if trace is not None else trace_of(name)
    rt = PlannedExecution(w.model, plan, trace, **runtime_kwargs) if plan is not None else None
    torch.manual_seed(1234)  # dropout draws the same masks in every run
    losses = []
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        if rt is None:
            loss = w.loss_fn(w.model(*w.inputs))
            loss.backward()
        else:
            with rt:
                if hand_over:
                    loss = w.loss_fn(w.model(*[x.clone() for x in w.inputs]))
                else:
                    loss = w.loss_fn(w.model(*w.inputs))
                loss.backward()
        opt.step()
        losses.append(loss.detach().clone())
    w.model.eval()
    with torch.no_grad():
        out = w.model(*w.inputs)
    state = {k: v.detach().clone() for k, v in w.model.state_dict().items()}
    outputs = [x.detach().clone() for x in leaves(out) if isinstance(x, torch.Tensor)]  # a tensor or a ModelOutput
    return Trained(losses, state, opt.state_dict(), outputs, rt)


@lru_cache(maxsize=None)
def reference(name: str) -> Trained:
    return train(name)


def _flat(x: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(x, dict):
        out: dict[str, Any] = {}
        for k, v in x.items():
            out.update(_flat(v, f"{prefix}{k}/"))
        return out
    if isinstance(x, (list, tuple)):
        out = {}
        for i, v in enumerate(x):
            out.update(_flat(v, f"{prefix}{i}/"))
        return out
    return {prefix.rstrip("/"): x}


def assert_same_training(name: str, got: Trained) -> None:
    """Losses, the whole ``state_dict`` (parameters and buffers), the optimizer's state and the
    eval-mode outputs bit-identical to unplanned training."""
    ref = reference(name)
    for i, (a, b) in enumerate(zip(ref.losses, got.losses)):
        assert torch.equal(a, b), f"{name}: loss {i} is {b.item()!r}, unplanned {a.item()!r}"
    assert ref.state.keys() == got.state.keys()
    for key in ref.state:
        a, b = ref.state[key], got.state[key]
        assert torch.equal(a, b), f"{name}: state_dict[{key!r}] differs by {(a.double() - b.double()).abs().max()}"
    fa, fb = _flat(ref.optimizer), _flat(got.optimizer)
    assert fa.keys() == fb.keys(), f"{name}: optimizer state has other entries"
    for key in fa:
        a, b = fa[key], fb[key]
        same = torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b
        assert same, f"{name}: optimizer state {key!r} differs"
    assert len(ref.eval_output) == len(got.eval_output)
    assert all(torch.equal(a, b) for a, b in zip(ref.eval_output, got.eval_output)), f"{name}: eval-mode outputs differ"


def hand_plan(name: str, kind: str) -> Plan:
    """Plans made by hand: every activation swapped, every recomputable one removed, or both mixed."""
    trace = trace_of(name)
    acts = saved_activations(trace)
    rec = recomputable_activations(trace)
    if kind == "swap":
        return manual_plan(trace, swap=acts, planner="swap-all")
    if kind == "recompute":
        return manual_plan(trace, recompute=rec, planner="recompute-all")
    removed = set(rec[1::2]) or set(rec[:1])  # every other one; the only one where there is one
    return manual_plan(trace, swap=[t for t in acts if t not in removed], recompute=sorted(removed), planner="mixed")


def assert_same_state(a: nn.Module, oa: torch.optim.Optimizer, b: nn.Module, ob: torch.optim.Optimizer) -> None:
    """The whole training state equal bit for bit: parameters, buffers and the optimizer's state."""
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for k in sa:
        assert torch.equal(sa[k], sb[k]), k
    da, db = oa.state_dict(), ob.state_dict()
    assert da["param_groups"] == db["param_groups"]
    assert da["state"].keys() == db["state"].keys()
    for k, st in da["state"].items():
        for name, v in st.items():
            w = db["state"][k][name]
            assert torch.equal(v, w) if isinstance(v, torch.Tensor) else v == w, (k, name)


def mlp_loop(autoplan_kwargs: dict[str, Any] | None, steps: int = 3) -> tuple[nn.Module, torch.optim.Optimizer, Any]:
    """A small GELU MLP trained ``steps`` steps with Adam, plainly (``autoplan_kwargs`` None) or with
    ``autoplan(model, optimizer=..., verbose=False, **autoplan_kwargs)``; returns the model, its
    optimizer and the ``AutoPlan`` (its hooks removed; None when plain)."""
    from dqn_swap.integrations import autoplan

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 64), nn.GELU(), nn.Linear(64, 4))
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    planned = autoplan(model, optimizer=opt, verbose=False, **autoplan_kwargs) if autoplan_kwargs is not None else None
    torch.manual_seed(1)
    for _ in range(steps):
        x = torch.randn(64, 32)
        if planned is not None:
            with planned.step():
                model(x).square().mean().backward()
        else:
            model(x).square().mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    if planned is not None:
        planned.remove()
    return model, opt, planned

