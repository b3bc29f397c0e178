"""Random networks by family: a corpus for planners that must plan networks they have never seen.

A planner trained on five networks learns five answers; one trained on the space of
networks can learn the structure of plans.  This module samples that space.  A
*family* is an architecture with its sizes left open (:mod:`dqn_swap.models.families`
and the zoo's own networks); a :class:`NetworkSpec` fixes them -- depth, width,
resolution or sequence length, batch size and device profile -- from a family name and
a seed, reproducibly (NumPy's ``default_rng`` seeded with the family and the seed).

Families are split, by family, into training, validation and test sets
(:data:`FAMILIES`, :func:`family_names`): a planner is trained on the training
families, tuned on the validation families, and its generalization is measured on the
test families, which it has never seen:

==========  =================================================================================
split       families
==========  =================================================================================
train       plain_cnn, residual_cnn, bottleneck_cnn, encoder_decoder_cnn, decoder_transformer,
            recurrent_lm, deep_mlp, grouped_cnn (ResNeXt/ConvNeXt), video_cnn (3D
            convolutions), hf_decoder (Hugging Face GPT-2/Llama)
validation  dense_cnn, text_encoder, inception_cnn (multi-branch), audio_encoder (1D-conv
            front-end and transformer encoder), graph_network (PyTorch Geometric GCN/GIN/GAT)
test        inverted_residual_cnn (MobileNetV2), vision_transformer, gru_seq2seq,
            wide_residual_cnn, mlp_mixer -- the five kinds of network the shipped agent was
            measured on outside the zoo -- and se_cnn (squeeze-excitation and stochastic
            depth), hf_seq2seq (Hugging Face T5/BART/Marian with cross-attention)
==========  =================================================================================

The transformer families ``hf_seq2seq``, ``hf_decoder`` and ``audio_encoder`` draw a
``bf16`` size: True trains the forward pass under bfloat16 autocast
(:mod:`dqn_swap.models.precision`).

Every spec builds a :class:`~dqn_swap.models.Workload` (``build_workload("gen:FAMILY:SEED",
batch)``, and ``--model gen:FAMILY:SEED`` on the command line) and records on ``meta``
(:mod:`dqn_swap.models.corpus`), except where ``meta`` cannot run it
(:attr:`NetworkSpec.record_device`: bf16 autocast and PyTorch Geometric's graph networks record on ``cpu``)::

    spec = sample("mlp_mixer", seed=3)
    specs = corpus("train", per_family=20)          # 20 seeds of every training family
    trace = record_spec(spec)                       # meta, spec.profile, spec.batch_size
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

#: The splits, in the order a training run uses them.
SPLITS = ("train", "validation", "test")

Sizes = dict[str, Any]


@dataclass(frozen=True)
class Family:
    """One architecture family: how to draw its sizes and its batch size.

    ``batch``: the range batch sizes are drawn from, log-uniformly.  ``device``: where its
    networks record (``"meta"``, or ``"cpu"`` for a family whose ops read tensor values).
    """

    name: str
    split: str
    description: str
    sample: Callable[[np.random.Generator], Sizes]
    batch: tuple[int, int]
    device: str = "meta"


@dataclass(frozen=True)
class NetworkSpec:
    """One sampled network: its family, seed, batch size, device profile and sizes."""

    family: str
    seed: int
    batch_size: int
    profile: str
    sizes: tuple[tuple[str, Any], ...]

    @property
    def name(self) -> str:
        """The model name the command line accepts: ``gen:FAMILY:SEED``."""
        return f"gen:{self.family}:{self.seed}"

    @property
    def split(self) -> str:
        return FAMILIES[self.family].split

    def config(self) -> Sizes:
        return dict(self.sizes)

    @property
    def record_device(self) -> str:
        """Where the network records: its family's device, or ``"cpu"`` under bf16 autocast, which
        does not act on ``meta`` tensors (:mod:`dqn_swap.models.precision`)."""
        return "cpu" if self.config().get("bf16") else FAMILIES[self.family].device


# --------------------------------------------------------------------------- samplers
def _choice(rng: np.random.Generator, values: "list[Any] | tuple[Any, ...]") -> Any:
    return values[int(rng.integers(len(values)))]


def _int(rng: np.random.Generator, low: int, high: int) -> int:
    return int(rng.integers(low, high + 1))


def _log_int(rng: np.random.Generator, low: int, high: int) -> int:
    return int(round(float(np.exp(rng.uniform(np.log(low), np.log(high))))))


def _plain_cnn(rng: np.random.Generator) -> Sizes:
    stages, first = _int(rng, 2, 5), _choice(rng, (16, 32, 48, 64))
    return {"widths": tuple(min(512, first * 2**i) for i in range(stages)), "convs": _int(rng, 1, 3),
            "batch_norm": bool(rng.random() < 0.5), "image": _choice(rng, (32, 64, 96, 128)),
            "classes": _choice(rng, (10, 100, 1000))}


def _residual(block: str, blocks: tuple[int, int], images: tuple[int, ...]) -> Callable[[np.random.Generator], Sizes]:
    def sample(rng: np.random.Generator) -> Sizes:
        stages = _int(rng, 3, 4)
        return {"block": block, "blocks": tuple(_int(rng, *blocks) for _ in range(stages)),
                "width": _choice(rng, (16, 32, 48, 64)), "image": _choice(rng, images),
                "classes": _choice(rng, (10, 100, 1000))}

    return sample


def _encoder_decoder_cnn(rng: np.random.Generator) -> Sizes:
    levels = _int(rng, 2, 4)
    return {"levels": levels, "base": _choice(rng, (8, 16, 24, 32, 48)), "image": _choice(rng, (64, 96, 128, 192, 256)),
            "classes": _int(rng, 2, 8)}


def _decoder_transformer(rng: np.random.Generator) -> Sizes:
    d_model = 64 * _int(rng, 2, 8)
    return {"layers": _int(rng, 2, 8), "d_model": d_model, "heads": d_model // 64,
            "seq_len": _choice(rng, (64, 128, 256, 384, 512)), "vocab": _log_int(rng, 1000, 32000)}


def _recurrent_lm(rng: np.random.Generator) -> Sizes:
    return {"vocab": _log_int(rng, 50, 10000), "hidden": 64 * _int(rng, 2, 16), "layers": _int(rng, 1, 3),
            "seq_len": _int(rng, 10, 60)}


def _deep_mlp(rng: np.random.Generator) -> Sizes:
    return {"inputs": _choice(rng, (64, 256, 784, 1024)), "width": _choice(rng, (256, 512, 1024, 2048, 4096)),
            "layers": _int(rng, 3, 16), "outputs": _choice(rng, (10, 100, 1000))}


def _dense_cnn(rng: np.random.Generator) -> Sizes:
    growth = _choice(rng, (8, 12, 16, 24, 32))
    return {"blocks": tuple(_int(rng, 2, 8) for _ in range(_int(rng, 2, 4))), "growth": growth,
            "image": _choice(rng, (64, 96, 128, 160)), "classes": _choice(rng, (10, 100, 1000))}


def _text_encoder(rng: np.random.Generator) -> Sizes:
    d_model = 64 * _int(rng, 2, 8)
    return {"layers": _int(rng, 2, 8), "d_model": d_model, "heads": d_model // 64,
            "seq_len": _choice(rng, (64, 128, 256, 384)), "vocab": _log_int(rng, 1000, 30000)}


def _inverted_residual_cnn(rng: np.random.Generator) -> Sizes:
    widths = (16, 24, 32, 64, 96, 160, 320)
    n = _int(rng, 4, 7)
    stages = tuple((widths[i], _int(rng, 1, 4), 2 if i in (1, 2, 3, 5) else 1) for i in range(n))
    return {"stages": stages, "expand": _int(rng, 2, 6), "stem": _choice(rng, (16, 24, 32)),
            "image": _choice(rng, (64, 96, 128, 160, 224)), "classes": _choice(rng, (10, 100, 1000))}


#: (image side, patch side) pairs of the patch-based families: 16 to 196 tokens.
_PATCHINGS = ((32, 4), (64, 8), (96, 8), (128, 16), (224, 16), (224, 32))


def _vision_transformer(rng: np.random.Generator) -> Sizes:
    d_model = 64 * _int(rng, 2, 6)
    image, patch = _choice(rng, _PATCHINGS)
    return {"image": image, "patch": patch, "layers": _int(rng, 2, 8), "d_model": d_model, "heads": d_model // 64,
            "classes": _choice(rng, (10, 100, 1000))}


def _gru_seq2seq(rng: np.random.Generator) -> Sizes:
    return {"vocab": _log_int(rng, 100, 10000), "hidden": 64 * _int(rng, 2, 12), "layers": _int(rng, 1, 3),
            "source_len": _int(rng, 8, 40), "target_len": _int(rng, 8, 40)}


def _wide_residual_cnn(rng: np.random.Generator) -> Sizes:
    return {"block": "wide", "blocks": (_int(rng, 1, 4),) * 3, "width": 16, "widen": _int(rng, 2, 10),
            "dropout": _choice(rng, (0.0, 0.3)), "image": 32, "classes": _choice(rng, (10, 100))}


def _mlp_mixer(rng: np.random.Generator) -> Sizes:
    channels = 64 * _int(rng, 2, 8)
    image, patch = _choice(rng, _PATCHINGS)
    return {"image": image, "patch": patch, "layers": _int(rng, 2, 8), "channels": channels,
            "token_hidden": 32 * _int(rng, 2, 8), "channel_hidden": channels * _int(rng, 2, 4),
            "classes": _choice(rng, (10, 100, 1000))}


def _se_cnn(rng: np.random.Generator) -> Sizes:
    stages = _int(rng, 3, 4)
    return {"blocks": tuple(_int(rng, 1, 3) for _ in range(stages)), "width": _choice(rng, (16, 32, 48, 64)),
            "bottleneck": bool(rng.random() < 0.5), "reduction": _choice(rng, (4, 8, 16)),
            "last_survival": _choice(rng, (0.5, 0.6, 0.7, 0.8, 0.9)), "image": _choice(rng, (32, 64, 96, 128)),
            "classes": _choice(rng, (10, 100, 1000))}


def _hf_heads(rng: np.random.Generator, low: int, high: int) -> tuple[int, int]:
    """(d_model, heads): heads of 32 or 64 dimensions, d_model from ``low`` to ``high``."""
    head_dim = _choice(rng, (32, 64))
    heads = _int(rng, max(1, low // head_dim), high // head_dim)
    return heads * head_dim, heads


def _hf_seq2seq(rng: np.random.Generator) -> Sizes:
    kind = _choice(rng, ("t5", "bart", "marian"))
    d_model, heads = _hf_heads(rng, 64, 256)
    return {"kind": kind, "encoder_layers": _int(rng, 1, 4), "decoder_layers": _int(rng, 1, 4), "d_model": d_model,
            "heads": heads, "ffn": d_model * _int(rng, 2, 4), "vocab": _log_int(rng, 1000, 16000),
            "source_len": _choice(rng, (16, 32, 64, 128)), "target_len": _choice(rng, (8, 16, 32, 64)),
            "bf16": bool(rng.random() < 0.5)}


def _grouped_cnn(rng: np.random.Generator) -> Sizes:
    stages = _int(rng, 3, 4)
    return {"style": _choice(rng, ("resnext", "convnext")), "blocks": tuple(_int(rng, 1, 3) for _ in range(stages)),
            "width": _choice(rng, (32, 64, 96, 128)), "groups": _choice(rng, (4, 8, 16, 32)),
            "kernel": _choice(rng, (5, 7, 9)), "image": _choice(rng, (32, 64, 96, 128)),
            "classes": _choice(rng, (10, 100, 1000))}


def _video_cnn(rng: np.random.Generator) -> Sizes:
    stages = _int(rng, 2, 4)
    return {"blocks": tuple(_int(rng, 1, 2) for _ in range(stages)), "width": _choice(rng, (8, 16, 24, 32)),
            "factorised": bool(rng.random() < 0.5), "frames": _choice(rng, (4, 8, 16)),
            "image": _choice(rng, (32, 48, 64, 112)), "classes": _choice(rng, (10, 51, 101, 400))}


def _hf_decoder(rng: np.random.Generator) -> Sizes:
    kind = _choice(rng, ("gpt2", "llama"))
    d_model, heads = _hf_heads(rng, 64, 384)
    kv_heads = _choice(rng, tuple(k for k in (1, 2, 4, heads) if heads % k == 0))
    return {"kind": kind, "layers": _int(rng, 1, 6), "d_model": d_model, "heads": heads, "kv_heads": kv_heads,
            "ffn": d_model * _int(rng, 2, 4), "vocab": _log_int(rng, 1000, 16000),
            "seq_len": _choice(rng, (32, 64, 128, 256)), "bf16": bool(rng.random() < 0.5)}


def _inception_cnn(rng: np.random.Generator) -> Sizes:
    stages = _int(rng, 2, 3)
    return {"blocks": tuple(_int(rng, 1, 3) for _ in range(stages)), "width": _choice(rng, (16, 32, 48, 64)),
            "image": _choice(rng, (32, 64, 96, 128)), "classes": _choice(rng, (10, 100, 1000))}


def _audio_encoder(rng: np.random.Generator) -> Sizes:
    d_model = 64 * _int(rng, 2, 6)
    return {"front": _choice(rng, ("waveform", "mel")), "frames": _choice(rng, (25, 50, 100, 150)),
            "mels": _choice(rng, (40, 80, 128)), "conv_width": _choice(rng, (64, 128, 256)),
            "layers": _int(rng, 2, 6), "d_model": d_model, "heads": d_model // 64,
            "classes": _choice(rng, (32, 64, 128)), "bf16": bool(rng.random() < 0.5)}


def _graph_network(rng: np.random.Generator) -> Sizes:
    nodes = _log_int(rng, 100, 1000)
    return {"conv": _choice(rng, ("gcn", "gin", "gat")), "nodes": nodes, "edges": nodes * _int(rng, 2, 8),
            "features": _choice(rng, (16, 64, 128, 256)), "hidden": _choice(rng, (32, 64, 128, 256)),
            "heads": _choice(rng, (2, 4, 8)), "layers": _int(rng, 2, 4), "classes": _int(rng, 2, 40)}


#: Every family, by name, with its split.
FAMILIES: dict[str, Family] = {f.name: f for f in (
    Family("plain_cnn", "train", "VGG-style 3x3 convolution stacks", _plain_cnn, (8, 256)),
    Family("residual_cnn", "train", "ResNet of basic blocks", _residual("basic", (1, 4), (32, 64, 96, 128)),
           (8, 256)),
    Family("bottleneck_cnn", "train", "ResNet of bottleneck blocks",
           _residual("bottleneck", (1, 6), (64, 96, 128, 160)), (8, 128)),
    Family("encoder_decoder_cnn", "train", "U-Net encoder-decoder with skip connections", _encoder_decoder_cnn,
           (2, 32)),
    Family("decoder_transformer", "train", "GPT-style causal decoder", _decoder_transformer, (2, 32)),
    Family("recurrent_lm", "train", "unrolled LSTM language model", _recurrent_lm, (16, 256)),
    Family("deep_mlp", "train", "fully connected layers with layer norm", _deep_mlp, (64, 4096)),
    Family("dense_cnn", "validation", "DenseNet-BC dense blocks", _dense_cnn, (8, 128)),
    Family("text_encoder", "validation", "BERT-style bidirectional encoder", _text_encoder, (2, 32)),
    Family("inverted_residual_cnn", "test", "MobileNetV2-style inverted residuals", _inverted_residual_cnn,
           (16, 128)),
    Family("vision_transformer", "test", "ViT: patch embedding and encoder blocks", _vision_transformer, (16, 128)),
    Family("gru_seq2seq", "test", "GRU encoder-decoder, teacher forcing", _gru_seq2seq, (16, 256)),
    Family("wide_residual_cnn", "test", "wide ResNet (pre-activation, dropout)", _wide_residual_cnn, (16, 128)),
    Family("mlp_mixer", "test", "MLP-Mixer token and channel mixing", _mlp_mixer, (16, 128)),
    Family("se_cnn", "test", "ResNet with squeeze-excitation and stochastic depth (drop path)", _se_cnn, (8, 128)),
    Family("hf_seq2seq", "test", "Hugging Face T5/BART/Marian encoder-decoder, cross-attention", _hf_seq2seq,
           (2, 32)),
    Family("grouped_cnn", "train", "ResNeXt grouped 3x3 or ConvNeXt depthwise large-kernel blocks", _grouped_cnn,
           (8, 128)),
    Family("video_cnn", "train", "3D (or (2+1)D) residual convolutions over video clips", _video_cnn, (2, 32)),
    Family("hf_decoder", "train", "Hugging Face GPT-2/Llama causal language model", _hf_decoder, (2, 32)),
    Family("inception_cnn", "validation", "inception blocks: four branches concatenated", _inception_cnn, (8, 128)),
    Family("audio_encoder", "validation", "wav2vec/Whisper-style 1D-conv front-end and transformer encoder",
           _audio_encoder, (2, 32)),
    Family("graph_network", "validation", "PyTorch Geometric GCN/GIN/GAT node classification", _graph_network,
           (1, 4), device="cpu"),
)}


#: The family each zoo and Hugging Face network belongs to (None: no family's, e.g. K-means), so
#: that a network of a held-out family is never trained on, whichever way it is named.
ZOO_FAMILIES: dict[str, str | None] = {
    **{f"resnet{d}": "residual_cnn" for d in (18, 34)},
    **{f"resnet{d}": "bottleneck_cnn" for d in (50, 101, 152, 1001, 1517)},
    "resnet_sd": "residual_cnn", "resnet_tiny": "residual_cnn", "vgg16": "plain_cnn", "vgg19": "plain_cnn",
    "densenet121": "dense_cnn", "unet": "encoder_decoder_cnn", "lstm": "recurrent_lm", "lstm_short": "recurrent_lm",
    "gpt": "decoder_transformer", "gpt_tiny": "decoder_transformer", "kmeans": None, "mlp_tiny": "deep_mlp",
    "hf:gpt2": "hf_decoder", "hf:llama": "hf_decoder", "hf:bert": "text_encoder",
    "hf:vit": "vision_transformer",
}


def family_of(model: str) -> str | None:
    """The family of a model name: ``gen:FAMILY:SEED``, a zoo name or ``hf:NAME`` (None: none)."""
    if model.startswith("gen:"):
        return parse_name(model)[0]
    if model not in ZOO_FAMILIES:
        raise ValueError(f"no family is known for {model!r}; known: {', '.join(ZOO_FAMILIES)}, gen:FAMILY:SEED")
    return ZOO_FAMILIES[model]


def split_of(model: str) -> str | None:
    """The split a model belongs to by its family (None: it has none)."""
    family = family_of(model)
    return None if family is None else FAMILIES[family].split


def family_names(split: str | None = None) -> tuple[str, ...]:
    """The families of ``split`` (all of them for None), in a fixed order."""
    if split is not None and split not in SPLITS:
        raise ValueError(f"unknown split {split!r}: one of {', '.join(SPLITS)}")
    return tuple(name for name, f in FAMILIES.items() if split is None or f.split == split)


def _family(name: str) -> Family:
    try:
        return FAMILIES[name]
    except KeyError:
        raise ValueError(f"unknown network family {name!r}; families: {', '.join(FAMILIES)}") from None


def sample(family: str, seed: int, *, profiles: tuple[str, ...] | None = None) -> NetworkSpec:
    """The network of ``family`` drawn with ``seed``: sizes, batch size and device profile."""
    from ..cost import PROFILES

    fam = _family(family)
    if not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"a network's seed is a whole number from 0 up, not {seed!r}")
    rng = np.random.default_rng([zlib.crc32(family.encode()), int(seed)])
    sizes = fam.sample(rng)
    batch = _log_int(rng, *fam.batch)
    profile = _choice(rng, tuple(profiles or sorted(PROFILES)))
    return NetworkSpec(family, int(seed), batch, profile, tuple(sizes.items()))


def corpus(split: str, per_family: int, first_seed: int = 0) -> list[NetworkSpec]:
    """``per_family`` networks (seeds ``first_seed`` on) of every family of ``split``."""
    return [sample(f, s) for f in family_names(split) for s in range(first_seed, first_seed + per_family)]


def parse_name(name: str) -> tuple[str, int]:
    """``"gen:FAMILY:SEED"`` as (family, seed); ``ValueError`` naming the form otherwise."""
    parts = name.split(":")
    if len(parts) != 3 or parts[0] != "gen" or not parts[2].isdigit():
        raise ValueError(f"a generated network is named gen:FAMILY:SEED (e.g. gen:mlp_mixer:3), not {name!r}; "
                         f"families: {', '.join(FAMILIES)}")
    _family(parts[1])
    return parts[1], int(parts[2])


# --------------------------------------------------------------------------- building
def build_parts(spec: NetworkSpec, batch: int, data: Any) -> tuple:
    """(model, inputs, loss_fn, optimizer factory) of ``spec`` at ``batch``; ``data`` draws inputs
    (:class:`dqn_swap.models.registry._Sampler`).  Called on the target device."""
    parts = (_image_parts if spec.family in _IMAGE_FAMILIES else _other_parts)(spec.family, spec.config(), batch,
                                                                               data)
    if parts is None:
        raise AssertionError(f"family {spec.family!r} has no builder")
    return parts


#: The families whose inputs are images (or clips) and whose targets are labels per image or pixel.
_IMAGE_FAMILIES = ("plain_cnn", "residual_cnn", "bottleneck_cnn", "wide_residual_cnn", "inverted_residual_cnn",
                   "dense_cnn", "vision_transformer", "mlp_mixer", "encoder_decoder_cnn", "se_cnn", "grouped_cnn",
                   "inception_cnn", "video_cnn")


def _classify(model: Any, batch: int, data: Any, image: int, classes: int) -> tuple:
    """Images of ``image`` pixels square, one class label each, cross entropy, SGD with momentum."""
    import torch.nn.functional as F

    from .optim import sgd_momentum

    target = data.randint(classes, batch)
    return model, (data.randn(batch, 3, image, image),), lambda out: F.cross_entropy(out, target), sgd_momentum


def _mixed(model: Any, c: dict[str, Any]) -> Any:
    """``model`` under bf16 autocast if the spec draws it (:mod:`dqn_swap.models.precision`)."""
    if not c.get("bf16"):
        return model
    from .precision import Autocast

    return Autocast(model)


def _image_parts(f: str, c: dict[str, Any], batch: int, data: Any) -> tuple | None:
    """:func:`build_parts` of the :data:`_IMAGE_FAMILIES`."""
    import torch.nn.functional as F

    from . import cnn_families as cf
    from . import families as fm
    from .densenet import DenseNet
    from .optim import sgd_momentum
    from .unet import UNet

    if f == "plain_cnn":
        model = fm.PlainCNN(c["widths"], c["convs"], c["batch_norm"], c["classes"])
    elif f in ("residual_cnn", "bottleneck_cnn", "wide_residual_cnn"):
        model = fm.ResidualCNN(c["block"], c["blocks"], c["width"], c["classes"], c.get("widen", 1),
                               c.get("dropout", 0.0))
    elif f == "inverted_residual_cnn":
        model = fm.InvertedResidualCNN(c["stages"], c["expand"], c["stem"], c["classes"])
    elif f == "dense_cnn":
        model = DenseNet(c["blocks"], c["growth"], 2 * c["growth"], num_classes=c["classes"])
    elif f == "vision_transformer":
        model = fm.VisionTransformer(c["image"], c["patch"], c["layers"], c["d_model"], c["heads"], c["classes"])
    elif f == "mlp_mixer":
        model = fm.MLPMixer(c["image"], c["patch"], c["layers"], c["channels"], c["token_hidden"],
                            c["channel_hidden"], c["classes"])
    elif f == "se_cnn":
        model = cf.SECNN(c["blocks"], c["width"], c["bottleneck"], c["reduction"], c["last_survival"], c["classes"])
    elif f == "grouped_cnn":
        model = cf.GroupedCNN(c["style"], c["blocks"], c["width"], c["groups"], c["kernel"], c["classes"])
    elif f == "inception_cnn":
        model = cf.InceptionCNN(c["blocks"], c["width"], c["classes"])
    elif f == "encoder_decoder_cnn":
        target = data.randint(c["classes"], batch, c["image"], c["image"])
        model = UNet(3, c["classes"], c["base"], c["levels"])
        return model, (data.randn(batch, 3, c["image"], c["image"]),), lambda out: F.cross_entropy(out, target), \
            sgd_momentum
    elif f == "video_cnn":
        target = data.randint(c["classes"], batch)
        clips = data.randn(batch, 3, c["frames"], c["image"], c["image"])
        model = cf.VideoCNN(c["frames"], c["blocks"], c["width"], c["factorised"], c["classes"])
        return model, (clips,), lambda out: F.cross_entropy(out, target), sgd_momentum
    else:
        return None
    return _classify(model, batch, data, c["image"], c["classes"])


def _other_parts(f: str, c: dict[str, Any], batch: int, data: Any) -> tuple | None:
    """:func:`build_parts` of the families of sequences, audio, graphs and vectors."""
    import torch.nn.functional as F

    from . import families as fm
    from .optim import adam, sgd_momentum

    def language(model: Any, vocab: int, seq: int) -> tuple:
        tokens = data.randint(vocab, batch, seq + 1)
        inputs, target = tokens[:, :-1].contiguous(), tokens[:, 1:].reshape(-1)
        return model, (inputs,), lambda out: F.cross_entropy(out.reshape(-1, vocab), target), adam

    if f == "decoder_transformer":
        from .transformer import GPT, GPTConfig

        cfg = GPTConfig(layers=c["layers"], d_model=c["d_model"], heads=c["heads"], seq_len=c["seq_len"],
                        vocab=c["vocab"])
        return language(GPT(cfg), c["vocab"], c["seq_len"])
    if f == "text_encoder":
        return language(fm.TextEncoder(c["vocab"], c["seq_len"], c["layers"], c["d_model"], c["heads"]), c["vocab"],
                        c["seq_len"])
    if f == "recurrent_lm":
        from .rnn import CharLSTM

        return language(CharLSTM(c["vocab"], c["hidden"], c["layers"]), c["vocab"], c["seq_len"])
    if f == "gru_seq2seq":
        source = data.randint(c["vocab"], batch, c["source_len"])
        target = data.randint(c["vocab"], batch, c["target_len"] + 1)
        decoder_in, labels = target[:, :-1].contiguous(), target[:, 1:].reshape(-1)
        model = fm.GRUSeq2Seq(c["vocab"], c["hidden"], c["layers"])
        return model, (source, decoder_in), \
            lambda out: F.cross_entropy(out.reshape(-1, c["vocab"]), labels), adam
    if f == "deep_mlp":
        target = data.randint(c["outputs"], batch)
        model = fm.DeepMLP(c["inputs"], c["width"], c["layers"], c["outputs"])
        return model, (data.randn(batch, c["inputs"]),), lambda out: F.cross_entropy(out, target), sgd_momentum
    if f in ("hf_seq2seq", "hf_decoder"):
        from .hf_families import hf_family_parts

        model, inputs, loss_fn, make_optimizer = hf_family_parts(f, c, batch, data)
        return _mixed(model, c), inputs, loss_fn, make_optimizer
    if f == "audio_encoder":
        from .audio import AudioEncoder, waveform_samples

        frames = c["frames"]
        model = AudioEncoder(c["front"], frames, c["layers"], c["d_model"], c["heads"], c["classes"], c["mels"],
                             c["conv_width"])
        audio = (data.randn(batch, waveform_samples(frames)) if c["front"] == "waveform"
                 else data.randn(batch, c["mels"], 2 * frames))
        target = data.randint(c["classes"], batch * frames)
        return _mixed(model, c), (audio,), \
            lambda out: F.cross_entropy(out.reshape(-1, c["classes"]).float(), target), adam
    if f == "graph_network":
        from .graph import GraphNetwork, random_graphs

        nodes = batch * c["nodes"]
        edge_index = random_graphs(batch, c["nodes"], c["edges"], data.randint)
        target = data.randint(c["classes"], nodes)
        model = GraphNetwork(c["conv"], c["features"], c["hidden"], c["layers"], c["classes"], c["heads"])
        return model, (data.randn(nodes, c["features"]), edge_index), lambda out: F.cross_entropy(out, target), adam
    return None


__all__ = ["FAMILIES", "SPLITS", "ZOO_FAMILIES", "Family", "NetworkSpec", "build_parts", "corpus", "family_names",
           "family_of", "parse_name", "sample", "split_of"]
