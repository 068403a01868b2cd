"""A live progress bar for long-running commands, on stderr (stdout stays machine-readable)."""

from __future__ import annotations

import sys
from typing import Any

__all__ = ["StepProgress", "progress_bar"]


class StepProgress:
    """A ``tqdm`` bar over global batches, with trained tokens and the untrained share.

    Args:
        total: Steps expected.
        seq_len: Tokens per sample (for the untrained share).
        file: Where the bar is drawn (default: stderr).
    """

    def __init__(self, total: int, seq_len: int, file: Any = None) -> None:
        from tqdm import tqdm

        self.seq_len = seq_len
        self.tokens = 0
        self.cells = 0
        self.bar = tqdm(
            total=total,
            unit="step",
            file=file if file is not None else sys.stderr,
            dynamic_ncols=True,
            desc="global batches",
        )

    def update(self, result: Any) -> None:
        """Advance by one step (a :class:`~zephon_nodes.verification.simulate.StepResult`)."""
        self.tokens += int(result.tokens)
        self.cells += int(result.rows) * self.seq_len
        untrained = 1 - self.tokens / self.cells if self.cells else 0.0
        self.bar.set_postfix(tokens=self.tokens, untrained=f"{untrained:.1%}", refresh=False)
        self.bar.update(1)

    def close(self) -> None:
        """Draw the final state and release the line."""
        self.bar.close()


def progress_bar(total: int, seq_len: int) -> StepProgress:
    """Return a progress bar on stderr for ``total`` global batches."""
    return StepProgress(total, seq_len)
