"""Training workloads (model, one batch of inputs, loss, optimizer) of the networks that
GPU-memory papers benchmark.

==============  ==========================================================================
name            network (see each module for the paper and departures)
==============  ==========================================================================
resnet18..152   ImageNet ResNet, 3x224x224, 1000 classes, cross entropy
resnet1001      CIFAR pre-activation bottleneck ResNet, depth 9n+2 with n=111, 10 classes
resnet1517      Layrub's "ResNet-1517": 1517 = 9n+2 has no integral n, so n=168 is used,
                i.e. the network actually has depth 1514
resnet_sd       CIFAR ResNet-110 with stochastic depth (survival 1.0 -> 0.5)
resnet_tiny     CIFAR ResNet-14 of width 8 (2 basic blocks per stage), for tests
vgg16, vgg19    VGG configurations D and E, no batch norm
densenet121     DenseNet-BC-121
unet            U-Net, 3x256x256 input, 2 classes, per-pixel cross entropy
lstm            char-rnn: 2-layer LSTM 512, vocabulary 65, 100 steps, next-char loss
lstm_short      the same char-rnn unrolled over 20 steps (a 5x smaller graph of the same
                shape, to train agents for ``lstm`` quickly: section 4.4.2 of the DQN paper)
gpt             GPT-2-small-shaped decoder, 512 tokens, vocabulary 50257, next-token loss
gpt_tiny        2 layers, d_model 128, 4 heads, 64 tokens, vocabulary 1000, for tests
hf:NAME         a Hugging Face transformer built from its configuration (random weights):
                hf:gpt2, hf:llama, hf:bert, hf:vit, or hf:PATH to a config.json (:mod:`.hf`)
gen:FAMILY:SEED a network drawn from a family of :mod:`.generator` (sizes from the seed)
kmeans          one Lloyd iteration, batch_size*1024 points in 64-d, 256 centroids
mlp_tiny        Linear(8,16)-ReLU-Linear(16,4), MSE to zeros, for tests
==============  ==========================================================================

Optimizers: SGD (lr 0.1, momentum 0.9) except Adam (lr 1e-3) for ``gpt``, ``gpt_tiny``
and ``lstm`` (char-rnn used RMSprop); none for ``kmeans``.  ``foreach=False`` keeps the
per-parameter update ops, which also run on ``meta``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from .densenet import DenseNet
from .names import MODEL_NAMES as _NAMES
from .names import check_batch_size
from .optim import adam, sgd_momentum
from .kmeans import KMeansStep
from .resnet import RESNET_LAYERS, CifarResNet, PreActResNet, resnet
from .rnn import CharLSTM
from .transformer import GPT, GPTConfig
from .unet import UNet
from .vgg import VGG

LossFn = Callable[[Any], torch.Tensor]
OptimizerFactory = Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer]


@dataclass(frozen=True)
class Workload:
    """One training iteration: ``loss_fn(model(*example_inputs)).backward()`` then an optimizer step.

    ``loss_fn`` closes over its targets (already on the model's device); ``loss_fn`` and
    ``make_optimizer`` are None for workloads without a backward pass (``kmeans``).
    """

    name: str
    model: nn.Module
    example_inputs: tuple
    loss_fn: LossFn | None
    make_optimizer: OptimizerFactory | None


class _Sampler:
    """Random data on ``device``: drawn on CPU from a seeded generator then moved; shape-only on meta."""

    def __init__(self, device: torch.device, seed: int) -> None:
        self.device = device
        self.gen = torch.Generator().manual_seed(seed)

    def randn(self, *shape: int) -> torch.Tensor:
        if self.device.type == "meta":
            return torch.randn(shape, device=self.device)
        return torch.randn(shape, generator=self.gen, device="cpu").to(self.device)

    def randint(self, high: int, *shape: int) -> torch.Tensor:
        if self.device.type == "meta":
            return torch.randint(high, shape, device=self.device)
        return torch.randint(high, shape, generator=self.gen, device="cpu").to(self.device)


_Parts = tuple[nn.Module, tuple, LossFn | None, OptimizerFactory | None]
_Builder = Callable[[int, _Sampler, int], _Parts]  # (batch_size, sampler, seed) -> parts


def _classifier(make: Callable[[int], nn.Module], shape: tuple[int, ...], classes: int) -> _Builder:
    """Images of ``shape``, one class label each, cross entropy."""

    def build(batch: int, data: _Sampler, seed: int) -> _Parts:
        target = data.randint(classes, batch)
        return make(seed), (data.randn(batch, *shape),), lambda out: F.cross_entropy(out, target), sgd_momentum

    return build


def _segmenter(batch: int, data: _Sampler, seed: int) -> _Parts:
    target = data.randint(2, batch, 256, 256)
    return UNet(), (data.randn(batch, 3, 256, 256),), lambda out: F.cross_entropy(out, target), sgd_momentum


def _language(make: Callable[[], nn.Module], vocab: int, seq: int) -> _Builder:
    """Token ids (batch, seq); the targets are the same random stream shifted by one."""

    def build(batch: int, data: _Sampler, seed: int) -> _Parts:
        tokens = data.randint(vocab, batch, seq + 1)
        inputs, target = tokens[:, :-1].contiguous(), tokens[:, 1:].reshape(-1)
        return make(), (inputs,), lambda out: F.cross_entropy(out.reshape(-1, vocab), target), adam

    return build


def _kmeans(batch: int, data: _Sampler, seed: int) -> _Parts:
    points = data.randn(batch * 1024, 64)
    return KMeansStep(points, points[:256].clone()), (), None, None


def _mlp(batch: int, data: _Sampler, seed: int) -> _Parts:
    target = torch.zeros(batch, 4, device=data.device)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    return model, (data.randn(batch, 8),), lambda out: F.mse_loss(out, target), sgd_momentum


_IMAGENET = (3, 224, 224)
_CIFAR = (3, 32, 32)
_GPT_TINY = GPTConfig(layers=2, d_model=128, heads=4, seq_len=64, vocab=1000)

_BUILDERS: dict[str, _Builder] = {
    **{f"resnet{d}": _classifier(lambda seed, d=d: resnet(d), _IMAGENET, 1000) for d in RESNET_LAYERS},
    "resnet1001": _classifier(lambda seed: PreActResNet(111), _CIFAR, 10),
    "resnet1517": _classifier(lambda seed: PreActResNet(168), _CIFAR, 10),
    "resnet_sd": _classifier(lambda seed: CifarResNet(18, last_survival=0.5, seed=seed), _CIFAR, 10),
    "resnet_tiny": _classifier(lambda seed: CifarResNet(2, width=8), _CIFAR, 10),
    "vgg16": _classifier(lambda seed: VGG(16), _IMAGENET, 1000),
    "vgg19": _classifier(lambda seed: VGG(19), _IMAGENET, 1000),
    "densenet121": _classifier(lambda seed: DenseNet(), _IMAGENET, 1000),
    "unet": _segmenter,
    "lstm": _language(CharLSTM, 65, 100),
    "lstm_short": _language(CharLSTM, 65, 20),
    "gpt": _language(lambda: GPT(GPTConfig()), GPTConfig.vocab, GPTConfig.seq_len),
    "gpt_tiny": _language(lambda: GPT(_GPT_TINY), _GPT_TINY.vocab, _GPT_TINY.seq_len),
    "kmeans": _kmeans,
    "mlp_tiny": _mlp,
}

MODEL_NAMES: tuple[str, ...] = tuple(_BUILDERS)
assert MODEL_NAMES == _NAMES, "dqn_swap/models/names.py must list the builders of this module"


def build_workload(name: str, batch_size: int, device: str | torch.device = "meta", seed: int = 0,
                   seq_len: int | None = None) -> Workload:
    """Build workload ``name`` for ``batch_size`` directly on ``device`` (default ``meta``: shapes only).

    ``torch.manual_seed(seed)`` runs first, so CPU weights (and later dropout masks) are
    reproducible; inputs and targets come from a CPU generator seeded with ``seed``.
    ``seq_len``: the sequence length of a Hugging Face language model (default 64, at most its
    positions); other models refuse it.
    """
    if seq_len is not None:
        if not name.startswith("hf:"):
            raise ValueError(f"{name}: only Hugging Face language models (hf:NAME) take a sequence length")
        if isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len < 1:
            raise ValueError(f"sequence length {seq_len!r}: a whole number from 1")
    if name not in _BUILDERS and not name.startswith(("hf:", "gen:")):
        raise ValueError(f"unknown model {name!r}; valid names: {', '.join(MODEL_NAMES)}, hf:NAME for a "
                         "Hugging Face model (hf:gpt2, hf:llama, hf:bert, hf:vit, hf:PATH/config.json), or "
                         "gen:FAMILY:SEED for a generated network")
    check_batch_size(batch_size)
    device = torch.device(device)
    if name.startswith("hf:"):
        from .hf import hf_workload

        torch.manual_seed(seed)
        model, inputs, loss_fn, make_optimizer = hf_workload(name[3:], batch_size, device, seed, seq_len)
        return Workload(name, model.train(), inputs, loss_fn, make_optimizer)
    if name.startswith("gen:"):
        from .generator import build_parts, parse_name, sample

        spec = sample(*parse_name(name))
        builder: _Builder = lambda batch, data, seed: build_parts(spec, batch, data)  # noqa: E731
    else:
        builder = _BUILDERS[name]
    data = _Sampler(device, seed)
    torch.manual_seed(seed)
    with device:
        model, inputs, loss_fn, make_optimizer = builder(batch_size, data, seed)
    return Workload(name, model.train(), inputs, loss_fn, make_optimizer)
