"""A remote object overwritten with the same size during a run (issue 27.2, remote half).

Every range read of a remote shard is conditional on the version tag seen when the shard
was opened (S3 ``IfMatch``, Azure ``If-Match``, HTTP ``If-Match``, GCS generation checked).
Against the real servers (moto, Azurite, gcp-storage-emulator, nginx), the object is
replaced between two batches by one of the same size, and the run either stops with the
"object changed during the run" error, or (every block it still needs cached at the
pinned version, or the shard read whole at open) gives exactly the unchanged run's
batches. In both cases every batch delivered equals the baseline computed from the
original local files: never a batch of new bytes.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import zstandard

from tests.commands.run import zephon
from tests.io.conftest import STORES, Store, use_store
from tests.io.servers import IgnoringIfMatchServer
from tests.io.test_hf_versions import hub, upload  # noqa: F401 (hub: a fixture)
from tests.io.test_remote_digests import recipe as _recipe
from zephon_nodes import DatasetSpec, Pipeline, Recipe, WorkSpec, simulate
from zephon_nodes.core.errors import DataError
from zephon_nodes.io.index import index
from zephon_nodes.io.storage import storage

STEPS = 200  # more than three passes over the small corpus: the run ends with the data
CHANGED = r"the object changed during the run: it was version '[^']+' when its shard"


def recipe(paths: list[str], **kw: Any) -> Recipe:
    """The byte-tokenizer recipe of the remote suite, three passes over the data: reads go
    on long after the overwrite, whatever is read ahead."""
    return _recipe(paths, work=WorkSpec(chunk_size=4, epochs=3), **kw)


def _corpus(root: Path, docs: int = 200) -> Path:
    """One jsonl shard of ``docs`` records (about 10 kB: one 1 MiB block)."""
    root.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps({"text": f"doc {i} " + "word " * (i % 9 + 1)}) for i in range(docs)]
    path = root / "a.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def _same_size_edit(blob: bytes) -> bytes:
    """Every record changed, not one byte more or less."""
    out = blob.replace(b"word", b"WORD")
    assert out != blob and len(out) == len(blob)
    return out


def _replace_served(dest: Path, blob: bytes) -> None:
    """Replace a file nginx serves as an object store replaces an object: at once.

    The new bytes go to a file beside it, dated 10 s after the old one (nginx's ETag and
    Last-Modified are the mtime in seconds and the size: a rewrite within the same second
    would keep them), then renamed over it. Written in place, a read running beside the
    rewrite (the run's read-ahead) could see the truncated file (416) or the new bytes under
    the old mtime and size, which no object store serves.
    """
    old = dest.stat().st_mtime
    fresh = dest.with_name(dest.name + ".new")
    fresh.write_bytes(blob)
    os.utime(fresh, (old + 10, old + 10))
    os.replace(fresh, dest)


def _digests(r: Recipe, steps: int = STEPS) -> list[str]:
    return [x.digest for x, _ in simulate(Pipeline(r), 1, steps, num_workers=1)]


def _run_with_overwrite(
    r: Recipe, overwrite: Any, steps: int = STEPS
) -> tuple[list[str], DataError | None]:
    """Digests until the run ends or stops; ``overwrite()`` runs after the first batch."""
    got: list[str] = []
    it = simulate(Pipeline(r), 1, steps, num_workers=1)
    try:
        for batch, _ in it:
            got.append(batch.digest)
            if len(got) == 1:
                overwrite()
    except DataError as e:
        return got, e
    return got, None


@pytest.fixture(params=[*STORES, "http"])
def backend(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """(put, overwrite) for one backend: ``put(root, where) -> uri of a.jsonl`` and
    ``overwrite(local file, where)`` replacing the object with the file's bytes."""
    if request.param == "http":
        server = request.getfixturevalue("http_server")

        def put_http(root: Path, where: str) -> str:
            shutil.copytree(root, server.root / where)
            return str(server.url(f"{where}/a.jsonl"))

        def over_http(path: Path, where: str) -> None:
            _replace_served(server.root / where / path.name, path.read_bytes())

        yield request.param, put_http, over_http
    else:
        store: Store = request.getfixturevalue(f"{request.param}_server")
        use_store(store, monkeypatch)

        def put_store(root: Path, where: str) -> str:
            return store.put_tree(where, root) + "/a.jsonl"

        def over_store(path: Path, where: str) -> None:
            store.put_tree(where, path.parent)

        yield request.param, put_store, over_store
    storage._forget_filesystems()


def _bucket(tmp_path: Path) -> str:
    return "midrun-" + tmp_path.name.lower().replace("_", "-")[-30:].strip("-")


def test_overwrite_without_read_cache_stops_with_the_error(backend, tmp_path, monkeypatch):
    """``ZEPHON_READ_CACHE_MB=0``: every read is a request; the first after the overwrite
    gets 412 (or the version check fails) and the run stops naming the object, the pinned
    version and what to do; every batch before it is the unchanged run's."""
    source, put, overwrite = backend
    monkeypatch.setenv("ZEPHON_READ_CACHE_MB", "0")
    local = _corpus(tmp_path / "data")
    baseline = _digests(recipe([str(local)]))
    where = _bucket(tmp_path)
    uri = put(local.parent, where)
    r = recipe([uri])
    edited = tmp_path / "edited" / "a.jsonl"
    edited.parent.mkdir()
    edited.write_bytes(_same_size_edit(local.read_bytes()))
    got, error = _run_with_overwrite(r, lambda: overwrite(edited, where))
    assert error is not None, f"{source}: {len(got)} batches, no error after the overwrite"
    text = str(error)
    assert storage.redact(uri) in text and "a.jsonl" in text
    assert re.search(CHANGED, text), text
    assert "restore that version" in text and "new name" in text
    assert 1 <= len(got) < len(baseline)
    assert got == baseline[: len(got)]


def test_overwrite_with_the_block_cached_serves_the_pinned_bytes(backend, tmp_path, monkeypatch):
    """Default block cache (128 MB): the whole 10 kB object is one block, cached at the
    pinned version by the first batch; after the overwrite every read is served from it,
    so the run gives exactly the unchanged run's batches."""
    _, put, overwrite = backend
    monkeypatch.delenv("ZEPHON_READ_CACHE_MB", raising=False)
    local = _corpus(tmp_path / "data")
    baseline = _digests(recipe([str(local)]))
    where = _bucket(tmp_path)
    uri = put(local.parent, where)
    edited = tmp_path / "edited" / "a.jsonl"
    edited.parent.mkdir()
    edited.write_bytes(_same_size_edit(local.read_bytes()))
    got, error = _run_with_overwrite(recipe([uri]), lambda: overwrite(edited, where))
    assert error is None, str(error)
    assert got == baseline and len(baseline) > 100  # three passes of 36 batches


def _big_corpus(root: Path) -> Path:
    """One jsonl shard of about 2.6 MB: three 1 MiB blocks."""
    root.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps({"text": f"doc {i} " + "word " * 200}) for i in range(2500)]
    path = root / "a.jsonl"
    path.write_text("\n".join(lines) + "\n")
    assert path.stat().st_size > 2 * storage.BLOCK
    return path


def test_s3_tiny_block_cache_refetches_and_stops(s3_env, tmp_path, monkeypatch):
    """``ZEPHON_READ_CACHE_MB=1``: one cached block of a three-block object. A pass over
    the shard needs all three, so a block is fetched after the overwrite: 412, the run
    stops; every batch before is the unchanged run's."""
    monkeypatch.setenv("ZEPHON_READ_CACHE_MB", "1")
    local = _big_corpus(tmp_path / "data")
    big = recipe([str(local)], seq_len=2048, global_batch_size=32)
    steps = 4 * (local.stat().st_size // (2048 * 32) + 1)  # more than three passes
    baseline = _digests(big, steps)
    uri = s3_env.put_tree("midrun-tiny", local.parent) + "/a.jsonl"
    edited = tmp_path / "edited" / "a.jsonl"
    edited.parent.mkdir()
    edited.write_bytes(_same_size_edit(local.read_bytes()))
    r = big.replace(datasets=(DatasetSpec("web", paths=(uri,)),))
    got, error = _run_with_overwrite(
        r, lambda: s3_env.put_tree("midrun-tiny", edited.parent), steps
    )
    assert error is not None and "412 Precondition Failed to If-Match" in str(error)
    assert got == baseline[: len(got)] and len(got) < len(baseline)


def _frames_zst(root: Path) -> Path:
    """A multi-frame .jsonl.zst (read in frame ranges with a dataset index)."""
    root.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps({"text": f"zst {i} " + "word " * (i % 7 + 1)}) for i in range(240)]
    cctx = zstandard.ZstdCompressor()
    blob = b"".join(
        cctx.compress(("\n".join(lines[k : k + 20]) + "\n").encode()) for k in range(0, 240, 20)
    )
    path = root / "c.jsonl.zst"
    path.write_bytes(blob)
    return path


def _flip_last_frame(blob: bytes) -> bytes:
    """The same size, one byte of the last frame changed."""
    out = bytearray(blob)
    out[-10] ^= 0x01
    return bytes(out)


def test_s3_indexed_zst_frames_stop_with_the_error(s3_env, tmp_path, monkeypatch):
    """A multi-frame .zst under a dataset index is read in frame ranges from S3: with
    ``ZEPHON_READ_CACHE_MB=0`` an overwrite stops the run with the error (not a corrupt
    zstd frame), every batch before it the unchanged run's."""
    monkeypatch.setenv("ZEPHON_READ_CACHE_MB", "0")
    local = _frames_zst(tmp_path / "data")
    baseline = _digests(recipe([str(local)]))
    base = s3_env.put_tree("midrun-zst", local.parent)
    assert zephon("index", base + "/*.jsonl.zst", "--quiet") == 0
    index.forget()
    edited = tmp_path / "edited" / local.name
    edited.parent.mkdir()
    edited.write_bytes(_flip_last_frame(local.read_bytes()))
    try:
        got, error = _run_with_overwrite(
            recipe([base + "/*.jsonl.zst"]), lambda: s3_env.put_tree("midrun-zst", edited.parent)
        )
    finally:
        index.forget()
    assert error is not None and "412 Precondition Failed to If-Match" in str(error), error
    assert "c.jsonl.zst" in str(error) and "corrupt" not in str(error)
    assert got == baseline[: len(got)] and len(got) < len(baseline)


def test_s3_unindexed_zst_is_read_whole_at_open(s3_env, tmp_path, monkeypatch):
    """Without an index a .zst is fetched whole (conditionally) and decompressed when it is
    opened: an overwrite later reaches no read, and the run gives the unchanged batches."""
    monkeypatch.setenv("ZEPHON_READ_CACHE_MB", "0")
    monkeypatch.setenv("ZEPHON_CACHE_DIR", str(tmp_path / "cache"))
    local = _frames_zst(tmp_path / "data")
    baseline = _digests(recipe([str(local)]))
    base = s3_env.put_tree("midrun-zst-whole", local.parent)
    edited = tmp_path / "edited" / local.name
    edited.parent.mkdir()
    edited.write_bytes(_flip_last_frame(local.read_bytes()))
    got, error = _run_with_overwrite(
        recipe([base + "/*.jsonl.zst"]),
        lambda: s3_env.put_tree("midrun-zst-whole", edited.parent),
    )
    assert error is None, str(error)
    assert got == baseline


def test_s3_change_is_refused_under_skip(s3_env, tmp_path, monkeypatch):
    """Under ``on_error = "skip"`` the change still stops the run: what a skip would leave
    out would depend on when the object was replaced."""
    monkeypatch.setenv("ZEPHON_READ_CACHE_MB", "0")
    local = _corpus(tmp_path / "data")
    skipping = DatasetSpec("web", paths=(str(local),), on_error="skip")
    baseline = _digests(recipe([str(local)]).replace(datasets=(skipping,)))
    uri = s3_env.put_tree("midrun-skip", local.parent) + "/a.jsonl"
    edited = tmp_path / "edited" / "a.jsonl"
    edited.parent.mkdir()
    edited.write_bytes(_same_size_edit(local.read_bytes()))
    r = recipe([uri]).replace(datasets=(DatasetSpec("web", paths=(uri,), on_error="skip"),))
    got, error = _run_with_overwrite(r, lambda: s3_env.put_tree("midrun-skip", edited.parent))
    assert error is not None and "the object changed during the run" in str(error)
    assert got == baseline[: len(got)] and len(got) < len(baseline)


@pytest.mark.parametrize("source", ["s3", "azure"])
def test_a_failed_condition_is_not_transient(source, request, tmp_path, monkeypatch):
    """The backend's own 412 (botocore's ``PreconditionFailed``, azure-core's
    ``ResourceModifiedError``) is never retried, and a pinned read raises the error at once."""
    server: Store = request.getfixturevalue(f"{source}_server")
    use_store(server, monkeypatch)
    local = _corpus(tmp_path / "data")
    uri = server.put_tree("midrun-412", local.parent) + "/a.jsonl"
    old = storage.stat(uri)
    edited = tmp_path / "edited" / "a.jsonl"
    edited.parent.mkdir()
    edited.write_bytes(_same_size_edit(local.read_bytes()))
    server.put_tree("midrun-412", edited.parent)
    fs = storage.filesystem(uri)
    with pytest.raises(Exception) as raw:
        if source == "s3":
            bucket, key, _ = fs.split_path(uri)
            fs.call_s3("get_object", Bucket=bucket, Key=key, IfMatch=f'"{old.version}"')
        else:
            from azure.core import MatchConditions
            from azure.storage.blob import BlobServiceClient

            client = BlobServiceClient.from_connection_string(server.connection_string())
            blob = client.get_blob_client("midrun-412", "a.jsonl")
            blob.download_blob(
                etag=f'"{old.version}"', match_condition=MatchConditions.IfNotModified
            ).readall()
    assert not storage.is_transient(raw.value), repr(raw.value)
    with pytest.raises(storage.ObjectChanged, match=CHANGED):
        storage.read_range(uri, 0, 10, cache=False, version=old.version)
    with pytest.raises(storage.ObjectChanged, match=CHANGED):  # a whole-file fetch too
        storage.fetch(uri, lambda _: None, st=old)
    new, size = storage.stat(uri).version, len(edited.read_bytes())
    assert new != old.version  # the edited bytes, read pinned to their own version
    assert storage.read_range(uri, 0, size, cache=False, version=new) == edited.read_bytes()


@pytest.mark.parametrize("cache_mb", ["0", "128"])
def test_hf_stub_checks_the_version_after_each_fetch(hub, tmp_path, monkeypatch, cache_mb):  # noqa: F811
    """hf:// (the fsspec-level Hub stub of test_hf_versions: no condition can be sent) is
    asked for the object's version tag after each fetch: without a read cache the run
    stops with the error; with the block cached it gives the unchanged batches."""
    monkeypatch.setenv("ZEPHON_READ_CACHE_MB", cache_mb)
    local = _corpus(tmp_path / "data")
    baseline = _digests(recipe([str(local)]))
    uri = upload(hub, local.parent) + "/a.jsonl"
    key = "datasets/org/corpus/data/a.jsonl"

    def overwrite() -> None:
        hub.files[key] = _same_size_edit(hub.files[key])

    got, error = _run_with_overwrite(recipe([uri]), overwrite)
    if cache_mb == "0":
        assert error is not None and re.search(CHANGED, str(error)), error
        assert "to a metadata request after the read" in str(error)
        assert got == baseline[: len(got)] and len(got) < len(baseline)
    else:
        assert error is None, str(error)
        assert got == baseline


def test_s3_worker_processes_read_the_version_pinned_at_open(s3_env, tmp_path, monkeypatch):
    """Spawned worker processes get the shard (and its pinned version) by pickle, not by
    opening it again: an overwrite after the first batch stops the run there too."""
    monkeypatch.setenv("ZEPHON_READ_CACHE_MB", "0")
    local = _corpus(tmp_path / "data")
    baseline = _digests(recipe([str(local)]))
    uri = s3_env.put_tree("midrun-procs", local.parent) + "/a.jsonl"
    edited = tmp_path / "edited" / "a.jsonl"
    edited.parent.mkdir()
    edited.write_bytes(_same_size_edit(local.read_bytes()))
    got: list[str] = []
    it = simulate(Pipeline(recipe([uri])), 1, STEPS, num_workers=1, runner="process")
    with pytest.raises(DataError, match=CHANGED):
        for batch, _ in it:
            got.append(batch.digest)
            if len(got) == 1:
                s3_env.put_tree("midrun-procs", edited.parent)
    assert got == baseline[: len(got)] and len(got) < len(baseline)


def test_gcs_requests_carry_the_pinned_generation(gcs_server, tmp_path, monkeypatch):
    """What a pinned read sends to GCS: ``ifGenerationMatch`` with the generation the
    object had when it was opened (the emulator ignores it; real GCS answers 412)."""
    use_store(gcs_server, monkeypatch)
    monkeypatch.setenv("ZEPHON_READ_CACHE_MB", "0")
    local = _corpus(tmp_path / "data")
    uri = gcs_server.put_tree("midrun-gen", local.parent) + "/a.jsonl"
    fs = storage.filesystem(uri)
    generation = fs.info(uri)["generation"]
    sent: list[str] = []
    real = type(fs).call

    def call(self: Any, method: str, path: str, *args: Any, **kw: Any) -> Any:
        sent.append(f"{method} {path}")
        return real(self, method, path, *args, **kw)

    monkeypatch.setattr(type(fs), "call", call)
    version = storage.stat(uri).version
    assert storage.read_range(uri, 5, 40, version=version) == local.read_bytes()[5:40]
    gets = [s for s in sent if s.startswith("GET ") and "alt=media" in s]
    assert gets and all(f"ifGenerationMatch={generation}" in s for s in gets), sent


def _tar(path: Path, caption: str) -> None:
    import io
    import tarfile

    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as t:
        for i in range(6):
            for ext, blob in (("txt", f"{caption} {i}".encode()), ("png", bytes([i]) * 33)):
                info = tarfile.TarInfo(f"k{i}.{ext}")
                info.size = len(blob)
                info.mtime = 0
                t.addfile(info, io.BytesIO(blob))


@pytest.mark.parametrize("cache_mb", ["0", "128"])
def test_s3_tar_members_are_pinned_too(s3_env, tmp_path, monkeypatch, cache_mb):
    """A tar shard's member ranges: after a same-size overwrite, the next read stops with
    the error without a read cache, and gives the original members with the whole small
    tar cached by the first read."""
    from zephon_nodes.io.formats.tar import open_tar_shard

    monkeypatch.setenv("ZEPHON_READ_CACHE_MB", cache_mb)
    _tar(tmp_path / "old" / "s.tar", "caption")
    _tar(tmp_path / "new" / "s.tar", "CAPTION")
    old, new = (tmp_path / d / "s.tar" for d in ("old", "new"))
    assert old.stat().st_size == new.stat().st_size and old.read_bytes() != new.read_bytes()
    local = open_tar_shard(old)
    uri = s3_env.put_tree(f"midrun-tar-{cache_mb}", old.parent) + "/s.tar"
    remote = open_tar_shard(uri)
    assert remote.read(0, 2) == local.read(0, 2)
    s3_env.put_tree(f"midrun-tar-{cache_mb}", new.parent)
    if cache_mb == "0":
        with pytest.raises(DataError, match=CHANGED) as e:
            remote.read(2, 6)
        assert e.value.refused_under_skip and "s.tar" in str(e.value)
    else:
        assert remote.read(2, 6) == local.read(2, 6)


def test_http_without_etag_pins_last_modified(http_server, tmp_path, monkeypatch):
    """nginx with ``etag off``: the version tag is ``Last-Modified``, sent back as
    ``If-Unmodified-Since``; an overwrite dated later stops the run with the error."""
    monkeypatch.setenv("ZEPHON_READ_CACHE_MB", "0")
    local = _corpus(tmp_path / "data")
    baseline = _digests(recipe([str(local)]))
    where = "noetag/" + _bucket(tmp_path)
    shutil.copytree(local.parent, http_server.root / where)
    uri = http_server.url(f"{where}/a.jsonl")
    version = storage.stat(uri).version
    assert version.endswith(" GMT"), version  # Last-Modified, no ETag
    dest = http_server.root / where / "a.jsonl"

    def overwrite() -> None:
        _replace_served(dest, _same_size_edit(local.read_bytes()))

    got, error = _run_with_overwrite(recipe([uri]), overwrite)
    assert error is not None and "412 Precondition Failed to If-Unmodified-Since" in str(error)
    assert got == baseline[: len(got)] and len(got) < len(baseline)


def test_http_server_ignoring_if_match_is_caught_by_the_response_etag(tmp_path, monkeypatch):
    """A server that ignores ``If-Match`` answers 206 with the new bytes: their ``ETag`` is
    not the pinned one, so the run stops with the error all the same."""
    monkeypatch.setenv("ZEPHON_READ_CACHE_MB", "0")
    local = _corpus(tmp_path / "data")
    baseline = _digests(recipe([str(local)]))
    server = IgnoringIfMatchServer(local.read_bytes())
    try:
        storage._forget_filesystems()

        def overwrite() -> None:
            server.blob = _same_size_edit(local.read_bytes())

        got, error = _run_with_overwrite(recipe([server.url]), overwrite)
    finally:
        server.close()
        storage._forget_filesystems()
    assert server.conditions  # If-Match was sent (and ignored)
    assert error is not None and re.search(
        r"answered 206 with version tag '[0-9a-f]{32}'", str(error)
    )
    assert got == baseline[: len(got)] and len(got) < len(baseline)
