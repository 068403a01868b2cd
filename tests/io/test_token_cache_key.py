"""Each part of a token-cache key matters (issue 35.3): a mutation dropping one is caught.

A work item's record range and its dataset's ``on_error`` policy decide its tokens; a warm
cache read by a recipe that differs in exactly one of them must give what the cache off
gives (never an entry stored for the other recipe).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.io.test_token_cache import digests, write_corpus
from tests.mixing.conftest import train_hf_tokenizer
from zephon_nodes import DatasetSpec, Recipe, TokenizerSpec, WorkSpec
from zephon_nodes.core.errors import DataError
from zephon_nodes.io.nodecache.tokenstore import (
    ENABLED_ENV,
    LIMIT_ENV,
    token_cache_settings,
    token_store,
)


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A private cache directory; returns the token cache's folder. Cache off at first."""
    monkeypatch.setenv("ZEPHON_CACHE_DIR", str(tmp_path / "zc"))
    monkeypatch.setenv(ENABLED_ENV, "off")
    monkeypatch.delenv(LIMIT_ENV, raising=False)
    yield tmp_path / "zc" / "tokens"


def _recipe(root: Path, chunk_size: int = 4, on_error: str = "raise") -> Recipe:
    return Recipe(
        datasets=(DatasetSpec("web", paths=(str(root / "*.jsonl"),), on_error=on_error),),
        tokenizer=TokenizerSpec(kind="bytes"),
        seed=7,
        num_lanes=4,
        global_batch_size=8,
        seq_len=24,
        flush_every=2,
        work=WorkSpec(chunk_size=chunk_size),
    )


def test_a_warm_cache_of_another_chunk_size(
    tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Items of 4 records cached, then read with items of 5: the chunk-5 batches (cache off).

    Shards of 20 records: the last item of a shard is [16, 20) at 4 and [15, 20) at 5, the
    same end and another start.
    """
    write_corpus(tmp_path / "d")
    off = digests(_recipe(tmp_path / "d", 5))
    assert off != digests(_recipe(tmp_path / "d", 4))
    monkeypatch.setenv(ENABLED_ENV, "on")
    digests(_recipe(tmp_path / "d", 4))  # the cache holds the chunk-4 items
    stored = len(list((cache / "data").iterdir()))
    assert digests(_recipe(tmp_path / "d", 5)) == off
    # Every chunk-5 item is an entry of its own (4 per shard of 20), none served from chunk 4.
    assert len(list((cache / "data").iterdir())) == stored + 4 * 6


def test_a_skip_run_cached_does_not_let_a_raise_run_skip(
    tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under ``skip`` a bad record is dropped and the item cached; under ``raise`` it raises."""
    monkeypatch.setenv("ZEPHON_ITEM_SIZES", "off")  # every build sizes through the token cache
    write_corpus(tmp_path / "d")
    part = tmp_path / "d" / "part-03.jsonl"
    lines = part.read_text().splitlines()
    lines[6] = '{"text": "a record cut in the middle'
    part.write_text("\n".join(lines) + "\n")
    skip = _recipe(tmp_path / "d", on_error="skip")
    off = digests(skip)
    monkeypatch.setenv(ENABLED_ENV, "on")
    assert digests(skip) == off  # cold: stored, the bad record counted as skipped
    skipped = [e for e in (cache / "data").iterdir() if b'"skipped": [["' in e.read_bytes()[:400]]
    assert len(skipped) == 1  # the item holding the bad record, cached with its skip
    with pytest.raises(DataError, match=r"part-03\.jsonl:7: invalid JSON"):
        digests(_recipe(tmp_path / "d", on_error="raise"))
    # The other items were served from the cache: only the bad one's key differs.
    assert token_store(str(cache), token_cache_settings()[1]).stats()["hits"] > 0


def test_a_full_disk_warns_once_and_runs_uncached(
    tmp_path: Path,
    cache: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """ENOSPC writing an entry (issue 35.5): one line on stderr, the cache-off digests."""
    import errno

    from zephon_nodes.io.nodecache import tokenstore

    write_corpus(tmp_path / "d")
    r = _recipe(tmp_path / "d")
    off = digests(r)
    monkeypatch.setenv(ENABLED_ENV, "on")

    def full(f: object, entry: object, key: str) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(tokenstore, "write_entry", full)
    capsys.readouterr()
    assert digests(r) == off
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if "token cache" in line]
    assert len(lines) == 1 and "No space left on device" in lines[0], err
    assert not list((cache / "data").iterdir())  # nothing half-written left
    assert token_store(str(cache), token_cache_settings()[1]).stats()["uncached"] > 0


def _sentencepiece(path: Path, vocab_size: int) -> Path:
    import sentencepiece as spm

    texts = [
        f"shard {s} record {r} " + "abcdefgh"[: (s + r) % 8] * 4
        for s in range(6)
        for r in range(20)
    ]
    with open(path, "wb") as f:
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(texts * 3),
            model_writer=f,
            vocab_size=vocab_size,
            model_type="bpe",
            minloglevel=2,
        )
    return path


def _tokenizer_files(kind: str, root: Path) -> tuple[bytes, bytes]:
    """Two tokenizers of ``kind`` that encode the corpus differently (their files' bytes)."""
    root.mkdir()
    if kind == "hf":
        from tokenizers import Tokenizer

        first = train_hf_tokenizer(root / "a.json")
        edited = Tokenizer.from_file(str(first))
        edited.add_tokens(["record"])
        edited.save(str(root / "b.json"))
        return first.read_bytes(), (root / "b.json").read_bytes()
    a = _sentencepiece(root / "a.model", 40).read_bytes()
    return a, _sentencepiece(root / "b.model", 60).read_bytes()


@pytest.mark.parametrize("kind", ["hf", "sentencepiece"])
def test_a_tokenizer_file_retrained_in_place_is_not_stored_under_the_new_key(
    kind: str, tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A tokenizer file replaced at the same path in a running process (a notebook retrains it).

    The key names the new file's SHA-256: the entries stored under it must hold the new
    tokenizer's ids, not those of the tokenizer the process loaded from that path before
    (which later runs, anywhere the cache is shared, would then be served).
    """
    from zephon_nodes.operators import tokenize

    first, second = _tokenizer_files(kind, tmp_path / "t")
    write_corpus(tmp_path / "d")
    # The expected digests: the second tokenizer, from another path, the cache off.
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "tok").write_bytes(second)
    expected = digests(_tokenizer_recipe(tmp_path, kind, tmp_path / "elsewhere" / "tok"))
    path = tmp_path / "tok"
    path.write_bytes(first)
    monkeypatch.setenv(ENABLED_ENV, "on")
    before = digests(_tokenizer_recipe(tmp_path, kind, path))  # stored under the first's key
    assert before != expected
    path.write_bytes(second)  # retrained in place
    assert digests(_tokenizer_recipe(tmp_path, kind, path)) == expected
    # What a new process reads from the cache: the second tokenizer's ids.
    monkeypatch.setattr(tokenize, "_TOKENIZERS", {})
    hits = token_store(str(cache), token_cache_settings()[1]).stats()["hits"]
    assert digests(_tokenizer_recipe(tmp_path, kind, path)) == expected
    assert token_store(str(cache), token_cache_settings()[1]).stats()["hits"] > hits


def _tokenizer_recipe(root: Path, kind: str, tok: Path) -> Recipe:
    return Recipe(
        datasets=(DatasetSpec("web", paths=(str(root / "d" / "*.jsonl"),)),),
        tokenizer=TokenizerSpec(kind=kind, path=tok),
        seed=7,
        num_lanes=4,
        global_batch_size=8,
        seq_len=24,
        flush_every=2,
        work=WorkSpec(chunk_size=4),
    )


def test_a_tokenizer_file_changed_after_the_build_is_refused_by_the_workers(
    tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Worker processes load the tokenizer file the pipeline was built with, or refuse it.

    A file replaced between the build (which keyed the cache by its SHA-256) and a spawned
    worker's load would tokenize with another tokenizer and store its ids under the key of
    the first: later runs of the first would be served them.
    """
    from zephon_nodes import Pipeline
    from zephon_nodes.core.errors import RecipeError
    from zephon_nodes.verification.simulate import simulate

    first, second = _tokenizer_files("hf", tmp_path / "t")
    write_corpus(tmp_path / "d")
    path = tmp_path / "tok"
    path.write_bytes(first)
    expected = digests(_tokenizer_recipe(tmp_path, "hf", path))  # the cache off
    monkeypatch.setenv(ENABLED_ENV, "on")
    built = Pipeline(_tokenizer_recipe(tmp_path, "hf", path))
    path.write_bytes(second)
    with pytest.raises(RecipeError, match=r"tok changed since the pipeline was built"):
        list(simulate(built, 1, 10_000, runner="process"))
    path.write_bytes(first)
    assert digests(_tokenizer_recipe(tmp_path, "hf", path)) == expected


def test_entries_of_the_code_before_the_huge_document_cut_fix_are_not_served(
    tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Entries keyed under code version 1 are never served (issue: 13d68f6 changed ids).

    13d68f6 changed the ids a huge document is tokenized into (a cut the check windows
    accepted while the whole text merged across it), so entries written before it may hold
    ids the parse and tokenize of today do not give. Here every entry written under version
    1's keys holds other ids (each shifted by one): a run today gives the cache-off digests.
    """
    from zephon_nodes.io.nodecache.tokenstore import Entry, read_entry, write_entry
    from zephon_nodes.operators import tokencache

    write_corpus(tmp_path / "d")
    r = _recipe(tmp_path / "d")
    off = digests(r)
    monkeypatch.setenv(ENABLED_ENV, "on")
    with monkeypatch.context() as m:
        m.setattr(tokencache, "CODE_VERSION", 1)
        assert digests(r) == off
    stored = sorted((cache / "data").iterdir())
    assert stored
    for path in stored:  # the same entries, other ids (3..258 stay the byte tokenizer's)
        blob = path.read_bytes()
        key = json.loads(blob[24 : 24 + int.from_bytes(blob[8:12], "little")])["key"]
        old = read_entry(path, key)
        shifted = 3 + (old.tokens - 3 + 1) % 256
        with open(path, "wb") as f:
            write_entry(f, Entry(shifted, old.lengths, old.skipped, old.cpu_ns), key)
    assert digests(r) == off
