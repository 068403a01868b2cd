"""Transient faults retried (issue 27.6): a fault proxy on 127.0.0.1 in front of moto cuts
responses at 0, 300 and 5,000 bytes.

At 0 the connection closes once the request arrived (botocore: ``ConnectionClosedError``),
at 300 inside the response headers, at 5,000 inside the body (aiohttp: the payload is not
complete). Each exception the real client stack raises is classified transient, a retried
call returns the exact bytes, and a run through the proxy gives the no-fault digests.
"""

from __future__ import annotations

import http.client
from typing import Any

import pytest

from tests.io.conftest import FaultProxy, S3Server, use_store
from tests.io.test_remote_digests import recipe, run, write_corpus
from zephon_nodes.io.storage import storage

CUTS = (0, 300, 5000)
DATA = bytes(range(256)) * 100  # 25.6 kB: a body longer than every cut


def bare_s3(port: int) -> Any:
    """An s3fs client through ``port`` with its own and botocore's retries off."""
    import s3fs

    fs = s3fs.S3FileSystem(
        skip_instance_cache=True,
        endpoint_url=f"http://127.0.0.1:{port}",
        config_kwargs={"retries": {"max_attempts": 1, "mode": "standard"}},
    )
    fs.retries = 1
    return fs


@pytest.fixture(scope="module")
def faulty_bucket(s3_server: S3Server, tmp_path_factory: pytest.TempPathFactory) -> str:
    root = tmp_path_factory.mktemp("faults")
    (root / "blob.bin").write_bytes(DATA)
    with pytest.MonkeyPatch.context() as mp:
        use_store(s3_server, mp)
        return s3_server.put_tree("faults", root)


@pytest.mark.parametrize("cut", CUTS)
def test_each_cut_raises_a_transient_error(s3_server, faulty_bucket, cut, monkeypatch):
    """What botocore/aiohttp raise for each cut is_transient(); with_retries gets the bytes."""
    use_store(s3_server, monkeypatch)
    proxy = FaultProxy(s3_server.port, cut=cut, faults=1000)
    try:
        fs = bare_s3(proxy.port)
        with pytest.raises(Exception) as e:
            fs.cat_file(faulty_bucket + "/blob.bin", start=0, end=len(DATA))
        assert storage.is_transient(e.value), repr(e.value)
        if cut > 300:  # inside the body: the headers (and a HEAD) got through
            assert "payload" in str(e.value).lower() or "incomplete" in str(e.value).lower()
    finally:
        proxy.close()
    proxy = FaultProxy(s3_server.port, cut=cut, faults=2)
    try:
        fs = bare_s3(proxy.port)
        policy = storage.RetryPolicy(budget_s=30, base_s=0.01, max_s=0.05)
        got = storage.with_retries(
            lambda: fs.cat_file(faulty_bucket + "/blob.bin", start=0, end=len(DATA)),
            faulty_bucket,
            policy,
        )
        assert got == DATA and proxy.cuts == 2
    finally:
        proxy.close()


@pytest.mark.parametrize("cut", CUTS)
def test_a_run_through_the_fault_proxy_gives_the_no_fault_digests(
    s3_server, tmp_path, cut, monkeypatch
):
    """Three connections cut at ``cut`` bytes mid-run, then the proxy passes: same digests."""
    root = tmp_path / "c"
    write_corpus(root)
    reference = run(recipe([str(root / "*.jsonl*")]), 2, 4)
    use_store(s3_server, monkeypatch)
    base = s3_server.put_tree(f"cut{cut}", root)
    proxy = FaultProxy(s3_server.port, cut=cut, faults=3)
    try:
        use_store(s3_server, monkeypatch, proxy.port)
        monkeypatch.setenv("ZEPHON_READ_CACHE_MB", "0")  # every read is a request
        monkeypatch.setenv("ZEPHON_STORAGE_BACKOFF_MAX_S", "0.2")
        assert run(recipe([base + "/*.jsonl*"]), 2, 4) == reference
        assert proxy.cuts == 3
    finally:
        proxy.close()
        storage._forget_filesystems()


def test_the_named_exceptions_of_issue_27_are_transient():
    """The exception types the probe saw, built from the real classes."""
    from botocore.exceptions import ConnectionClosedError, ResponseStreamingError

    cases = [
        ConnectionClosedError(endpoint_url="http://127.0.0.1:1/b/k"),
        KeyError("ContentLength"),
        ResponseStreamingError(error=http.client.IncompleteRead(b"x" * 10, 90)),
        http.client.IncompleteRead(b"x" * 10, 90),
    ]
    for exc in cases:
        assert storage.is_transient(exc), repr(exc)
    assert not storage.is_transient(KeyError("columns"))  # a bug, not a cut response
