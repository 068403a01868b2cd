"""Storage URIs against real servers on 127.0.0.1: moto, gcp-storage-emulator, Azurite, nginx."""

from __future__ import annotations

import base64
import time
from pathlib import Path

import pytest

from tests.io.conftest import AzureServer, FaultProxy, HttpServer, Store, free_port, use_store
from zephon_nodes.core.errors import DataError, RecipeError
from zephon_nodes.io.discovery import dataset_files
from zephon_nodes.io.storage import storage
from zephon_nodes.recipe.datasets import DatasetSpec


def _tree(root: Path) -> None:
    (root / "sub").mkdir(parents=True)
    for name in ("b.jsonl", "a.jsonl", "c.txt", "sub/d.jsonl"):
        (root / name).write_bytes(f"{name}\n".encode() * 3)


class TestUris:
    """Scheme parsing, redaction and local paths."""

    def test_schemes(self):
        """Plain paths and file:// are local; the rest are remote."""
        assert not storage.is_remote("data/x.jsonl")
        assert not storage.is_remote("file:///tmp/x.jsonl")
        assert storage.local_path("file:///tmp/x.jsonl") == "/tmp/x.jsonl"
        for uri in ("s3://b/k", "gs://b/k", "az://c/k", "hf://datasets/x/y", "https://h/x"):
            assert storage.is_remote(uri)

    def test_credentials_never_in_messages(self):
        """A user:password@ part is removed from every message."""
        assert storage.redact("https://me:secret@host/x.jsonl") == "https://host/x.jsonl"
        with pytest.raises(DataError) as e:
            storage.filesystem("ftp://me:secret@host/x")
        assert "secret" not in str(e.value) and "ftp" in str(e.value)

    def test_file_uri_glob(self, tmp_path):
        """file:// globs like a plain path, sorted."""
        _tree(tmp_path)
        got = storage.expand(f"file://{tmp_path}/*.jsonl")
        assert got == [str(tmp_path / "a.jsonl"), str(tmp_path / "b.jsonl")]


class TestObjectStores:
    """s3://, gs:// and az:// against moto, gcp-storage-emulator and Azurite."""

    def test_glob_is_sorted_and_reads_ranges(self, store: Store, tmp_path):
        """A glob lists by the backend, sorted; ranges and stat match the local file."""
        _tree(tmp_path)
        base = store.put_tree("glob", tmp_path, "p")
        assert storage.expand(base + "/*.jsonl") == [base + "/a.jsonl", base + "/b.jsonl"]
        assert storage.expand(base + "/**/*.jsonl")[-1] == base + "/sub/d.jsonl"
        assert storage.expand(base + "/*.parquet") == []
        data = (tmp_path / "b.jsonl").read_bytes()
        assert storage.read_range(base + "/b.jsonl", 3, 11) == data[3:11]
        st = storage.stat(base + "/b.jsonl")
        assert st.size == len(data) and st.version
        chunks: list[bytes] = []
        assert storage.fetch(base + "/b.jsonl", chunks.append, block=5) == len(data)
        assert b"".join(chunks) == data

    def test_new_upload_changes_the_version_tag(self, store: Store, tmp_path):
        """Re-uploading other bytes of the same size gives another version tag."""
        (tmp_path / "v.jsonl").write_bytes(b"version one\n")
        base = store.put_tree("versions", tmp_path)
        before = storage.stat(base + "/v.jsonl")
        (tmp_path / "v.jsonl").write_bytes(b"version two\n")
        store.put_tree("versions", tmp_path)
        after = storage.stat(base + "/v.jsonl")
        assert after.size == before.size and after.version != before.version

    def test_missing_key_and_bucket_fail_fast(self, store: Store, tmp_path):
        """404s (key, bucket) fail at once naming the URI, without retrying."""
        _tree(tmp_path)
        base = store.put_tree("missing", tmp_path)
        for uri in (base + "/nope.jsonl", f"{store.scheme}://no-such-bucket-zn/x.jsonl"):
            t = time.monotonic()
            with pytest.raises(DataError, match=uri.replace(".", r"\.") + ".*not found"):
                storage.stat(uri)
            assert time.monotonic() - t < 5

    def test_a_missing_bucket_is_told_from_an_empty_match(self, store: Store, tmp_path):
        """A pattern that matches nothing in a bucket that does not exist says so."""
        _tree(tmp_path)
        base = store.put_tree("present", tmp_path)
        assert storage.missing_container(base + "/*.parquet") is None  # empty, bucket there
        gone = f"{store.scheme}://no-such-bucket-zn"
        assert storage.missing_container(gone + "/x/*.jsonl") == gone
        spec = DatasetSpec("d", paths=(gone + "/x/*.jsonl",))
        # GCS answers the listing itself with a 404; S3 and Azure list nothing
        with pytest.raises(
            (RecipeError, DataError), match=f"{gone}.*(does not exist or these|missing bucket)"
        ):
            dataset_files(spec)

    def test_access_denied_fails_fast(self, store: Store, tmp_path, monkeypatch):
        """A 403 fails at once naming the URI, for a read and for a listing.

        Azurite checks the account key (a wrong key gives its real 403); moto and the GCS
        emulator check no credentials, so a proxy answers their 403 in their error format.
        """
        _tree(tmp_path)
        base = store.put_tree("denied", tmp_path)
        proxy = None
        if isinstance(store, AzureServer):
            wrong = base64.b64encode(b"not the account key").decode()
            monkeypatch.setenv(
                "AZURE_STORAGE_CONNECTION_STRING", store.connection_string(key=wrong)
            )
            storage._forget_filesystems()
        else:
            proxy = FaultProxy.refusing(store.port, 403, store.scheme)
            use_store(store, monkeypatch, proxy.port)
        try:
            for call in (
                lambda: storage.read_range(base + "/a.jsonl", 0, 5, cache=False),
                lambda: storage.expand(base + "/*.jsonl"),
            ):
                t = time.monotonic()
                with pytest.raises(DataError, match=f"{base}.*(access denied|403)"):
                    call()
                assert time.monotonic() - t < 5
        finally:
            if proxy is not None:
                proxy.close()
            storage._forget_filesystems()


class TestHttp:
    """http:// single files through nginx (Range)."""

    def test_range_and_stat(self, http_server: HttpServer):
        """Ranges come back exactly; a URL names one file (no glob)."""
        data = bytes(range(256)) * 40
        (http_server.root / "r.bin").write_bytes(data)
        url = http_server.url("r.bin")
        assert storage.read_range(url, 1000, 1100) == data[1000:1100]
        assert storage.stat(url).size == len(data)
        assert storage.expand(url) == [url]
        assert storage.expand(http_server.url("absent.bin")) == []

    def test_block_cache_saves_requests_not_bytes(self, http_server: HttpServer, monkeypatch):
        """Neighbouring reads of one 1 MiB block cost one request; the bytes are exact."""
        data = bytes(range(256)) * 6000  # 1.5 MB: two blocks
        (http_server.root / "blocks.bin").write_bytes(data)
        url = http_server.url("blocks.bin")
        fs = storage.filesystem(url)
        calls: list[tuple[int, int]] = []
        real = fs.cat_file

        def counting(path: str, start: int, end: int) -> bytes:
            calls.append((start, end))
            return real(path, start=start, end=end)

        monkeypatch.setattr(fs, "cat_file", counting)
        got = [storage.read_range(url, a, b, tag="t1") for a, b in ((5, 90), (100, 4000))]
        assert got == [data[5:90], data[100:4000]] and len(calls) == 1
        assert storage.read_range(url, 1_000_000, 1_100_000, tag="t1") == data[1_000_000:1_100_000]
        assert len(calls) == 2  # the second block; its end is the end of the file
        assert storage.read_range(url, 5, 90, tag="t2") == data[5:90] and len(calls) == 3
        monkeypatch.setenv("ZEPHON_READ_CACHE_MB", "0")
        assert storage.read_range(url, 5, 90, tag="t1") == data[5:90] and calls[-1] == (5, 90)

    def test_403_and_404_fail_fast(self, http_server: HttpServer):
        """403 and 404 fail at once naming the URL."""
        for rel, why in (("forbidden/x.jsonl", "access denied|403"), ("no.jsonl", "not found")):
            url = http_server.url(rel)
            t = time.monotonic()
            with pytest.raises(DataError, match=f"{url}.*({why})"):
                storage.read_range(url, 0, 10)
            assert time.monotonic() - t < 5


@pytest.mark.parametrize(
    ("rel", "why"), [("forbidden/x.jsonl", "access denied"), ("no.jsonl", "matches no file")]
)
def test_cli_names_the_url_in_one_line(http_server: HttpServer, tmp_path, capsys, rel, why):
    """`zephon digest` over a 403 or 404 URL: exit 2, one line naming the URL."""
    from tests.commands.run import zephon

    url = http_server.url(rel)
    (tmp_path / "r.toml").write_text(
        f'[tokenizer]\nkind = "bytes"\n[[datasets]]\nname = "w"\npaths = ["{url}"]\n'
    )
    assert zephon("digest", str(tmp_path / "r.toml"), "--steps", "1") == 2
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and url in out[0] and why in out[0], out


def test_http_server_down_is_transient_not_missing(monkeypatch):
    """A refused HTTP connection is retried (not taken for a 404), then named."""
    monkeypatch.setenv("ZEPHON_STORAGE_RETRY_S", "0.5")
    url = f"http://127.0.0.1:{free_port()}/x.jsonl"
    with pytest.raises(DataError, match=url.replace(".", r"\.") + ": cannot stat: transient"):
        storage.expand(url)


class _Status(Exception):
    def __init__(self, status: int) -> None:
        super().__init__(f"HTTP {status}")
        self.status = status


@pytest.mark.parametrize(
    ("exc", "transient"),
    [
        (_Status(503), True),
        (_Status(500), True),
        (_Status(429), True),
        (_Status(404), False),
        (_Status(403), False),
        (ConnectionResetError(104, "Connection reset by peer"), True),
        (TimeoutError("read timed out"), True),
        (OSError("An error occurred (SlowDown): Please reduce your request rate"), True),
        (FileNotFoundError("s3://b/k"), False),
        (PermissionError("Forbidden"), False),
        (ValueError("bad value"), False),
    ],
)
def test_transient_errors_are_told_apart(exc, transient):
    """5xx, 429, resets, timeouts and throttling are retried; 403/404 and bugs are not."""
    assert storage.is_transient(exc) is transient


def test_retry_backoff_recovers_and_budget_is_honoured():
    """Two transient failures then success; a permanent one is not retried."""
    calls = []

    def flaky() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise _Status(503)
        return "ok"

    policy = storage.RetryPolicy(budget_s=10, base_s=0.01, max_s=0.02)
    assert storage.with_retries(flaky, "s3://b/k", policy) == "ok" and len(calls) == 3

    def denied() -> None:
        calls.append(1)
        raise PermissionError("denied")

    calls.clear()
    with pytest.raises(DataError, match=r"s3://b/k: cannot read: access denied"):
        storage.with_retries(denied, "s3://b/k", policy)
    assert len(calls) == 1
