"""Progress of a long run on stderr: a live bar on a terminal, a few plain lines otherwise.

A bar redraws its line in place with carriage returns; in a file or a CI log that is
clutter. When the stream is not a terminal, :class:`Progress` writes a plain line at most
every ``interval`` seconds and one at the end, so a log still shows that a long run moves.
"""

from __future__ import annotations

import sys
import time
from typing import Any, TextIO

__all__ = ["Progress", "is_terminal"]


class Progress:
    """Count work done towards ``total`` on ``stream`` (default stderr).

    Args:
        total: Units expected, or ``None`` when unknown.
        desc: What is counted (``"indexing shards"``).
        unit: The unit's name (``"shard"``).
        stream: Where progress goes; a terminal gets a tqdm bar.
        disable: Show nothing at all.
        interval: Seconds between plain lines when ``stream`` is not a terminal.
    """

    def __init__(
        self,
        total: int | None,
        desc: str,
        unit: str,
        stream: TextIO | None = None,
        disable: bool = False,
        interval: float = 30.0,
    ) -> None:
        self.total = total
        self.desc = desc
        self.unit = unit
        self.stream = stream if stream is not None else sys.stderr
        self.disable = disable
        self.interval = interval
        self.done = 0
        self.postfix: dict[str, Any] = {}
        self._last = time.monotonic()
        self._bar: Any = None
        if not disable and is_terminal(self.stream):
            from tqdm import tqdm

            self._bar = tqdm(
                total=total, desc=desc, unit=unit, file=self.stream, dynamic_ncols=True
            )

    @property
    def is_bar(self) -> bool:
        """Whether a live bar is drawn (the stream is a terminal)."""
        return self._bar is not None

    def update(self, n: int = 1, **postfix: Any) -> None:
        """Advance by ``n`` units; ``postfix`` values are shown beside the count."""
        self.done += n
        self.postfix.update(postfix)
        if self.disable:
            return
        if self._bar is not None:
            if postfix:
                self._bar.set_postfix(self.postfix, refresh=False)
            self._bar.update(n)
            return
        now = time.monotonic()
        if now - self._last >= self.interval:
            self._last = now
            self._line()

    def describe(self, desc: str) -> None:
        """Change what the bar says is being done (a plain line uses it from then on)."""
        self.desc = desc
        if self._bar is not None:
            self._bar.set_description(desc, refresh=False)

    def write(self, message: str) -> None:
        """Print a message line without breaking the bar."""
        if self._bar is not None:
            self._bar.write(message, file=self.stream)
        else:
            print(message, file=self.stream, flush=True)

    def close(self) -> None:
        """Draw the final state: the bar's last frame, or one plain line."""
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        elif not self.disable and self.done:
            self._line()
            self.disable = True

    def _line(self) -> None:
        count = f"{self.done:,}" if self.total is None else f"{self.done:,}/{self.total:,}"
        extra = "".join(f", {k}={v}" for k, v in self.postfix.items())
        print(f"{self.desc}: {count} {self.unit}(s){extra}", file=self.stream, flush=True)


def is_terminal(stream: TextIO) -> bool:
    """Whether ``stream`` is a terminal (a closed or file-less stream is not)."""
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False
