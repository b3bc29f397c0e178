"""Models and training loops dqn-swap was not written on, for ``bench_varying_loops.py``.

Every model is built from a small configuration with the library's defaults (dropout, layerdrop,
time masking, attention implementations), and called the way its users call it: Hugging Face
models with their keyword batch and ``labels``, PyG networks with a graph, plain modules with a
tensor.  A :class:`Workload` makes the batches of a run from a fixed seed; ``padded=True`` pads
some rows of every third batch (same shapes, another mask: what a padding collator gives), which
changes the op sequence of several Hugging Face models.

The loops (:data:`LOOPS`) are the ones users write: plain, outputs held past ``optimizer.step()``,
gradient accumulation with clipping, a parameter group added midway, two backward passes over a
retained graph, and padded batches.  :func:`run_loop` trains one, planned or not, and measures
every step with the allocator's timeline (bytes alive at the step's start included).
"""

from __future__ import annotations

import gc
import math
from collections.abc import Callable
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

BATCH, SEQ = 4, 16
SEED = 0


def _tf() -> Any:
    import transformers

    transformers.logging.set_verbosity_error()
    return transformers


@dataclass
class Workload:
    """A model factory and its batches; ``loss`` reads the loss from the model's output."""

    name: str
    family: str  # "text", "seq2seq", "audio", "vision", "graph", "custom"
    build: Callable[[], nn.Module]
    make: Callable[[torch.Generator, bool], dict[str, Any]]  # (generator, padded) -> keyword batch
    loss: Callable[[Any], torch.Tensor] = lambda out: out.loss
    pads: bool = False  # padding changes its batches (text and audio)
    collate: bool = False  # trained by the Trainer with DataCollatorWithPadding

    def batches(self, n: int, padded: bool = False) -> list[dict[str, Any]]:
        g = torch.Generator().manual_seed(SEED)
        return [self.make(g, padded and i % 3 == 2) for i in range(n)]


def _text_batch(vocab: int, *, classes: int | None = None, seq2seq: bool = False) -> Callable:
    def make(g: torch.Generator, padded: bool) -> dict[str, Any]:
        ids = torch.randint(3, vocab, (BATCH, SEQ), generator=g)
        mask = torch.ones(BATCH, SEQ, dtype=torch.long)
        if padded:  # the last row is shorter: padded on the right, as collators do
            n = int(torch.randint(SEQ // 2, SEQ - 1, (1,), generator=g))
            mask[-1, n:] = 0
            ids[-1, n:] = 0
        if classes is not None:
            labels = torch.randint(0, classes, (BATCH,), generator=g)
        elif seq2seq:
            labels = torch.randint(3, vocab, (BATCH, SEQ // 2), generator=g)
        else:
            labels = ids.masked_fill(mask == 0, -100)
        return {"input_ids": ids, "attention_mask": mask, "labels": labels}

    return make


def _seeded(f: Callable[[], nn.Module]) -> Callable[[], nn.Module]:
    def build() -> nn.Module:
        torch.manual_seed(SEED)
        return f()

    return build


# --------------------------------------------------------------------------- Hugging Face
def _causal(name: str, config: Callable[[Any], Any], model_cls: str, checkpointing: bool = False) -> Workload:
    def build() -> nn.Module:
        tf = _tf()
        m = getattr(tf, model_cls)(config(tf))
        if checkpointing:
            m.gradient_checkpointing_enable()
        return m

    return Workload(name, "text", _seeded(build), _text_batch(96), pads=True, collate=True)


def qwen2() -> Workload:
    return _causal("qwen2", lambda tf: tf.Qwen2Config(vocab_size=96, hidden_size=32, intermediate_size=64,
                                                      num_hidden_layers=2, num_attention_heads=4,
                                                      num_key_value_heads=2, max_position_embeddings=64),
                   "Qwen2ForCausalLM")


def mistral() -> Workload:
    return _causal("mistral", lambda tf: tf.MistralConfig(vocab_size=96, hidden_size=32, intermediate_size=64,
                                                          num_hidden_layers=2, num_attention_heads=4,
                                                          num_key_value_heads=2, max_position_embeddings=64,
                                                          sliding_window=8), "MistralForCausalLM")


def llama_checkpointed() -> Workload:
    return _causal("llama-gc", lambda tf: tf.LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=64,
                                                         num_hidden_layers=2, num_attention_heads=4,
                                                         num_key_value_heads=2, max_position_embeddings=64),
                   "LlamaForCausalLM", checkpointing=True)


def gpt2() -> Workload:
    return _causal("gpt2", lambda tf: tf.GPT2Config(vocab_size=96, n_embd=32, n_layer=2, n_head=4, n_positions=64),
                   "GPT2LMHeadModel")


def gpt2_checkpointed() -> Workload:
    return _causal("gpt2-gc", lambda tf: tf.GPT2Config(vocab_size=96, n_embd=32, n_layer=2, n_head=4,
                                                       n_positions=64), "GPT2LMHeadModel", checkpointing=True)


def bart() -> Workload:
    def build() -> nn.Module:
        tf = _tf()
        return tf.BartForConditionalGeneration(tf.BartConfig(
            vocab_size=96, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
            decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=64))

    return Workload("bart", "seq2seq", _seeded(build), _text_batch(96, seq2seq=True), pads=True)


def t5() -> Workload:
    def build() -> nn.Module:
        tf = _tf()
        return tf.T5ForConditionalGeneration(tf.T5Config(
            vocab_size=96, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_decoder_layers=2, num_heads=4,
            relative_attention_num_buckets=8, decoder_start_token_id=0, pad_token_id=0))

    return Workload("t5", "seq2seq", _seeded(build), _text_batch(96, seq2seq=True), pads=True)


def _classifier(name: str, config: Callable[[Any], Any], model_cls: str) -> Workload:
    def build() -> nn.Module:
        tf = _tf()
        return getattr(tf, model_cls)(config(tf))

    return Workload(name, "text", _seeded(build), _text_batch(96, classes=3), pads=True, collate=True)


def deberta_v2() -> Workload:
    return _classifier("deberta-v2", lambda tf: tf.DebertaV2Config(
        vocab_size=96, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
        max_position_embeddings=64, num_labels=3), "DebertaV2ForSequenceClassification")


def bert() -> Workload:
    return _classifier("bert", lambda tf: tf.BertConfig(
        vocab_size=96, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
        max_position_embeddings=64, num_labels=3), "BertForSequenceClassification")


def distilbert() -> Workload:
    return _classifier("distilbert", lambda tf: tf.DistilBertConfig(
        vocab_size=96, dim=32, n_layers=2, n_heads=4, hidden_dim=64, max_position_embeddings=64, num_labels=3),
        "DistilBertForSequenceClassification")


def whisper() -> Workload:
    mels, frames = 8, 32

    def build() -> nn.Module:
        tf = _tf()
        return tf.WhisperForConditionalGeneration(tf.WhisperConfig(
            vocab_size=96, num_mel_bins=mels, d_model=32, encoder_layers=2, decoder_layers=2,
            encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64,
            max_source_positions=frames // 2, max_target_positions=32, decoder_start_token_id=1, pad_token_id=0,
            bos_token_id=1, eos_token_id=2))

    def make(g: torch.Generator, padded: bool) -> dict[str, Any]:
        labels = torch.randint(3, 96, (BATCH, 8), generator=g)
        if padded:
            labels[-1, 5:] = -100
        return {"input_features": torch.randn(BATCH, mels, frames, generator=g), "labels": labels}

    return Workload("whisper", "audio", _seeded(build), make, pads=True)


def wav2vec2_ctc() -> Workload:
    samples = 800

    def build() -> nn.Module:
        tf = _tf()
        return tf.Wav2Vec2ForCTC(tf.Wav2Vec2Config(
            vocab_size=32, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
            conv_dim=(16, 16), conv_stride=(5, 4), conv_kernel=(10, 4), num_conv_pos_embeddings=8,
            num_conv_pos_embedding_groups=4, pad_token_id=0, ctc_loss_reduction="mean"))  # layerdrop 0.1 by default

    def make(g: torch.Generator, padded: bool) -> dict[str, Any]:
        labels = torch.randint(1, 32, (BATCH, 6), generator=g)
        if padded:
            labels[-1, 4:] = -100
        return {"input_values": torch.randn(BATCH, samples, generator=g), "labels": labels}

    return Workload("wav2vec2-ctc", "audio", _seeded(build), make, pads=True)


def _images(name: str, config: Callable[[Any], Any], model_cls: str) -> Workload:
    def build() -> nn.Module:
        tf = _tf()
        return getattr(tf, model_cls)(config(tf))

    def make(g: torch.Generator, padded: bool) -> dict[str, Any]:
        return {"pixel_values": torch.randn(BATCH, 3, 32, 32, generator=g),
                "labels": torch.randint(0, 5, (BATCH,), generator=g)}

    return Workload(name, "vision", _seeded(build), make)


def swin() -> Workload:
    return _images("swin", lambda tf: tf.SwinConfig(image_size=32, patch_size=4, embed_dim=16, depths=[1, 1],
                                                    num_heads=[2, 2], window_size=4, num_labels=5),
                   "SwinForImageClassification")


def convnext() -> Workload:
    return _images("convnext", lambda tf: tf.ConvNextConfig(hidden_sizes=[8, 16], depths=[1, 1], num_stages=2,
                                                            image_size=32, num_labels=5, drop_path_rate=0.1),
                   "ConvNextForImageClassification")


def vit() -> Workload:
    return _images("vit", lambda tf: tf.ViTConfig(image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=2,
                                                  num_attention_heads=4, intermediate_size=64, num_labels=5),
                   "ViTForImageClassification")


class PadTokenizer:
    """The two things ``transformers.DataCollatorWithPadding`` asks of a tokenizer: pad ids on the right
    with 0 and make the attention mask."""

    pad_token_id = 0
    padding_side = "right"
    model_input_names = ["input_ids", "attention_mask"]

    def pad(self, features: list[dict[str, Any]], padding: Any = True, max_length: int | None = None,
            pad_to_multiple_of: int | None = None, return_tensors: str = "pt", **_: Any) -> dict[str, torch.Tensor]:
        n = max_length or max(len(f["input_ids"]) for f in features)
        ids = torch.zeros(len(features), n, dtype=torch.long)
        mask = torch.zeros(len(features), n, dtype=torch.long)
        for i, f in enumerate(features):
            k = len(f["input_ids"])
            ids[i, :k] = torch.tensor(f["input_ids"])
            mask[i, :k] = 1
        return {"input_ids": ids, "attention_mask": mask}


# --------------------------------------------------------------------------- PyTorch Geometric
class _PyG(nn.Module):
    def __init__(self, kind: str, features: int = 16, hidden: int = 32, classes: int = 4) -> None:
        super().__init__()
        import torch_geometric.nn as gnn

        conv = {"gcn": lambda i, o: gnn.GCNConv(i, o), "gat": lambda i, o: gnn.GATConv(i, o // 2, heads=2),
                "sage": lambda i, o: gnn.SAGEConv(i, o)}[kind]
        self.convs = nn.ModuleList([conv(features, hidden), conv(hidden, hidden)])
        self.head = nn.Linear(hidden, classes)

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
        for conv in self.convs:
            x = F.dropout(F.relu(conv(x, edge_index)), 0.1, self.training)
        return {"loss": F.cross_entropy(self.head(x), labels)}


def _graph_batch(nodes: int = 96, edges: int = 384) -> Callable:
    def make(g: torch.Generator, padded: bool) -> dict[str, Any]:
        return {"x": torch.randn(nodes, 16, generator=g), "edge_index": torch.randint(0, nodes, (2, edges), generator=g),
                "labels": torch.randint(0, 4, (nodes,), generator=g)}

    return make


def _pyg(kind: str) -> Workload:
    return Workload(f"pyg-{kind}", "graph", _seeded(lambda: _PyG(kind)), _graph_batch(), loss=lambda out: out["loss"])


# --------------------------------------------------------------------------- plain PyTorch
class _Swish(torch.autograd.Function):
    """A custom autograd.Function that saves its input itself (ctx.save_for_backward)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x)
        return x * torch.sigmoid(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        (x,) = ctx.saved_tensors
        s = torch.sigmoid(x)
        return grad * (s + x * s * (1 - s))


class FunctionMLP(nn.Module):
    def __init__(self, width: int = 64, depth: int = 4) -> None:
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(width, width) for _ in range(depth)])
        self.head = nn.Linear(width, 5)

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
        for layer in self.layers:
            x = _Swish.apply(layer(x))
        return {"loss": F.cross_entropy(self.head(x), labels)}


class AttentionNet(nn.Module):
    """Two blocks of ``nn.MultiheadAttention`` with a key padding mask, pre-norm, GELU MLP."""

    def __init__(self, dim: int = 32, heads: int = 4, blocks: int = 2) -> None:
        super().__init__()
        self.embed = nn.Embedding(96, dim)
        self.attn = nn.ModuleList([nn.MultiheadAttention(dim, heads, dropout=0.1, batch_first=True)
                                   for _ in range(blocks)])
        self.norms = nn.ModuleList([nn.LayerNorm(dim) for _ in range(blocks)])
        self.mlps = nn.ModuleList([nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))
                                   for _ in range(blocks)])
        self.head = nn.Linear(dim, 96)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, labels: torch.Tensor) -> dict:
        x = self.embed(input_ids)
        pad = attention_mask == 0
        for attn, norm, mlp in zip(self.attn, self.norms, self.mlps):
            h = norm(x)
            x = x + attn(h, h, h, key_padding_mask=pad, need_weights=False)[0]
            x = x + mlp(x)
        return {"loss": F.cross_entropy(self.head(x).flatten(0, 1), labels.flatten(), ignore_index=-100)}


class ChannelsLastCNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(inplace=True),
                                  nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.BatchNorm2d(32), nn.SiLU(),
                                  nn.Conv2d(32, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU())
        self.head = nn.Linear(32, 5)

    def forward(self, pixel_values: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
        x = self.body(pixel_values.contiguous(memory_format=torch.channels_last))
        return {"loss": F.cross_entropy(self.head(x.mean((2, 3))), labels)}


def _function_mlp() -> Workload:
    def make(g: torch.Generator, padded: bool) -> dict[str, Any]:
        return {"x": torch.randn(32, 64, generator=g), "labels": torch.randint(0, 5, (32,), generator=g)}

    return Workload("function-mlp", "custom", _seeded(FunctionMLP), make, loss=lambda out: out["loss"])


def _attention() -> Workload:
    return Workload("mha", "custom", _seeded(AttentionNet), _text_batch(96), loss=lambda out: out["loss"], pads=True)


def _cnn() -> Workload:
    def build() -> nn.Module:
        return ChannelsLastCNN().to(memory_format=torch.channels_last)

    def make(g: torch.Generator, padded: bool) -> dict[str, Any]:
        return {"pixel_values": torch.randn(BATCH, 3, 16, 16, generator=g),
                "labels": torch.randint(0, 5, (BATCH,), generator=g)}

    return Workload("cnn-channels-last", "custom", _seeded(build), make, loss=lambda out: out["loss"])


WORKLOADS: dict[str, Callable[[], Workload]] = {
    "qwen2": qwen2, "mistral": mistral, "llama-gc": llama_checkpointed, "gpt2": gpt2, "gpt2-gc": gpt2_checkpointed,
    "bart": bart, "t5": t5, "deberta-v2": deberta_v2, "bert": bert, "distilbert": distilbert,
    "whisper": whisper, "wav2vec2-ctc": wav2vec2_ctc, "swin": swin, "convnext": convnext, "vit": vit,
    "pyg-gcn": lambda: _pyg("gcn"), "pyg-gat": lambda: _pyg("gat"), "pyg-sage": lambda: _pyg("sage"),
    "function-mlp": _function_mlp, "mha": _attention, "cnn-channels-last": _cnn,
}

#: The loops of :func:`run_loop`; ``padded`` only for workloads whose batches pad.
LOOPS = ("plain", "held", "accumulate", "groups", "retain", "padded")


def loops_for(w: Workload) -> tuple[str, ...]:
    return tuple(loop for loop in LOOPS if loop != "padded" or w.pads)


# --------------------------------------------------------------------------- the loop
@dataclass
class StepRecord:
    """One optimizer step's micro-step as measured: bytes alive at its start and its peak (absolute,
    since the run began), and what the planned side did in it."""

    start: int
    peak: int
    kind: str = "unplanned"  # autoplan's kind: warmup, record, planned; "planned" for PlannedExecution
    entry: str | None = None  # the plan's entry followed or recorded
    diverged: bool = False
    safe_from: int | None = None  # the saved tensor from which the step ran in safe mode (left its plan)


@dataclass
class Run:
    losses: list[float] = field(default_factory=list)
    steps: list[StepRecord] = field(default_factory=list)
    state: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    #: garbage collections that ran on another thread and freed objects during the run: frees the
    #: timeline did not see (AllocatorTimeline.foreign_collections)
    foreign_collections: int = 0


def _optimizer(model: nn.Module, loop: str) -> torch.optim.Optimizer:
    params = [p for p in model.parameters() if p.requires_grad]
    if loop == "groups":  # the last parameters join the optimizer midway (add_param_group)
        params = params[:-2]
    return _optimizer_of(params)


def _optimizer_of(params: list[nn.Parameter]) -> torch.optim.Optimizer:
    """AdamW with two groups: weight decay on matrices, none on vectors."""
    decay = [p for p in params if p.dim() > 1]
    rest = [p for p in params if p.dim() <= 1]
    return torch.optim.AdamW([{"params": decay, "weight_decay": 0.01}, {"params": rest, "weight_decay": 0.0}],
                             lr=1e-3)


def seed_everything(seed: int) -> None:
    """torch's, NumPy's and Python's generators (wav2vec2's time masking draws from NumPy)."""
    import random

    import numpy as np

    torch.manual_seed(seed)
    np.random.seed(seed)
    random.seed(seed)


def _flat(x: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(x, dict):
        out: dict[str, Any] = {}
        for k, v in x.items():
            out.update(_flat(v, f"{prefix}{k}."))
        return out
    if isinstance(x, (list, tuple)):
        out = {}
        for i, v in enumerate(x):
            out.update(_flat(v, f"{prefix}{i}."))
        return out
    return {prefix: x.detach().clone() if isinstance(x, torch.Tensor) else x}


def state_of(model: nn.Module, opt: torch.optim.Optimizer) -> dict[str, Any]:
    return {"model": {k: v.detach().clone() for k, v in model.state_dict().items()},
            "optimizer": _flat(opt.state_dict())}


def differences(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    out = []
    for part in ("model", "optimizer"):
        x, y = a[part], b[part]
        if x.keys() != y.keys():
            out.append(f"{part} keys")
            continue
        for k, u in x.items():
            v = y[k]
            same = torch.equal(u, v) if isinstance(u, torch.Tensor) else (u == v or (
                isinstance(u, float) and math.isnan(u) and math.isnan(v)))
            if not same:
                out.append(f"{part}[{k}]")
    return out


@contextmanager
def host_rng_states() -> Iterator[None]:
    """``torch.get_rng_state()`` allocating beside the device: activation checkpointing keeps the
    CPU generator's state (5,056 bytes a call) to replay dropout, a CPU tensor that on a GPU is
    host memory.  On the CPU standing in for the device the allocator's timeline would count it;
    the run's timeline leaves it out, as it does the runtime's host buffers (AllocatorTimeline.aside)."""
    from dqn_swap.meter import AllocatorTimeline

    get = torch.get_rng_state

    def aside() -> torch.Tensor:
        with AllocatorTimeline.aside():
            return get()

    torch.get_rng_state = aside
    try:
        yield
    finally:
        torch.get_rng_state = get


def run_loop(w: Workload, loop: str, precision: str, steps: int, planned: Callable[[nn.Module, Any], Any] | None = None,
             measure: bool = True) -> tuple[Run, Any]:
    """Train ``w`` for ``steps`` optimizer steps of ``loop`` in ``precision`` ("fp32" or "bf16" autocast).

    ``planned(model, optimizer)`` gives the planned side: an :class:`~dqn_swap.integrations.AutoPlan`
    (its ``step()`` opens each micro-step) or a context manager such as a
    :class:`~dqn_swap.runtime.PlannedExecution`; ``None`` trains unplanned.  Returns the run and
    the planned side.  With ``measure``, one allocator timeline covers the whole run, from before the
    model is built: every step's start and peak are bytes alive since then (the batch is made inside)."""
    from dqn_swap.meter import AllocatorTimeline

    data = w.batches(steps * (2 if loop == "accumulate" else 1), padded=loop == "padded")
    timeline = AllocatorTimeline(own_blocks=True) if measure else nullcontext()
    run = Run()
    side = None
    marks: list[tuple[str, dict[str, Any]]] = []
    with timeline, host_rng_states():
        model = w.build()
        model.train()
        opt = _optimizer(model, loop)
        side = planned(model, opt) if planned is not None else None
        seed_everything(SEED + 1)  # dropout, layerdrop and time masking draw the same in every run
        micro = 2 if loop == "accumulate" else 1
        out = None
        for step in range(steps):
            if loop == "groups" and step == 2:
                have = {id(p) for g in opt.param_groups for p in g["params"]}
                opt.add_param_group({"params": [p for p in model.parameters() if id(p) not in have], "lr": 5e-4})
            for k in range(micro):
                gc.collect()
                name = f"step{step}.{k}"
                info: dict[str, Any] = {}
                if measure:
                    AllocatorTimeline.instant(name + "<")
                if True:
                    batch = {key: v.clone() if isinstance(v, torch.Tensor) else v
                             for key, v in data[step * micro + k].items()}
                    ctx = (side.step() if hasattr(side, "step") else side) if side is not None else nullcontext()
                    auto = (torch.autocast("cpu", dtype=torch.bfloat16) if precision == "bf16" else nullcontext())
                    with ctx:
                        with auto:
                            out = model(**batch)
                            loss = w.loss(out)
                        if loop == "accumulate":
                            loss = loss / micro
                        if loop == "retain":
                            loss.backward(retain_graph=True)
                            loss.backward()
                        else:
                            loss.backward()
                    if hasattr(side, "step"):
                        info["kind"] = side.last
                        info["entry"] = side.last_entry.key if side.last_entry is not None else None
                    elif side is not None:
                        info["kind"] = "planned"
                        info["diverged"] = bool(side.stats is not None and side.stats.diverged)
                        if info["diverged"]:
                            info["safe_from"] = side.stats.diverged_at
                    run.losses.append(float(loss.detach().float()))
                    if k == micro - 1:
                        if loop == "accumulate":
                            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                        opt.step()
                        opt.zero_grad(set_to_none=True)
                    del loss, batch
                    if loop != "held":  # held: the loop's name for the outputs is bound again at the next call
                        out = None
                if measure:
                    AllocatorTimeline.instant(name + ">")
                marks.append((name, info))
        out = None
        run.state = state_of(model, opt)
    if measure:
        run.foreign_collections = timeline.foreign_collections
        for name, info in marks:
            before, peak = timeline.between(name + "<", name + ">")
            run.steps.append(StepRecord(before, peak, info.get("kind", "unplanned"), info.get("entry"),
                                        bool(info.get("diverged", False)), info.get("safe_from")))
    if hasattr(side, "step"):  # a recorded step's plan is made after it (at the optimizer's step)
        for i, s in enumerate(run.steps):
            if s.kind == "record":
                s.entry = side.recorded.get(i)
    return run, side


# --------------------------------------------------------------------------- shapes that never repeat
def sampled_graph_batches(n: int, nodes: int = 2000, edges: int = 8000, seeds: int = 24,
                          seed: int = SEED) -> list[dict[str, Any]]:
    """Mini-batches of a fixed random graph by neighbour sampling: ``seeds`` random target nodes and
    their two-hop neighbourhood (``torch_geometric.utils.k_hop_subgraph``), relabelled; the loss
    is on the targets.  Every batch has another node and edge count."""
    from torch_geometric.utils import k_hop_subgraph

    g = torch.Generator().manual_seed(seed)
    x = torch.randn(nodes, 16, generator=g)
    edge_index = torch.randint(0, nodes, (2, edges), generator=g)
    y = torch.randint(0, 4, (nodes,), generator=g)
    out = []
    for _ in range(n):
        targets = torch.randperm(nodes, generator=g)[:seeds]
        subset, sub_edges, mapping, _ = k_hop_subgraph(targets, 2, edge_index, relabel_nodes=True, num_nodes=nodes)
        labels = torch.full((len(subset),), -100, dtype=torch.long)
        labels[mapping] = y[targets]
        out.append({"x": x[subset], "edge_index": sub_edges, "labels": labels})
    return out


class _SampledGNN(_PyG):
    def forward(self, x: torch.Tensor, edge_index: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
        for conv in self.convs:
            x = F.dropout(F.relu(conv(x, edge_index)), 0.1, self.training)
        return {"loss": F.cross_entropy(self.head(x), labels, ignore_index=-100)}


def unpadded_text_batches(n: int, low: int = 8, high: int = 48, seed: int = SEED) -> list[dict[str, Any]]:
    """Batches of 4 sequences of one random length in [low, high] each, unpadded (a length-grouped
    sampler without padding)."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        length = int(torch.randint(low, high + 1, (1,), generator=g))
        ids = torch.randint(3, 96, (BATCH, length), generator=g)
        out.append({"input_ids": ids, "labels": ids.clone()})
    return out


#: (name, model factory, batches(n)) of the workloads whose shapes change at every step.
VARYING: dict[str, tuple[Callable[[], nn.Module], Callable[[int], list[dict[str, Any]]]]] = {
    "pyg-gcn-sampled": (_seeded(lambda: _SampledGNN("gcn")), sampled_graph_batches),
    "pyg-sage-sampled": (_seeded(lambda: _SampledGNN("sage")), sampled_graph_batches),
    "gpt2-unpadded": (_seeded(lambda: _tf().GPT2LMHeadModel(_tf().GPT2Config(
        vocab_size=96, n_embd=32, n_layer=2, n_head=4, n_positions=64))), unpadded_text_batches),
}


def run_varying(name: str, steps: int, planned: Callable[[nn.Module, Any], Any] | None = None) -> tuple[Run, Any]:
    """:func:`run_loop`'s plain loop over a workload of :data:`VARYING` (loss: ``out["loss"]`` or
    ``out.loss``)."""
    build, batches = VARYING[name]
    data = batches(steps)
    w = Workload(name, "varying", build, lambda g, padded: {}, loss=lambda out: out["loss"] if isinstance(out, dict)
                 else out.loss)
    w.batches = lambda n, padded=False: data[:n]  # type: ignore[method-assign]
    return run_loop(w, "plain", "fp32", steps, planned)
