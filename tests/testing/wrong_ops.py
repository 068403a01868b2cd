"""Operators, accumulators and nodes for the kit's own tests: one correct, several wrong."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import numpy as np
from torchdata.nodes import BaseNode

from zephon_nodes.operators.documents import DocBatch


class Reverse:
    """Correct: reverses every document's tokens (a pure function of the batch)."""

    name = "reverse"

    def __call__(self, batch: DocBatch) -> DocBatch:
        docs = [d[::-1] for d in batch.documents()]
        tokens = np.concatenate(docs) if docs else batch.tokens
        return DocBatch(tokens.astype(np.int32), batch.lengths)


class WorkerTag:
    """Wrong: adds the number of the worker thread it runs on (0 in the calling thread)."""

    name = "worker-tag"

    def __call__(self, batch: DocBatch) -> DocBatch:
        thread = threading.current_thread()
        if thread is threading.main_thread():
            worker = 0
        else:  # workers are numbered 1, 2, ... in the order they first run this operator
            worker = _WORKER_IDS.setdefault(thread.ident or 0, len(_WORKER_IDS) + 1)
        return DocBatch((batch.tokens + worker).astype(np.int32), batch.lengths)


_WORKER_IDS: dict[int, int] = {}


class ThreadIdentity:
    """Wrong: mixes the thread identity into the output (here: into a field)."""

    name = "thread-identity"

    def __call__(self, batch: DocBatch) -> dict[str, Any]:
        return {"tokens": batch.tokens, "thread": threading.get_ident()}


class Counting:
    """Wrong: numbers its outputs with a per-instance counter."""

    name = "counting"

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, batch: DocBatch) -> tuple[int, int]:
        self.calls += 1
        return (self.calls, len(batch.tokens))


class Unpicklable:
    """Wrong for the process runner: holds a lambda, which does not pickle."""

    name = "unpicklable"

    def __init__(self) -> None:
        self.scale = lambda x: x

    def __call__(self, batch: DocBatch) -> DocBatch:
        return DocBatch(self.scale(batch.tokens), batch.lengths)


class ChunkPacker:
    """Correct accumulator: tokens into chunks of 4; a flush emits the rest, then nothing."""

    def __init__(self) -> None:
        self.held: list[int] = []

    def feed(self, batch: DocBatch) -> list[list[int]]:
        self.held += batch.tokens.tolist()
        out = []
        while len(self.held) >= 4:
            out.append(self.held[:4])
            self.held = self.held[4:]
        return out

    def flush(self) -> list[list[int]]:
        out, self.held = ([self.held] if self.held else []), []
        return out


def make_chunk_packer(window: int) -> ChunkPacker:
    return ChunkPacker()


def make_carry_over() -> Callable[[int], Any]:
    """Wrong: a packer whose flush keeps the partial chunk for the next window."""
    carry: list[int] = []

    class CarryPacker(ChunkPacker):
        def __init__(self) -> None:
            self.held = carry

        def feed(self, batch: DocBatch) -> list[list[int]]:
            out = super().feed(batch)
            carry[:] = self.held
            self.held = carry
            return out

        def flush(self) -> list[list[int]]:
            return []  # the partial chunk stays in `carry` across the flush

    def make(window: int) -> CarryPacker:
        return CarryPacker()

    return make


def make_shared_counter() -> Callable[[int], Any]:
    """Wrong: every window's accumulator numbers outputs from a counter shared by all windows."""
    counter = [0]

    class Numbered:
        def feed(self, batch: DocBatch) -> list[tuple[int, int]]:
            counter[0] += 1
            return [(counter[0], len(batch.tokens))]

        def flush(self) -> list[Any]:
            return []

    def make(window: int) -> Numbered:
        return Numbered()

    return make


class RunningSum(BaseNode[tuple[Any, int]]):
    """A node that yields (item, running count); its state holds the items seen so far.

    With ``live=True`` (wrong) ``get_state`` returns the node's own list, which keeps growing
    after the state was taken; with ``live=False`` it returns a copy.
    """

    def __init__(self, source: BaseNode[Any], live: bool) -> None:
        super().__init__()
        self.source = source
        self.live = live
        self._seen: list[int] = []

    def reset(self, initial_state: dict[str, Any] | None = None) -> None:
        super().reset(initial_state)
        if initial_state is None:
            self.source.reset(None)
            self._seen = []
        else:
            self.source.reset(initial_state["source"])
            self._seen = list(initial_state["seen"])

    def next(self) -> tuple[Any, int]:
        item = next(self.source)
        self._seen.append(len(self._seen))
        return item, len(self._seen)

    def get_state(self) -> dict[str, Any]:
        seen = self._seen if self.live else list(self._seen)
        return {"source": self.source.get_state(), "seen": seen}
