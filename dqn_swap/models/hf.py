"""Hugging Face transformers as workloads: ``hf:gpt2``, ``hf:llama``, ``hf:bert``, ``hf:vit``,
or ``hf:PATH`` to a model's ``config.json`` (or its folder).

The model is built from its configuration with random weights (``AutoModelFor*.from_config``):
nothing is downloaded, and the memory and time of an iteration do not depend on the weights.
It trains the way its task trains, with the library's own defaults (a causal language
model also returns its key/value cache): the batch goes in with its labels, and the
model's own loss (``output.loss``) is the loss.

=============  ====================================================  ===========================
name           architecture (small configuration; ``hf:PATH``        inputs, labels
               takes any size)
=============  ====================================================  ===========================
``hf:gpt2``    GPT-2, 2 layers, width 128, 4 heads, vocabulary 512   tokens (batch, 64), next tokens
``hf:llama``   Llama, 2 layers, width 128, 4 heads (2 key/value),    tokens (batch, 64), next tokens
               vocabulary 512
``hf:bert``    BERT for masked LM, 2 layers, width 128, 4 heads      tokens (batch, 64), the tokens
``hf:vit``     ViT, 2 layers, width 128, 4 heads, 32x32 images,      images (batch, 3, 32, 32),
               patches of 8, 10 classes                               a class each
=============  ====================================================  ===========================

Needs ``transformers`` (``pip install dqn-swap[hf]``).
"""

from __future__ import annotations

import contextlib

from pathlib import Path
from typing import Any

import torch
from torch import nn

SMALL: dict[str, dict[str, Any]] = {
    "gpt2": dict(model_type="gpt2", n_layer=2, n_embd=128, n_head=4, vocab_size=512, n_positions=128,
                 bos_token_id=0, eos_token_id=0),
    "llama": dict(model_type="llama", num_hidden_layers=2, hidden_size=128, intermediate_size=256,
                  num_attention_heads=4, num_key_value_heads=2, vocab_size=512, max_position_embeddings=128,
                  bos_token_id=0, eos_token_id=0),
    "bert": dict(model_type="bert", num_hidden_layers=2, hidden_size=128, intermediate_size=256,
                 num_attention_heads=4, vocab_size=512, max_position_embeddings=128),
    "vit": dict(model_type="vit", image_size=32, patch_size=8, num_hidden_layers=2, hidden_size=128,
                intermediate_size=256, num_attention_heads=4, num_labels=10),
}
SEQ_LEN = 64


class HFTraining(nn.Module):
    """A Hugging Face model called the way it trains: the batch and its labels in, its output out
    (``loss_fn`` reads ``output.loss``)."""

    def __init__(self, model: nn.Module, input_name: str) -> None:
        super().__init__()
        self.model = model
        self.input_name = input_name

    def forward(self, inputs: torch.Tensor, labels: torch.Tensor) -> Any:
        return self.model(**{self.input_name: inputs, "labels": labels})


def _transformers() -> Any:
    try:
        import transformers
    except ImportError:
        raise ValueError("Hugging Face models need the transformers package: pip install 'dqn-swap[hf]'") from None
    transformers.logging.set_verbosity_error()
    return transformers


def config_of(spec: str) -> Any:
    """The configuration ``spec`` names: one of :data:`SMALL`, or a config.json file or folder."""
    tf = _transformers()
    if spec in SMALL:
        fields = dict(SMALL[spec])
        return tf.AutoConfig.for_model(fields.pop("model_type"), **fields)
    path = Path(spec)
    if not path.exists():
        raise ValueError(f"unknown Hugging Face model 'hf:{spec}': name one of "
                         f"{', '.join('hf:' + n for n in SMALL)} or hf:PATH of a config.json (or of a folder holding one)")
    try:
        return tf.AutoConfig.from_pretrained(str(path), local_files_only=True)
    except Exception as e:  # the library's own validation errors derive from several bases
        raise ValueError(f"{path}: not a Hugging Face model configuration ({_first_line(e)})") from None


def hf_workload(spec: str, batch_size: int, device: torch.device, seed: int, seq_len: int | None = None
                ) -> tuple[nn.Module, tuple, Any, Any]:
    """Model, inputs, loss and optimizer factory of Hugging Face model ``spec`` (module docstring).

    A configuration the library rejects or cannot run here (a field of the wrong type, an attention
    implementation whose package is missing) is one ``ValueError`` line naming it."""
    config = config_of(spec)
    try:
        return _build(spec, config, batch_size, device, seed, seq_len)
    except ValueError as e:
        if str(e).startswith((f"Hugging Face model {spec!r}", f"{spec}:")):
            raise
        raise ValueError(f"{spec}: the Hugging Face configuration cannot be built ({_first_line(e)})") from None
    except (TypeError, ImportError, AttributeError, KeyError, RuntimeError, OverflowError) as e:
        raise ValueError(f"{spec}: the Hugging Face configuration cannot be built ({_first_line(e)})") from None


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    one = " ".join(text.split())  # messages of several lines become one
    return f"{type(e).__name__}: {one[:240]}" if text else type(e).__name__


def positions_of(config: Any) -> int:
    """The longest sequence a language model's configuration allows (its position embeddings)."""
    return int(getattr(config, "max_position_embeddings", getattr(config, "n_positions", SEQ_LEN)))


def _build(spec: str, config: Any, batch_size: int, device: torch.device, seed: int, seq_len: int | None = None
           ) -> tuple[nn.Module, tuple, Any, Any]:
    tf = _transformers()
    gen = torch.Generator().manual_seed(seed)

    def data(make: Any) -> torch.Tensor:
        return make().to(device) if device.type != "meta" else make().to("meta")

    # On meta the model is built there directly: a large configuration (a 7B Llama) never
    # materialises its weights in host memory.
    place = torch.device("meta") if device.type == "meta" else contextlib.nullcontext()
    kind = config.model_type
    if kind in ("vit", "deit", "beit", "swin", "convnext", "resnet", "dinov2"):
        if seq_len is not None:
            raise ValueError(f"{spec}: an image model ({kind}) takes no sequence length")
        with place:
            model = tf.AutoModelForImageClassification.from_config(config)
        size, classes = int(getattr(config, "image_size", 224)), int(getattr(config, "num_labels", 2))
        channels = int(getattr(config, "num_channels", 3))
        inputs = data(lambda: torch.randn(batch_size, channels, size, size, generator=gen))
        labels = data(lambda: torch.randint(0, classes, (batch_size,), generator=gen))
        wrapped = HFTraining(model, "pixel_values")
    else:
        masked = kind in ("bert", "roberta", "distilbert", "albert", "electra", "deberta", "deberta-v2")
        auto = tf.AutoModelForMaskedLM if masked else tf.AutoModelForCausalLM
        try:
            with place:
                model = auto.from_config(config)
        except ValueError as e:
            raise ValueError(f"Hugging Face model {spec!r} ({kind}) is neither a causal nor a masked language "
                             f"model nor an image classifier dqn-swap knows how to train ({str(e).splitlines()[0]})"
                             ) from None
        positions = positions_of(config)
        if seq_len is not None and seq_len > positions:
            raise ValueError(f"{spec}: a sequence of {seq_len} is longer than the {positions} positions of its "
                             "configuration")
        seq = min(SEQ_LEN, positions) if seq_len is None else seq_len
        inputs = data(lambda: torch.randint(0, int(config.vocab_size), (batch_size, seq), generator=gen))
        labels = inputs  # the model shifts them for next-token prediction; masked LM predicts them
        wrapped = HFTraining(model, "input_ids")
    wrapped = wrapped.to(device)

    def make_optimizer(params: Any) -> torch.optim.Optimizer:
        return torch.optim.AdamW(params, lr=1e-4, foreach=False)

    return wrapped, (inputs, labels), (lambda out: out.loss), make_optimizer


__all__ = ["SMALL", "HFTraining", "config_of", "hf_workload", "positions_of"]
