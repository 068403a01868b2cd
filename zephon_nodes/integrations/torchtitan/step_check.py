"""The trainer's optimizer step against the recipe's global batch, checked as it happens.

TorchTitan passes a loader its micro-batch size, never its optimizer step
(``training.global_batch_size`` on 0.3.0, ``training.num_tokens_per_train_step`` on main).
The step is what the trainer does, so it is measured there: :class:`StepCheck` counts the
micro-batches the trainer takes (with gradients enabled; a validator reads under
``torch.no_grad``) and PyTorch's documented optimizer hook
(``torch.optim.optimizer.register_optimizer_step_post_hook``) says where an optimizer step
ends. The first optimizer step after micro-batches were taken must have taken a whole
number of the recipe's steps on this rank; otherwise it is refused, naming the trainer's
setting and the recipe's ``global_batch_size``, before the trainer can write a checkpoint
(TorchTitan saves after the optimizer step).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.optim.optimizer import Optimizer, register_optimizer_step_post_hook

from zephon_nodes.core.errors import RecipeError

__all__ = ["StepCheck", "StepSetting"]


@dataclass(frozen=True, slots=True)
class StepSetting:
    """How a TorchTitan version names its optimizer step, for the refusal's message.

    Attributes:
        name: The setting, e.g. ``"training.global_batch_size"``.
        flag: Its command-line flag, e.g. ``"--training.global-batch-size"``.
        tokens: True when the setting counts tokens (main), False when samples (0.3.0).
    """

    name: str
    flag: str
    tokens: bool


class StepCheck:
    """Refuse a trainer whose optimizer step is not a whole number of recipe steps.

    Args:
        setting: The TorchTitan setting of the optimizer step.
        micro_per_step: Micro-batches of this rank in one recipe step.
        rows: Samples per micro-batch.
        dp_world_size: Data-parallel size.
        global_batch_size: The recipe's ``global_batch_size``.
        seq_len: The recipe's ``seq_len``.
        recipe: The recipe's path, for the message.
    """

    def __init__(
        self,
        setting: StepSetting,
        *,
        micro_per_step: int,
        rows: int,
        dp_world_size: int,
        global_batch_size: int,
        seq_len: int,
        recipe: str,
    ) -> None:
        self.setting = setting
        self.micro_per_step = micro_per_step
        self.rows = rows
        self.dp_world_size = dp_world_size
        self.global_batch_size = global_batch_size
        self.seq_len = seq_len
        self.recipe = recipe
        self.taken = 0
        """Micro-batches the trainer took (gradients enabled) before its first optimizer step."""
        self.checked: int | None = None
        """Micro-batches of the checked optimizer step (None: not checked yet)."""
        self._handle = register_optimizer_step_post_hook(self._on_optimizer_step)

    def took(self) -> None:
        """Count one micro-batch handed to the trainer (not counted under ``no_grad``)."""
        if self.checked is None and torch.is_grad_enabled():
            self.taken += 1

    def _on_optimizer_step(self, optimizer: Optimizer, args: object, kwargs: object) -> None:
        del optimizer, args, kwargs
        if self.checked is not None or self.taken == 0:
            return  # an optimizer step before any batch (TorchTitan's state initialization)
        self.close()
        self.check(self.taken)

    def check(self, micro: int) -> None:
        """Check one optimizer step of ``micro`` micro-batches per rank.

        Raises:
            RecipeError: Naming the trainer's setting, its value and the recipe's
                ``global_batch_size``, with the flag that fixes it.
        """
        self.checked = micro
        if micro % self.micro_per_step == 0:
            return
        G, S = self.global_batch_size, self.seq_len
        samples = micro * self.rows * self.dp_world_size
        unit, value, want = (
            ("tokens", samples * S, G * S)
            if self.setting.tokens
            else (
                "samples",
                samples,
                G,
            )
        )
        raise RecipeError(
            f"the trainer's optimizer step took {micro} micro-batch(es) of {self.rows} "
            f"samples on each of {self.dp_world_size} data-parallel rank(s): "
            f"{self.setting.name}={value} {unit}, which is not a multiple of the recipe's "
            f"global_batch_size={G} (x seq_len={S}: {G * S} tokens) of {self.recipe}; an "
            f"optimizer step must hold whole global batches, or a resume at another dp "
            f"size trains on other batches per step: set {self.setting.flag} {want} (or a "
            f"multiple)"
        )

    def close(self) -> None:
        """Remove the optimizer hook (idempotent)."""
        self._handle.remove()
