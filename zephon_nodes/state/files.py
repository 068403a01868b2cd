"""Checkpoint files: the single-file state, atomic writes, the writability probe.

``save_state(directory, state)`` writes ``directory/zephon_state.json`` (checksummed, temp
name + rename); ``load_state(path)`` verifies and reads it, upgrading what older versions
wrote (:mod:`zephon_nodes.state.migrate`). The multi-rank layout is
:mod:`zephon_nodes.state.layout`.
"""

from __future__ import annotations

import errno
import os
import secrets
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from zephon_nodes.core.errors import CheckpointError
from zephon_nodes.state.codec import MAX_FILE_BYTES, decode_checked, encode_checked
from zephon_nodes.state.migrate import upgrade

__all__ = [
    "STATE_FILE",
    "check_writable",
    "load_state",
    "read_bytes",
    "save_state",
    "write_atomic",
]

STATE_FILE = "zephon_state.json"


def write_atomic(target: Path, data: bytes) -> None:
    """Write ``data`` to a temporary name in ``target``'s directory, fsync, then rename.

    A failure (disk full, permissions) removes the temporary file and leaves any previous
    ``target`` untouched.

    Raises:
        CheckpointError: Naming the file and the OS error.
    """
    # Created with the default mode (0o666 less the umask), like any file the user writes.
    tmp = str(target.parent / f".{target.name}.{secrets.token_hex(8)}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    except OSError as e:
        raise CheckpointError(f"cannot write the checkpoint file {target}: {e}") from None
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException as e:
        if os.path.exists(tmp):
            os.unlink(tmp)
        if isinstance(e, OSError):
            raise CheckpointError(
                f"cannot write the checkpoint file {target}: {e} (any previous version of "
                f"the file is intact)"
            ) from None
        raise


def check_writable(directory: str | os.PathLike[str], *, create: bool = True) -> Path:
    """Check at start-up that checkpoints can be written to ``directory`` (created if absent).

    Creates and removes a small probe file, so a read-only mount, missing permission or a
    path that is a file fails now, not hours later at the first save.

    Args:
        directory: Where the checkpoints go.
        create: Make ``directory`` (and its parents) now. False: an absent ``directory`` is
            left absent and the probe goes to the nearest folder above it that exists (for a
            command that may still refuse its work: it leaves no empty folder behind).

    Raises:
        CheckpointError: Naming the directory and the OS error.
    """
    d = Path(directory)
    try:
        if create:
            d.mkdir(parents=True, exist_ok=True)
        probe_dir = d
        while not create and not probe_dir.exists() and probe_dir != probe_dir.parent:
            probe_dir = probe_dir.parent
        if not probe_dir.is_dir():
            raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), str(probe_dir))
        fd, probe = tempfile.mkstemp(dir=probe_dir, prefix=".zephon-probe.", suffix=".tmp")
        try:
            os.write(fd, b"0")
            os.fsync(fd)
        finally:
            os.close(fd)
            os.unlink(probe)
    except OSError as e:
        raise CheckpointError(f"checkpoint directory {d} is not writable: {e}") from None
    return d


def save_state(directory: str | os.PathLike[str], state: Mapping[str, Any]) -> Path:
    """Write ``state`` to ``directory/zephon_state.json`` with its checksum (temp file, rename).

    Raises:
        CheckpointError: If the state is not plain JSON data or the file cannot be written
            (the previous file, if any, stays intact).
    """
    d = Path(directory)
    try:
        d.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise CheckpointError(f"cannot create the checkpoint directory {d}: {e}") from None
    target = d / STATE_FILE
    write_atomic(target, encode_checked(state))
    return target


def load_state(path: str | os.PathLike[str], *, allow_unchecked: bool = False) -> dict[str, Any]:
    """Read a state saved by :func:`save_state` (a directory or the JSON file itself).

    The checksum is verified before the JSON is parsed. A file holding a whole
    ``torchdata.nodes.Loader`` state gives the library state inside it (:func:`unwrap_state`).

    Args:
        path: The file, or the directory holding ``zephon_state.json``.
        allow_unchecked: Also accept a file without a checksum (written by an older version).

    Raises:
        CheckpointError: If the file is missing, too large, damaged (checksum mismatch),
            holds duplicated keys, or is not a JSON object.
    """
    p = Path(path)
    if p.is_dir():
        p = p / STATE_FILE
    if not p.is_file():
        raise CheckpointError(f"no checkpoint state at {p}")
    if p.stat().st_size > MAX_FILE_BYTES:
        raise CheckpointError(f"{p}: {p.stat().st_size} bytes is too large for a state file")
    state = decode_checked(read_bytes(p, "state"), p, allow_unchecked=allow_unchecked)
    if not isinstance(state, dict):
        raise CheckpointError(f"{p}: a state must be a JSON object, got {type(state).__name__}")
    return upgrade(state, p)


def read_bytes(p: Path, what: str) -> bytes:
    """Read a checkpoint file's bytes.

    Raises:
        CheckpointError: Naming the file and the OS error.
    """
    try:
        return p.read_bytes()
    except OSError as e:
        raise CheckpointError(f"{p}: cannot read the checkpoint {what}: {e}") from None
