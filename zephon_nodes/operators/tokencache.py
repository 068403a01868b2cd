"""Token cache: a work item's tokenized documents, reused when its records meet its tokenizer.

Reused by another seed, mixture, lane count, packing or run.

The key of a work item is what determines its tokens and nothing else: the shard's content
checksum and the record range, the dataset's text field and ``on_error`` policy, the
tokenizer's identity (its kind, the SHA-256 of its file, bos/eos, the version of the library
that runs it) and the version of the parse and tokenize code. Seed, mixture weights, lanes,
packing and shuffling are downstream and never part of it, so an ablation that changes only
those hits the cache. Entries are kept by :mod:`zephon_nodes.io.nodecache.tokenstore` (one bounded
directory per node, shared by all ranks and runs, each entry checked on every read), optionally
in front of a folder shared by a cluster (:mod:`zephon_nodes.io.nodecache.sharedtokens`).

The cache sits in the stateless chain as two operators that replace parse and tokenize
and keep their names (so per-operator pools name them as before):

- :class:`CachedParse` (``"parse"``): on a hit returns the item's :class:`DocBatch` without
  reading a record; on a miss parses and passes the texts on with the key (:class:`Pending`);
- :class:`CachedTokenize` (``"tokenize"``): tokenizes a pending batch and stores it (a key
  wanted by several processes at once is written once), passes a hit through.

Only recipes whose chain is parse then tokenize are cached: filters and maps run registered
Python code whose changes no key could see, and chat and image recipes have their own
chains (neither is cached yet). A shard without a content checksum (in-memory records) and a
custom tokenizer are never cached.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

import numpy as np

from zephon_nodes.core.errors import FILE_ERROR_KINDS
from zephon_nodes.io.formats.lines import is_text_lines
from zephon_nodes.io.nodecache.tokenstore import (
    Entry,
    default_root,
    now_cpu_ns,
    shared_location,
    token_cache_settings,
    token_store,
)
from zephon_nodes.operators.bestfit import LongDocuments
from zephon_nodes.operators.documents import DocBatch, TextBatch
from zephon_nodes.operators.parse import ParseJsonl
from zephon_nodes.operators.tokenize import Tokenize

__all__ = [
    "CODE_VERSION",
    "CachedParse",
    "CachedTokenize",
    "Pending",
    "cached_chain",
    "cached_item_pairs",
    "tokenizer_identity",
]

# Skip reasons of a whole file (see core.errors.FileErrorKind): not stored.
FILE_ERRORS = FILE_ERROR_KINDS
# Bump when parse or tokenize could give other ids for the same records (old entries are
# then never hit again). 2: a huge document's cut needs the whole word beside it in each check
# window (13d68f6): version 1 could store ids of a cut the whole text merges across.
CODE_VERSION = 2


def _library_version(kind: str) -> str:
    try:
        if kind == "hf":
            import tokenizers

            return f"tokenizers-{tokenizers.__version__}"
        if kind == "sentencepiece":
            import sentencepiece

            return f"sentencepiece-{sentencepiece.__version__}"
    except ImportError:  # pragma: no cover - the tokenizer could not load either
        return "missing"
    return "builtin"


def tokenizer_identity(spec: Any, sha256: str | None = None) -> str | None:
    """A digest of everything about a tokenizer spec that decides its ids (None: custom).

    Args:
        spec: A :class:`~zephon_nodes.recipe.tokenizer.TokenizerSpec`.
        sha256: The SHA-256 of the file its tokenizer was loaded from (what
            :class:`~zephon_nodes.operators.tokenize.Tokenize` holds and its workers load);
            None: the file's now.
    """
    if spec.kind == "custom":
        return None
    text = json.dumps(
        {
            "code": CODE_VERSION,
            "tokenizer": spec.canonical(sha256),  # kind, file SHA-256, add_bos, add_eos
            "library": _library_version(spec.kind),
        },
        sort_keys=True,
    )
    return hashlib.sha256(text.encode()).hexdigest()


def _shard_checksum(shard: Any) -> str:
    checksum = getattr(shard, "checksum", "") or ""
    inner = getattr(shard, "shard", None)  # a NodeCachedShard wraps the shard
    if not checksum and inner is not None:
        checksum = getattr(inner, "checksum", "") or ""
    return str(checksum)


@dataclass(frozen=True)
class Pending:
    """A parsed work item on its way to :class:`CachedTokenize`.

    Attributes:
        text: The parse's output.
        key: The item's cache key.
        cpu_ns: CPU nanoseconds the parse took.
    """

    text: TextBatch
    key: str
    cpu_ns: int


@dataclass(frozen=True)
class CachedParse:
    """Stateless operator ``WorkItem -> DocBatch | Pending``: parse, unless the cache holds it.

    Args:
        parse: The parse it stands for.
        tokenize: The recipe's tokenize (used only if a hit is evicted before it is read).
        identity: :func:`tokenizer_identity` of the recipe's tokenizer.
        root: The store's directory.
        limit_bytes: The store's size limit.
        shared: A folder shared by a cluster behind the store (``""``: none).
    """

    parse: ParseJsonl
    tokenize: Tokenize
    identity: str
    root: str
    limit_bytes: int
    name: str = "parse"
    shared: str = ""

    def key(self, item: Any) -> str | None:
        """The cache key of a work item (None: its shard has no content checksum)."""
        checksum = _shard_checksum(item.shard)
        if not checksum:
            return None
        text = json.dumps(
            [
                self.identity,
                checksum,
                int(item.start),
                int(item.stop),
                item.text_field,
                item.dataset in self.parse.skip,
                # plain-text lines are parsed otherwise than JSON ones of the same bytes
                *(["text-lines"] if is_text_lines(item.shard.path) else []),
            ]
        )
        return "t-" + hashlib.sha256(text.encode()).hexdigest()[:40]

    def __call__(self, item: Any) -> DocBatch | Pending | TextBatch:
        """Return the cached documents, or the parsed texts (with the key) on a miss."""
        key = self.key(item)
        if key is None:
            return self.parse(item)
        store = token_store(self.root, self.limit_bytes, self.shared or None)
        if store.cache.contains(key) or store.pull(key):
            # Another process may evict it before it is pinned: then it is computed here.
            entry = store.get(key, lambda: _compute(self.parse, self.tokenize, item))
            return DocBatch(entry.tokens, entry.lengths, item.dataset, entry.skipped)
        t0 = now_cpu_ns()
        text = self.parse(item)
        if isinstance(text, DocBatch):  # a pre-tokenized item (never keyed, so never here)
            return text
        if any(reason in FILE_ERRORS for reason, _ in text.skipped):
            return text  # a file that could not be read (perhaps for now): never stored
        return Pending(text, key, now_cpu_ns() - t0)

    def lengths(self, item: Any) -> Entry | None:
        """The cached lengths of ``item``'s documents (no tokens, no record read), or None."""
        key = self.key(item)
        if key is None:
            return None
        return token_store(self.root, self.limit_bytes, self.shared or None).lengths(key)


def _compute(parse: ParseJsonl, tokenize: Tokenize, item: Any) -> Entry:
    """Parse and tokenize a work item: its entry and its CPU cost."""
    t0 = now_cpu_ns()
    docs = tokenize(parse(item))
    return Entry(docs.tokens, docs.lengths, docs.skipped, now_cpu_ns() - t0)


@dataclass(frozen=True)
class CachedTokenize:
    """Stateless operator ``Pending | DocBatch | TextBatch -> DocBatch``: tokenize and store.

    Args:
        tokenize: The tokenize it stands for.
        root: The store's directory.
        limit_bytes: The store's size limit.
        shared: A folder shared by a cluster behind the store (``""``: none).
    """

    tokenize: Tokenize
    root: str
    limit_bytes: int
    name: str = "tokenize"
    shared: str = ""

    def __call__(self, batch: Any) -> DocBatch:
        """Pass a cached batch through; tokenize (and store) a pending one."""
        if isinstance(batch, DocBatch):
            return batch
        if not isinstance(batch, Pending):
            return self.tokenize(batch)
        text = batch.text
        made: list[DocBatch] = []

        def compute() -> Entry:
            t0 = now_cpu_ns()
            docs = self.tokenize(text)
            made.append(docs)
            return Entry(docs.tokens, docs.lengths, docs.skipped, batch.cpu_ns + now_cpu_ns() - t0)

        store = token_store(self.root, self.limit_bytes, self.shared or None)
        entry = store.get(batch.key, compute)
        if made:
            return made[0]
        return DocBatch(entry.tokens, entry.lengths, text.dataset, entry.skipped)


def cached_chain(ops: list[Any], recipe: Any) -> list[Any]:
    """``ops`` (a text recipe's stateless operators) with parse and tokenize cached.

    Unchanged when the token cache is off, the chain is not parse, tokenize (then the
    long-document rule), or the tokenizer is custom.
    """
    enabled, limit = token_cache_settings()
    if not enabled or len(ops) < 2:
        return ops
    parse, tokenize = ops[0], ops[1]
    if not isinstance(parse, ParseJsonl) or not isinstance(tokenize, Tokenize):
        return ops
    if tokenize.tokenizer is not None or any(not isinstance(o, LongDocuments) for o in ops[2:]):
        return ops
    identity = tokenizer_identity(recipe.tokenizer, tokenize.sha256)
    if identity is None:
        return ops
    root, shared = str(default_root()), shared_location() or ""
    first = CachedParse(parse, tokenize, identity, root, limit, shared=shared)
    return [first, CachedTokenize(tokenize, root, limit, shared=shared), *ops[2:]]


def cached_item_pairs(chain: Any, item: Any) -> int | None:
    """The input/label pairs ``chain`` makes of ``item``, from the cache alone (or None).

    What dealing by tokens sizes an item by: ``n - 1`` pairs per document of ``n`` tokens
    after the long-document rule (a split keeps every pair, a drop loses the document's).
    """
    ops = getattr(chain, "operators", ())
    if not ops or not isinstance(ops[0], CachedParse):
        return None
    entry = ops[0].lengths(item)
    if entry is None:
        return None
    pairs = np.maximum(entry.lengths - 1, 0)
    for op in ops[1:]:
        if isinstance(op, LongDocuments) and op.mode == "drop":
            pairs = pairs[pairs <= op.seq_len]
    return int(pairs.sum())
