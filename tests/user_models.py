"""Foreign workloads: models and a training loop dqn-swap did not write, built the way their users
build them, for the memory property of planned training (``tests/runtime/test_runtime_memory_user.py``,
``benchmarks/bench_runtime.py memory``).

========== ==============================================================================================
name       workload (small sizes: a CPU iteration takes well under a second)
========== ==============================================================================================
t5         Hugging Face ``T5ForConditionalGeneration`` from a small ``T5Config`` (2+2 layers, d_model 64),
           ``input_ids``, ``attention_mask`` (padded tails) and ``labels`` in, ``out.loss`` out
distilbert Hugging Face ``DistilBertForMaskedLM`` from a small ``DistilBertConfig``: 15 % of the tokens
           replaced by ``[MASK]``, labels -100 elsewhere, ``out.loss``
gcn        PyTorch Geometric: 3 ``GCNConv`` layers, ReLU and dropout, node classification on a random
           graph (``x``, ``edge_index``), cross entropy over the training nodes' mask
gin        PyTorch Geometric: 3 ``GINConv`` layers with an MLP (Linear-BatchNorm-ReLU-Linear), graph
           classification of a batch of random graphs (``global_add_pool`` over the ``batch`` vector)
se_cnn     a ResNet-style CNN with squeeze-excitation blocks, stochastic depth (timm's ``DropPath``: a
           residual branch scaled by a per-sample Bernoulli draw in training) and ``ReLU(inplace=True)``
mbconv     an EfficientNet-style CNN: inverted residuals (expand, depthwise, squeeze-excitation, project)
           with ``SiLU(inplace=True)``, batch norm and ``DropPath``
========== ==============================================================================================

``NAME@bf16`` is the same workload with its model wrapped in :class:`Autocast` (the forward pass,
the model's own loss included, under ``torch.autocast("cpu", dtype=torch.bfloat16)``).

Every workload's optimizer is :func:`adamw_param_groups` (AdamW, weight decay on matrices, none
on biases and norms' weights) and its loop :func:`train_iteration`: gradient accumulation over
two micro-batches, ``clip_grad_norm_`` and an LR scheduler (linear warm-up then decay).  Nothing
is downloaded; weights come from ``torch.manual_seed(0)`` and data from generators seeded per
micro-batch, so two builds of a workload train bit-identically.

The loop and its trace
----------------------
The static device tensors of a workload (:attr:`UserWorkload.buffers`: the model's positional
arguments, then the targets the loss reads) are filled in place with each micro-batch's host data
(:meth:`UserWorkload.feed`), as a loop with pinned staging buffers does.  One iteration is::

    optimizer.zero_grad(set_to_none=True)
    for k in range(2):
        feed(k)
        with runtime:                    # the plan applies to every micro-batch's forward and backward
            out = model(*inputs)
            loss = loss_fn(out) / 2
            loss.backward()              # micro-batch 1: gradients accumulate into micro-batch 0's
        if k == 1:
            clip_grad_norm_(params, 1.0); optimizer.step(); scheduler.step()
        del out, loss

:func:`record` records the **last micro-step** (the heaviest): :class:`AccumulationStep` is what the
recorder calls the optimizer; its ``zero_grad`` keeps the gradients (they are alive when the
micro-step starts: its ``state`` declares them, beside AdamW's moments, as state alive before the
iteration, so ``trace.initial_bytes`` counts them) and its ``step`` clips, steps and schedules.
The recorded iteration is then: forward, loss / 2, backward accumulating into the gradients,
clipping, AdamW, the scheduler, the output's death -- micro-step 1 of the loop.  Micro-step 0 runs
the same forward and backward under the same plan with at most as much memory at every op (its
gradients are allocated during its backward instead of alive from the start; ``zero_grad``
freed them before), so the peak of the whole iteration is micro-step 1's, and
``trace.initial_bytes`` is what is alive when an iteration starts (the previous iteration's
gradients included).  :func:`measured_loop_peak` measures it as
:func:`dqn_swap.integrations.experiment.measured_cpu_peak` does: every iteration under the allocator's
timeline, the last one's peak above its start plus ``trace.initial_bytes``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from .runtime_support import _flat

ACCUMULATION = 2
MAX_NORM = 1.0
DATA_SEED = 1
LOOP_SEED = 1234


# --------------------------------------------------------------------------- optimizer, scheduler
def adamw_param_groups(params: Iterable[nn.Parameter], lr: float = 1e-3, weight_decay: float = 0.01
                       ) -> torch.optim.Optimizer:
    """AdamW with two parameter groups: weight decay on matrices and kernels, none on biases and
    norms' weights (every 1-d parameter), as nanoGPT and the Hugging Face examples split them."""
    params = [p for p in params if p.requires_grad]
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": weight_decay},
                              {"params": no_decay, "weight_decay": 0.0}], lr=lr, betas=(0.9, 0.98))


def warmup_linear(optimizer: torch.optim.Optimizer, warmup: int = 2, total: int = 50
                  ) -> torch.optim.lr_scheduler.LRScheduler:
    """Linear warm-up then linear decay (``transformers.get_linear_schedule_with_warmup``'s shape)."""
    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / (warmup + 1)
        return max(0.0, (total - step) / max(1, total - warmup))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


class AccumulationStep:
    """What the recorder calls the optimizer when it records the last micro-step of an accumulation
    loop: ``zero_grad`` keeps the gradients of the earlier micro-step, ``state`` declares them (and
    AdamW's) as state alive before the iteration, ``step`` clips, steps and schedules."""

    def __init__(self, params: Iterable[nn.Parameter], make_optimizer: Callable[[Any], torch.optim.Optimizer],
                 max_norm: float = MAX_NORM) -> None:
        self.params = list(params)
        self.optimizer = make_optimizer(self.params)
        self.scheduler = warmup_linear(self.optimizer)
        self.max_norm = max_norm

    @property
    def state(self) -> dict[Any, dict[str, Any]]:
        out: dict[Any, dict[str, Any]] = {}
        for p in self.params:
            s = dict(self.optimizer.state.get(p, {}))
            if p.grad is not None:
                s["accumulated_grad"] = p.grad
            out[p] = s
        return out

    def zero_grad(self, set_to_none: bool = True) -> None:
        """The micro-step after the first: the gradients stay and accumulate."""

    def step(self) -> None:
        torch.nn.utils.clip_grad_norm_(self.params, self.max_norm)
        self.optimizer.step()
        self.scheduler.step()


# --------------------------------------------------------------------------- workloads
@dataclass
class UserWorkload:
    """A foreign model, its static device tensors and its micro-batches' host data.

    ``buffers[:n_args]`` are the model's positional arguments (:attr:`inputs`), the rest the targets
    the loss reads; ``micro_batches[k]`` holds micro-batch ``k``'s tensors, shaped like ``buffers``.
    """

    name: str
    model: nn.Module
    buffers: tuple[torch.Tensor, ...]
    n_args: int
    micro_batches: list[tuple[torch.Tensor, ...]]
    loss_fn: Callable[[Any], torch.Tensor]
    make_optimizer: Callable[[Any], torch.optim.Optimizer] = adamw_param_groups
    make_scheduler: Callable[[torch.optim.Optimizer], Any] = warmup_linear
    notes: str = ""
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def inputs(self) -> tuple[torch.Tensor, ...]:
        return self.buffers[:self.n_args]

    def feed(self, k: int) -> None:
        """Copy micro-batch ``k`` into the static tensors (no allocation)."""
        with torch.no_grad():
            for dst, src in zip(self.buffers, self.micro_batches[k]):
                dst.copy_(src)


def _workload(name: str, model: nn.Module, make_batch: Callable[[torch.Generator], tuple[torch.Tensor, ...]],
              n_args: int, loss: Callable[[Any, tuple[torch.Tensor, ...]], torch.Tensor],
              micro: int = ACCUMULATION) -> UserWorkload:
    batches = [make_batch(torch.Generator().manual_seed(DATA_SEED + k)) for k in range(micro)]
    buffers = tuple(t.clone() for t in batches[0])
    targets = buffers[n_args:]
    return UserWorkload(name, model.train(), buffers, n_args, batches, lambda out: loss(out, targets))


class Autocast(nn.Module):
    """``model``'s forward under ``torch.autocast("cpu", dtype=torch.bfloat16)``: mixed precision,
    weights and gradients in fp32."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, *args: Any) -> Any:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return self.model(*args)


# --- Hugging Face
class Seq2SeqLM(nn.Module):
    """How a T5 is called in training: keyword arguments, labels in, the output (``out.loss``) out."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, labels: torch.Tensor) -> Any:
        return self.model(input_ids=input_ids, attention_mask=attention_mask, labels=labels)


class MaskedLM(nn.Module):
    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, labels: torch.Tensor) -> Any:
        return self.model(input_ids=input_ids, attention_mask=attention_mask, labels=labels)


def _hf_quiet() -> Any:
    import transformers

    transformers.logging.set_verbosity_error()
    return transformers


def t5(batch: int = 4, seq: int = 32, target_len: int = 16) -> UserWorkload:
    tf = _hf_quiet()
    config = tf.T5Config(vocab_size=256, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_decoder_layers=2,
                         num_heads=4, relative_attention_num_buckets=16, dropout_rate=0.1,
                         decoder_start_token_id=0, pad_token_id=0, eos_token_id=1)
    torch.manual_seed(0)
    model = Seq2SeqLM(tf.T5ForConditionalGeneration(config))

    def make(gen: torch.Generator) -> tuple[torch.Tensor, ...]:
        ids = torch.randint(2, 256, (batch, seq), generator=gen)
        lengths = torch.randint(seq // 2, seq + 1, (batch,), generator=gen)
        mask = (torch.arange(seq)[None, :] < lengths[:, None]).long()
        ids = ids * mask  # padded tails (pad id 0)
        labels = torch.randint(2, 256, (batch, target_len), generator=gen)
        labels[:, -3:] = -100  # ignored label positions, as a collator pads them
        return ids, mask, labels

    return _workload("t5", model, make, 3, lambda out, _: out.loss)


def distilbert(batch: int = 4, seq: int = 32) -> UserWorkload:
    tf = _hf_quiet()
    config = tf.DistilBertConfig(vocab_size=256, dim=64, hidden_dim=128, n_layers=2, n_heads=4,
                                 max_position_embeddings=64, dropout=0.1, attention_dropout=0.1, pad_token_id=0)
    torch.manual_seed(0)
    model = MaskedLM(tf.DistilBertForMaskedLM(config))
    mask_id = 3

    def make(gen: torch.Generator) -> tuple[torch.Tensor, ...]:
        tokens = torch.randint(5, 256, (batch, seq), generator=gen)
        chosen = torch.rand(batch, seq, generator=gen) < 0.15
        chosen[:, 0] = True  # at least one prediction per sequence
        labels = torch.where(chosen, tokens, torch.full_like(tokens, -100))
        ids = torch.where(chosen, torch.full_like(tokens, mask_id), tokens)
        return ids, torch.ones(batch, seq, dtype=torch.long), labels

    return _workload("distilbert", model, make, 3, lambda out, _: out.loss)


# --- PyTorch Geometric
class GCN(nn.Module):
    """The PyG example's GCN, three layers: ``GCNConv``-ReLU-dropout."""

    def __init__(self, features: int, hidden: int, classes: int, dropout: float = 0.5) -> None:
        super().__init__()
        from torch_geometric.nn import GCNConv

        self.convs = nn.ModuleList([GCNConv(features, hidden), GCNConv(hidden, hidden), GCNConv(hidden, classes)])
        self.dropout = dropout

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        for i, conv in enumerate(self.convs):
            x = F.dropout(x, p=self.dropout, training=self.training)
            x = conv(x, edge_index)
            if i < len(self.convs) - 1:
                x = x.relu()
        return x


def gcn(nodes: int = 256, edges: int = 1024, features: int = 32, hidden: int = 64, classes: int = 7
        ) -> UserWorkload:
    torch.manual_seed(0)
    model = GCN(features, hidden, classes)

    def make(gen: torch.Generator) -> tuple[torch.Tensor, ...]:
        x = torch.randn(nodes, features, generator=gen)
        src = torch.randint(0, nodes, (edges,), generator=gen)
        dst = (src + torch.randint(1, nodes, (edges,), generator=gen)) % nodes  # no self-loops: GCNConv adds
        e = torch.stack([src, dst])                                              # one per node, a fixed count
        ei = torch.cat([e, e.flip(0)], dim=1)  # undirected: each edge both ways
        y = torch.randint(0, classes, (nodes,), generator=gen)
        train_mask = torch.zeros(nodes, dtype=torch.bool)
        train_mask[torch.randperm(nodes, generator=gen)[:nodes // 2]] = True  # the same count in every graph
        return x, ei, y, train_mask

    def loss(out: torch.Tensor, targets: tuple[torch.Tensor, ...]) -> torch.Tensor:
        y, mask = targets
        return F.cross_entropy(out.float()[mask], y[mask])

    return _workload("gcn", model, make, 2, loss)


class GIN(nn.Module):
    """GIN for graph classification: ``GINConv`` with an MLP, sum pooling, a linear classifier."""

    def __init__(self, features: int, hidden: int, classes: int, layers: int = 3) -> None:
        super().__init__()
        from torch_geometric.nn import GINConv

        self.convs = nn.ModuleList()
        for i in range(layers):
            mlp = nn.Sequential(nn.Linear(features if i == 0 else hidden, hidden), nn.BatchNorm1d(hidden),
                                nn.ReLU(), nn.Linear(hidden, hidden))
            self.convs.append(GINConv(mlp, train_eps=True))
        self.head = nn.Sequential(nn.Linear(hidden, hidden), nn.ReLU(), nn.Dropout(0.5), nn.Linear(hidden, classes))

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor, batch: torch.Tensor) -> torch.Tensor:
        from torch_geometric.nn import global_add_pool

        for conv in self.convs:
            x = conv(x, edge_index).relu()
        return self.head(global_add_pool(x, batch))


def gin(graphs: int = 8, nodes: int = 24, edges: int = 64, features: int = 16, hidden: int = 64, classes: int = 4
        ) -> UserWorkload:
    torch.manual_seed(0)
    model = GIN(features, hidden, classes)

    def make(gen: torch.Generator) -> tuple[torch.Tensor, ...]:
        x = torch.randn(graphs * nodes, features, generator=gen)
        parts = [torch.randint(0, nodes, (2, edges), generator=gen) + g * nodes for g in range(graphs)]
        batch = torch.arange(graphs).repeat_interleave(nodes)
        y = torch.randint(0, classes, (graphs,), generator=gen)
        return x, torch.cat(parts, dim=1), batch, y

    return _workload("gin", model, make, 3, lambda out, t: F.cross_entropy(out.float(), t[0]))


# --- CNNs
class DropPath(nn.Module):
    """Stochastic depth as timm writes it: the residual branch scaled by a per-sample Bernoulli draw."""

    def __init__(self, p: float) -> None:
        super().__init__()
        self.p = p

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.p == 0.0 or not self.training:
            return x
        keep = 1.0 - self.p
        mask = x.new_empty((x.shape[0],) + (1,) * (x.ndim - 1)).bernoulli_(keep)
        return x * mask.div_(keep)


class SqueezeExcite(nn.Module):
    def __init__(self, channels: int, reduced: int, act: type[nn.Module] = nn.ReLU) -> None:
        super().__init__()
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc1 = nn.Conv2d(channels, reduced, 1)
        self.act = act(inplace=True)
        self.fc2 = nn.Conv2d(reduced, channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.sigmoid(self.fc2(self.act(self.fc1(self.pool(x)))))


class SEBlock(nn.Module):
    """SE-ResNet basic block: conv-BN-ReLU(inplace)-conv-BN, squeeze-excitation, drop path, add, ReLU(inplace)."""

    def __init__(self, cin: int, cout: int, stride: int, drop: float) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.relu1 = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.se = SqueezeExcite(cout, max(4, cout // 4))
        self.drop_path = DropPath(drop)
        self.shortcut = (nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
                         if stride != 1 or cin != cout else nn.Identity())
        self.relu2 = nn.ReLU(inplace=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu1(self.bn1(self.conv1(x)))
        out = self.se(self.bn2(self.conv2(out)))
        return self.relu2(self.shortcut(x) + self.drop_path(out))


class SECNN(nn.Module):
    def __init__(self, widths: tuple[int, ...] = (16, 32, 64), blocks: int = 2, classes: int = 10,
                 drop_path: float = 0.2) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, widths[0], 3, 1, 1, bias=False), nn.BatchNorm2d(widths[0]),
                                  nn.ReLU(inplace=True))
        layers, cin, n = [], widths[0], len(widths) * blocks
        for s, w in enumerate(widths):
            for b in range(blocks):
                i = s * blocks + b
                layers.append(SEBlock(cin, w, 2 if (b == 0 and s > 0) else 1, drop_path * i / max(1, n - 1)))
                cin = w
        self.layers = nn.Sequential(*layers)
        self.head = nn.Linear(cin, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.flatten(F.adaptive_avg_pool2d(self.layers(self.stem(x)), 1), 1))


class MBConv(nn.Module):
    """EfficientNet's inverted residual: 1x1 expand-BN-SiLU(inplace), depthwise 3x3-BN-SiLU(inplace),
    squeeze-excitation (SiLU), 1x1 project-BN, drop path and the residual when shapes allow."""

    def __init__(self, cin: int, cout: int, stride: int, expand: int, drop: float) -> None:
        super().__init__()
        mid = cin * expand
        self.expand = nn.Sequential(nn.Conv2d(cin, mid, 1, bias=False), nn.BatchNorm2d(mid), nn.SiLU(inplace=True))
        self.dw = nn.Sequential(nn.Conv2d(mid, mid, 3, stride, 1, groups=mid, bias=False), nn.BatchNorm2d(mid),
                                nn.SiLU(inplace=True))
        self.se = SqueezeExcite(mid, max(4, cin // 4), act=nn.SiLU)
        self.project = nn.Sequential(nn.Conv2d(mid, cout, 1, bias=False), nn.BatchNorm2d(cout))
        self.residual = stride == 1 and cin == cout
        self.drop_path = DropPath(drop)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.project(self.se(self.dw(self.expand(x))))
        return x + self.drop_path(out) if self.residual else out


class EfficientNetTiny(nn.Module):
    def __init__(self, classes: int = 10, drop_path: float = 0.2) -> None:
        super().__init__()
        cfg = [(16, 16, 1, 1), (16, 24, 2, 4), (24, 24, 1, 4), (24, 40, 2, 4), (40, 40, 1, 4)]
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, 1, 1, bias=False), nn.BatchNorm2d(16), nn.SiLU(inplace=True))
        self.blocks = nn.Sequential(*[MBConv(a, b, s, e, drop_path * i / (len(cfg) - 1))
                                      for i, (a, b, s, e) in enumerate(cfg)])
        self.head = nn.Sequential(nn.Conv2d(40, 128, 1, bias=False), nn.BatchNorm2d(128), nn.SiLU(inplace=True),
                                  nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Dropout(0.2), nn.Linear(128, classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(self.stem(x)))


def _images(model: nn.Module, name: str, batch: int, size: int, classes: int = 10) -> UserWorkload:
    def make(gen: torch.Generator) -> tuple[torch.Tensor, ...]:
        return (torch.randn(batch, 3, size, size, generator=gen), torch.randint(0, classes, (batch,), generator=gen))

    return _workload(name, model, make, 1, lambda out, t: F.cross_entropy(out.float(), t[0], label_smoothing=0.1))


def se_cnn(batch: int = 8, size: int = 32) -> UserWorkload:
    torch.manual_seed(0)
    return _images(SECNN(), "se_cnn", batch, size)


def mbconv(batch: int = 8, size: int = 32) -> UserWorkload:
    torch.manual_seed(0)
    return _images(EfficientNetTiny(), "mbconv", batch, size)


USER_MODELS: dict[str, Callable[[], UserWorkload]] = {
    "t5": t5, "distilbert": distilbert, "gcn": gcn, "gin": gin, "se_cnn": se_cnn, "mbconv": mbconv,
}


def split_precision(name: str) -> tuple[str, str]:
    """``"t5@bf16"`` -> ``("t5", "bf16")``; no suffix is fp32."""
    base, _, precision = name.partition("@")
    precision = precision or "fp32"
    if precision not in ("fp32", "bf16"):
        raise ValueError(f"{name}: precision {precision!r} is not fp32 or bf16")
    return base, precision


def is_user_model(name: str) -> bool:
    return split_precision(name)[0] in USER_MODELS


def build(name: str) -> UserWorkload:
    """The workload ``name`` (``t5``, ``t5@bf16`` ...), built afresh from its seeds."""
    base, precision = split_precision(name)
    if base not in USER_MODELS:
        raise ValueError(f"unknown user model {base!r}; one of {', '.join(USER_MODELS)}")
    w = USER_MODELS[base]()
    if precision == "bf16":
        w.model = Autocast(w.model)
    w.name = name
    return w


def from_zoo(model: nn.Module, inputs: tuple, loss_fn: Callable[[Any], torch.Tensor],
             make_optimizer: Callable[[Any], torch.optim.Optimizer], name: str, bf16: bool = False) -> UserWorkload:
    """A zoo workload in the same loop: its own optimizer, with clipping and the scheduler; the second
    micro-batch is the first rolled by one sample (the targets the loss captured stay)."""
    buffers = tuple(inputs)
    batches = [tuple(t.clone() for t in buffers),
               tuple(t.roll(1, 0) if t.dim() > 0 else t.clone() for t in buffers)]
    return UserWorkload(name, Autocast(model) if bf16 else model, buffers, len(buffers), batches, loss_fn,
                        make_optimizer)


# --------------------------------------------------------------------------- the loop
@dataclass
class Loop:
    """A workload with its optimizer and scheduler, trained by :func:`train_iteration`."""

    w: UserWorkload
    optimizer: torch.optim.Optimizer
    scheduler: Any
    losses: list[float] = field(default_factory=list)


def start(w: UserWorkload) -> Loop:
    opt = w.make_optimizer(w.model.parameters())
    return Loop(w, opt, w.make_scheduler(opt))


def train_iteration(loop: Loop, runtime: Any = None, accumulation: int = ACCUMULATION,
                    max_norm: float = MAX_NORM) -> None:
    """One optimizer step over ``accumulation`` micro-batches (module docstring)."""
    w, opt = loop.w, loop.optimizer
    opt.zero_grad(set_to_none=True)
    for k in range(accumulation):
        w.feed(k)
        with runtime if runtime is not None else nullcontext():
            out = w.model(*w.inputs)
            loss = w.loss_fn(out) / accumulation
            loss.backward()
        if k == accumulation - 1:
            torch.nn.utils.clip_grad_norm_(w.model.parameters(), max_norm)
            opt.step()
            loop.scheduler.step()
        loop.losses.append(loss.item())
        del out, loss


def record(w: UserWorkload, accumulation: int = ACCUMULATION, max_norm: float = MAX_NORM) -> Any:
    """The trace of the loop's last micro-step, recorded on ``w`` (which it trains: pass a separate build)."""
    from dqn_swap.recorder import record_trace

    def micro_loss(out: Any) -> torch.Tensor:
        return w.loss_fn(out) / accumulation

    w.feed(accumulation - 1)
    return record_trace(w.model, w.inputs, micro_loss,
                        lambda params: AccumulationStep(params, w.make_optimizer, max_norm), device="cpu",
                        meta={"model": w.name, "loop": f"accumulation {accumulation}, clip {max_norm}, scheduler"})


def measured_loop_peak(loop: Loop, runtime: Any, baseline: int, iterations: int = 3) -> int:
    """The peak bytes of the loop's iteration, measured as ``measured_cpu_peak`` measures one: every
    iteration under the allocator's timeline, ``baseline`` plus the last one's peak above its start."""
    from dqn_swap.meter import AllocatorTimeline, collector_still

    torch.manual_seed(LOOP_SEED)  # dropout and drop path draw the same numbers in every run
    peak = 0
    for i in range(iterations):
        timeline = AllocatorTimeline()
        with collector_still(), timeline:
            train_iteration(loop, runtime)
        if i == iterations - 1:
            peak = timeline.peak
    return int(baseline) + int(peak)


def state_of(loop: Loop) -> dict[str, Any]:
    """Everything training leaves: the model's ``state_dict``, the optimizer's, the scheduler's, the losses."""
    return {"model": {k: v.detach().clone() for k, v in loop.w.model.state_dict().items()},
            "optimizer": {k: v.detach().clone() if isinstance(v, torch.Tensor) else v
                          for k, v in _flat(loop.optimizer.state_dict()).items()},
            "scheduler": loop.scheduler.state_dict() if loop.scheduler is not None else None,
            "losses": list(loop.losses)}




def differences(ref: dict[str, Any], got: dict[str, Any]) -> list[str]:
    """Where ``got`` is not bit-identical to ``ref`` (empty: identical)."""
    out = []
    if ref["model"].keys() != got["model"].keys():
        out.append("state_dict keys")
    else:
        for k, a in ref["model"].items():
            b = got["model"][k]
            if not torch.equal(a, b):
                diff = (a.double() - b.double()).abs().max().item() if a.is_floating_point() else "int"
                out.append(f"state_dict[{k}] (max diff {diff})")
    fa, fb = ref["optimizer"], got["optimizer"]
    if fa.keys() != fb.keys():
        out.append("optimizer state keys")
    else:
        for k, a in fa.items():
            b = fb[k]
            same = torch.equal(a, b) if isinstance(a, torch.Tensor) else (a == b or (
                isinstance(a, float) and math.isnan(a) and math.isnan(b)))
            if not same:
                out.append(f"optimizer[{k}]")
    if ref["scheduler"] != got["scheduler"]:
        out.append("scheduler")
    if ref["losses"] != got["losses"]:
        out.append(f"losses {got['losses']} vs {ref['losses']}")
    return out


__all__ = ["ACCUMULATION", "USER_MODELS", "AccumulationStep", "Autocast", "Loop", "UserWorkload",
           "adamw_param_groups", "build", "differences", "from_zoo", "is_user_model", "measured_loop_peak",
           "record", "split_precision", "start", "state_of", "train_iteration", "warmup_linear"]
