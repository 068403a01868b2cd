"""An empty cache directory, every backend and format: with and without a dataset index.

The first run on a machine finds nothing in ``ZEPHON_CACHE_DIR``: every shard is fetched
(remote) or read (local) and indexed, or, with a dataset index, read through it. Each case
runs on a fresh cache directory and must give the digests of the same records read as local
``.jsonl`` (a cache of its own). Without an index stderr says so; with one it does not, and
no object is fetched whole that the index makes unnecessary: only single-frame ``.zst``
shards (which cannot be read in part) are, each at most once, when a work item reads them.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

from tests.commands.run import zephon
from tests.io.conftest import Store, use_store
from tests.io.test_remote_digests import recipe, run
from zephon_nodes import DatasetSpec
from zephon_nodes.io.index import index
from zephon_nodes.io.storage import remote, storage

SHARDS = 3
RECORDS = 13
STEPS = 4
FORMATS = {"jsonl": ".jsonl", "zst1": ".jsonl.zst", "zstn": ".jsonl.zst", "parquet": ".parquet"}
SOURCES = ("local", "s3", "gcs", "azure", "http")


def _docs(shard: int) -> list[str]:
    return [f"shard {shard} doc {i} " + "word " * (i % 6) for i in range(RECORDS)]


def _write(root: Path, fmt: str) -> list[str]:
    """The corpus's shards in ``fmt`` under ``root``; return their names."""
    root.mkdir(parents=True)
    names = []
    for s in range(SHARDS):
        name = f"part-{s}{FORMATS[fmt]}"
        lines = [json.dumps({"text": t}) + "\n" for t in _docs(s)]
        if fmt == "jsonl":
            (root / name).write_text("".join(lines))
        elif fmt == "zst1":
            blob = zstandard.ZstdCompressor().compress("".join(lines).encode())
            (root / name).write_bytes(blob)
        elif fmt == "zstn":  # a frame per 4 records: read frame by frame through an index
            frames = [
                zstandard.ZstdCompressor().compress("".join(lines[k : k + 4]).encode())
                for k in range(0, RECORDS, 4)
            ]
            (root / name).write_bytes(b"".join(frames))
        else:
            pq.write_table(pa.table({"text": _docs(s)}), root / name, row_group_size=5)
        names.append(name)
    return names


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """Digests of the corpus as local ``.jsonl`` (read on a cache directory of its own)."""
    root = tmp_path_factory.mktemp("reference")
    _write(root / "jsonl", "jsonl")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ZEPHON_CACHE_DIR", str(root / "cache"))
        digests = run(recipe([str(root / "jsonl" / "*.jsonl")]), 1, STEPS)
    assert len(set(digests)) == STEPS
    return digests


@pytest.fixture
def fetches(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The objects fetched whole (each one's URI), counted at the storage layer."""
    seen: list[str] = []
    whole = storage.fetch

    def counted(uri: str, *a: Any, **k: Any) -> Any:
        seen.append(storage.redact(uri))
        return whole(uri, *a, **k)

    monkeypatch.setattr(storage, "fetch", counted)
    yield seen


def _place(
    request: pytest.FixtureRequest, mp: pytest.MonkeyPatch, source: str, root: Path, where: str
) -> tuple[list[str], bool]:
    """Copy ``root`` to ``source``; return the recipe paths and whether they are globs."""
    names = sorted(p.name for p in root.iterdir())
    suffix = Path(names[0]).name.partition(".")[2]
    if source == "local":
        return [str(root / f"*.{suffix}")], True
    if source == "http":
        server = request.getfixturevalue("http_server")
        shutil.copytree(root, server.root / where)
        return [server.url(f"{where}/{n}") for n in names], False
    store: Store = request.getfixturevalue(f"{source}_server")
    use_store(store, mp)
    base = store.put_tree(where.replace("/", "-"), root, "v1")
    return [base + f"/*.{suffix}"], True


@pytest.mark.parametrize("indexed", [False, True], ids=["no-index", "index"])
@pytest.mark.parametrize("fmt", list(FORMATS))
@pytest.mark.parametrize("source", SOURCES)
def test_cold_cache(
    source: str,
    fmt: str,
    indexed: bool,
    reference: list[str],
    fetches: list[str],
    request: pytest.FixtureRequest,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A first run on an empty cache directory gives the local digests; an index is used."""
    _write(tmp_path / "data", fmt)
    where = f"cold/{fmt}/{'i' if indexed else 'n'}"
    paths, globbed = _place(request, monkeypatch, source, tmp_path / "data", where)
    r = recipe(paths)
    if indexed:
        if globbed:
            assert zephon("index", *paths, "--quiet") == 0
        else:  # http(s): no listing, no writing: the index is kept aside and named
            out = str(tmp_path / "index.json")
            assert zephon("index", *paths, "--output", out, "--quiet") == 0
            r = r.replace(datasets=(DatasetSpec("web", paths=tuple(paths), index=out),))
    index.forget()
    remote.finish_progress()
    fetches.clear()
    capsys.readouterr()
    monkeypatch.setenv("ZEPHON_CACHE_DIR", str(tmp_path / "cold-cache"))
    try:
        assert run(r, 1, STEPS) == reference
    finally:
        index.forget()
        remote.finish_progress()
    err = capsys.readouterr().err
    is_remote = source != "local"
    if not indexed:
        assert ("without a dataset index" in err) == is_remote, err
        return
    assert "without a dataset index" not in err, err
    assert ("through the dataset index" in err) == is_remote, err
    if fmt == "zst1":  # read whole: fetched once each, when read, and said why
        assert len(fetches) == len(set(fetches)) and len(fetches) <= SHARDS, fetches
        assert ("to read them whole" in err) == is_remote, err
    else:  # the index has what a fetch would have given: nothing is fetched whole
        assert fetches == []


def test_inspect_and_resume_on_a_cold_cache(
    s3_env: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    """`inspect --recipe` and `digest --resume-from` over S3 single-frame .zst, cache empty."""
    _write(tmp_path / "data", "zst1")
    base = s3_env.put_tree("cold-cli", tmp_path / "data")
    recipe_path = tmp_path / "r.toml"
    recipe_path.write_text(
        "seed = 5\nnum_lanes = 4\nglobal_batch_size = 8\nseq_len = 24\nflush_every = 2\n"
        '[tokenizer]\nkind = "bytes"\n[[datasets]]\nname = "web"\n'
        f'paths = ["{base}/*.jsonl.zst"]\n[work]\nchunk_size = 4\n'
    )
    ckpt = tmp_path / "ckpt"
    monkeypatch.setenv("ZEPHON_CACHE_DIR", str(tmp_path / "cache-1"))
    saved = ["--steps", "4", "--save-at", "2", "--checkpoint-dir", str(ckpt)]
    try:
        assert zephon("digest", str(recipe_path), *saved) == 0
        whole = capsys.readouterr().out.splitlines()
        assert len(whole) == 4
        for k, argv in enumerate(
            (
                ["inspect", str(ckpt), "--recipe", str(recipe_path)],
                ["digest", str(recipe_path), "--steps", "2", "--resume-from", str(ckpt)],
            )
        ):
            monkeypatch.setenv("ZEPHON_CACHE_DIR", str(tmp_path / f"cold-{k}"))
            remote.finish_progress()
            assert zephon(*argv) == 0
            got = capsys.readouterr()
            assert "Traceback" not in got.err and "without a dataset index" in got.err
        assert got.out.splitlines() == whole[2:]
    finally:
        remote.finish_progress()
