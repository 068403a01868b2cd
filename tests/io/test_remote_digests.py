"""The same recipe over local, s3://, gs://, az:// and http:// copies gives the same digests.

One suite for every backend, each against a real server on 127.0.0.1: moto (S3),
gcp-storage-emulator (GCS), Azurite (Azure Blob) and nginx (HTTP): digests at dp 1/2/4 and
both runners, a dataset index, the bounded node cache, a changed object refused at resume,
and an outage of the endpoint for 10 s (marked slow).
"""

from __future__ import annotations

import json
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import zstandard

from tests.commands.run import zephon
from tests.io.conftest import STORES, OutageProxy, Store, use_store
from zephon_nodes import DatasetSpec, Pipeline, Recipe, TokenizerSpec, WorkSpec, simulate
from zephon_nodes.core.errors import CheckpointError
from zephon_nodes.io.index import index
from zephon_nodes.io.nodecache.nodecache import set_cache_limit
from zephon_nodes.io.storage import storage

STEPS = 6


def _doc(i: int) -> str:
    return json.dumps({"text": f"doc {i} " + "word " * (i % 9 + 1)})


def write_corpus(root: Path, sizes: tuple[int, ...] = (23, 0, 17, 31)) -> list[str]:
    """Shards a.jsonl (with a blank line), b.jsonl (empty), c.jsonl.zst (2 frames), d.jsonl."""
    root.mkdir(parents=True, exist_ok=True)
    names = []
    start = 0
    for k, n in enumerate(sizes):
        lines = [_doc(start + i) for i in range(n)]
        start += n
        name = "abcdefgh"[k % 8] + str(k // 8)
        if k % 3 == 2:
            half = len(lines) // 2
            blob = b"".join(
                zstandard.ZstdCompressor().compress(("\n".join(part) + "\n").encode())
                for part in (lines[:half], lines[half:])
            )
            (root / f"{name}.jsonl.zst").write_bytes(blob)
            names.append(f"{name}.jsonl.zst")
        else:
            text = "\n".join([*lines[:3], "", *lines[3:]]) + ("\n" if lines else "")
            (root / f"{name}.jsonl").write_text(text)
            names.append(f"{name}.jsonl")
    return names


def recipe(paths: list[str], **kw: Any) -> Recipe:
    """A tiny byte-tokenizer recipe over ``paths``."""
    base: dict[str, Any] = {
        "datasets": (DatasetSpec("web", paths=tuple(paths)),),
        "tokenizer": TokenizerSpec(kind="bytes"),
        "seed": 5,
        "num_lanes": 4,
        "global_batch_size": 8,
        "seq_len": 24,
        "flush_every": 2,
        "work": WorkSpec(chunk_size=4),
    }
    base.update(kw)
    return Recipe(**base)


def run(r: Recipe, world: int = 1, steps: int = STEPS, **kw: Any) -> list[str]:
    """Digests of a simulated run."""
    return [x.digest for x, _ in simulate(Pipeline(r), world, steps, **kw)]


SOURCES = (*STORES, "http")


@pytest.fixture(scope="module")
def local(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The corpus on local disk and its reference digests."""
    root = tmp_path_factory.mktemp("corpus")
    names = write_corpus(root)
    r = recipe([str(root / "*.jsonl*")])
    return {"root": root, "names": names, "recipe": r, "reference": run(r, 1, num_workers=1)}


def put_copy(
    request: pytest.FixtureRequest, source: str, root: Path, names: list[str], where: str
) -> tuple[list[str], Store | None]:
    """Copy ``root`` to ``source`` under ``where``; return the recipe paths and the store.

    An object store's variables must be set (:func:`use_store`) while its paths are read.
    """
    if source == "http":
        server = request.getfixturevalue("http_server")
        shutil.copytree(root, server.root / where)
        return [server.url(f"{where}/{n}") for n in names], None
    store: Store = request.getfixturevalue(f"{source}_server")
    base = store.put_tree(where, root, "v1")
    return [base + "/*.jsonl*"], store


@pytest.fixture(scope="module", params=SOURCES)
def remote(request: pytest.FixtureRequest, local: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The corpus copied to each backend in turn, its variables set for the module."""
    with pytest.MonkeyPatch.context() as mp:
        store = None
        if request.param != "http":
            store = request.getfixturevalue(f"{request.param}_server")
            use_store(store, mp)
        paths, _ = put_copy(request, request.param, local["root"], local["names"], "corpus")
        yield {"source": request.param, "store": store, "recipe": recipe(paths)}
    storage._forget_filesystems()


def test_reference_is_not_trivial(local):
    """The reference run has STEPS distinct batches."""
    assert len(local["reference"]) == STEPS and len(set(local["reference"])) == STEPS


@pytest.mark.parametrize(("world", "workers"), [(1, 1), (2, 2), (4, 2)])
def test_remote_copies_give_the_local_digests(remote, local, world, workers):
    """Every backend's copy: identical digests at dp 1, 2 and 4, 1 and 2 workers."""
    assert run(remote["recipe"], world, num_workers=workers) == local["reference"]


@pytest.mark.parametrize("remote", ["s3"], indirect=True)
def test_process_runner_over_s3(remote, local):
    """Worker processes reading S3 give the same digests (one store: ~25 s a backend)."""
    assert run(remote["recipe"], 2, num_workers=1, runner="process") == local["reference"]


def test_fingerprint_is_the_same_for_every_copy(remote, local):
    """Where the bytes live is not part of the fingerprint."""
    assert Pipeline(remote["recipe"]).fingerprint == Pipeline(local["recipe"]).fingerprint


def test_resume_on_another_copy_at_another_dp(remote, local):
    """Saved over the backend at dp 2, resumed locally at dp 4 and remotely at dp 1."""
    saved: dict[str, Any] = {}
    list(simulate(Pipeline(remote["recipe"]), 2, 3, save_at=3, on_save=saved.update))
    assert run(local["recipe"], 4, STEPS - 3, resume_state=saved) == local["reference"][3:]
    assert run(remote["recipe"], 1, STEPS - 3, resume_state=saved) == local["reference"][3:]


def test_dataset_index_over_the_copy(remote, local, request, tmp_path):
    """`zephon index` over the backend's copy: the index is found and used, same digests.

    An object store gets the index beside its shards; http(s) (no listing, no writing)
    needs ``--output`` and the dataset's ``index``.
    """
    source = remote["source"]
    paths, _ = put_copy(request, source, local["root"], local["names"], "indexed")
    index.forget()
    if source == "http":
        where = str(tmp_path / "http-index.json")
        assert zephon("index", *paths, "--output", where, "--quiet") == 0
        spec = DatasetSpec("web", paths=tuple(paths), index=where)
        r = recipe(paths).replace(datasets=(spec,))
    else:
        assert zephon("index", *paths, "--quiet") == 0
        where = paths[0].rsplit("/", 1)[0] + "/" + index.INDEX_NAME
        r = recipe(paths)
    try:
        pipeline = Pipeline(r)
        first = storage.expand(paths[0])[0] if source != "http" else paths[0]
        found = index.find_entry(first)
        assert found is not None and found[1] == where
        assert [x.digest for x, _ in simulate(pipeline, 2, STEPS)] == local["reference"]
    finally:
        index.forget()


def test_changed_remote_file_is_refused_at_resume(store: Store, tmp_path):
    """A same-size edit of one object is refused at resume, naming the file."""
    root = tmp_path / "c"
    write_corpus(root)
    base = store.put_tree("changing", root)
    r = recipe([base + "/*.jsonl*"])
    saved: dict[str, Any] = {}
    list(simulate(Pipeline(r), 2, 2, save_at=2, on_save=saved.update))
    text = (root / "d0.jsonl").read_bytes()
    (root / "d0.jsonl").write_bytes(text.replace(b"doc 40", b"doc 04"))
    assert len((root / "d0.jsonl").read_bytes()) == len(text)
    store.put_tree("changing", root)
    with pytest.raises(CheckpointError, match=r"content changed in d0\.jsonl"):
        next(simulate(Pipeline(r), 2, 1, resume_state=saved))


def _zst_corpus(root: Path, shards: int = 6) -> int:
    """Single-frame .jsonl.zst shards (read whole, through the node cache); their size."""
    root.mkdir(parents=True)
    biggest = 0
    for s in range(shards):
        rows = [json.dumps({"text": f"zst {s} doc {r} " * (1 + (s + r) % 4)}) for r in range(18)]
        blob = ("\n".join(rows) + "\n").encode()
        biggest = max(biggest, len(blob))
        (root / f"z{s}.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(blob))
    return biggest


def test_node_cache_limit_over_the_store(store: Store, tmp_path, monkeypatch):
    """Single-frame .zst shards fetched from the store into a node cache of two shards:
    the local digests, the cache never above its limit, every shard fetched."""
    root = tmp_path / "zst"
    biggest = _zst_corpus(root)
    monkeypatch.setenv("ZEPHON_CACHE_DIR", str(tmp_path / "plain"))
    reference = run(recipe([str(root / "*.jsonl.zst")]), 2, STEPS)
    base = store.put_tree("zsts", root)
    assert zephon("index", base + "/*.jsonl.zst", "--quiet") == 0
    index.forget()
    monkeypatch.setenv("ZEPHON_CACHE_DIR", str(tmp_path / "zc"))
    limit = 2 * biggest
    set_cache_limit(limit)
    try:
        pipeline = Pipeline(recipe([base + "/*.jsonl.zst"]))
        assert [x.digest for x, _ in simulate(pipeline, 2, STEPS)] == reference
        stats = pipeline.cache_stats()
    finally:
        set_cache_limit(None)
        index.forget()
    assert stats is not None and 0 < stats["peak_bytes"] <= limit
    assert stats["fetches"] >= 3  # more shards than fit: fetched from the store


@pytest.mark.slow
@pytest.mark.parametrize("source", STORES)
def test_outage_of_10_s_costs_time_not_bytes(source, local, request, monkeypatch):
    """The endpoint vanishes for 10 s mid-run (connections reset, new ones refused) and
    comes back on the same port: the same digests, and reads went through it after.

    The outage starts inside the third read after the pipeline is built, so a read is
    always in flight when the endpoint goes (reads ahead of the consumer cannot race it).
    """
    server: Store = request.getfixturevalue(f"{source}_server")
    use_store(server, monkeypatch)
    paths, _ = put_copy(request, source, local["root"], local["names"], "outage")
    proxy = OutageProxy(server.port)
    timers: list[threading.Timer] = []
    reads = [0]
    real = storage._cat_range

    def come_back() -> None:
        proxy.start()
        proxy.restarts += 1

    def cat(uri: str, start: int, stop: int, *pinned: str) -> bytes:
        reads[0] += 1
        if reads[0] == 3:
            proxy.stop()
            timers.append(threading.Timer(10.0, come_back))
            timers[0].start()
        return real(uri, start, stop, *pinned)

    try:
        use_store(server, monkeypatch, proxy.port)
        monkeypatch.setenv("ZEPHON_STORAGE_BACKOFF_MAX_S", "0.5")
        monkeypatch.setenv("ZEPHON_READ_CACHE_MB", "0")  # every read goes to the endpoint
        pipeline = Pipeline(recipe(paths))  # indexed before the outage (fetched once)
        monkeypatch.setattr(storage, "_cat_range", cat)
        t = time.monotonic()
        got = [x.digest for x, _ in simulate(pipeline, 2, STEPS, num_workers=2)]
        took = time.monotonic() - t
        assert timers, "no read after the build: the outage never happened"
        timers[0].join()
        assert got == local["reference"]
        # The endpoint really went away (the run waited for it) and came back.
        assert proxy.restarts == 1 and took >= 9.5 and reads[0] > 3
    finally:
        for timer in timers:
            timer.cancel()
        proxy.stop()
        storage._forget_filesystems()


def test_corrupt_remote_shard_is_skipped_like_a_local_one(store: Store, tmp_path):
    """Under on_error = "skip", a truncated .zst in the store is left out exactly as locally."""
    root = tmp_path / "c"
    write_corpus(root)
    blob = (root / "c0.jsonl.zst").read_bytes()
    (root / "c0.jsonl.zst").write_bytes(blob[: len(blob) - 7])
    base = store.put_tree("corrupt", root)
    spec = DatasetSpec("web", paths=(str(root / "*.jsonl*"),), on_error="skip")
    local = recipe([str(root / "*.jsonl*")]).replace(datasets=(spec,))
    remote = local.replace(datasets=(DatasetSpec("web", paths=(base + "/*",), on_error="skip"),))
    p_local, p_remote = Pipeline(local), Pipeline(remote)
    assert p_local.skipped_files == p_remote.skipped_files
    assert sum(p_local.skipped_files["web"].values()) >= 2  # the empty file and the corrupt one
    assert p_local.fingerprint == p_remote.fingerprint
    assert run(remote, 2, 3) == run(local, 2, 3)


def test_copy_in_another_folder_resumes(local, tmp_path):
    """The same shards copied elsewhere (new paths, new mtimes) resume the run."""
    saved: dict[str, Any] = {}
    list(simulate(Pipeline(local["recipe"]), 2, 2, save_at=2, on_save=saved.update))
    copy = tmp_path / "elsewhere" / "data"
    shutil.copytree(local["root"], copy)
    moved = recipe([str(copy / "*.jsonl*")])
    assert run(moved, 4, STEPS - 2, resume_state=saved) == local["reference"][2:]
