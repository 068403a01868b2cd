"""The recipe's ``[shuffle]`` table: the per-lane shuffle buffer of packed samples."""

from __future__ import annotations

from dataclasses import dataclass

from zephon_nodes.recipe.bounds import check_setting

__all__ = ["ShuffleSpec"]


@dataclass(frozen=True)
class ShuffleSpec:
    """Per-lane shuffle buffer applied to packed samples.

    Args:
        buffer_size: Samples held per lane; 0 disables the shuffle.
    """

    buffer_size: int = 0

    def __post_init__(self) -> None:
        check_setting("shuffle.buffer_size", self.buffer_size)
