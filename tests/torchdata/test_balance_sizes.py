"""Exact token sizes are computed once per node and served from its cache on later builds.

Sizes are checked against the corpus itself: with the ``bytes`` tokenizer (bos and eos on) a
record of ``n`` UTF-8 bytes is ``n + 2`` tokens, ``n + 1`` input/label pairs.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from zephon_nodes import DatasetSpec, Pipeline, Recipe, TokenizerSpec, WorkSpec
from zephon_nodes.engine.balance import BalancedWorkSource
from zephon_nodes.io.formats.entrysums import bad_entries
from zephon_nodes.io.index import index
from zephon_nodes.operators.tokenize import Tokenize
from zephon_nodes.verification.simulate import simulate

SHARDS, RECORDS, CHUNK = 5, 12, 4


def texts(salt: str = "") -> list[list[str]]:
    return [
        [f"{salt}s{s} r{r} " + "xyz" * ((s * 7 + r * 5) % 11) for r in range(RECORDS)]
        for s in range(SHARDS)
    ]


def write(folder: Path, corpus: list[list[str]]) -> None:
    folder.mkdir(exist_ok=True)
    for s, lines in enumerate(corpus):
        body = "".join(json.dumps({"text": t}) + "\n" for t in lines)
        (folder / f"p{s}.jsonl").write_text(body, encoding="utf-8")


def expected(corpus: list[list[str]], bos_eos: int = 2) -> list[int]:
    """Pairs per work item, from the texts: (bytes + bos + eos - 1) per record."""
    out = []
    for lines in corpus:
        for a in range(0, RECORDS, CHUNK):
            out.append(sum(len(t.encode()) + bos_eos - 1 for t in lines[a : a + CHUNK]))
    return out


def recipe(
    folder: Path, seed: int = 3, lanes: int = 4, pattern: str = "*.jsonl", **tok: bool
) -> Recipe:
    return Recipe(
        datasets=(DatasetSpec("d", paths=(str(folder / pattern),)),),
        tokenizer=TokenizerSpec(kind="bytes", **tok),
        seed=seed,
        num_lanes=lanes,
        global_batch_size=lanes,
        seq_len=32,
        flush_every=2,
        work=WorkSpec(chunk_size=CHUNK, epochs=1, deal="balanced"),
    )


@pytest.fixture
def calls(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """A private cache directory; the tokenizer's calls counted (one per work item)."""
    monkeypatch.setenv("ZEPHON_CACHE_DIR", str(tmp_path / "zc"))
    counted: list[int] = []
    real = Tokenize.__call__

    def counting(self: Tokenize, batch: object) -> object:
        counted.append(1)
        return real(self, batch)  # type: ignore[arg-type]

    monkeypatch.setattr(Tokenize, "__call__", counting)
    return counted


def sizes(p: Pipeline) -> list[int]:
    ws = p.work_source
    assert isinstance(ws, BalancedWorkSource) and ws.measure == "tokens"
    return [int(x) for x in ws.item_sizes]


def digests(p: Pipeline) -> list[str]:
    return [r.digest for r, _ in simulate(p, 2, 100, num_workers=0)]


def test_second_build_reads_the_sizes_and_tokenizes_nothing(
    tmp_path: Path, calls: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    corpus = texts()
    write(tmp_path / "d", corpus)
    items = SHARDS * RECORDS // CHUNK
    first = Pipeline(recipe(tmp_path / "d"))
    assert len(calls) == items and sizes(first) == expected(corpus)
    calls.clear()
    again = Pipeline(recipe(tmp_path / "d"))
    assert calls == [] and sizes(again) == expected(corpus)
    # Another seed and lane count deal the same sizes: still nothing tokenized.
    other = Pipeline(recipe(tmp_path / "d", seed=9, lanes=3))
    assert calls == [] and sizes(other) == expected(corpus)
    # The same digests as a build that computed its sizes (a fresh cache directory).
    ref = digests(first)
    monkeypatch.setenv("ZEPHON_CACHE_DIR", str(tmp_path / "fresh"))
    calls.clear()
    fresh = Pipeline(recipe(tmp_path / "d"))
    assert len(calls) == items
    assert digests(again) == ref == digests(fresh)


def test_changed_content_or_tokenizer_computes_new_sizes(tmp_path: Path, calls: list[int]) -> None:
    write(tmp_path / "d", texts())
    Pipeline(recipe(tmp_path / "d"))
    changed = texts(salt="new ")
    write(tmp_path / "d", changed)
    calls.clear()
    assert sizes(Pipeline(recipe(tmp_path / "d"))) == expected(changed) and calls
    calls.clear()
    no_eos = Pipeline(recipe(tmp_path / "d", add_eos=False))
    assert sizes(no_eos) == expected(changed, bos_eos=1) and calls


@pytest.mark.parametrize("indexed", [False, True])
def test_the_same_bytes_as_plain_text_lines_are_sized_as_lines(
    indexed: bool, tmp_path: Path, calls: list[int]
) -> None:
    """``.txt`` shards holding the bytes of ``.jsonl`` ones sized before: each line is a text.

    The shards' checksums are the same; their records are not (a plain-text line is its
    own text, JSON and all), so neither are the sizes, nor the deal made of them. With
    dataset indexes the key is made from their columns.
    """
    corpus = texts()
    write(tmp_path / "d", corpus)
    (tmp_path / "t").mkdir()
    for s in range(SHARDS):
        (tmp_path / "t" / f"p{s}.txt").write_bytes((tmp_path / "d" / f"p{s}.jsonl").read_bytes())
    for folder, pattern in (("d", "*.jsonl"), ("t", "*.txt")) if indexed else ():
        directory, manifest = index.build_index([str(tmp_path / folder / pattern)], workers=1)
        index.write_index(manifest, str(tmp_path / folder / index.INDEX_NAME), directory)
    assert sizes(Pipeline(recipe(tmp_path / "d"))) == expected(corpus)
    lines = [[json.dumps({"text": t}) for t in shard] for shard in corpus]
    calls.clear()
    assert sizes(Pipeline(recipe(tmp_path / "t", pattern="*.txt"))) == expected(lines)
    assert calls


def test_a_damaged_sizes_file_is_recomputed_and_counted(tmp_path: Path, calls: list[int]) -> None:
    corpus = texts()
    write(tmp_path / "d", corpus)
    Pipeline(recipe(tmp_path / "d"))
    (stored,) = (tmp_path / "zc" / "sizes").glob("*.npy")
    values = np.load(stored)
    values[0] += 1  # a flipped value: its check no longer holds
    np.save(stored, values)
    calls.clear()
    bad = bad_entries()
    assert sizes(Pipeline(recipe(tmp_path / "d"))) == expected(corpus)
    assert calls and bad_entries() == bad + 1
    calls.clear()
    assert sizes(Pipeline(recipe(tmp_path / "d"))) == expected(corpus) and calls == []


def test_an_indexed_dataset_is_keyed_by_its_index(tmp_path: Path, calls: list[int]) -> None:
    """With a dataset index the key comes from its columns: no shard is opened to make it."""
    corpus = texts()
    write(tmp_path / "d", corpus)
    directory, manifest = index.build_index([str(tmp_path / "d" / "*.jsonl")], workers=1)
    index.write_index(manifest, str(tmp_path / "d" / index.INDEX_NAME), directory)
    assert sizes(Pipeline(recipe(tmp_path / "d"))) == expected(corpus)
    calls.clear()
    assert sizes(Pipeline(recipe(tmp_path / "d"))) == expected(corpus) and calls == []
