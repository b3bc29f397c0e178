"""A speech encoder of the corpus generator's ``audio_encoder`` family (:mod:`dqn_swap.models.generator`).

:class:`AudioEncoder` is a convolutional front-end followed by a transformer encoder and a
linear classifier per frame:

* ``"waveform"``: wav2vec 2.0's feature encoder (Baevski et al., NeurIPS 2020): seven 1D
  convolutions of ``conv_width`` channels, kernels (10, 3, 3, 3, 3, 2, 2) and strides
  (5, 2, 2, 2, 2, 2, 2) -- one frame per 320 samples -- with GELU, group norm after the
  first; then a linear projection to ``d_model``.
* ``"mel"``: Whisper's encoder stem (Radford et al., "Robust Speech Recognition via
  Large-Scale Weak Supervision", 2022): log-mel frames (batch, ``mels``, 2T) through two
  3-wide 1D convolutions with GELU, the second of stride 2, to T frames of ``d_model``.

Then learned position embeddings, ``layers`` pre-norm encoder blocks
(:class:`~dqn_swap.models.transformer.Block`, unmasked), a final layer norm and a linear
head to ``classes`` per frame, trained with cross entropy per frame (frame classification;
departure from both papers: no quantiser/contrastive loss, no text decoder, and no CTC
alignment -- a per-frame cross entropy has CTC's activations without its dynamic program).
Weights use PyTorch's default initialisation (values, not memory).
"""

from __future__ import annotations

import torch
from torch import nn

from .transformer import Block, GPTConfig

#: wav2vec 2.0's feature encoder: (kernel, stride) of each convolution.
WAV2VEC_CONVS = ((10, 5), (3, 2), (3, 2), (3, 2), (3, 2), (2, 2), (2, 2))


def waveform_samples(frames: int) -> int:
    """The waveform length the ``"waveform"`` front-end turns into exactly ``frames`` frames."""
    n = frames
    for kernel, stride in reversed(WAV2VEC_CONVS):
        n = (n - 1) * stride + kernel
    return n


class AudioEncoder(nn.Module):
    """Maps a waveform (batch, samples) or log-mel frames (batch, mels, 2 * frames) to logits
    (batch, frames, classes)."""

    def __init__(self, front: str, frames: int, layers: int, d_model: int, heads: int, classes: int,
                 mels: int = 80, conv_width: int = 512) -> None:
        super().__init__()
        if front == "waveform":
            convs: list[nn.Module] = []
            cin = 1
            for i, (kernel, stride) in enumerate(WAV2VEC_CONVS):
                convs.append(nn.Conv1d(cin, conv_width, kernel, stride, bias=False))
                if i == 0:
                    convs.append(nn.GroupNorm(conv_width, conv_width))
                convs.append(nn.GELU())
                cin = conv_width
            self.front = nn.Sequential(*convs)
            self.project = nn.Sequential(nn.LayerNorm(conv_width), nn.Linear(conv_width, d_model))
        elif front == "mel":
            self.front = nn.Sequential(nn.Conv1d(mels, d_model, 3, 1, 1), nn.GELU(),
                                       nn.Conv1d(d_model, d_model, 3, 2, 1), nn.GELU())
            self.project = nn.Identity()
        else:
            raise ValueError(f"unknown audio front-end {front!r}: 'waveform' or 'mel'")
        self.waveform = front == "waveform"
        cfg = GPTConfig(layers=layers, d_model=d_model, heads=heads, seq_len=frames, vocab=1, causal=False)
        self.pos = nn.Parameter(torch.zeros(1, frames, d_model))
        self.blocks = nn.Sequential(*(Block(cfg) for _ in range(layers)))
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.waveform:
            x = x.unsqueeze(1)
        x = self.project(self.front(x).transpose(1, 2)) + self.pos
        return self.head(self.norm(self.blocks(x)))


__all__ = ["AudioEncoder", "WAV2VEC_CONVS", "waveform_samples"]
