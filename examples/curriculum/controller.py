"""The controller of the worked dynamic-mixture example: per-domain loss -> new weights.

Pure pieces, no TorchTitan: :func:`domain_sums` turns per-token losses and the batch's
``dataset_ids`` into per-domain ``[loss sum, token count]``; :class:`ExpGradController` turns
per-domain mean losses into the next weights by an exponentiated-gradient step
(DoReMi-style: ``w_d <- w_d * exp(eta * (loss_d - mean))``, normalized, mixed with
``smoothing`` of the uniform mixture) and rounds them to multiples of ``quantum``.

The rounding is what makes the decisions the same at every dp size. The all-reduced losses
differ in their last bits between a dp 2 job and the same job resumed at dp 1 or dp 4
(gradient reductions run in another order), so raw exponentiated-gradient weights would
differ too, and so would the decision logs. Rounded to a grid, they agree unless a weight
lies closer to a rounding boundary than the loss noise moves it; :attr:`Decision.margin`
reports that distance, and the example prints the smallest one.

The real-Trainer example that uses them is :mod:`examples.curriculum.trainer` (a TorchTitan
``Trainer`` subclass), driven by :mod:`examples.curriculum.run`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

__all__ = ["Decision", "ExpGradController", "domain_sums"]


def domain_sums(loss: torch.Tensor, ids: torch.Tensor, k: int) -> torch.Tensor:
    """Per-domain ``[loss sum, token count]`` (float64 ``[2, k]``) from per-token losses.

    Args:
        loss: Per-token losses, any shape.
        ids: The batch's ``dataset_ids``, same number of elements (-1: padding, skipped).
        k: Number of recipe datasets.
    """
    loss, ids = loss.detach().reshape(-1).double(), ids.reshape(-1).to(torch.int64)
    out = torch.zeros(2, k, dtype=torch.float64)
    valid = ids >= 0
    out[0].index_add_(0, ids[valid], loss[valid])
    out[1].index_add_(0, ids[valid], torch.ones_like(loss)[valid])
    return out


@dataclass(frozen=True)
class Decision:
    """One controller decision.

    Attributes:
        weights: The rounded weights (``{dataset: weight}``, multiples of the quantum).
        raw: The weights before rounding.
        margin: Smallest distance of a raw weight to a rounding boundary, in units of
            the quantum (0.5 is the most robust; a loss difference that moves a raw weight
            by less than ``margin * quantum`` cannot change the decision).
    """

    weights: dict[str, float]
    raw: dict[str, float]
    margin: float


@dataclass
class ExpGradController:
    """Exponentiated-gradient weights over domains from their mean losses.

    Attributes:
        names: The recipe's dataset names.
        eta: Step size of the update.
        smoothing: Share of the uniform mixture mixed into every decision (keeps every
            domain sampled, so its loss stays measurable).
        quantum: Grid of the decided weights (0: no rounding).
    """

    names: Sequence[str]
    eta: float = 1.0
    smoothing: float = 0.1
    quantum: float = 0.01

    def update(self, weights: Mapping[str, float], losses: Sequence[float]) -> Decision:
        """Return the decision that follows ``weights`` given each domain's mean loss.

        A NaN loss (no token of the domain since the last decision) counts as the mean of
        the measured ones, so that domain's weight only moves by the normalization.
        """
        measured = [x for x in losses if not math.isnan(x)]
        mean = sum(measured) / len(measured) if measured else 0.0
        filled = [mean if math.isnan(x) else x for x in losses]
        total_w = sum(weights[n] for n in self.names)
        raw = {
            n: weights[n] / total_w * math.exp(self.eta * (loss - mean))
            for n, loss in zip(self.names, filled, strict=True)
        }
        total = sum(raw.values())
        k = len(self.names)
        raw = {n: (1 - self.smoothing) * v / total + self.smoothing / k for n, v in raw.items()}
        if self.quantum <= 0:
            return Decision(dict(raw), raw, 0.5)
        rounded = {n: round(v / self.quantum) * self.quantum for n, v in raw.items()}
        margin = min(0.5 - abs(v / self.quantum - round(v / self.quantum)) for v in raw.values())
        return Decision(rounded, raw, margin)
