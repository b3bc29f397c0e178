"""Character-level LSTM language model after Karpathy's char-rnn ("The Unreasonable
Effectiveness of Recurrent Neural Networks", 2015; LSTM of Hochreiter & Schmidhuber 1997):
embedding -> 2-layer LSTM (hidden 512) -> linear to the vocabulary, cross entropy at every
step.

The LSTM is unrolled explicitly, one cell step (linear maps, gates, state update) per layer
and timestep, instead of using ``nn.LSTM``: cuDNN's fused LSTM kernel keeps the per-step
gates and states inside one opaque workspace tensor, whereas a memory planner needs each
timestep's activations as separate tensors with their own lifetimes.  Departures: a
learned embedding replaces char-rnn's one-hot input (the same linear map), no dropout
(char-rnn's default), and PyTorch default initialisation.
"""

from __future__ import annotations

import torch
from torch import nn


class LSTMCell(nn.Module):
    """One LSTM step: gates = W_x x + W_h h + b; c' = f*c + i*g; h' = o*tanh(c')."""

    def __init__(self, input_size: int, hidden_size: int) -> None:
        super().__init__()
        self.x2gates = nn.Linear(input_size, 4 * hidden_size)
        self.h2gates = nn.Linear(hidden_size, 4 * hidden_size, bias=False)

    def forward(self, x: torch.Tensor, h: torch.Tensor, c: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        i, f, g, o = (self.x2gates(x) + self.h2gates(h)).chunk(4, dim=1)
        c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
        return torch.sigmoid(o) * torch.tanh(c), c


class CharLSTM(nn.Module):
    """Maps token ids (batch, steps) to logits (batch, steps, vocab), starting from zero states."""

    def __init__(self, vocab: int = 65, hidden: int = 512, layers: int = 2) -> None:
        super().__init__()
        self.hidden = hidden
        self.embed = nn.Embedding(vocab, hidden)
        self.cells = nn.ModuleList(LSTMCell(hidden, hidden) for _ in range(layers))
        self.out = nn.Linear(hidden, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        zeros = tokens.new_zeros((tokens.shape[0], self.hidden), dtype=self.embed.weight.dtype)
        states = [(zeros, zeros) for _ in self.cells]
        outputs: list[torch.Tensor] = []
        for x in self.embed(tokens).unbind(1):
            for layer, cell in enumerate(self.cells):
                states[layer] = cell(x, *states[layer])
                x = states[layer][0]
            outputs.append(x)
        return self.out(torch.stack(outputs, dim=1))
