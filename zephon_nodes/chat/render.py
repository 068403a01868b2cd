"""RenderChat: conversation records -> token ids with a trained-token mask (SFT)."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from zephon_nodes.chat.template import ChatTemplate, TemplateFailure
from zephon_nodes.core.errors import DataError, RecipeError
from zephon_nodes.core.work_item import WorkItem
from zephon_nodes.operators.documents import DocBatch, Skipped, add_skipped
from zephon_nodes.operators.parse import record_object, skip_reason
from zephon_nodes.operators.tokenize import (
    ByteTokenizer,
    HFTokenizer,
    SentencePieceTokenizer,
    Tokenizer,
    load_tokenizer,
)
from zephon_nodes.recipe import TokenizerSpec
from zephon_nodes.recipe.chat import ChatSpec

__all__ = ["RenderChat", "conversation_of", "encode_with_offsets", "trained_mask"]

# Reason under which a conversation without any trained token is dropped (whatever the
# on_error policy: it is not bad data, it would only cost compute).
NOTHING_TO_TRAIN = "no_trained_tokens"


def conversation_of(
    raw: Any, messages_field: str, roles: Sequence[str]
) -> tuple[list[dict[str, Any]] | None, str, str]:
    """Return ``(messages, "", "")`` or ``(None, reason, message)`` for one raw record."""
    record, reason, message = record_object(raw)
    if record is None:
        return None, reason, message
    if messages_field not in record:
        return (
            None,
            "missing_field",
            f"missing messages field {messages_field!r} (keys: {sorted(record)[:8]})",
        )
    messages = record[messages_field]
    if not isinstance(messages, list) or not messages:
        return (
            None,
            "not_a_conversation",
            f"field {messages_field!r} must be a non-empty list of messages, got "
            f"{type(messages).__name__}{'' if messages else ' (empty)'}",
        )
    out = []
    for k, m in enumerate(messages):
        if not isinstance(m, dict):
            return None, "not_a_conversation", f"message {k} is a {type(m).__name__}, not an object"
        role = m.get("role")
        if role not in roles:
            return (
                None,
                "unknown_role",
                f"message {k}: role {role!r} is not one of {list(roles)} (chat.roles)",
            )
        content = m.get("content")
        if content is None and not m.get("tool_calls"):
            return None, "missing_content", f"message {k} ({role}) has no 'content'"
        if content is not None and not isinstance(content, str):
            return (
                None,
                "non_string_content",
                f"message {k} ({role}): 'content' must be a string, got {type(content).__name__}",
            )
        # Columnar formats give every message every struct field; absent ones come back None.
        out.append({key: v for key, v in m.items() if v is not None or key == "content"})
    return out, "", ""


def _char_index_of_bytes(text: str) -> np.ndarray:
    """For each UTF-8 byte of ``text`` (and one past the end): the index of its character."""
    raw = np.frombuffer(text.encode("utf-8"), dtype=np.uint8)
    first = (raw & 0xC0) != 0x80  # a character's first byte (not a continuation byte)
    index = np.cumsum(first, dtype=np.int64) - 1
    return np.concatenate([index, np.asarray([len(text)], dtype=np.int64)])


def _encode_plain(tok: Any, text: str) -> tuple[Any, Any, Any]:
    """Ids and character ``[start, end)`` of each token of ``text`` (no special tokens).

    Arrays or lists of ints (a 20 MB message is 20 million byte tokens: arrays, not lists).
    """
    if not text:
        return [], [], []
    if isinstance(tok, ByteTokenizer):
        ids = np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.int64) + 3
        chars = _char_index_of_bytes(text)[:-1]
        return ids, chars, chars + 1
    if isinstance(tok, SentencePieceTokenizer):
        out = tok.sp.encode(text, out_type="offset_mapping")  # character offsets
        pairs = out["offsets"]
        return [int(i) for i in out["ids"]], [int(a) for a, _ in pairs], [int(b) for _, b in pairs]
    if hasattr(tok, "encode_with_offsets"):
        ids, offsets = tok.encode_with_offsets(text)
        return list(ids), [int(a) for a, _ in offsets], [int(b) for _, b in offsets]
    raise RecipeError(
        f"tokenizer {type(tok).__name__} cannot be used with [chat]: it needs "
        f"encode_with_offsets(text) -> (ids, [(start, end) character offsets])"
    )


def encode_with_offsets(
    tok: Tokenizer, text: str, specials: Mapping[str, int]
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Tokenize a rendered conversation whole; return ids and each token's character span.

    A Hugging Face tokenizer finds its special tokens in the text itself. For the others,
    the texts in ``specials`` (the template's bos/eos token texts) become their ids and the
    text between them is encoded piece by piece.
    """
    if isinstance(tok, HFTokenizer):
        enc = tok.tok.encode(text, add_special_tokens=False)
        offsets = np.asarray(enc.offsets, dtype=np.int64).reshape(-1, 2)
        return np.asarray(enc.ids, dtype=np.int64), offsets[:, 0], offsets[:, 1]
    ids: list[np.ndarray] = []
    starts: list[np.ndarray] = []
    ends: list[np.ndarray] = []

    def add(i: Any, a: Any, b: Any, pos: int) -> None:
        ids.append(np.asarray(i, dtype=np.int64))
        starts.append(np.asarray(a, dtype=np.int64) + pos)
        ends.append(np.asarray(b, dtype=np.int64) + pos)

    pieces = [re.escape(s) for s in sorted(specials, key=len, reverse=True) if s]
    pos = 0
    for m in re.finditer("|".join(pieces), text) if pieces else ():
        add(*_encode_plain(tok, text[pos : m.start()]), pos)
        add([specials[m.group()]], [m.start()], [m.end()], 0)
        pos = m.end()
    add(*_encode_plain(tok, text[pos:]), pos)
    return np.concatenate(ids), np.concatenate(starts), np.concatenate(ends)


def trained_mask(
    starts: np.ndarray, ends: np.ndarray, spans: Sequence[tuple[int, int]]
) -> np.ndarray:
    """Tokens overlapping a trained character span (a zero-width token: starting inside one)."""
    mask = np.zeros(len(starts), dtype=bool)
    for a, b in spans:
        mask |= (starts < b) & (ends > a)
        mask |= (starts == ends) & (starts >= a) & (starts < b)
    return mask


@dataclass(frozen=True)
class RenderChat:
    """Stateless operator: ``WorkItem -> DocBatch`` of conversations, with a trained mask.

    Each record's messages are checked (a list of objects with a known ``role`` and a string
    ``content``), rendered with the chat template, tokenized whole and masked: a token is
    trained when it overlaps the text of a trained turn (``chat.train_on``). The batch's
    ``mask`` marks the tokens whose *label* is kept; the packers give every other label -100.
    Bad records raise :class:`DataError` naming the file, record and reason, or are skipped
    and counted (``unknown_role``, ``missing_content``, ``template_error``, ...) under
    ``on_error = "skip"``. A conversation with no trained token is dropped and counted under
    ``"no_trained_tokens"``. The tokenizer's ``add_bos``/``add_eos`` are not used: the
    template writes the special tokens.

    Args:
        tokenizer_spec: The recipe's tokenizer (loaded once per worker).
        chat: The ``[chat]`` settings.
        template: The chat template, with its special token texts.
        skip: Indexes of the datasets whose ``on_error`` is ``"skip"``.
        tokenizer: A custom tokenizer object (it travels with the operator).
        sha256: The SHA-256 of the tokenizer file the pipeline was built with (see
            :func:`~zephon_nodes.operators.tokenize.load_tokenizer`; None: its content when
            it is loaded).
    """

    tokenizer_spec: TokenizerSpec
    chat: ChatSpec
    template: ChatTemplate
    skip: frozenset[int] = frozenset()
    tokenizer: Any = field(default=None, compare=False, repr=False)
    name: str = "render_chat"
    sha256: str | None = None

    def _specials(self, tok: Tokenizer) -> dict[str, int]:
        tokens = dict(self.template.tokens)
        out = {}
        for key, token_id in (("bos_token", tok.bos_id), ("eos_token", tok.eos_id)):
            if tokens.get(key) and token_id >= 0:
                out[tokens[key]] = int(token_id)
        return out

    def __call__(self, item: WorkItem) -> DocBatch:
        """Read, check, render, tokenize and mask the conversations of ``item``."""
        skipping = item.dataset in self.skip
        skipped: Skipped = ()
        empty = np.zeros(0, dtype=np.int32)
        try:
            rows = item.shard.read(item.start, item.stop)
        except DataError as e:
            if not skipping or getattr(e, "refused_under_skip", False):
                raise DataError(f"dataset {item.dataset_name!r}: {e}", kind=e.kind) from None
            reason: str = skip_reason(e, item.shard.path)
            skipped = add_skipped((), reason, item.stop - item.start)
            return DocBatch(empty, np.zeros(0, np.int64), item.dataset, skipped, np.zeros(0, bool))
        tok = self.tokenizer
        if tok is None:
            tok = load_tokenizer(self.tokenizer_spec, self.sha256)
        specials = self._specials(tok)
        docs: list[np.ndarray] = []
        masks: list[np.ndarray] = []
        records: list[int] = []
        for record_no, raw in rows:
            messages, reason, message = conversation_of(
                raw, self.chat.messages_field, self.chat.roles
            )
            if messages is not None:
                try:
                    text, spans = self.template.render_trained(messages, self.chat.train_on)
                except TemplateFailure as e:
                    reason, message = "template_error", f"chat template {self.template.path}: {e}"
                else:
                    ids, starts, ends = encode_with_offsets(tok, text, specials)
                    mask = trained_mask(starts, ends, spans)
                    if mask.any():
                        docs.append(ids)
                        masks.append(mask)
                        records.append(record_no)
                    else:
                        skipped = add_skipped(skipped, NOTHING_TO_TRAIN, 1)
                    continue
            if not skipping:
                raise DataError(
                    f"dataset {item.dataset_name!r}: {item.shard.where(record_no)}: {message}"
                )
            skipped = add_skipped(skipped, reason, 1)
        lengths = np.asarray([len(d) for d in docs], dtype=np.int64)
        tokens = np.concatenate(docs).astype(np.int32) if docs else empty
        mask_all = np.concatenate(masks) if masks else np.zeros(0, dtype=bool)
        return DocBatch(
            tokens,
            lengths,
            item.dataset,
            skipped,
            mask_all,
            item.shard_index,
            np.asarray(records, dtype=np.int64),
        )
