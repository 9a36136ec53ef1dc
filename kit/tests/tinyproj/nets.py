"""Two small networks: an MLP over pixels and a one-block causal transformer over characters."""

from __future__ import annotations

from math import prod

import torch
from torch import nn
from torch.nn import functional as F


class MLP(nn.Sequential):
    """Flatten, one hidden layer with dropout (so that an exact resume must restore the RNG), a head."""

    def __init__(
        self, num_classes: int, input_shape: tuple[int, int, int], hidden: int = 32, dropout: float = 0.1
    ) -> None:
        if hidden < 1:
            raise ValueError(f"net.hidden must be a positive width, got {hidden}")
        super().__init__(
            nn.Flatten(),
            nn.Linear(prod(input_shape), hidden),
            nn.LayerNorm(hidden),
            nn.GELU(),
            nn.Dropout(dropout),
            nn.Linear(hidden, num_classes),
        )


class TinyGPT(nn.Module):
    """Token ids ``(B, T)`` in, next-token logits ``(B, T, vocab_size)`` out; ``block_size`` is the
    longest context, linked into the data module's windows."""

    def __init__(
        self, vocab_size: int, block_size: int = 16, n_embd: int = 32, n_head: int = 2, dropout: float = 0.1
    ) -> None:
        super().__init__()
        if n_embd % n_head:
            raise ValueError(f"net.n_embd ({n_embd}) must be divisible by net.n_head ({n_head})")
        self.block_size, self.n_head = block_size, n_head
        self.wte = nn.Embedding(vocab_size, n_embd)
        self.wpe = nn.Embedding(block_size, n_embd)
        self.ln_1, self.ln_2 = nn.LayerNorm(n_embd), nn.LayerNorm(n_embd)
        self.qkv = nn.Linear(n_embd, 3 * n_embd)
        self.mlp = nn.Sequential(nn.Linear(n_embd, 4 * n_embd), nn.GELU(), nn.Linear(4 * n_embd, n_embd))
        self.drop = nn.Dropout(dropout)
        self.head = nn.Linear(n_embd, vocab_size)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        B, T = idx.shape
        x = self.drop(self.wte(idx) + self.wpe(torch.arange(T, device=idx.device)))
        q, k, v = (
            t.view(B, T, self.n_head, -1).transpose(1, 2) for t in self.qkv(self.ln_1(x)).chunk(3, dim=-1)
        )
        x = x + F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, T, -1)
        x = x + self.drop(self.mlp(self.ln_2(x)))
        return self.head(x)
