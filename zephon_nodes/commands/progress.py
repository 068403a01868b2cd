"""``zephon digest --progress``: global batches, trained tokens and the untrained share."""

from __future__ import annotations

from typing import Any, TextIO

from zephon_nodes.core.progress import Progress

__all__ = ["StepProgress", "progress_bar"]


class StepProgress:
    """Progress over global batches, with trained tokens and the untrained share.

    A live bar on a terminal, a plain line every 30 s otherwise (see
    :class:`~zephon_nodes.core.progress.Progress`).

    Args:
        total: Steps expected.
        seq_len: Tokens per sample (for the untrained share).
        file: Where progress goes (default: stderr).
    """

    def __init__(self, total: int, seq_len: int, file: TextIO | None = None) -> None:
        self.seq_len = seq_len
        self.tokens = 0
        self.cells = 0
        self.progress = Progress(total, "global batches", "step", stream=file)

    def update(self, result: Any) -> None:
        """Advance by one step (a :class:`~zephon_nodes.verification.simulate.StepResult`)."""
        self.tokens += int(result.tokens)
        self.cells += int(result.rows) * self.seq_len
        untrained = 1 - self.tokens / self.cells if self.cells else 0.0
        self.progress.update(1, tokens=self.tokens, untrained=f"{untrained:.1%}")

    def close(self) -> None:
        """Draw the final state and release the line."""
        self.progress.close()


def progress_bar(total: int, seq_len: int) -> StepProgress:
    """Return progress on stderr for ``total`` global batches."""
    return StepProgress(total, seq_len)
