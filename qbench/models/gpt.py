"""A GPT-style decoder (the sharded-training workload of issue 35): token and position
embeddings, ``layers`` pre-norm blocks (causal self-attention, then a 4x GELU MLP), a final
LayerNorm and a head tied to the token embedding, as nanoGPT (Karpathy) and GPT-2 (Radford et
al., 2019) build it. Every position predicts the next token: the output is (batch, seq_len,
vocab) and the targets (batch, seq_len), which the worker's cross-entropy flattens.

Defaults are a "baby GPT" that trains on 2 CPU cores: byte-level vocabulary (256), width 128,
4 layers of 4 heads, 64 tokens, about 0.83M parameters. Synthetic batches come from a fixed
random bigram chain (each token's successor drawn from a few likely ones), so the loss falls well
below log(vocab) once the model learns it.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

from qbench.models.workload import Batch

_SUCCESSORS = 4  # likely next tokens per token in the synthetic bigram chain


class Block(nn.Module):
    def __init__(self, width: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.heads, self.dropout = heads, dropout
        self.ln1, self.ln2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.fc = nn.Linear(width, 4 * width)
        self.out = nn.Linear(4 * width, width)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        p = self.dropout if self.training else 0.0
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
        x = x + self.drop(self.proj(y.transpose(1, 2).reshape(b, t, c)))
        return x + self.drop(self.out(F.gelu(self.fc(self.ln2(x)))))


class GPT(nn.Module):
    def __init__(
        self, vocab: int, width: int, layers: int, heads: int, seq_len: int, dropout: float
    ) -> None:
        super().__init__()
        self.tokens = nn.Embedding(vocab, width)
        self.positions = nn.Embedding(seq_len, width)
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(Block(width, heads, dropout) for _ in range(layers))
        self.ln = nn.LayerNorm(width)
        self.apply(_init)
        for name, p in self.named_parameters():  # GPT-2: residual projections scaled by depth
            if name.endswith(("proj.weight", "out.weight")):
                nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * layers))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        t = tokens.shape[1]
        x = self.drop(self.tokens(tokens) + self.positions(torch.arange(t, device=tokens.device)))
        for block in self.blocks:
            x = block(x)
        return self.ln(x) @ self.tokens.weight.T  # the head is the token embedding (tied)


def _init(m: nn.Module) -> None:
    if isinstance(m, nn.Linear):
        nn.init.normal_(m.weight, 0.0, 0.02)
        nn.init.zeros_(m.bias)
    elif isinstance(m, nn.Embedding):
        nn.init.normal_(m.weight, 0.0, 0.02)


def bigram_batches(vocab: int, seq_len: int, seed: int = 0) -> Batch:
    """``batch(batch_size, generator) -> (tokens, next tokens)``: sequences of a fixed random
    bigram chain (``seed``), each token followed by one of ``_SUCCESSORS`` likely ones."""
    successors = torch.randint(
        0, vocab, (vocab, _SUCCESSORS), generator=torch.Generator().manual_seed(seed)
    )

    def batch(batch_size: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        seq = torch.empty(batch_size, seq_len + 1, dtype=torch.int64)
        seq[:, 0] = torch.randint(0, vocab, (batch_size,), generator=gen)
        pick = torch.randint(0, _SUCCESSORS, (batch_size, seq_len), generator=gen)
        for i in range(seq_len):
            seq[:, i + 1] = successors[seq[:, i], pick[:, i]]
        return seq[:, :-1], seq[:, 1:]

    return batch
