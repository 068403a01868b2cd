"""Shared-memory transport for the process runner: large arrays cross without a pipe copy.

A worker process pickles an operator's result with protocol 5; array buffers of at least
:data:`MIN_BYTES` go out of band into POSIX shared memory (``/dev/shm``) and only the small
pickle travels through the executor's pipe. Each worker writes into its own *arena*, a ring
buffer of :func:`arena_bytes` whose pages stay allocated (a fresh file per result costs a
page fault per 4 KiB, ~10x the copy); the rank copies each result out as it arrives and
marks its span free in the arena's header, in order. A result that does not fit in the free
part of the arena goes into a file of its own, which the rank maps, unlinks at once and
reads without a copy. The output is the same bytes on every path.

Memory is bounded: one arena per worker, plus the results in flight that did not fit. Every
exit path removes the files: the rank unlinks an arena the first time it maps it and a
result file as soon as it arrives (even one nobody reads); closing the pool removes what a
killed worker left; a worker whose rank died (SIGKILL) removes the rank's files before it
exits; and a new pool removes files of ranks that no longer exist in its own pid namespace.
Names start with ``zephon-<rank pid>-ns<pid namespace>-<pool>-<worker pid>-``: containers
that share ``/dev/shm`` but not their pid namespace (one container per GPU with
``--ipc=host``) see each other's files under pids that mean nothing to them, and leave them
alone.
"""

from __future__ import annotations

import contextlib
import itertools
import mmap
import os
import pickle
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from zephon_nodes.core.operator import operator_name
from zephon_nodes.core.settings import current

__all__ = [
    "arena_bytes",
    "MIN_BYTES",
    "SHM_DIR",
    "ShmCall",
    "ShmResult",
    "available",
    "forget",
    "remove_segments",
]

SHM_DIR = Path("/dev/shm")
# Buffers smaller than this stay in the pickle (a file per result costs ~20 us).
MIN_BYTES = 64 * 1024
_ALIGN = 64
_HEADER = 64
_PREFIX = "zephon-"
# The owner's pid and, since names carry it, its pid namespace (names of earlier versions
# have none).
_NAME = re.compile(r"^zephon-(\d+)-(?:ns(\d+)-)?")
_counter = itertools.count()


def arena_bytes() -> int:
    """Bytes of a worker's arena: the ring buffer results are written into (pages reused).

    The ``shm_arena_mb`` of the settings the worker's call runs under (the pool sends them
    with every call; ``ZEPHON_SHM_ARENA_MB``, default 32; 0: a file per result), read when
    the worker writes its first result.
    """
    return int(current().shm_arena_mb * 2**20)


def available() -> bool:
    """Whether POSIX shared memory is usable here (Linux ``/dev/shm``)."""
    return SHM_DIR.is_dir() and os.access(SHM_DIR, os.W_OK)


def _pid_namespace() -> int:
    """The inode of this process's pid namespace (0 where ``/proc`` does not say)."""
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return 0


def process_prefix() -> str:
    """The file-name prefix of this process's files: its pid and pid namespace."""
    return f"{_PREFIX}{os.getpid()}-ns{_pid_namespace()}-"


def pool_prefix(pool_id: int) -> str:
    """The file-name prefix of one pool of this process."""
    return f"{process_prefix()}{pool_id}-"


def remove_segments(prefix: str) -> int:
    """Unlink every shared-memory file whose name starts with ``prefix``; return the count."""
    n = 0
    try:
        names = os.listdir(SHM_DIR)
    except OSError:
        return 0
    for name in names:
        if name.startswith(prefix):
            with contextlib.suppress(OSError):
                os.unlink(SHM_DIR / name)
                n += 1
    return n


def remove_stale_segments() -> int:
    """Unlink files of ranks (processes) that no longer exist; return the count.

    Only files of this pid namespace: another namespace's pids are not this one's.
    """
    n = 0
    try:
        names = os.listdir(SHM_DIR)
    except OSError:
        return 0
    own = str(_pid_namespace())
    for name in names:
        m = _NAME.match(name)
        if m is None or m.group(2) not in (None, own):
            continue
        try:
            os.kill(int(m.group(1)), 0)
        except ProcessLookupError:
            with contextlib.suppress(OSError):
                os.unlink(SHM_DIR / name)
                n += 1
        except OSError:
            pass  # alive, another user's
    return n


@dataclass(frozen=True, slots=True)
class ShmResult:
    """What a worker sends instead of a large result: a small pickle and where the rest is.

    Attributes:
        data: The protocol-5 pickle (in-band part).
        name: Shared-memory file holding the out-of-band buffers (an arena or a result file).
        spans: ``(offset, length)`` of each buffer in the file, in pickle order.
        seq: Arena results: the worker's result number (spans are freed in this order);
            -1 for a result file.
        release: Arena results: the arena position up to which this result's span ends.
    """

    data: bytes
    name: str
    spans: tuple[tuple[int, int], ...]
    seq: int = -1
    release: int = 0

    def load(self) -> Any:
        """Rebuild the result: copied out of an arena, or over a result file's mapping."""
        if self.seq >= 0:
            arena = _ReaderArena.get(self.name)
            buffers: list[Any] = arena.copy_out(self.spans)
            arena.done(self.seq, self.release)
            return pickle.loads(self.data, buffers=buffers)
        path = SHM_DIR / self.name
        fd = os.open(path, os.O_RDWR)
        try:
            size = os.fstat(fd).st_size
            mapping = mmap.mmap(fd, size)
        finally:
            os.close(fd)
            os.unlink(path)
        view = memoryview(mapping)
        buffers = [view[o : o + n] for o, n in self.spans]
        # Each array keeps its slice, hence the mapping, alive; nothing else does.
        return pickle.loads(self.data, buffers=buffers)


class _ReaderArena:
    """The rank's side of one worker's arena: mapped once (and unlinked), freed in order."""

    _open: ClassVar[dict[str, _ReaderArena]] = {}
    _lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self, name: str) -> None:
        path = SHM_DIR / name
        fd = os.open(path, os.O_RDWR)
        try:
            self.map = mmap.mmap(fd, os.fstat(fd).st_size)
        finally:
            os.close(fd)
            os.unlink(path)  # no file left behind, whatever happens next
        self.released = np.frombuffer(self.map, dtype=np.int64, count=1)
        self.next_seq = 0
        self.finished: dict[int, int] = {}
        self.lock = threading.Lock()

    @classmethod
    def get(cls, name: str) -> _ReaderArena:
        with cls._lock:
            arena = cls._open.get(name)
            if arena is None:
                arena = cls._open[name] = _ReaderArena(name)
            return arena

    def copy_out(self, spans: tuple[tuple[int, int], ...]) -> list[bytearray]:
        view = memoryview(self.map)
        try:
            return [bytearray(view[o : o + n]) for o, n in spans]  # one copy each
        finally:
            view.release()

    def done(self, seq: int, release: int) -> None:
        """Free spans up to ``release`` once every earlier result was copied out."""
        with self.lock:
            self.finished[seq] = release
            while self.next_seq in self.finished:
                self.released[0] = self.finished.pop(self.next_seq)
                self.next_seq += 1


def forget(prefix: str) -> None:
    """Drop the rank's mappings of the arenas of one pool (when it is closed)."""
    with _ReaderArena._lock:
        for name in [n for n in _ReaderArena._open if n.startswith(prefix)]:
            arena = _ReaderArena._open.pop(name)
            del arena.released
            with contextlib.suppress(BufferError):  # a copy in progress: closed when freed
                arena.map.close()


class _WriterArena:
    """A worker's arena: results are written at ``head``; the rank frees up to the header."""

    _mine: ClassVar[dict[str, _WriterArena]] = {}

    def __init__(self, prefix: str, size: int) -> None:
        self.name = f"{prefix}{os.getpid()}-arena"
        fd = os.open(SHM_DIR / self.name, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        try:
            os.ftruncate(fd, size)
            self.map = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        self.released = np.frombuffer(self.map, dtype=np.int64, count=1)
        self.capacity = size - _HEADER
        self.head = 0
        self.seq = 0

    @classmethod
    def get(cls, prefix: str) -> _WriterArena | None:
        arena = cls._mine.get(prefix)
        size = arena_bytes() if arena is None else 0
        if arena is None and size > _HEADER:
            try:
                arena = cls._mine[prefix] = _WriterArena(prefix, size)
            except OSError:
                return None  # /dev/shm full: result files (or the pipe) instead
        return arena

    def write(self, data: bytes, big: list[pickle.PickleBuffer]) -> ShmResult | None:
        """Write the buffers at the head, or return None when they do not fit now."""
        sizes = [buf.raw().nbytes for buf in big]
        total = sum(-(-n // _ALIGN) * _ALIGN for n in sizes)
        start = self.head
        if start % self.capacity + total > self.capacity:  # would wrap: start at 0
            start += self.capacity - start % self.capacity
        end = start + total
        if end - int(self.released[0]) > self.capacity:
            return None
        spans = []
        offset = _HEADER + start % self.capacity
        for n, buf in zip(sizes, big, strict=True):
            self.map[offset : offset + n] = buf.raw()
            spans.append((offset, n))
            offset += -(-n // _ALIGN) * _ALIGN
        self.head = end
        self.seq += 1
        return ShmResult(data, self.name, tuple(spans), self.seq - 1, end)


def _export(result: Any, prefix: str) -> Any:
    """In a worker: move the large buffers of ``result`` into shared memory."""
    big: list[pickle.PickleBuffer] = []

    def keep_small(buf: pickle.PickleBuffer) -> bool:
        if buf.raw().nbytes >= MIN_BYTES:
            big.append(buf)
            return False  # out of band
        return True  # in the pickle

    data = pickle.dumps(result, protocol=5, buffer_callback=keep_small)
    if not big:
        return result
    arena = _WriterArena.get(prefix)
    if arena is not None:
        written = arena.write(data, big)
        if written is not None:
            return written
    spans: list[tuple[int, int]] = []
    offset = 0
    for buf in big:
        spans.append((offset, buf.raw().nbytes))
        offset += -(-buf.raw().nbytes // _ALIGN) * _ALIGN
    name = f"{prefix}{os.getpid()}-{next(_counter)}"
    fd = os.open(SHM_DIR / name, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    try:
        os.ftruncate(fd, offset)
        with mmap.mmap(fd, offset) as mapping:
            for (o, n), buf in zip(spans, big, strict=True):
                mapping[o : o + n] = buf.raw()
    except BaseException:
        os.unlink(SHM_DIR / name)
        raise
    finally:
        os.close(fd)
    return ShmResult(data, name, tuple(spans))


@dataclass(frozen=True)
class ShmCall:
    """A picklable wrapper run in a worker: ``fn(arg)``, large arrays exported to shm.

    Args:
        fn: The operator.
        prefix: The pool's file-name prefix.
    """

    fn: Callable[[Any], Any]
    prefix: str

    def __call__(self, arg: Any) -> Any:
        """Run ``fn`` and export its result."""
        return _export(self.fn(arg), self.prefix)

    @property
    def name(self) -> str:
        """The operator's name (messages)."""
        return operator_name(self.fn)
