"""``Pipeline.check_produces``: a recipe that can make no batch is refused for its real cause."""

from __future__ import annotations

import pytest

from tests.commands.test_stats import _recipe
from zephon_nodes import Pipeline
from zephon_nodes.core.errors import RecipeError


def test_a_mixture_whose_end_dataset_has_fewer_items_than_lanes() -> None:
    """Found by the stats property: ``d1`` (on_exhausted "end") holds 3 work items for 4
    lanes, so lane 3 ends where it would take its first ``d1`` item. The refusal blamed
    skipped records and token-less items, which this data has none of; it now names the
    dataset and what to change."""
    recipe = _recipe((40, 6), ("repeat", "end"), (1.0, 1.0))
    with pytest.raises(RecipeError) as e:
        Pipeline(recipe).check_produces()
    message = str(e.value)
    assert "'d1'" in message and "3 work item(s)" in message and "4 lanes" in message, message
    assert "skipped" not in message
    assert "\n" not in message
