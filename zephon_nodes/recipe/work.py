"""The recipe's ``[work]`` table: how datasets are cut into work items and repeated."""

from __future__ import annotations

from dataclasses import dataclass

from zephon_nodes.errors import RecipeError
from zephon_nodes.recipe.bounds import check_setting

__all__ = ["DEALS", "END_OF_DATA", "WorkSpec"]

END_OF_DATA = ("drop_report", "error", "wrap")
DEALS = ("auto", "balanced", "round_robin")


@dataclass(frozen=True)
class WorkSpec:
    """How datasets are cut into work items and repeated.

    Args:
        chunk_size: Records per work item (the last item of a shard may be shorter).
        epochs: Passes over the data; ``None`` repeats forever (a new seeded order each epoch).
        end_of_data: What a finite stream does with the samples its lanes still hold after
            the last full global batch: ``"drop_report"`` stops there and counts them
            (``Multiplexer.unused_samples``, ``zephon digest``, ``zephon stats``);
            ``"error"`` stops there too but raises ``DataError`` if any were left (neither
            is part of the fingerprint: the batches are the same); ``"wrap"`` never stops:
            a lane that runs dry continues into the next pass's data (single-dataset
            recipes; part of the fingerprint, as it changes the batches after the first
            lane runs dry).
        deal: How a finite stream's work items go to lanes: ``"balanced"`` (largest first
            to the lane holding the fewest tokens, so lanes end together; single-dataset
            text recipes), ``"round_robin"`` (item ``g`` to lane ``g % L``) or ``"auto"``
            (the default: balanced where it applies, round-robin for mixtures and image
            recipes). Endless streams are always dealt round-robin.
    """

    chunk_size: int = 64
    epochs: int | None = 1
    end_of_data: str = "drop_report"
    deal: str = "auto"

    def __post_init__(self) -> None:
        check_setting("work.chunk_size", self.chunk_size)
        if self.epochs is not None:
            check_setting("work.epochs", self.epochs)
        if self.deal not in DEALS:
            raise RecipeError(f"work.deal={self.deal!r} must be one of {list(DEALS)}")
        if self.end_of_data not in END_OF_DATA:
            raise RecipeError(
                f"work.end_of_data={self.end_of_data!r} must be one of {list(END_OF_DATA)}"
            )
