"""Plain-text shards (``.txt``, ``.txt.zst``): each non-blank line is one document.

Checked against the same documents written as JSON lines (``{"text": line}``): the runs
give the same batches, so every line is a document, in order, with its text as written. A
line that looks like JSON is text like any other; blank lines (CRLF ones included) are not
documents; invalid UTF-8 is named by file and line, or skipped and counted under ``skip``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import zstandard

from zephon_nodes import DatasetSpec, Pipeline, Recipe, TokenizerSpec, WorkSpec, simulate
from zephon_nodes.core.errors import DataError
from zephon_nodes.io.nodecache.tokenstore import ENABLED_ENV, LIMIT_ENV

LINES = [
    f"line {i}: " + "word " * (i % 13) + ("caf\u00e9 \u4e2d" if i % 5 == 0 else "")
    for i in range(90)
]
LINES[7] = '{"text": "a line that looks like JSON"}'


def _recipe(pattern: Path, on_error: str = "raise") -> Recipe:
    return Recipe(
        datasets=(DatasetSpec("t", paths=(str(pattern),), on_error=on_error),),
        tokenizer=TokenizerSpec(kind="bytes"),
        seed=7,
        num_lanes=4,
        global_batch_size=8,
        seq_len=24,
        flush_every=2,
        work=WorkSpec(chunk_size=4),
    )


def digests(recipe: Recipe, world: int = 1) -> list[str]:
    return [r.digest for r, _ in simulate(Pipeline(recipe), world, 10_000)]


def _text(lines: list[str]) -> bytes:
    """The lines with blank ones between (LF and CRLF) and CRLF endings on some."""
    out = []
    for i, line in enumerate(lines):
        out.append(line + ("\r\n" if i % 3 == 0 else "\n"))
        if i % 10 == 4:
            out.append("\n" if i % 20 == 4 else "\r\n")
    return "".join(out).encode()


def _jsonl(lines: list[str]) -> bytes:
    return "".join(json.dumps({"text": line}) + "\n" for line in lines).encode()


@pytest.fixture
def corpus(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The same 90 documents as two .txt shards, two .txt.zst shards and two .jsonl ones."""
    monkeypatch.setenv("ZEPHON_CACHE_DIR", str(tmp_path / "zc"))
    monkeypatch.setenv(ENABLED_ENV, "off")
    monkeypatch.delenv(LIMIT_ENV, raising=False)
    halves = [LINES[:50], LINES[50:]]
    for folder in ("txt", "zst", "jsonl"):
        (tmp_path / folder).mkdir()
    for k, half in enumerate(halves):
        (tmp_path / "txt" / f"s{k}.txt").write_bytes(_text(half))
        packed = zstandard.ZstdCompressor().compress(_text(half))
        (tmp_path / "zst" / f"s{k}.txt.zst").write_bytes(packed)
        (tmp_path / "jsonl" / f"s{k}.jsonl").write_bytes(_jsonl(half))
    yield tmp_path


@pytest.mark.parametrize("folder", ["txt", "zst"])
def test_each_line_is_a_document_as_in_json_lines(corpus: Path, folder: str) -> None:
    expected = digests(_recipe(corpus / "jsonl" / "*.jsonl"))
    assert len(expected) > 5
    plain = _recipe(corpus / folder / "*.txt*")
    assert Pipeline(plain).datasets[0].num_records == len(LINES)  # blank lines are not
    assert digests(plain) == expected
    assert digests(plain, world=2) == expected


def test_invalid_utf8_is_named_or_skipped(corpus: Path) -> None:
    bad = corpus / "txt" / "s0.txt"
    bad.write_bytes(bad.read_bytes().replace(b"line 3:", b"line \xff:", 1))
    with pytest.raises(DataError, match=r"s0\.txt:\d+: invalid UTF-8"):
        digests(_recipe(corpus / "txt" / "*.txt"))
    node = Pipeline(_recipe(corpus / "txt" / "*.txt", "skip")).rank_node()
    node.reset(None)
    steps = sum(1 for _ in node)
    node.close()
    assert steps > 5 and node.metrics()["skipped"] == {"invalid_utf8": 1}


def test_a_warm_token_cache_tells_text_lines_from_json_lines(
    corpus: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same bytes as a .jsonl and as a .txt shard: each read as its own format.

    The token cache keys an item by its shard's content: without the format in the key, the
    second recipe would be served the first one's tokens.
    """
    for name in ("same.jsonl", "same.txt"):
        (corpus / "same").mkdir(exist_ok=True)
        (corpus / "same" / name).write_bytes(_jsonl(LINES))
    as_json = _recipe(corpus / "same" / "*.jsonl")
    as_text = _recipe(corpus / "same" / "*.txt")
    off = digests(as_json), digests(as_text)
    assert off[0] != off[1]
    monkeypatch.setenv(ENABLED_ENV, "on")
    assert digests(as_json) == off[0]  # fills the cache
    assert digests(as_text) == off[1]
    assert digests(as_text) == off[1]  # and from the cache
