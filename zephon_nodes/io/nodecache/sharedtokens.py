"""The token cache's shared tier: entries on storage that every node of a cluster reads.

With ``--token-cache s3://bucket/tokens`` (or ``ZEPHON_TOKEN_CACHE_SHARED``), each node
keeps its own token cache (:mod:`zephon_nodes.io.nodecache.tokenstore`) in front of a
folder every node reaches. A node that misses locally reads the shared entry and keeps a
copy; a node that misses both computes the entry, keeps it and writes it to the shared
folder *once*: the first writer wins and every later write of the key is refused by the
store itself, so an entry is never replaced under a reader:

- S3: ``PutObject`` with ``If-None-Match: *`` (strongly consistent reads after a write);
- GCS: an upload with ``ifGenerationMatch=0`` (strongly consistent);
- Azure Blob: ``Put Blob`` with ``If-None-Match: *`` (strongly consistent);
- a folder on a shared mount: written to a temporary name in the folder, then linked to its
  name (``link`` fails if the name exists, atomically on POSIX file systems and NFSv3+), so
  a reader sees a whole entry or none; a file system without hard links (vfat, SMB, FUSE
  mounts such as gcsfuse) falls back to ``rename`` (the last of two simultaneous writers
  wins; both wrote a valid entry).

Every shared entry is checked as a local one is (its key in the header, the checksums of
its header and sections) before it is kept; a damaged one is counted and computed locally,
never served. A shared folder that cannot be read or written (permissions, an outage) is
reported once, in one line, and the run goes on with the node's own cache.
"""

from __future__ import annotations

import contextlib
import errno
import os
import uuid
from pathlib import Path

from zephon_nodes.core.errors import RecipeError
from zephon_nodes.io.nodecache.entries import entry_name
from zephon_nodes.io.storage import storage

__all__ = ["SharedTokens"]

# The layout's version: a folder of another layout is never read.
LAYOUT = "ztok-v2"


class SharedTokens:
    """Token-cache entries in a storage folder shared by a cluster (written once per key).

    Args:
        location: The folder: ``s3://``, ``gs://``, ``az://`` (``abfs://``), ``file://`` or
            a local path on a shared mount.

    Raises:
        RecipeError: A scheme that cannot be written once-only (``http(s)://``, ``hf://``).
    """

    def __init__(self, location: str) -> None:
        self.location = location.rstrip("/")
        self.remote = storage.is_remote(self.location)
        if self.remote and storage.scheme(self.location) not in _CREATE_ONLY:
            raise RecipeError(
                f"token cache {storage.redact(self.location)}: a shared token cache needs "
                f"a store that writes once ({sorted(_CREATE_ONLY)}) or a shared folder"
            )

    def _where(self, key: str) -> str:
        name = f"{LAYOUT}/{entry_name(key)}"
        if self.remote:
            return f"{self.location}/{name}"
        return os.path.join(storage.local_path(self.location), name)

    def read(self, key: str) -> bytes | None:
        """The shared entry of ``key`` (unchecked bytes), or None if there is none.

        Raises:
            OSError: The folder cannot be read (an outage, permissions).
        """
        where = self._where(key)
        try:
            if self.remote:
                data: bytes = storage.filesystem(where).cat_file(where)
                return data
            with open(where, "rb") as f:
                return f.read()
        except FileNotFoundError:
            return None
        except IsADirectoryError:
            return b""  # not an entry: refused by the reader's checks, counted damaged

    def write(self, key: str, blob: bytes) -> bool:
        """Write ``key``'s entry unless one exists; return whether this call wrote it.

        Raises:
            OSError: The folder cannot be written (an outage, permissions, a full disk).
        """
        where = self._where(key)
        if not self.remote:
            return _write_local(Path(where), blob)
        fs = storage.filesystem(where)
        try:
            if storage.scheme(where) in ("az", "abfs"):
                fs.pipe_file(where, blob, overwrite=False)
            else:
                fs.pipe_file(where, blob, mode="create")
        except FileExistsError:
            return False
        except Exception as e:  # each backend words "it exists" its own way
            if _exists_error(e):
                return False
            raise OSError(errno.EIO, f"{type(e).__name__}: {e}") from None
        return True


_CREATE_ONLY = ("s3", "gs", "gcs", "az", "abfs")
# What ``link`` raises where a file system has no hard links: vfat (EPERM), SMB/CIFS and
# s3fs (EOPNOTSUPP), FUSE file systems that do not implement it, gcsfuse among them (ENOSYS).
_NO_LINKS = frozenset({errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV, errno.ENOSYS})


def _exists_error(e: BaseException) -> bool:
    """Whether a backend's error says the object exists (a refused create-only write)."""
    text = f"{type(e).__name__} {e}"
    return any(
        word in text
        for word in ("PreconditionFailed", "412", "BlobAlreadyExists", "ConditionNotMet")
    )


def _write_local(path: Path, blob: bytes) -> bool:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(blob)
            f.flush()
            os.fsync(f.fileno())
        try:
            os.link(tmp, path)  # fails if the name exists: the first writer wins
        except FileExistsError:
            return False
        except OSError as e:
            if e.errno not in _NO_LINKS:
                raise
            os.replace(tmp, path)  # no hard links here: whole entries still, last one wins
        return True
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
