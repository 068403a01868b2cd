"""Progress on stderr: no carriage returns when stderr is not a terminal, counts that agree."""

from __future__ import annotations

import io

from zephon_nodes.core.progress import Progress, is_terminal


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_file_gets_plain_lines_and_no_carriage_return() -> None:
    out = io.StringIO()
    bar = Progress(5, "indexing shards", "shard", stream=out, interval=0.0)
    for _ in range(5):
        bar.update(1)
    bar.close()
    text = out.getvalue()
    assert "\r" not in text
    lines = text.splitlines()
    assert lines[0] == "indexing shards: 1/5 shard(s)"
    assert lines[-1] == "indexing shards: 5/5 shard(s)"


def test_plain_lines_are_rate_limited() -> None:
    out = io.StringIO()
    bar = Progress(None, "fetching", "shard", stream=out, interval=3600.0)
    for _ in range(1000):
        bar.update(1)
    bar.close()
    assert out.getvalue().splitlines() == ["fetching: 1,000 shard(s)"]


def test_a_terminal_gets_a_live_bar() -> None:
    out = _Terminal()
    bar = Progress(3, "global batches", "step", stream=out)
    assert bar.is_bar
    for _ in range(3):
        bar.update(1, tokens=7)
    bar.close()
    assert "\r" in out.getvalue() and "3/3" in out.getvalue() and "tokens=7" in out.getvalue()


def test_disabled_shows_nothing() -> None:
    out = _Terminal()
    bar = Progress(3, "x", "y", stream=out, disable=True)
    bar.update(3)
    bar.close()
    assert out.getvalue() == ""
    assert not is_terminal(io.StringIO())
