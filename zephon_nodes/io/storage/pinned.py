"""Range reads pinned to the version of a remote object seen when its shard was opened.

A shard opened from remote storage keeps the object's version tag (S3/HTTP ETag, Azure
etag, GCS etag or generation). Every later range read of it is conditional on that tag,
so a run reads exactly the bytes of the version it started with, or stops with
:class:`ObjectChanged` (never serves new bytes silently, whatever the read cache holds):

- ``s3://``: ``GetObject`` with ``IfMatch=<ETag>``; the server answers 412.
- ``az://``, ``abfs://``: ``download_blob`` with ``etag`` and ``MatchConditions.IfNotModified``
  (``If-Match``); the server answers 412 (``ConditionNotMet``).
- ``http(s)://``: ``If-Match: <ETag>`` (a strong ETag) or ``If-Unmodified-Since`` (a server
  that sends only ``Last-Modified``); a 412 is a change, and so is a response whose own
  ``ETag`` or ``Last-Modified`` is not the pinned one (a server that ignores the condition).
- ``gs://``: the object's generation (read once per process from a metadata request that
  must show the pinned tag) is sent as ``ifGenerationMatch``; the response's
  ``x-goog-generation`` must be that generation. A server that sends no such header (an
  emulator) is asked for the object's version tag after each fetch instead.
- Any other scheme (``hf://``): the version tag is asked for after each fetch.

The check after a fetch is sound for tags that never come back (a GCS generation); for a
content hash (``hf://``) it misses only an object changed and then restored to the pinned
content in between. Cached blocks are keyed by the pinned version, so they are always
bytes of it.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from zephon_nodes.core.errors import CHANGED_FILE, DataError
from zephon_nodes.io.storage.retry import redact

__all__ = ["ObjectChanged", "is_precondition_failure", "read", "version_of"]

Info = Callable[[], dict[str, Any]]

_HTTP_DATE = re.compile(r"^[A-Z][a-z]{2}, \d{2} [A-Z][a-z]{2} \d{4} \d{2}:\d{2}:\d{2} GMT$")
_GENERATIONS: dict[tuple[str, str], str] = {}


class ObjectChanged(DataError):
    """A remote object changed during the run: refused, even under ``on_error = "skip"``.

    What a skip would leave out would depend on when the object was replaced.
    """

    refused_under_skip = True


def version_of(info: dict[str, Any]) -> str:
    """The version tag in a backend's ``info`` (``""`` when it reports none)."""
    lfs = info.get("lfs")
    if isinstance(lfs, dict) and lfs.get("sha256"):
        return f"sha256:{lfs['sha256']}"  # hf://: the LFS object's content hash
    for key in ("xet_hash", "blob_id"):  # hf://: the Xet or git object id of the content
        if info.get(key):
            return f"{key}:{info[key]}"
    for key in ("ETag", "etag", "generation", "VersionId", "version_id", "last_modified"):
        value = info.get(key)
        if value:
            return str(value).strip('"')
    mtime = (
        info.get("LastModified")
        or info.get("Last-Modified")
        or info.get("mtime")
        or info.get("updated")
    )
    return str(mtime) if mtime else ""


def changed(uri: str, pinned: str, answered: str, info: Info | None = None) -> ObjectChanged:
    """The error for an object whose version is no longer ``pinned`` (naming what it is now)."""
    now = ""
    if info is not None:
        try:
            now = f"; its version tag is now {version_of(info())!r}"
        except Exception:  # the message is all that is at stake: say what is known
            now = ""
    return ObjectChanged(
        f"{redact(uri)}: the object changed during the run: it was version {pinned!r} when "
        f"its shard was opened, and the server answered {answered}{now}. A run reads only "
        "the bytes of the version it started with, so it stops here: restore that version "
        "of the object, or give the new data a new name (another path or prefix) and use "
        "it in a new run",
        kind=CHANGED_FILE,
    )


def is_precondition_failure(exc: BaseException) -> bool:
    """Whether ``exc`` (or an error behind it) is a failed condition: HTTP 412 and kin."""
    inner: BaseException | None = exc
    for _ in range(6):
        if inner is None:
            return False
        name = type(inner).__name__
        if name in ("ResourceModifiedError", "FileExpired", "PreconditionFailed"):
            return True
        if getattr(inner, "status_code", None) == 412 or getattr(inner, "status", None) == 412:
            return True
        response = getattr(inner, "response", None)
        if isinstance(response, dict):
            if response.get("ResponseMetadata", {}).get("HTTPStatusCode") == 412:
                return True
            if response.get("Error", {}).get("Code") in ("PreconditionFailed", "412"):
                return True
        if getattr(inner, "error_code", None) == "ConditionNotMet":
            return True
        inner = inner.__cause__ or inner.__context__
    return False


def _quoted(version: str) -> str:
    return version if version.startswith(('"', "W/")) else f'"{version}"'


def _sync(fs: Any, make: Callable[[], Any]) -> Any:
    from fsspec.asyn import sync

    return sync(fs.loop, make)


def _s3(fs: Any, uri: str, start: int, stop: int, version: str, info: Info) -> bytes:
    bucket, key, vers = fs.split_path(uri)
    extra = {"VersionId": vers} if vers else {}

    async def get() -> bytes:
        resp = await fs._call_s3(
            "get_object",
            Bucket=bucket,
            Key=key,
            Range=f"bytes={start}-{stop - 1}",
            IfMatch=_quoted(version),
            **extra,
        )
        try:
            data: bytes = await resp["Body"].read()
        finally:
            resp["Body"].close()
        return data

    try:
        return bytes(_sync(fs, get))
    except Exception as e:
        if is_precondition_failure(e) or "pre-conditions" in str(e):
            raise changed(uri, version, "412 Precondition Failed to If-Match", info) from None
        raise


def _azure(fs: Any, uri: str, start: int, stop: int, version: str, info: Info) -> bytes:
    from azure.core import MatchConditions

    container, blob, version_id = fs.split_path(fs._strip_protocol(uri))

    async def get() -> bytes:
        async with fs.service_client.get_blob_client(container=container, blob=blob) as bc:
            stream = await bc.download_blob(
                offset=start,
                length=stop - start,
                version_id=version_id,
                etag=_quoted(version),
                match_condition=MatchConditions.IfNotModified,
                **getattr(fs, "_timeout_kwargs", {}),
            )
            data: bytes = await stream.readall()
            return data

    try:
        return bytes(_sync(fs, get))
    except Exception as e:
        if type(e).__name__ == "ResourceNotFoundError":
            raise FileNotFoundError(f"{redact(uri)}: not found (404)") from e
        if is_precondition_failure(e):
            raise changed(uri, version, "412 ConditionNotMet to If-Match", info) from None
        raise


def _bare(tag: str) -> str:
    return tag.removeprefix("W/").strip('"')


def _http(fs: Any, uri: str, start: int, stop: int, version: str, info: Info) -> bytes:
    by_date = bool(_HTTP_DATE.match(version))
    weak = version.startswith("W/")
    condition: dict[str, str] = {}
    if by_date:
        condition["If-Unmodified-Since"] = version
    elif not weak:  # If-Match compares strongly: a weak ETag never matches
        condition["If-Match"] = _quoted(version)

    async def get() -> tuple[int, bytes, str]:
        kw = dict(fs.kwargs)
        headers = {**kw.pop("headers", {}), **condition, "Range": f"bytes={start}-{stop - 1}"}
        session = await fs.set_session()
        async with session.get(fs.encode_url(uri), headers=headers, **kw) as r:
            if r.status == 412:
                return 412, b"", ""
            fs._raise_not_found_for_status(r, uri)
            body: bytes = await r.read()
            served = r.headers.get("Last-Modified" if by_date else "ETag", "")
            return int(r.status), body, str(served)

    code, body, served = _sync(fs, get)
    what = "If-Unmodified-Since" if by_date else "If-Match"
    if code == 412:
        raise changed(uri, version, f"412 Precondition Failed to {what}", info)
    if served and (served != version if by_date else _bare(served) != _bare(version)):
        raise changed(uri, version, f"{code} with version tag {_bare(served)!r}", info)
    return bytes(body)


def _gcs(fs: Any, uri: str, start: int, stop: int, version: str, info: Info) -> bytes:
    generation = _GENERATIONS.get((uri, version))
    if generation is None:
        meta = info()
        if version_of(meta) != version:
            raise changed(uri, version, f"version tag {version_of(meta)!r} to a metadata request")
        generation = str(meta.get("generation") or "")
        _GENERATIONS[(uri, version)] = generation
    url = fs.url(uri) + (f"&ifGenerationMatch={generation}" if generation else "")
    try:
        headers, data = fs.call("GET", url, headers={"Range": f"bytes={start}-{stop - 1}"})
    except FileExistsError:  # gcsfs's word for a 412
        raise changed(uri, version, "412 Precondition Failed to ifGenerationMatch", info) from None
    served = headers.get("x-goog-generation") if hasattr(headers, "get") else None
    if served:
        if generation and str(served) != generation:
            raise changed(uri, version, f"generation {served} (pinned {generation})", info)
    else:
        _check_after(uri, version, info)
    return bytes(data)


def _check_after(uri: str, version: str, info: Info) -> None:
    """After a fetch from a server that does not say which version it served: ask."""
    now = version_of(info())
    if now != version:
        raise changed(uri, version, f"version tag {now!r} to a metadata request after the read")


def read(fs: Any, scheme: str, uri: str, start: int, stop: int, version: str, info: Info) -> bytes:
    """Bytes ``[start, stop)`` of ``uri`` in one request, only if it is still ``version``.

    Args:
        fs: The backend's fsspec filesystem.
        scheme: ``uri``'s lower-case scheme.
        uri: The object.
        start: First byte.
        stop: One past the last byte.
        version: The version tag pinned when the shard was opened.
        info: A fresh metadata request for ``uri`` (its fsspec ``info``).

    Raises:
        ObjectChanged: The object is no longer ``version``.
    """
    if scheme == "s3":
        return _s3(fs, uri, start, stop, version, info)
    if scheme in ("az", "abfs"):
        return _azure(fs, uri, start, stop, version, info)
    if scheme in ("http", "https"):
        return _http(fs, uri, start, stop, version, info)
    if scheme in ("gs", "gcs"):
        return _gcs(fs, uri, start, stop, version, info)
    data = bytes(fs.cat_file(uri, start=start, end=stop))
    _check_after(uri, version, info)
    return data
