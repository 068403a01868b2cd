"""Storage URIs: local paths, ``file://``, ``s3://``, ``gs://``, ``az://``, ``hf://``, ``http(s)://``.

Remote URIs go through `fsspec <https://filesystem-spec.readthedocs.io>`_ and each backend's
own package, installed as an optional extra (``pip install 'zephon-nodes[s3]'``, ``[gcs]``,
``[azure]``, ``[hf]``, ``[http]``). Credentials and endpoints come only from the backend's
standard environment and configuration (for S3: ``AWS_ENDPOINT_URL``,
``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_REGION``, profiles); they never appear
in a recipe, a message, a checkpoint or a fingerprint (a URI's ``user:password@`` part is
removed from every message).

Every remote call goes through :func:`with_retries`: transient errors (connection reset or
refused, timeouts, HTTP 5xx, 429 and S3 throttling) are retried with exponential backoff and
full jitter until the :class:`RetryPolicy` budget is spent, then a :class:`DataError` names
the URI and the last error. Permanent errors (403, 404, a missing bucket) fail at once.
Where bytes come from never changes a byte of output: retries only cost time.

A remote shard's reads are pinned to the version tag seen when it was opened
(:mod:`~zephon_nodes.io.storage.pinned`): an object replaced during a run stops it with
:class:`ObjectChanged`, whatever the read cache holds; it never serves new bytes.
"""

from __future__ import annotations

import glob as globlib
import os
import re
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from zephon_nodes.core.errors import CHANGED_FILE, MISSING_FILE, DataError, os_error_kind
from zephon_nodes.core.settings import current
from zephon_nodes.io.storage import pinned, retry
from zephon_nodes.io.storage.checksum import build_memo
from zephon_nodes.io.storage.pinned import ObjectChanged
from zephon_nodes.io.storage.pinned import version_of as _version
from zephon_nodes.io.storage.retry import RetryPolicy, is_transient, redact
from zephon_nodes.io.storage.versions import check_backend

_describe = retry.describe

__all__ = [
    "FileStat",
    "ObjectChanged",
    "RetryPolicy",
    "expand",
    "fetch",
    "is_remote",
    "is_transient",
    "join",
    "local_path",
    "missing_container",
    "read_range",
    "redact",
    "stat",
    "with_retries",
]

T = TypeVar("T")

# Scheme -> (fsspec protocol, package to install, extra name).
BACKENDS: dict[str, tuple[str, str, str]] = {
    "s3": ("s3", "s3fs", "s3"),
    "gs": ("gcs", "gcsfs", "gcs"),
    "gcs": ("gcs", "gcsfs", "gcs"),
    "az": ("az", "adlfs", "azure"),
    "abfs": ("abfs", "adlfs", "azure"),
    "hf": ("hf", "huggingface_hub", "hf"),
    "http": ("http", "aiohttp", "http"),
    "https": ("https", "aiohttp", "http"),
}
_GLOB_CHARS = re.compile(r"[*?\[]")


def scheme(uri: str) -> str:
    """Return the lower-case scheme of ``uri`` (``""`` for a plain path)."""
    head, sep, _ = uri.partition("://")
    return head.lower() if sep and re.fullmatch(r"[a-zA-Z][a-zA-Z0-9+.-]*", head) else ""


def is_remote(uri: str | os.PathLike[str]) -> bool:
    """Whether ``uri`` names remote storage (anything but a plain path or ``file://``)."""
    return scheme(str(uri)) not in ("", "file")


def local_path(uri: str | os.PathLike[str]) -> str:
    """Return the local path of a plain path or ``file://`` URI."""
    text = str(uri)
    return text[len("file://") :] if scheme(text) == "file" else text


def join(directory: str, name: str) -> str:
    """``name`` inside ``directory``: with ``/`` for a URI, :func:`os.path.join` for a path.

    (A plain relative path stays relative: ``join("", "a.jsonl")`` is ``"a.jsonl"``.)
    """
    if is_remote(directory):
        return directory.rstrip("/") + "/" + name
    return os.path.join(directory, name)


def with_retries(
    fn: Callable[[], T], uri: str, policy: RetryPolicy | None = None, what: str = "read"
) -> T:
    """Call ``fn()``; retry transient errors within the budget.

    What is transient, and the budget, are :mod:`~zephon_nodes.io.storage.retry`'s. Before
    each retry the process's filesystem clients are dropped, so a restarted endpoint gets
    fresh connections.

    Raises:
        DataError: At once on a permanent error, or when the budget is spent, naming the
            URI and the last error.
    """
    return retry.with_retries(fn, uri, policy, what, on_retry=_forget_filesystems)


_FS: dict[tuple[int, str], Any] = {}
_FS_LOCK = threading.Lock()


def _forget_filesystems() -> None:
    with _FS_LOCK:
        _FS.clear()


def _gcs_emulator_class() -> Any:
    """The plain JSON-API class of gcsfs when ``STORAGE_EMULATOR_HOST`` names a custom endpoint.

    From gcsfs 2026.3 on, ``gs://`` maps by default to ``ExtendedGcsFileSystem``
    (``GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT`` defaults to true), which first asks the gRPC
    Storage Control API for the bucket's type; an emulator or a private endpoint never
    answers, and each first open of a bucket waits about 60 s for that probe. With an
    emulator endpoint the plain ``gcsfs.core.GCSFileSystem`` is used instead (the JSON API
    only, what an emulator serves), with anonymous credentials, as Google's own client does
    for ``STORAGE_EMULATOR_HOST``; setting ``GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=false`` does
    the same for every endpoint. Returns None for the standard endpoint.
    """
    host = current().gcs_emulator_host or ""
    if host in ("", "default"):
        return None
    from gcsfs.core import GCSFileSystem

    return GCSFileSystem


def filesystem(uri: str) -> Any:
    """Return the fsspec filesystem for ``uri``'s scheme (one per process and scheme).

    Raises:
        DataError: If the scheme is unknown, its backend package is not installed or is
            older than the extra pins (:mod:`~zephon_nodes.io.storage.versions`).
    """
    sch = scheme(uri)
    if sch not in BACKENDS:
        raise DataError(
            f"{redact(uri)}: unsupported storage scheme {sch!r}; expected a path or one of "
            f"{[*sorted(BACKENDS), 'file']}"
        )
    protocol, package, extra = BACKENDS[sch]
    key = (os.getpid(), protocol)
    with _FS_LOCK:
        fs = _FS.get(key)
        if fs is None:
            check_backend(extra, redact(uri))
            try:
                import fsspec

                # skip_instance_cache: fsspec's shared instances are not safe across fork;
                # no listings cache: a changed object must show its new size and version tag.
                options: dict[str, Any] = {"skip_instance_cache": True, "use_listings_cache": False}
                cls = _gcs_emulator_class() if protocol == "gcs" else None
                if cls is not None:
                    fs = cls(token="anon", **options)
                else:
                    fs = fsspec.filesystem(protocol, **options)
            except ImportError:
                raise DataError(
                    f"{redact(uri)}: reading {sch}:// needs {package}: "
                    f"pip install 'zephon-nodes[{extra}]'"
                ) from None
            _FS[key] = fs
    return fs


@dataclass(frozen=True)
class FileStat:
    """Size and version tag of a file.

    Attributes:
        size: Bytes.
        version: The backend's version tag (S3/HTTP ETag, GCS generation, Azure etag; for a
            local file its modification time in ns). A fast currency check, never the
            identity: an S3 ETag depends on the upload's part size.
    """

    size: int
    version: str


def stat(uri: str | os.PathLike[str]) -> FileStat:
    """Return the size and version tag of a file.

    Raises:
        DataError: If the file does not exist or cannot be reached.
    """
    text = str(uri)
    memo = build_memo()
    if memo is not None and ("stat", text) in memo:
        listed: FileStat = memo[("stat", text)]  # from this build's listing
        return listed
    if not is_remote(text):
        try:
            st = os.stat(local_path(text))
        except OSError as e:
            raise DataError(
                f"{text}: data file not found: {_describe(e)}", kind=MISSING_FILE
            ) from None
        return FileStat(st.st_size, str(st.st_mtime_ns))

    hf = scheme(text) == "hf"

    def info() -> dict[str, Any]:
        # HfFileSystem.info drops the file's blob id and LFS hash unless asked to expand.
        extra = {"expand_info": True} if hf else {}
        result: dict[str, Any] = filesystem(text).info(text, **extra)
        return result

    meta = with_retries(info, text, what="stat")
    if meta.get("type") == "directory":
        raise DataError(f"{redact(text)}: is a directory, expected a data file")
    size = meta.get("size")
    if size is None:
        raise DataError(f"{redact(text)}: the server does not report the file's size")
    version = _version(meta)
    if hf and not version:
        raise DataError(
            f"{redact(text)}: the Hub reported no blob id or LFS hash for the file, so a "
            "change to it could not be detected; refusing to read it"
        )
    return FileStat(int(size), version)


def expand(pattern: str, base_dir: str | os.PathLike[str] | None = None) -> list[str]:
    """Expand a glob pattern into sorted file paths or URIs (empty if nothing matches).

    Local patterns are relative to ``base_dir``; remote ones are listed by their backend
    (``http(s)://`` names exactly one file: no glob).

    Raises:
        DataError: If the backend cannot list (after retries) or is not installed.
    """
    if not is_remote(pattern):
        path = local_path(pattern)
        full = path if os.path.isabs(path) or base_dir is None else str(Path(base_dir) / path)
        matches = sorted(globlib.glob(full, recursive=True))
        return [m for m in matches if os.path.isfile(m)]
    sch = scheme(pattern)
    if sch in ("http", "https") or not _GLOB_CHARS.search(pattern.partition("://")[2]):
        try:
            stat(pattern)
        except DataError as e:
            if "not found" in str(e):
                return []
            raise
        return [pattern]
    fs = filesystem(pattern)

    def listing() -> dict[str, Any]:
        found: dict[str, Any] = fs.glob(pattern, detail=True)
        return found

    found = with_retries(listing, pattern, what="list")
    prefix = pattern.partition("://")[0] + "://"
    memo = build_memo()
    files = []
    for name in sorted(found):
        info = found[name]
        uri = name if "://" in name else prefix + name
        if uri.endswith("/") or info.get("type") == "directory":
            continue
        files.append(uri)
        if memo is not None and info.get("size") is not None:
            # Sizes and version tags come with the listing: no request per shard in a build.
            memo[("stat", uri)] = FileStat(int(info["size"]), _version(info))
    return files


def missing_container(pattern: str) -> str | None:
    """The bucket or container of a remote ``pattern`` when it does not exist (else None).

    What a pattern that matches nothing says besides: a mistyped bucket, or credentials that
    cannot see it, is not an empty folder. Any error while asking is no answer (None).
    """
    sch = scheme(pattern)
    if sch in ("http", "https", "file", "hf") or not is_remote(pattern):
        return None
    container = pattern.partition("://")[2].split("/", 1)[0]
    if not container or _GLOB_CHARS.search(container):
        return None
    try:
        fs = filesystem(pattern)
        return None if fs.exists(container) else f"{sch}://{container}"
    except Exception:  # only a hint for an error already being raised
        return None


BLOCK = 1 << 20
_BLOCKS: OrderedDict[tuple[str, str, str, int], bytes] = OrderedDict()
_BLOCKS_LOCK = threading.Lock()
_BLOCKS_BYTES = [0]


def _read_cache_limit() -> int:
    """Bytes of remote blocks kept (the current settings' ``read_cache_mb``)."""
    return int(current().read_cache_mb * (1 << 20))


def _fresh_info(uri: str) -> dict[str, Any]:
    """The backend's metadata of ``uri`` from a new request (no build listing, retried)."""

    def info() -> dict[str, Any]:
        extra = {"expand_info": True} if scheme(uri) == "hf" else {}
        result: dict[str, Any] = filesystem(uri).info(uri, **extra)
        return result

    return with_retries(info, uri, what="stat")


def _cat_range(uri: str, start: int, stop: int, version: str = "") -> bytes:
    """Bytes ``[start, stop)`` of a remote file in one request (retried).

    With ``version`` (the tag pinned when the shard was opened) the request is conditional
    on it (see :mod:`~zephon_nodes.io.storage.pinned`).

    Raises:
        ObjectChanged: The object is no longer ``version`` (never retried).
        DataError: If the server answers with more bytes than asked: it ignored the
            ``Range`` header (an HTTP 200 with the whole file instead of a 206), which
            ``python -m http.server`` does.
    """

    def cat() -> bytes:
        fs = filesystem(uri)
        if version:
            return pinned.read(fs, scheme(uri), uri, start, stop, version, lambda: _fresh_info(uri))
        data: bytes = fs.cat_file(uri, start=start, end=stop)
        return data

    blob = with_retries(cat, uri)
    if len(blob) > stop - start:
        raise DataError(
            f"{redact(uri)}: the server ignored a Range request (asked for bytes [{start}, "
            f"{stop}), got {len(blob):,} bytes: an HTTP 200 with the whole file, not a 206); "
            "zephon reads remote files in parts, so serve them with a server that honours "
            "Range (nginx, Apache, object storage; `python -m http.server` does not) or "
            "read a local copy"
        )
    return blob


def _block(uri: str, tag: str, version: str, k: int, limit: int) -> bytes:
    """Block ``k`` (``BLOCK`` bytes, shorter at the end of the file) of a remote file.

    Keyed by the pinned ``version`` too: a block is only ever bytes of that version.
    """
    key = (uri, tag, version, k)
    with _BLOCKS_LOCK:
        hit = _BLOCKS.get(key)
        if hit is not None:
            _BLOCKS.move_to_end(key)
            return hit

    blob = _cat_range(uri, k * BLOCK, (k + 1) * BLOCK, version)
    with _BLOCKS_LOCK:
        if key not in _BLOCKS:
            _BLOCKS[key] = blob
            _BLOCKS_BYTES[0] += len(blob)
        while _BLOCKS_BYTES[0] > limit and _BLOCKS:
            _, old = _BLOCKS.popitem(last=False)
            _BLOCKS_BYTES[0] -= len(old)
    return blob


def read_range(
    uri: str, start: int, stop: int, *, cache: bool = True, tag: str = "", version: str = ""
) -> bytes:
    """Return bytes ``[start, stop)`` of a file (range requests for remote files).

    Remote reads go through a small per-process cache of 1 MiB blocks
    (``ZEPHON_READ_CACHE_MB``, default 128; 0: one request per read), so neighbouring work
    items of a shard cost one request. It changes how many requests are made, never a byte.
    ``tag`` (the shard's content checksum) keys the blocks, so new content is never served
    from blocks of the old. ``version`` (a remote object's version tag, pinned when its
    shard was opened) makes every request conditional on it and keys the blocks too: the
    bytes returned are that version's, or :class:`ObjectChanged` is raised.

    Raises:
        ObjectChanged: The remote object is no longer ``version``.
        DataError: If the read fails (after retries) or returns fewer bytes than asked.
    """
    if stop <= start:
        return b""
    if not is_remote(uri):
        try:
            with open(local_path(uri), "rb") as f:
                f.seek(start)
                blob = f.read(stop - start)
        except OSError as e:
            raise DataError(f"{uri}: cannot read: {_describe(e)}", kind=os_error_kind(e)) from None
    else:
        limit = _read_cache_limit() if cache else 0
        if limit >= BLOCK:
            first, last = start // BLOCK, (stop - 1) // BLOCK
            parts = []
            for k in range(first, last + 1):
                part = _block(uri, tag, version, k, limit)
                parts.append(part)
                if len(part) < BLOCK:
                    break
            joined = b"".join(parts)
            blob = joined[start - first * BLOCK : stop - first * BLOCK]
        else:
            blob = _cat_range(uri, start, stop, version)
    if len(blob) != stop - start:
        raise DataError(
            f"{redact(uri)}: file changed since it was indexed (asked bytes [{start}, {stop}), "
            f"got {len(blob)})",
            kind=CHANGED_FILE,
        )
    return blob


def fetch(
    uri: str, write: Callable[[bytes], Any], block: int = 8 << 20, st: FileStat | None = None
) -> int:
    """Stream a whole file into ``write(chunk)``; a transient error resumes at its offset.

    Args:
        uri: The file.
        write: Called with each chunk in order.
        block: Bytes a request.
        st: The file's size and version tag as seen by the caller (default: a new
            :func:`stat`); every request is conditional on that version.

    Returns:
        The number of bytes fetched.

    Raises:
        ObjectChanged: A remote object is no longer that version.
        DataError: If the file cannot be read (after retries) or its size changes meanwhile.
    """
    st = st or stat(uri)
    size = st.size
    version = st.version if is_remote(uri) else ""
    offset = 0
    while offset < size:
        chunk = read_range(uri, offset, min(size, offset + block), cache=False, version=version)
        write(chunk)
        offset += len(chunk)
    return offset
