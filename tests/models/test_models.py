"""Tests for the model zoo in ``dqn_swap.models``."""

from __future__ import annotations

import pytest
import torch

from dqn_swap.models import MODEL_NAMES, Workload, build_workload
from dqn_swap.models.resnet import CifarResNet

EXPECTED_NAMES = {
    "resnet18", "resnet34", "resnet50", "resnet101", "resnet152", "resnet1001", "resnet1517",
    "vgg16", "vgg19", "unet", "lstm", "densenet121", "resnet_sd", "kmeans", "gpt", "gpt_tiny",
    "mlp_tiny", "resnet_tiny", "lstm_short",
}


def output_shape(name: str, batch: int) -> tuple[int, ...]:
    if name == "unet":
        return (batch, 2, 256, 256)
    if name == "lstm":
        return (batch, 100, 65)
    if name == "lstm_short":
        return (batch, 20, 65)
    if name == "gpt":
        return (batch, 512, 50257)
    if name == "gpt_tiny":
        return (batch, 64, 1000)
    if name == "kmeans":
        return (256, 64)
    if name == "mlp_tiny":
        return (batch, 4)
    if name in ("resnet1001", "resnet1517", "resnet_sd", "resnet_tiny"):
        return (batch, 10)
    return (batch, 1000)


def run_iteration(w: Workload) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One training iteration; returns (model output, loss or None)."""
    out = w.model(*w.example_inputs)
    if w.loss_fn is None:
        return out, None
    loss = w.loss_fn(out)
    loss.backward()
    opt = w.make_optimizer(w.model.parameters())
    opt.step()
    opt.zero_grad()
    return out, loss


def test_names() -> None:
    assert set(MODEL_NAMES) == EXPECTED_NAMES
    assert len(MODEL_NAMES) == len(EXPECTED_NAMES)


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_meta_iteration(name: str) -> None:
    w = build_workload(name, 2)
    assert w.name == name
    tensors = [*w.model.parameters(), *w.model.buffers(), *w.example_inputs]
    assert tensors and all(t.device.type == "meta" for t in tensors)
    out, loss = run_iteration(w)
    assert tuple(out.shape) == output_shape(name, 2)
    if name == "kmeans":
        assert w.make_optimizer is None and not list(w.model.parameters()) and w.example_inputs == ()
    else:
        assert loss is not None and loss.shape == () and loss.device.type == "meta"
        assert all(p.grad is None or p.grad.device.type == "meta" for p in w.model.parameters())


@pytest.mark.parametrize(
    ("name", "batch"), [("mlp_tiny", 4), ("resnet_tiny", 2), ("gpt_tiny", 2), ("lstm", 2), ("kmeans", 1)]
)
def test_cpu_reproducible(name: str, batch: int) -> None:
    results = []
    for _ in range(2):
        w = build_workload(name, batch, device="cpu", seed=3)
        out, loss = run_iteration(w)
        assert tuple(out.shape) == output_shape(name, batch)
        value = out if loss is None else loss
        assert torch.isfinite(value).all()
        results.append((value.detach().clone(), [p.detach().clone() for p in w.model.parameters()]))
    (v1, p1), (v2, p2) = results
    assert torch.equal(v1, v2)
    assert all(torch.equal(a, b) for a, b in zip(p1, p2))
    other = build_workload(name, batch, device="cpu", seed=4)
    out, loss = run_iteration(other)
    assert not torch.equal(v1, out if loss is None else loss.detach())


def test_kmeans_matches_naive_lloyd() -> None:
    w = build_workload("kmeans", 1, device="cpu")
    points, old = w.model.points.clone(), w.model.centroids.clone()
    new = w.model()
    assert new.data_ptr() == w.model.centroids.data_ptr()
    assign = torch.cdist(points, old).argmin(1)
    for j in range(old.shape[0]):
        members = points[assign == j]
        expected = members.mean(0) if len(members) else old[j]
        torch.testing.assert_close(new[j], expected, rtol=1e-4, atol=1e-4)


def sd_draws(model: torch.nn.Module, x: torch.Tensor, calls: int) -> list[tuple[bool, ...]]:
    """The blocks whose residual branch actually ran in each of ``calls`` forward passes."""
    ran: list[bool] = []
    hooks = [
        b.body.register_forward_hook(lambda *_, i=i: ran.__setitem__(i, True)) for i, b in enumerate(model.blocks)
    ]
    draws = []
    for _ in range(calls):
        ran[:] = [False] * len(model.blocks)
        model(x)
        assert tuple(ran) == model.last_active
        draws.append(tuple(ran))
    for h in hooks:
        h.remove()
    return draws


def test_stochastic_depth() -> None:
    w = build_workload("resnet_sd", 2, seed=5)
    model, (x,) = w.model, w.example_inputs
    assert isinstance(model, CifarResNet) and len(model.blocks) == 54  # ResNet-110
    survival = [b.survival for b in model.blocks]
    assert survival[0] < 1.0 and survival[-1] == pytest.approx(0.5)
    assert all(a > b for a, b in zip(survival, survival[1:]))
    draws = sd_draws(model, x, 3)
    assert len(set(draws)) == 3 and not any(all(d) for d in draws)
    assert sd_draws(build_workload("resnet_sd", 2, seed=5).model, x, 3) == draws
    assert sd_draws(build_workload("resnet_sd", 2, seed=6).model, x, 3) != draws
    model.eval()
    assert all(sd_draws(model, x, 1)[0])


def test_stochastic_depth_cpu() -> None:
    model = CifarResNet(2, width=4, last_survival=0.5, seed=0).train()
    x = torch.randn(2, 3, 32, 32)
    assert len(set(sd_draws(model, x, 10))) > 1
    assert torch.isfinite(model(x)).all() and torch.isfinite(model.eval()(x)).all()


@pytest.mark.parametrize(
    ("name", "count"),
    [
        ("resnet18", 11_689_512),
        ("resnet34", 21_797_672),
        ("resnet50", 25_557_032),
        ("resnet101", 44_549_160),
        ("resnet152", 60_192_808),
        ("vgg16", 138_357_544),
        ("vgg19", 143_667_240),
        ("densenet121", 7_978_856),
    ],
)
def test_parameter_counts_match_torchvision(name: str, count: int) -> None:
    assert sum(p.numel() for p in build_workload(name, 1).model.parameters()) == count


def test_invalid_arguments() -> None:
    with pytest.raises(ValueError, match="valid names: .*resnet50"):
        build_workload("alexnet", 2)
    with pytest.raises(ValueError):
        build_workload("resnet18", 0)
