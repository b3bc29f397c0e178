"""Hugging Face transformers of the corpus generator's ``hf_seq2seq`` and ``hf_decoder`` families
(:mod:`dqn_swap.models.generator`), built from sampled small configurations.

As in :mod:`dqn_swap.models.hf`: the model comes from its configuration with random weights
(``AutoModelFor*.from_config``, nothing downloaded), directly on ``meta`` when recorded
there, its tied embeddings tied by the library; it is called the way it trains
(:class:`~dqn_swap.models.hf.HFTraining`: the batch and its labels in, ``output.loss`` out).

* ``hf_seq2seq``: T5 (Raffel et al., JMLR 2020), BART (Lewis et al., ACL 2020) or Marian
  (Junczys-Dowmunt et al., ACL 2018) encoder-decoders with cross-attention, trained with
  teacher forcing: source tokens in, target tokens as labels (the library shifts them into
  the decoder's inputs).  Attention is the library's ``"eager"`` implementation: with
  ``"sdpa"``, BART and Marian decide whether their causal mask can be skipped by reading
  the mask's values, which ``meta`` tensors do not have.  (Departure from the library's
  default for BART and Marian; the eager path keeps each attention probability tensor, as
  :class:`~dqn_swap.models.transformer.CausalSelfAttention` does.)
* ``hf_decoder``: GPT-2 (Radford et al. 2019) or Llama (Touvron et al. 2023, grouped-query
  attention with ``kv_heads``) causal language models, next-token labels; the library's
  default attention.

Needs ``transformers`` (``pip install 'dqn-swap[hf]'``).
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
from torch import nn

from .hf import HFTraining, _transformers


def seq2seq_config(c: dict[str, Any]) -> Any:
    """The configuration of sampled ``hf_seq2seq`` sizes ``c`` (kind, layers, d_model, heads, ffn, vocab)."""
    tf = _transformers()
    kind, d, heads, ffn, vocab = c["kind"], c["d_model"], c["heads"], c["ffn"], c["vocab"]
    if kind == "t5":
        cfg = tf.AutoConfig.for_model("t5", vocab_size=vocab, d_model=d, d_kv=d // heads, d_ff=ffn,
                                      num_layers=c["encoder_layers"], num_decoder_layers=c["decoder_layers"],
                                      num_heads=heads, decoder_start_token_id=0, pad_token_id=0, eos_token_id=1)
    else:
        positions = max(c["source_len"], c["target_len"])
        cfg = tf.AutoConfig.for_model(kind, vocab_size=vocab, d_model=d, encoder_layers=c["encoder_layers"],
                                      decoder_layers=c["decoder_layers"], encoder_attention_heads=heads,
                                      decoder_attention_heads=heads, encoder_ffn_dim=ffn, decoder_ffn_dim=ffn,
                                      max_position_embeddings=positions, pad_token_id=1, bos_token_id=0,
                                      eos_token_id=2, decoder_start_token_id=2)
    cfg._attn_implementation = "eager"
    return cfg


def decoder_config(c: dict[str, Any]) -> Any:
    """The configuration of sampled ``hf_decoder`` sizes ``c`` (kind, layers, d_model, heads, ffn, vocab, seq_len)."""
    tf = _transformers()
    if c["kind"] == "gpt2":
        return tf.AutoConfig.for_model("gpt2", n_layer=c["layers"], n_embd=c["d_model"], n_head=c["heads"],
                                       n_inner=c["ffn"], vocab_size=c["vocab"], n_positions=c["seq_len"],
                                       bos_token_id=0, eos_token_id=0)
    return tf.AutoConfig.for_model("llama", num_hidden_layers=c["layers"], hidden_size=c["d_model"],
                                   intermediate_size=c["ffn"], num_attention_heads=c["heads"],
                                   num_key_value_heads=c["kv_heads"], vocab_size=c["vocab"],
                                   max_position_embeddings=c["seq_len"], bos_token_id=0, eos_token_id=0)


def hf_family_parts(family: str, c: dict[str, Any], batch: int, data: Any) -> tuple[nn.Module, tuple, Any, Any]:
    """(model, (tokens, labels), loss, optimizer factory) of ``family`` with sizes ``c`` at ``batch``;
    ``data`` draws the tokens on the target device (``dqn_swap.models.registry._Sampler``)."""
    tf = _transformers()
    device = data.device
    place = torch.device("meta") if device.type == "meta" else contextlib.nullcontext()
    if family == "hf_seq2seq":
        config, auto = seq2seq_config(c), tf.AutoModelForSeq2SeqLM
        inputs = data.randint(c["vocab"], batch, c["source_len"])
        labels = data.randint(c["vocab"], batch, c["target_len"])
    else:
        config, auto = decoder_config(c), tf.AutoModelForCausalLM
        inputs = data.randint(c["vocab"], batch, c["seq_len"])
        labels = inputs  # the model shifts them for next-token prediction
    with place:
        model = auto.from_config(config)
    wrapped = HFTraining(model, "input_ids").to(device)

    def make_optimizer(params: Any) -> torch.optim.Optimizer:
        return torch.optim.AdamW(params, lr=1e-4, foreach=False)

    return wrapped, (inputs, labels), (lambda out: out.loss), make_optimizer


__all__ = ["decoder_config", "hf_family_parts", "seq2seq_config"]
