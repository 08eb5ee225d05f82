"""A language-model-style LSTM (the recurrent workload of seed 002).

Defaults are the classic "medium" Penn Treebank model of Zaremba et al. (2014): vocabulary 10,000,
650-wide embedding and 2 LSTM layers of 650, 35 unrolled steps, dropout 0.5, weights uniform in
[-0.05, 0.05], untied decoder: 19.8M parameters. Seed 002's speech LSTM (3 LSTM layers, 13M
parameters, AN4) is close to ``{layers: 3, hidden: 600, vocab: 4000}`` (13.5M).

Input: int64 tokens of shape (batch, seq_len). Output: logits (batch, vocab) predicting the token
after the sequence (the decoder runs on the last step only), so the worker's cross-entropy on
integer labels applies unchanged. The recurrent cost, which dominates, is that of full
truncated-BPTT training; the decoder's is seq_len times smaller than with a loss at every step.
"""

from __future__ import annotations

import torch
from torch import nn


class LSTMLanguageModel(nn.Module):
    def __init__(self, vocab: int, hidden: int, layers: int, dropout: float) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, hidden)
        self.drop = nn.Dropout(dropout)
        self.lstm = nn.LSTM(
            hidden, hidden, layers, batch_first=True, dropout=dropout if layers > 1 else 0.0
        )
        self.decoder = nn.Linear(hidden, vocab)
        for p in self.parameters():
            nn.init.uniform_(p, -0.05, 0.05)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        y, _ = self.lstm(self.drop(self.embed(tokens)))
        return self.decoder(self.drop(y[:, -1]))
