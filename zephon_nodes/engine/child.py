"""A rank's node run in a child process: the trainer's process only copies batches out.

:class:`ChildRankNode` starts a child process (``spawn``) that builds the rank node with a
picklable factory and runs all of it there: lanes, stateless chain, accumulators, collation.
Each micro-batch (a dict of tensors) comes back through a small ring of shared-memory slots,
``prefetch`` batches ahead; the trainer's process copies the tensors out of the slot (one
``memcpy`` each) and frees it. Only a few hundred bytes of metadata cross the pipe. A slot is
a ``memfd`` (anonymous shared memory, no name in ``/dev/shm``) whose descriptor the child
passes over the pipe's socket when it makes or grows the slot.

The state: the child sends, with every batch, the node's state after that batch; the parent
returns the state of the last batch it *handed out* (prefetched batches are not counted),
and a ``reset(state)`` restarts the child's node at that state (batches prefetched before are
dropped).

Death: the parent waits on the pipe and the process sentinel together, so a child killed,
crashed or raising is a :class:`ChildEngineError` (or the child's own error) as soon as the
batches it had sent are handed out, and on every later ``next()`` until a reset; a
``close()`` from another thread makes a ``next()`` waiting on the child raise it too; a live
child that sends nothing for ``stall_s`` (15 minutes by default) is stuck: its threads' stacks
go to stderr, it is stopped and the error says so. Files: without ``memfd`` a slot file
``/dev/shm/zephon-<parent pid>-ns<pid namespace>-engine<n>-...`` is unlinked as soon as it
is made; ``close()``, garbage collection and interpreter exit stop the child; a
child whose parent is gone exits (its mappings go with it).
"""

from __future__ import annotations

import contextlib
import copy
import faulthandler
import itertools
import mmap
import multiprocessing
import os
import pickle
import signal
import threading
import time
import traceback
import weakref
from collections import deque
from collections.abc import Callable, Mapping
from multiprocessing.connection import Connection, wait
from multiprocessing.reduction import ForkingPickler, recv_handle, send_handle
from typing import Any

import torch
from torchdata.nodes import BaseNode

from zephon_nodes.core.errors import WorkerError
from zephon_nodes.engine import shm

__all__ = ["STALL_S", "ChildEngineError", "ChildRankNode"]

_ALIGN = 64
_MIN_SLOT = 1 << 20
_IDS = itertools.count()
# Longest wait for the child to stop after "close" before it is terminated.
_CLOSE_S = 5.0
STALL_S = 900.0
# A new child's first message (spawn, imports, building the node) may take this long when
# ``stall_s`` is shorter: a start on a loaded node is slow, not stuck.
_START_S = 120.0
"""Default longest wait for a message from a live child before it is declared stuck.

A work item that runs too long is the child's own error (``worker_timeout_s``, 300 s by
default) and comes back as one; silence beyond this is a child stuck outside its operators
(a deadlock, a blocked read), which would otherwise hang the trainer."""


class ChildEngineError(WorkerError):
    """The engine's child process died (killed, crashed) or its pipe broke."""


def _slot_view(mapping: mmap.mmap) -> torch.Tensor:
    return torch.frombuffer(mapping, dtype=torch.uint8)


def _new_segment(name: str, size: int) -> int:
    """A file descriptor of ``size`` bytes of shared memory that no name points to."""
    if hasattr(os, "memfd_create"):
        fd = os.memfd_create(name, os.MFD_CLOEXEC)
    else:  # unlinked at once: only the descriptors keep it
        fd = os.open(shm.SHM_DIR / name, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        os.unlink(shm.SHM_DIR / name)
    try:
        os.ftruncate(fd, size)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _map_fd(fd: int) -> tuple[mmap.mmap, torch.Tensor]:
    """Map a slot's descriptor (then closed: the mapping keeps the memory)."""
    try:
        mapping = mmap.mmap(fd, os.fstat(fd).st_size)
    finally:
        os.close(fd)
    return mapping, _slot_view(mapping)


def _close_map(entry: tuple[mmap.mmap, torch.Tensor] | None) -> None:
    if entry is None:
        return
    mapping, view = entry
    del view, entry
    with contextlib.suppress(BufferError):  # a tensor still viewing it: freed with it
        mapping.close()


# ---------------------------------------------------------------------------- the child


class _WriterSlots:
    """The child's side of the ring: one shared-memory file per slot, grown on demand."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.maps: dict[int, tuple[mmap.mmap, torch.Tensor]] = {}
        self.sizes: dict[int, int] = {}
        self.generation = itertools.count()

    def ensure(self, slot: int, need: int) -> int | None:
        """Make slot ``slot`` hold ``need`` bytes; return the descriptor of a new segment."""
        if self.sizes.get(slot, 0) >= need:
            return None
        size = max(_MIN_SLOT, -(-(need * 5 // 4) // mmap.PAGESIZE) * mmap.PAGESIZE)
        fd = _new_segment(f"{self.prefix}{slot}-{next(self.generation)}", size)
        try:
            mapping = mmap.mmap(fd, size)
        except BaseException:
            os.close(fd)
            raise
        _close_map(self.maps.pop(slot, None))
        self.maps[slot] = (mapping, _slot_view(mapping))
        self.sizes[slot] = size
        return fd

    @staticmethod
    def plan(batch: Any) -> tuple[int, Any, list[torch.Tensor]]:
        """The bytes a batch needs in a slot, its layout and its tensors (contiguous)."""
        if not isinstance(batch, Mapping):
            return 0, ("pickle", batch), []
        tensors = {k: v.contiguous() for k, v in batch.items() if isinstance(v, torch.Tensor)}
        layout: list[tuple[str, str, tuple[int, ...], int, int]] = []
        offset = 0
        for key, t in tensors.items():
            n = t.numel() * t.element_size()
            layout.append((key, str(t.dtype).removeprefix("torch."), tuple(t.shape), offset, n))
            offset += -(-n // _ALIGN) * _ALIGN
        rest = {k: v for k, v in batch.items() if k not in tensors}
        return offset, ("slot", layout, rest, list(batch)), list(tensors.values())

    def fill(self, slot: int, layout: Any, tensors: list[torch.Tensor]) -> None:
        """Copy the tensors of a planned batch into its slot."""
        if layout[0] != "slot":
            return
        view = self.maps[slot][1]
        for (_, _, _, o, n), t in zip(layout[1], tensors, strict=True):
            if n:
                view[o : o + n].copy_(t.reshape(-1).view(torch.uint8))

    def close(self) -> None:
        for slot in list(self.maps):
            _close_map(self.maps.pop(slot))


def _error_payload(exc: BaseException) -> tuple[bytes | None, str]:
    """The exception pickled (the same type is raised in the parent), and its text."""
    text = f"{type(exc).__name__}: {exc}"
    try:
        data = pickle.dumps(exc)
        pickle.loads(data)
    except Exception:
        data = None
        text += "\n" + "".join(traceback.format_exception(exc))
    return data, text


def _watch_parent(parent: int, prefix: str) -> None:
    """Exit this child as soon as the trainer's process is gone (removing the slot files)."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        shm.remove_segments(prefix)
        os._exit(1)

    threading.Thread(target=watch, name="zephon-engine-parent-watch", daemon=True).start()


class _Child:
    """The child's loop: commands from the parent between batches, batches into free slots."""

    def __init__(
        self, node: Any, conn: Connection, prefix: str, prefetch: int, parent: int
    ) -> None:
        self.node = node
        self.parent = parent
        self.conn = conn
        self.slots = _WriterSlots(prefix)
        self.prefetch = prefetch
        self.free = set(range(prefetch))
        self.epoch = -1
        self.producing = False

    def info(self) -> dict[str, Any]:
        return {
            "state": self.node.get_state(),
            "micro_per_step": getattr(self.node, "micro_per_step", None),
        }

    def command(self, msg: tuple[Any, ...]) -> bool:
        """Handle one command; False when the child should stop."""
        kind = msg[0]
        if kind == "free":
            self.free.add(msg[1])
        elif kind == "reset":
            _, self.epoch, state, weights, own = msg
            self.free = set(range(self.prefetch))  # the parent drops what it has not read
            try:
                if own:  # the state of a pass's start this node made (see ChildRankNode.reset)
                    getattr(self.node, "reset_own", self.node.reset)(state)
                elif weights is None:
                    self.node.reset(state)
                else:  # a state this node made (no replay check), then the decision
                    if state is not None:
                        self.node.reset_own(state)
                    self.node.set_mixture(weights)
                self.conn.send(("reset_done", self.epoch, self.info()))
                self.producing = True
            except Exception as e:
                self.conn.send(("error", self.epoch, _error_payload(e)))
                self.producing = False
        elif kind == "call":
            _, call_id, name = msg
            try:
                self.conn.send(("reply", call_id, getattr(self.node, name)()))
            except Exception as e:
                self.conn.send(("reply_error", call_id, _error_payload(e)))
        elif kind == "close":
            return False
        return True

    def produce(self) -> None:
        try:
            batch = next(self.node)
        except StopIteration:
            self.conn.send(("end", self.epoch))
            self.producing = False
            return
        except Exception as e:
            self.conn.send(("error", self.epoch, _error_payload(e)))
            self.producing = False
            return
        slot = min(self.free)
        self.free.discard(slot)
        try:
            need, layout, tensors = self.slots.plan(batch)
            made = self.slots.ensure(slot, need)
        except Exception as e:
            self.fail(e, batch)
            return
        if made is not None:  # the descriptor follows its message on the same socket
            self.conn.send(("map", slot))
            try:
                send_handle(self.conn, made, self.parent)
            finally:
                os.close(made)
        try:
            self.slots.fill(slot, layout, tensors)
            data = ForkingPickler.dumps(("batch", self.epoch, slot, layout, self.info()))
        except Exception as e:  # a value that does not pickle, say: the parent says so
            self.fail(e, batch)
            return
        self.conn.send_bytes(data)

    def fail(self, exc: Exception, batch: Any) -> None:
        """Send the parent why a micro-batch cannot be sent; stop producing."""
        keys = f" (keys {list(batch)})" if isinstance(batch, Mapping) else ""
        err = TypeError(
            f"a micro-batch{keys} cannot be sent to the trainer's process: "
            f"{type(exc).__name__}: {exc}"
        )
        self.conn.send(("error", self.epoch, _error_payload(err)))
        self.producing = False

    def run(self) -> None:
        try:
            while True:
                while self.conn.poll(0) or not self.producing or not self.free:
                    if not self.command(self.conn.recv()):
                        return
                self.produce()
        except (EOFError, OSError):
            return  # the parent is gone or closed the pipe
        finally:
            with contextlib.suppress(Exception):
                self.node.close()
            self.slots.close()
            shm.remove_segments(self.slots.prefix)


class _Pickled:
    """A factory pickled in the parent, loaded in the child where a failure can be sent."""

    def __init__(self, factory: Callable[[], Any]) -> None:
        self.data = bytes(ForkingPickler.dumps(factory))
        self.text = repr(factory)[:300]

    def load(self) -> Callable[[], Any]:
        try:
            factory: Callable[[], Any] = pickle.loads(self.data)
        except Exception as e:
            raise TypeError(
                f"the engine child process cannot load its factory {self.text}: "
                f"{type(e).__name__}: {e} (a factory must be importable in a new "
                f"interpreter: a module-level function, or a functools.partial of one)"
            ) from None
        return factory


def _child_main(
    factory: Callable[[], Any] | _Pickled,
    conn: Connection,
    prefix: str,
    parent: int,
    prefetch: int,
) -> None:
    """Entry point of the child process."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent stops it (Ctrl-C goes there)
    # A parent that finds the child stuck asks for its threads' stacks before stopping it.
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    _watch_parent(parent, prefix)
    torch.set_num_threads(1)  # collation only; the trainer's cores are not ours
    try:
        node = (factory.load() if isinstance(factory, _Pickled) else factory)()
    except Exception as e:
        with contextlib.suppress(Exception):
            conn.send(("error", -1, _error_payload(e)))
        return
    _Child(node, conn, prefix, prefetch, parent).run()


# --------------------------------------------------------------------------- the parent


class _Process:
    """The parent's handle on one child: its process, pipe and mapped slots."""

    def __init__(
        self, factory: Callable[[], Any], prefetch: int, label: str, stall_s: float | None
    ) -> None:
        shm.remove_stale_segments()  # files of trainers that were killed
        self.prefix = f"{shm.process_prefix()}engine{next(_IDS)}-"
        self.label = label
        self.stall_s = stall_s
        self.started = False  # the child's first message came
        ctx = multiprocessing.get_context("spawn")
        try:  # a factory the child cannot load is then an error the child can send
            sent: Callable[[], Any] | _Pickled = _Pickled(factory)
        except RuntimeError:  # holds objects shared only through a spawn: passed as is
            sent = factory
        self.conn, child_conn = ctx.Pipe(duplex=True)
        self.proc = ctx.Process(
            target=_child_main,
            args=(sent, child_conn, self.prefix, os.getpid(), prefetch),
            name=f"zephon-engine-{label}",
            daemon=False,  # its worker pool may start processes of its own
        )
        self.proc.start()
        child_conn.close()
        self.slots: dict[int, tuple[mmap.mmap, torch.Tensor]] = {}
        self.inbox: deque[tuple[Any, ...]] = deque()
        self.closed = False
        # close() from another thread unmaps the slots: not while a batch is copied out
        self.maps_lock = threading.Lock()

    def closed_error(self) -> ChildEngineError:
        return ChildEngineError(f"the engine child process of {self.label} was closed")

    def describe_death(self) -> str:
        try:
            self.proc.join(1.0)
            code = self.proc.exitcode
        except ValueError:  # closed meanwhile by close() from another thread
            return str(self.closed_error())
        if code is None:
            how = "closed its pipe"
        elif code < 0:
            try:
                how = f"was killed by {signal.Signals(-code).name}"
            except ValueError:
                how = f"was killed by signal {-code}"
        else:
            how = f"exited with code {code}"
        return (
            f"the engine child process of {self.label} (pid {self.proc.pid}) {how}; "
            f"no batch was lost: restart from the last checkpoint"
        )

    @property
    def start_s(self) -> float | None:
        """Longest wait for the child's first message (at least ``stall_s``)."""
        return None if self.stall_s is None else max(self.stall_s, _START_S)

    def describe_stall(self, limit: float | None) -> str:
        """Ask the stuck child for its threads' stacks (on stderr); say what happened."""
        with contextlib.suppress(OSError):
            os.kill(self.proc.pid or 0, signal.SIGUSR1)
            time.sleep(1.0)  # faulthandler writes at once; give it the time to
        return (
            f"the engine child process of {self.label} (pid {self.proc.pid}) sent nothing for "
            f"{limit:g} s: alive but stuck outside its operators (their own limit is "
            f"worker_timeout_s); its threads' stacks are on stderr above, and it was stopped; "
            f"no batch was lost: restart from the last checkpoint"
        )

    def recv(self) -> tuple[Any, ...]:
        """The next message; ChildEngineError as soon as the child is dead, stuck or closed.

        Messages the child sent before it died are read first (its own error among them).
        """
        if self.inbox:
            return self.inbox.popleft()
        while True:
            if self.closed:  # here or by close() from another thread meanwhile
                raise self.closed_error()
            try:
                msg = self._poll()
            except ValueError:  # a handle closed by close() from another thread
                if self.closed:
                    continue
                raise
            except (EOFError, OSError):
                if self.closed:
                    continue
                break
            if msg is None:
                break
            if msg[0] != "map":
                return msg
        message = self.describe_death()
        self.close()
        raise ChildEngineError(message)

    def _poll(self) -> tuple[Any, ...] | None:
        """One message (a slot's descriptor mapped), or None when the child is gone."""
        limit = self.stall_s if self.started else self.start_s
        ready = wait([self.conn, self.proc.sentinel], timeout=limit)
        if self.closed:
            raise self.closed_error()
        if not ready:
            message = self.describe_stall(limit)
            self.close(wait_s=0.0)  # a stuck child does not read "close"
            raise ChildEngineError(message)
        if self.conn in ready or self.conn.poll(0):
            msg: tuple[Any, ...] = self.conn.recv()
            self.started = True
            if msg[0] == "map":  # the descriptor follows (EOFError if the child died first)
                entry = _map_fd(recv_handle(self.conn))
                with self.maps_lock:
                    _close_map(self.slots.pop(msg[1], None))
                    self.slots[msg[1]] = entry
            return msg
        return None  # only the sentinel: the child is gone and sent nothing more

    def send(self, msg: tuple[Any, ...]) -> None:
        """Send a command; a dead child's broken pipe is left to the next :meth:`recv`.

        That recv reads what the child sent before it died (its batches in flight, its own
        error) and only then says it died.
        """
        if self.closed:
            raise self.closed_error()
        with contextlib.suppress(OSError):
            self.conn.send(msg)

    def read(self, slot: int, layout: Any) -> Any:
        """Copy a batch out of its slot (one copy per tensor)."""
        if layout[0] == "pickle":
            return layout[1]
        _, tensors, rest, order = layout
        out: dict[str, Any] = {}
        with self.maps_lock:
            if self.closed:
                raise self.closed_error()
            view = self.slots[slot][1]
            for key, dtype, shape, offset, n in tensors:
                raw = torch.empty(n, dtype=torch.uint8)
                raw.copy_(view[offset : offset + n])
                out[key] = raw.view(getattr(torch, dtype)).reshape(shape)
        out.update(rest)
        return {k: out[k] for k in order}

    def close(self, wait_s: float = _CLOSE_S) -> None:
        """Stop the child (``wait_s`` to end politely, then a signal); remove every file."""
        if self.closed:
            return
        self.closed = True
        with contextlib.suppress(Exception):
            self.conn.send(("close",))
        self.proc.join(wait_s)
        if self.proc.is_alive():
            self.proc.terminate()
            self.proc.join(2.0)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join()
        with contextlib.suppress(Exception):
            self.proc.close()
        self.conn.close()
        with self.maps_lock:
            for slot in list(self.slots):
                _close_map(self.slots.pop(slot))
        shm.remove_segments(self.prefix)


def _child_error(payload: tuple[bytes | None, str], label: str) -> BaseException:
    """The exception the child raised (its own type when it pickles)."""
    data, text = payload
    if data is not None:
        exc = pickle.loads(data)
        if isinstance(exc, BaseException):
            return exc
    return ChildEngineError(f"the engine child process of {label} raised {text}")


class ChildRankNode(BaseNode[dict[str, torch.Tensor]]):
    """A rank node run in a child process; batches come back through shared memory.

    The same batches and states as the node ``factory`` builds, run in this process (see the
    module docstring). ``get_state()`` is the state after the last batch returned here.

    Args:
        factory: A picklable zero-argument callable (e.g. ``functools.partial`` of a
            module-level function) that builds the rank node (what
            :meth:`~zephon_nodes.engine.pipeline.Pipeline.rank_node` returns) in the child.
        prefetch: Batches the child prepares ahead (slots of the shared-memory ring).
        label: Names the child in errors (e.g. ``"rank 3"``).
        stall_s: Longest wait for a message from a live child (:data:`STALL_S`; ``None``:
            for ever); beyond it the child is declared stuck, its threads' stacks are
            written to stderr, it is stopped and :class:`ChildEngineError` is raised. A new
            child's first message (its start: spawn, imports, the node's build) may take
            up to 120 s when ``stall_s`` is shorter.
    """

    def __init__(
        self,
        factory: Callable[[], Any],
        *,
        prefetch: int = 4,
        label: str = "the rank",
        stall_s: float | None = STALL_S,
    ) -> None:
        super().__init__()
        if prefetch < 1:
            raise ValueError(f"{prefetch=} must be >= 1")
        if stall_s is not None and not stall_s > 0:
            raise ValueError(f"{stall_s=} must be > 0 (None: wait for ever)")
        self._factory = factory
        self._prefetch = prefetch
        self._label = label
        self._stall_s = stall_s
        self._proc: _Process | None = None
        self._finalizer: weakref.finalize[Any, Any] | None = None
        self._epoch = 0
        self._state: dict[str, Any] | None = None
        self._micro_per_step: int | None = None
        self._ended = False
        self._failed: BaseException | None = None
        # The state after a reset(None) while no batch was handed out since (see reset()).
        self._pass_start: dict[str, Any] | None = None
        self._calls = itertools.count()
        # torchdata may reset a node from a new iterator's thread while the old one's is
        # still in next(): the pipe carries one conversation at a time.
        self._driving = threading.RLock()
        self._start()  # the child builds its pipeline while the caller goes on

    def _start(self) -> _Process:
        if self._proc is None or self._proc.closed:
            self._proc = _Process(self._factory, self._prefetch, self._label, self._stall_s)
            self._finalizer = weakref.finalize(self, self._proc.close)
        return self._proc

    @property
    def pid(self) -> int | None:
        """The child's process id (None before it started or after close)."""
        p = self._proc
        return None if p is None or p.closed else p.proc.pid

    def _apply(self, info: Mapping[str, Any]) -> None:
        self._state = info["state"]
        self._micro_per_step = info["micro_per_step"]

    def _restart_at(
        self, state: dict[str, Any] | None, weights: Any = None, *, own: bool = False
    ) -> None:
        self._failed = None
        proc = self._start()
        self._epoch += 1
        proc.send(("reset", self._epoch, copy.deepcopy(state), weights, own))
        while True:
            msg = self._recv(proc)
            if msg[0] == "reset_done" and msg[1] == self._epoch:
                self._apply(msg[2])
                self._ended = False
                return
            if msg[0] == "error" and msg[1] in (self._epoch, -1):
                # every later next() raises it again, until a reset (the child produces
                # nothing after a failed reset: a next() would otherwise wait for stall_s)
                self._failed = self._child_failed(proc, msg)
                raise self._failed
            # earlier batches, ends and errors: dropped (the child freed every slot)

    def _child_failed(self, proc: _Process, msg: tuple[Any, ...]) -> BaseException:
        """The error the child sent; a child whose factory failed is exiting: closed."""
        if msg[1] == -1:
            proc.close()  # the next reset builds the node again in a new child
        return _child_error(msg[2], self._label)

    def _recv(self, proc: _Process) -> tuple[Any, ...]:
        try:
            return proc.recv()
        except ChildEngineError as e:
            self._failed = e  # every later next() says it again, until a reset
            raise

    def reset(self, initial_state: dict[str, Any] | None = None) -> None:
        """Restart the child's node from the beginning or at ``initial_state``.

        A ``reset(None)`` after a ``reset(None)`` with no batch handed out in between starts
        the same pass again, as the node would in this process: the child's node may have
        prefetched batches, which starts a pass for a node such as ``Multiplexer`` (a new
        ``reset(None)`` would then start the next pass), so the child restores the state
        it reported at the pass's start instead.
        """
        with self._driving:
            super().reset(initial_state)
            if initial_state is None and self._pass_start is not None:
                self._restart_at(self._pass_start, own=True)
                return
            self._pass_start = None
            self._restart_at(initial_state)
            if initial_state is None:
                self._pass_start = self.get_state()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore ``state`` (the same as ``reset(state)``)."""
        self.reset(state)

    def next(self) -> dict[str, torch.Tensor]:
        """Return the next micro-batch (copied out of shared memory)."""
        with self._driving:
            return self._next()

    def _next(self) -> dict[str, torch.Tensor]:
        if self._failed is not None:
            raise self._failed
        if self._ended:
            raise StopIteration
        if self._proc is None or self._proc.closed:  # closed: a new child goes on from here
            self._restart_at(self._state)
        proc = self._start()
        while True:
            msg = self._recv(proc)
            kind = msg[0]
            if kind == "error" and msg[1] == -1:
                self._failed = self._child_failed(proc, msg)
                raise self._failed
            if kind in ("reply", "reply_error") or msg[1] != self._epoch:
                continue  # stale
            if kind == "batch":
                _, _, slot, layout, info = msg
                batch = proc.read(slot, layout)
                proc.send(("free", slot))
                self._apply(info)
                self._pass_start = None
                return batch
            if kind == "end":
                self._ended = True
                raise StopIteration
            if kind == "error":  # every later next() raises it again, until a reset
                self._failed = _child_error(msg[2], self._label)
                raise self._failed

    def get_state(self) -> dict[str, Any]:
        """The state after the last batch returned (a fresh dict)."""
        return copy.deepcopy(self._state) if self._state is not None else {}

    @property
    def step(self) -> int:
        """Steps whose micro-batches were all returned (from the state)."""
        return int((self._state or {}).get("step", 0))

    @property
    def micro_per_step(self) -> int:
        """Micro-batches per step of the recipe in force (after a reset)."""
        if self._micro_per_step is None:
            self.reset(None)
        return int(self._micro_per_step or 0)

    def set_mixture(self, weights: Mapping[str, float]) -> None:
        """Change the mixture after the current step (see ``Multiplexer.set_mixture``)."""
        with self._driving:
            self._restart_at(self._state, dict(weights))

    def metrics(self) -> dict[str, Any]:
        """The child node's metrics (as of what it has prepared, prefetch included).

        Raises:
            ChildEngineError: If the child is closed, or died (the error ``next()`` raises):
                its metrics went with it (a new child would report a fresh node's).
        """
        with self._driving:
            return self._metrics()

    def _metrics(self) -> dict[str, Any]:
        if self._failed is not None:
            raise self._failed
        proc = self._proc
        if proc is None or proc.closed:
            raise ChildEngineError(
                f"the engine child process of {self._label} is closed: its metrics went "
                f"with it (a reset starts a new child)"
            )
        call_id = next(self._calls)
        proc.send(("call", call_id, "metrics"))
        held: deque[tuple[Any, ...]] = deque()
        while True:
            msg = self._recv(proc)
            if msg[0] in ("reply", "reply_error") and msg[1] == call_id:
                break
            held.append(msg)
        proc.inbox.extend(held)  # batches that came in meanwhile: next() reads them
        if msg[0] == "reply_error":
            raise _child_error(msg[2], self._label)
        return msg[2]

    def close(self) -> None:
        """Stop the child and remove its shared memory (idempotent; a reset starts anew)."""
        if self._finalizer is not None:
            self._finalizer()

    def __enter__(self) -> ChildRankNode:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
