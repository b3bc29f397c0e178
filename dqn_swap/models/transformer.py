"""GPT-style decoder-only transformer, Radford et al., "Language Models are Unsupervised
Multitask Learners" (GPT-2), 2019, on the Transformer of Vaswani et al. 2017: learned
token and position embeddings, pre-LayerNorm blocks with causal multi-head self-attention
and a 4x GELU MLP, final LayerNorm, linear head to the vocabulary.  Departures: the head
is not tied to the token embedding, and weights use PyTorch's default initialisation
instead of GPT-2's N(0, 0.02) with scaled residual projections (values, not memory)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class GPTConfig:
    layers: int = 12
    d_model: int = 768
    heads: int = 12
    seq_len: int = 512
    vocab: int = 50257
    dropout: float = 0.1
    #: False: every position attends to every other (an encoder, as in BERT or ViT).
    causal: bool = True


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention written out op by op (unmasked if ``cfg.causal`` is False).

    ``F.scaled_dot_product_attention`` would fuse scores, mask, softmax and dropout into one
    kernel (flash / memory-efficient attention) that saves only its own compact state;
    writing q@k^T, masking, softmax, dropout and @v explicitly keeps each (batch, heads,
    seq, seq) intermediate a separate saved tensor, which is what a memory planner must see.
    """

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.heads = cfg.heads
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model)
        self.attn_drop = nn.Dropout(cfg.dropout)
        self.resid_drop = nn.Dropout(cfg.dropout)
        mask = torch.ones(cfg.seq_len, cfg.seq_len, dtype=torch.bool).tril() if cfg.causal else None
        self.register_buffer("causal", mask, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in self.qkv(x).split(d, dim=2))
        scores = (q @ k.transpose(-2, -1)) * (d // self.heads) ** -0.5
        if self.causal is not None:
            scores = scores.masked_fill(~self.causal[:t, :t], float("-inf"))
        y = self.attn_drop(F.softmax(scores, dim=-1)) @ v
        return self.resid_drop(self.proj(y.transpose(1, 2).reshape(b, t, d)))


class Block(nn.Module):
    """x + attn(LN(x)), then x + MLP(LN(x))."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.d_model)
        self.attn = CausalSelfAttention(cfg)
        self.ln2 = nn.LayerNorm(cfg.d_model)
        self.mlp = nn.Sequential(
            nn.Linear(cfg.d_model, 4 * cfg.d_model), nn.GELU(),
            nn.Linear(4 * cfg.d_model, cfg.d_model), nn.Dropout(cfg.dropout),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    """Maps token ids (batch, seq <= cfg.seq_len) to logits (batch, seq, vocab)."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.tok = nn.Embedding(cfg.vocab, cfg.d_model)
        self.pos = nn.Embedding(cfg.seq_len, cfg.d_model)
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.Sequential(*(Block(cfg) for _ in range(cfg.layers)))
        self.ln_f = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.drop(self.tok(tokens) + self.pos(positions))
        return self.head(self.ln_f(self.blocks(x)))
