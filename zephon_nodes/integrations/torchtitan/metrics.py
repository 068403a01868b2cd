"""TorchTitan 0.3.0 metrics processor that logs the data loader's metrics at every log step.

TorchTitan's Trainer builds its metrics processor from ``Trainer.Config.metrics`` and calls
``log(step, loss, max_loss, grad_norm, extra_metrics=...)`` every ``metrics.log_freq`` steps;
whatever is in ``extra_metrics`` goes to every enabled logger (TensorBoard, W&B) with the
loss. :class:`ZephonMetricsProcessor` adds :func:`~zephon_nodes.integrations.torchtitan.
loader_metrics` there, so ``zephon/data_wait_s``, ``zephon/operators/<name>/busy_s``, ... show
up on the dashboard with no code in the training script. The config registry
(``zephon_nodes.integrations.torchtitan.configs``) uses it; in your own registry set
``config.metrics = ZephonMetricsProcessor.Config(...)``.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from torchtitan.components.metrics import MetricsProcessor

from zephon_nodes.integrations.torchtitan import loader_metrics

__all__ = ["ZephonMetricsProcessor", "with_zephon_metrics"]


class ZephonMetricsProcessor(MetricsProcessor):
    """TorchTitan's metrics processor, plus the data loader's metrics in every log."""

    @dataclass(kw_only=True, slots=True)
    class Config(MetricsProcessor.Config):
        """TorchTitan's metrics settings, plus whether to log the data loader's metrics."""

        zephon_metrics: bool = True
        """Log the zephon-nodes loader's metrics (zephon/...) with the training metrics."""

    def log(
        self,
        step: int,
        global_avg_loss: float,
        global_max_loss: float,
        grad_norm: float,
        extra_metrics: dict[str, Any] | None = None,
    ) -> None:
        """Log as TorchTitan does, with the loader's metrics added to ``extra_metrics``."""
        extra = dict(extra_metrics or {})
        if getattr(self.config, "zephon_metrics", True):
            extra.update(loader_metrics())
        super().log(step, global_avg_loss, global_max_loss, grad_norm, extra_metrics=extra)


def with_zephon_metrics(config: MetricsProcessor.Config) -> ZephonMetricsProcessor.Config:
    """Return ``config``'s settings as a :class:`ZephonMetricsProcessor` config."""
    names = [f.name for f in fields(config)]
    return ZephonMetricsProcessor.Config(**{n: getattr(config, n) for n in names})
