r"""TorchTitan's override seam: switch any existing job's dataloader to a recipe, one argument.

TorchTitan (0.3.0 and main) replaces a ``Configurable.Config`` of a job's config tree by the
factory an ``--override.imports`` entry names (``torchtitan/config/override.py``,
``torchtitan/overrides/README.md``). :func:`use_recipe` replaces the trainer's
``dataloader`` (not the validator's) by a :class:`ZephonDataLoader` config::

    torchrun --nproc_per_node 2 -m torchtitan.train \
        --module llama3 --config llama3_debugmodel \
        --override.imports \
        'zephon_nodes.integrations.torchtitan.override.use_recipe={"recipe": "/data/r.toml"}' \
        ...

The JSON object's keys are the loader's settings (``recipe`` and every physical field of
``ZephonDataLoader.Config``, typed as JSON: ``{"recipe": "r.toml", "num_workers": 4}``).
No config module of your own is needed; the config-module path
(:mod:`zephon_nodes.integrations.torchtitan.configs`) stays. :func:`log_loader_metrics`, a
second target of the same ``--override.imports`` argument, makes TorchTitan's metrics
processor log the loader's metrics (``zephon/...``) with the loss::

    --override.imports '...use_recipe={"recipe": "r.toml"}' \
        zephon_nodes.integrations.torchtitan.override.log_loader_metrics
"""

from __future__ import annotations

import dataclasses
from typing import Any

from torchtitan.components.metrics import MetricsProcessor
from torchtitan.config import override

from zephon_nodes.core.errors import RecipeError
from zephon_nodes.integrations.torchtitan import TitanDataLoader, ZephonDataLoader
from zephon_nodes.integrations.torchtitan.metrics import with_zephon_metrics

__all__ = ["log_loader_metrics", "use_recipe"]

NAME = "zephon_nodes.integrations.torchtitan.override.use_recipe"
"""What ``--override.imports`` names."""


@override(
    target=TitanDataLoader.Config,
    fqns=["dataloader"],
    description="zephon-nodes recipe: the same global batches at any dp size",
)
def use_recipe(cfg: Any, **settings: Any) -> Any:
    """Return the ``ZephonDataLoader.Config`` that replaces the job's ``dataloader``.

    Args:
        cfg: The job's dataloader config (TorchTitan's own, or already a Zephon one whose
            settings are kept unless given again).
        **settings: The loader's settings from the ``--override.imports`` JSON object;
            ``recipe`` is required unless ``cfg`` already names one.

    Raises:
        RecipeError: On a key that is not a loader setting (naming the known ones), a
            missing recipe, or a value the loader's checks refuse.
    """
    known = [f.name for f in dataclasses.fields(ZephonDataLoader.Config) if f.init]
    unknown = sorted(set(settings) - set(known))
    if unknown:
        raise RecipeError(
            f"--override.imports {NAME}: unknown setting(s) {unknown}; the loader's settings "
            f"are {sorted(k for k in known if k not in ('dataset', 'dataset_path'))}"
        )
    if isinstance(cfg, ZephonDataLoader.Config):
        new = dataclasses.replace(cfg, **settings)
    else:
        new = ZephonDataLoader.Config(**settings)
    if not new.recipe:
        raise RecipeError(
            f"--override.imports {NAME} needs a recipe: "
            f'\'{NAME}={{"recipe": "/path/recipe.toml"}}\''
        )
    return new


@override(
    target=MetricsProcessor.Config,
    fqns=["metrics"],
    description="zephon-nodes: log the data loader's metrics (zephon/...) with the loss",
)
def log_loader_metrics(cfg: Any) -> Any:
    """Return the job's metrics settings as a ``ZephonMetricsProcessor`` config."""
    return with_zephon_metrics(cfg)
