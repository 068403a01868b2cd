r"""TorchTitan's real Trainer with a dynamic-mixture controller (the worked example).

:class:`CurriculumTrainer` is ``torchtitan.trainer.Trainer`` with three additions, nothing
else changed (model, FSDP, optimizer, checkpointing are TorchTitan's):

1. the loss function is wrapped so that every micro-batch's per-token cross-entropy is kept
   (detached; the training loss itself is TorchTitan's);
2. after each ``train_step`` the per-token losses are paired with the ``dataset_ids`` the
   :class:`~zephon_nodes.integrations.torchtitan.ZephonDataLoader` kept aside
   (``pop_dataset_ids``), summed per domain, and all-reduced over the data-parallel
   (batch) mesh; every ``curriculum.every`` steps the
   :class:`~examples.curriculum.controller.ExpGradController` turns the mean losses since
   the last decision into new weights and every rank calls ``set_mixture`` (which checks
   with one all-gather that the ranks agree);
3. the loss sums since the last decision are part of the trainer's checkpoint state
   (``train_state.curriculum_window``), so a resume mid-window decides as the
   uninterrupted run does. The weights in force need no state of their own: they are the
   last entry of the loader's decision log, which is in the loader's checkpoint.

Rank 0 writes one JSON line per step to ``<dump_folder>/curriculum.jsonl``: the step, the
per-domain mean loss and token count of that step, the weights in force, and the decision
made after it (``null`` when none). Run it as TorchTitan's ``--module``::

    torchrun --nproc_per_node 2 -m zephon_nodes.integrations.torchtitan.train \
        --module examples.curriculum.trainer --config curriculum_debugmodel \
        --dataloader.recipe recipe.toml --hf-assets-path hf_assets --curriculum.every 4 ...

(``examples/curriculum/run.py`` does it end to end.)
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch.distributed.tensor import DTensor
from torchtitan.components.loss import ChunkedLossWrapper
from torchtitan.distributed import utils as dist_utils
from torchtitan.trainer import Trainer

from examples.curriculum.controller import ExpGradController, domain_sums
from zephon_nodes.integrations.torchtitan import ZephonDataLoader
from zephon_nodes.integrations.torchtitan.configs import zephon_llama3_debugmodel

__all__ = ["CurriculumConfig", "CurriculumTrainer", "curriculum_debugmodel"]

IGNORE_INDEX = -100


@dataclass(kw_only=True, slots=True)
class CurriculumConfig:
    """The controller's settings (``--curriculum.*``)."""

    every: int = 4
    """Steps between decisions (a decision after every step that is a multiple of it)."""

    eta: float = 1.0
    """Exponentiated-gradient step size."""

    smoothing: float = 0.1
    """Share of the uniform mixture mixed into every decision."""

    quantum: float = 0.01
    """Grid of the decided weights (what makes decisions equal at every dp size)."""


class _RecordingLoss:
    """TorchTitan's loss function, also keeping each micro-batch's per-token loss."""

    def __init__(self, inner: Any, sink: list[torch.Tensor]) -> None:
        self.inner = inner
        self.sink = sink

    def __call__(self, pred: torch.Tensor, labels: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        with torch.no_grad():
            logits = pred.full_tensor() if isinstance(pred, DTensor) else pred
            target = labels.full_tensor() if isinstance(labels, DTensor) else labels
            per_token = F.cross_entropy(
                logits.detach().flatten(0, -2).float(),
                target.flatten(),
                ignore_index=IGNORE_INDEX,
                reduction="none",
            )
            self.sink.append(per_token.view(target.shape).cpu())
        return self.inner(pred, labels, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


class CurriculumTrainer(Trainer):
    """TorchTitan's Trainer + an exponentiated-gradient mixture controller (see the module)."""

    @dataclass(kw_only=True, slots=True)
    class Config(Trainer.Config):
        curriculum: CurriculumConfig = field(default_factory=CurriculumConfig)
        """The mixture controller."""

    def __init__(self, config: Config) -> None:
        super().__init__(config)
        loader = self.dataloader
        if not isinstance(loader, ZephonDataLoader):
            raise TypeError("CurriculumTrainer needs the ZephonDataLoader (dataloader.recipe)")
        self.loader = loader
        self.domains = [d.name for d in loader.pipeline.recipe.datasets]
        c = config.curriculum
        self.controller = ExpGradController(
            self.domains, eta=c.eta, smoothing=c.smoothing, quantum=c.quantum
        )
        self.every = c.every
        self.per_token: list[torch.Tensor] = []
        # The per-token loss is taken where the logits are: with TorchTitan's
        # ChunkedLossWrapper (the lm_head applied chunk by chunk along the sequence), around
        # its inner loss, so one micro-batch gives ``chunks`` pieces to join along dim 1.
        if isinstance(self.loss_fn, ChunkedLossWrapper):
            self.chunks = self.loss_fn.num_chunks
            self.loss_fn.loss_fn = _RecordingLoss(self.loss_fn.loss_fn, self.per_token)  # type: ignore[assignment]
        else:
            self.chunks = 1
            self.loss_fn = _RecordingLoss(self.loss_fn, self.per_token)  # type: ignore[assignment]
        self.window = torch.zeros(2, len(self.domains), dtype=torch.float64)
        self.journal = Path(config.dump_folder) / "curriculum.jsonl"
        if torch.distributed.get_rank() == 0:
            self.journal.parent.mkdir(parents=True, exist_ok=True)
            self.journal.write_text("")

    def weights_in_force(self) -> dict[str, float]:
        """The last decision of the loader's log, or the recipe's weights."""
        log = self.loader.mixture_log
        if log:
            return dict(log[-1][1])
        ws = {d.name: float(d.weight) for d in self.loader.pipeline.recipe.datasets}
        total = sum(ws.values())
        return {n: w / total for n, w in ws.items()}

    def train_step(self, data_iterator: Any) -> None:
        """TorchTitan's step, then per-domain losses and (every N steps) a decision."""
        self.per_token.clear()
        super().train_step(data_iterator)
        ids = self.loader.pop_dataset_ids()
        if len(ids) * self.chunks != len(self.per_token):
            raise RuntimeError(
                f"step {self.step}: {len(ids)} micro-batches of dataset_ids for "
                f"{len(self.per_token)} loss computations ({self.chunks} per micro-batch)"
            )
        c = self.chunks
        losses = [torch.cat(self.per_token[k : k + c], dim=1) for k in range(0, len(ids) * c, c)]
        sums = sum(
            (domain_sums(loss, i, len(self.domains)) for loss, i in zip(losses, ids, strict=True)),
            torch.zeros(2, len(self.domains), dtype=torch.float64),
        )
        batch_mesh = self.parallel_dims.get_optional_mesh("batch")
        group = None
        if self.parallel_dims.dp_enabled and batch_mesh is not None:
            sums = dist_utils.dist_sum_tensor(sums.to(self.device), batch_mesh).cpu()
            group = batch_mesh.get_group()
        self.window += sums
        in_force = self.weights_in_force()
        record: dict[str, Any] = {
            "step": self.step,
            "loss": [s / c if c else None for s, c in zip(*sums.tolist(), strict=True)],
            "tokens": [int(c) for c in sums[1].tolist()],
            "weights": [in_force[n] for n in self.domains],
            "decision": None,
        }
        if self.step % self.every == 0:
            means = [s / c if c else math.nan for s, c in zip(*self.window.tolist(), strict=True)]
            decision = self.controller.update(in_force, means)
            self.loader.set_mixture(decision.weights, group=group)
            self.window.zero_()
            record["decision"] = [self.loader.mixture_log[-1][1][n] for n in self.domains]
            record["raw"] = [decision.raw[n] for n in self.domains]
            record["margin"] = decision.margin
        if torch.distributed.get_rank() == 0:
            with open(self.journal, "a", encoding="utf-8") as f:
                f.write(json.dumps(record) + "\n")

    def state_dict(self) -> dict[str, Any]:
        """TorchTitan's train state plus the controller's loss sums since the last decision."""
        out = super().state_dict()
        out["curriculum_window"] = self.window
        return out

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict(state_dict)
        self.window.copy_(state_dict["curriculum_window"])


def curriculum_debugmodel() -> CurriculumTrainer.Config:
    """``zephon_llama3_debugmodel`` (llama3 debug model + ZephonDataLoader) with the controller."""
    base = zephon_llama3_debugmodel()
    return CurriculumTrainer.Config(**{f.name: getattr(base, f.name) for f in fields(base)})
