"""The tiny model and training step shared by the elastic job and its in-process reference."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import nn

VOCAB = 512  # the byte tokenizer's ids (256 bytes + specials) fit
IGNORE = -100


class TinyLM(nn.Module):
    """Token + position embeddings, one MLP block, a vocabulary head."""

    def __init__(self, seq_len: int, dim: int = 32) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.tok = nn.Embedding(VOCAB, dim)
        self.pos = nn.Embedding(seq_len, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, dim), nn.GELU(), nn.Linear(dim, dim))
        self.head = nn.Linear(dim, VOCAB)

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        h = self.tok(tokens) + self.pos(positions)
        return self.head(h + self.mlp(h))


def make_optimizer(model: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.AdamW(model.parameters(), lr=3e-3)


def train_step(
    model: nn.Module,
    opt: torch.optim.Optimizer,
    microbatches: Sequence[dict[str, torch.Tensor]],
    all_reduce: Callable[[torch.Tensor], None] = lambda t: None,
) -> float:
    """One optimizer step on this rank's micro-batches; the loss is the global token mean.

    Gradients of the summed token losses are summed over ranks (``all_reduce``) and divided by
    the global count of label tokens, so any dp size computes the same update (up to the order
    of floating-point sums).
    """
    opt.zero_grad(set_to_none=False)
    total = torch.zeros(())
    count = torch.zeros(())
    for mb in microbatches:
        logits = model(mb["input"], mb["positions"])
        loss = F.cross_entropy(
            logits.flatten(0, 1), mb["labels"].flatten(), ignore_index=IGNORE, reduction="sum"
        )
        loss.backward()
        total += loss.detach()
        count += (mb["labels"] != IGNORE).sum()
    stats = torch.stack([total, count])
    all_reduce(stats)
    for p in model.parameters():
        if p.grad is not None:
            all_reduce(p.grad)
            p.grad /= stats[1]
    opt.step()
    return float(stats[0] / stats[1])
