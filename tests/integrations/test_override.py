"""TorchTitan's override seam: one ``--override.imports`` entry switches a job to a recipe.

Runs with the installed TorchTitan (0.3.0 here; main in ``make test-titan-main``, which
collects the same tests through ``titan_main/test_override_main.py``). The real Trainer
runs through the override in the walk-through tests (``examples/torchtitan/run.py``).
"""

from __future__ import annotations

import importlib

import pytest

from zephon_nodes.core.errors import RecipeError
from zephon_nodes.integrations.torchtitan import ZephonDataLoader

NAME = "zephon_nodes.integrations.torchtitan.override.use_recipe"
METRICS = "zephon_nodes.integrations.torchtitan.override.log_loader_metrics"


def debug_job() -> object:
    """TorchTitan's own llama3 debug-model job (its config function), untouched."""
    registry = importlib.import_module("torchtitan.models.llama3.config_registry")
    return registry.llama3_debugmodel()


def apply(entry: object, job: object) -> list[str]:
    from torchtitan.config.override import OverrideConfig, apply_overrides

    return apply_overrides(OverrideConfig(imports=[entry]), job)  # type: ignore[list-item,arg-type]


def test_one_entry_switches_the_trainers_dataloader_only() -> None:
    from torchtitan.config.override import parse_cli_imports

    job = debug_job()
    validator_before = job.validator.dataloader  # type: ignore[attr-defined]
    assert not isinstance(job.dataloader, ZephonDataLoader.Config)  # type: ignore[attr-defined]
    (entry,) = parse_cli_imports([f'{NAME}={{"recipe": "/data/r.toml", "num_workers": 3}}'])
    lines = apply(entry, job)
    assert len(lines) == 1 and lines[0].startswith(f"[Override] {NAME}: dataloader ")
    cfg = job.dataloader  # type: ignore[attr-defined]
    assert isinstance(cfg, ZephonDataLoader.Config)
    assert (cfg.recipe, cfg.num_workers, cfg.prefetch) == ("/data/r.toml", 3, 2)
    assert not getattr(cfg, "dataset", None) and not getattr(cfg, "dataset_path", None)
    assert job.validator.dataloader is validator_before  # type: ignore[attr-defined]


def test_a_zephon_dataloader_keeps_its_settings() -> None:
    job = debug_job()
    job.dataloader = ZephonDataLoader.Config(recipe="/a.toml", lookahead=7)  # type: ignore[attr-defined]
    apply((NAME, {"num_workers": 5}), job)
    cfg = job.dataloader  # type: ignore[attr-defined]
    assert (cfg.recipe, cfg.lookahead, cfg.num_workers) == ("/a.toml", 7, 5)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (
            {"recipe": "/r.toml", "workers": 2},
            r"unknown setting\(s\) \['workers'\]; .*'num_workers'",
        ),
        ({"num_workers": 2}, r"needs a recipe: .*use_recipe=\{\"recipe\""),
        ({"recipe": "/r.toml", "prefetch": -1}, r"dataloader.prefetch"),
    ],
)
def test_bad_settings_are_refused_naming_them(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(RecipeError, match=match):
        apply((NAME, kwargs), debug_job())


def test_a_second_target_logs_the_loaders_metrics() -> None:
    from torchtitan.config.override import OverrideConfig, apply_overrides, parse_cli_imports

    from zephon_nodes.integrations.torchtitan.metrics import ZephonMetricsProcessor

    job = debug_job()
    before = job.metrics  # type: ignore[attr-defined]
    tokens = [f'{NAME}={{"recipe": "/r.toml"}}', METRICS]
    apply_overrides(OverrideConfig(imports=parse_cli_imports(tokens)), job)  # type: ignore[arg-type]
    after = job.metrics  # type: ignore[attr-defined]
    assert isinstance(after, ZephonMetricsProcessor.Config) and after.zephon_metrics
    assert after.log_freq == before.log_freq  # the job's own settings are kept
    assert isinstance(job.dataloader, ZephonDataLoader.Config)  # type: ignore[attr-defined]
