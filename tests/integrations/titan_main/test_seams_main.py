"""The override seam and the optimizer-step check under TorchTitan main (the same tests,
the real Trainer's refusal included).

``tests/integrations/test_override.py`` and ``test_step_check.py`` run with the installed
TorchTitan's adapter; ``make test-titan-main`` collects this folder only, so they are
collected here again for main.
"""

from __future__ import annotations

import pytest

pytest.importorskip(
    "torchtitan.components.data.loader",
    reason="needs TorchTitan main (the .venv-titan-main of `make test-titan-main`)",
)

from tests.integrations.test_config_bounds import (
    test_a_directory_as_the_recipe_is_refused_naming_the_field,
    test_a_missing_amend_from_names_the_field,
    test_out_of_bounds_is_refused_when_the_config_is_made,
)
from tests.integrations.test_override import (
    test_a_second_target_logs_the_loaders_metrics,
    test_a_zephon_dataloader_keeps_its_settings,
    test_bad_settings_are_refused_naming_them,
    test_one_entry_switches_the_trainers_dataloader_only,
)
from tests.integrations.test_restore_log import test_one_line_per_rank_at_checkpoint_and_restore
from tests.integrations.test_step_check import (
    optimizer,
    test_a_closed_loader_leaves_no_hook,
    test_half_a_global_batch_per_optimizer_step_is_refused,
    test_whole_global_batches_per_optimizer_step_pass,
)

pytestmark = pytest.mark.titan_main

__all__ = [
    "optimizer",
    "test_a_closed_loader_leaves_no_hook",
    "test_a_directory_as_the_recipe_is_refused_naming_the_field",
    "test_a_missing_amend_from_names_the_field",
    "test_a_second_target_logs_the_loaders_metrics",
    "test_a_zephon_dataloader_keeps_its_settings",
    "test_bad_settings_are_refused_naming_them",
    "test_half_a_global_batch_per_optimizer_step_is_refused",
    "test_one_entry_switches_the_trainers_dataloader_only",
    "test_one_line_per_rank_at_checkpoint_and_restore",
    "test_out_of_bounds_is_refused_when_the_config_is_made",
    "test_whole_global_batches_per_optimizer_step_pass",
]
