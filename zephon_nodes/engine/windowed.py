"""The flush/replay state shared by nodes that restart at flush windows."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torchdata.nodes import BaseNode

from zephon_nodes.core.flush import is_flush
from zephon_nodes.errors import CheckpointError

__all__ = ["WindowedNode", "replay"]


def replay(
    take: Callable[[], Any],
    n: int,
    ended: Callable[[int], str],
    short: Callable[[int], str],
) -> None:
    """Take and drop ``n`` outputs: a restore replaying the consumed part of a window.

    Args:
        take: Returns the next output (or a flush marker); raises StopIteration at the end.
        n: Outputs to drop.
        ended: The message when the stream ends after ``k`` outputs.
        short: The message when the window's flush marker comes after ``k`` outputs.

    Raises:
        CheckpointError: If the window holds fewer than ``n`` outputs.
    """
    for k in range(n):
        try:
            item = take()
        except StopIteration:
            raise CheckpointError(ended(k)) from None
        if is_flush(item):
            raise CheckpointError(short(k))


class WindowedNode(BaseNode[Any]):
    """A node whose state is (upstream state at the window start, window, outputs yielded).

    Restore resets the upstream at the window's start and drops the outputs already yielded,
    so the state never holds buffered data. Subclasses call :meth:`_restart` from ``reset``
    and replay the returned number of outputs; they set ``_window_start`` and ``_window``
    when a flush marker passes and count ``_emitted``.

    Args:
        source: Upstream node of the lane (yields items and flush markers; provides
            ``state_at_window``).
    """

    SOURCE_KEY = "source"
    WINDOW_KEY = "window"
    EMITTED_KEY = "emitted"

    def __init__(self, source: BaseNode[Any]) -> None:
        super().__init__()
        self.source = source
        self._window = 0
        self._emitted = 0
        self._window_start: dict[str, Any] = {}

    def _restart(self, initial_state: dict[str, Any] | None) -> int:
        """Reset the upstream to the start (or the state's window); return outputs to drop."""
        if initial_state is None:
            self.source.reset(None)
            self._window, skip = 0, 0
        else:
            self.source.reset(initial_state[self.SOURCE_KEY])
            self._window = int(initial_state[self.WINDOW_KEY])
            skip = int(initial_state[self.EMITTED_KEY])
        self._window_start = self.source.get_state()
        self._emitted = 0
        return skip

    def get_state(self) -> dict[str, Any]:
        """Return (window start state, window, outputs yielded in the window)."""
        return {
            self.SOURCE_KEY: self._window_start,
            self.WINDOW_KEY: self._window,
            self.EMITTED_KEY: self._emitted,
        }

    def state_at_window(self, window: int) -> dict[str, Any]:
        """Return the state that starts the stream at flush window ``window``."""
        return {
            self.SOURCE_KEY: self.source.state_at_window(window),  # type: ignore[attr-defined]
            self.WINDOW_KEY: window,
            self.EMITTED_KEY: 0,
        }
