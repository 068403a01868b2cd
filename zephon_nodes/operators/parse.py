"""Parse: read a work item's records and take the text field of each."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from zephon_nodes.core.errors import DataError, classify_file_error, os_error_kind, skip_reason
from zephon_nodes.core.work_item import WorkItem
from zephon_nodes.io.formats.lines import is_text_lines
from zephon_nodes.operators.documents import DocBatch, Skipped, TextBatch, add_skipped

__all__ = ["ParseJsonl", "classify_file_error", "record_object", "skip_reason", "token_batch"]


def record_object(raw: Any) -> tuple[dict[str, Any] | None, str, str]:
    """Decode one raw record (a JSON line as bytes, or an already decoded value) to an object.

    Returns:
        ``(record, "", "")``, or ``(None, reason, message)`` for invalid UTF-8, invalid JSON
        or a value that is not a JSON object (reasons as counted by ``on_error = "skip"``).
    """
    record: Any = raw
    if isinstance(raw, bytes):
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            return None, "invalid_utf8", f"invalid UTF-8 at byte {e.start}"
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            return None, "invalid_json", f"invalid JSON: {e.msg} (column {e.colno})"
        except RecursionError:
            return None, "nesting_depth", "JSON nested too deeply to decode"
        except ValueError as e:  # an integer of more digits than Python converts
            return None, "number_size", f"a number too large to decode ({str(e)[:60]})"
        if "\\u" in line and _lone_surrogate(line, record):
            return None, "invalid_text_encoding", "a string holds a lone UTF-16 surrogate"
    if not isinstance(record, dict):
        return None, "not_an_object", f"a record must be a JSON object, got {type(record).__name__}"
    return record, "", ""


# A \u escape of a surrogate, in either case (what ``line.lower()`` then ``\ud8``..``\udf`` found).
_SURROGATE_ESCAPE = re.compile(r"\\[uU][dD][89a-fA-F]")


def _lone_surrogate(line: str, record: Any) -> bool:
    r"""Whether a decoded line holds a string that is not Unicode text (``"\ud800"``).

    Only lines with a ``\u`` escape of a surrogate (``\ud800`` to ``\udfff``) can.
    """
    if _SURROGATE_ESCAPE.search(line) is None:  # one pass, no lower-cased copy
        return False
    try:
        json.dumps(record, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return True
    except (RecursionError, ValueError):
        return False
    return False


def _line_text(raw: Any) -> tuple[str | None, str, str]:
    """The text of one line of a plain-text shard (a CRLF line's carriage return dropped)."""
    if not isinstance(raw, bytes):
        return None, "non_string_field", f"a text line must be bytes, got {type(raw).__name__}"
    try:
        return raw.removesuffix(b"\r").decode("utf-8"), "", ""
    except UnicodeDecodeError as e:
        return None, "invalid_utf8", f"invalid UTF-8 at byte {e.start}"


def _text_of(raw: Any, field_name: str) -> tuple[str | None, str, str]:
    """Return ``(text, "", "")`` or ``(None, reason, message)`` for one raw record."""
    record, reason, message = record_object(raw)
    if record is None:
        return None, reason, message
    if field_name not in record:
        return (
            None,
            "missing_field",
            (f"missing text field {field_name!r} (keys: {sorted(record)[:8]})"),
        )
    text = record[field_name]
    if not isinstance(text, str):
        return (
            None,
            "non_string_field",
            (f"field {field_name!r} must be a string, got {type(text).__name__}"),
        )
    return text, "", ""


@dataclass(frozen=True)
class ParseJsonl:
    """Stateless operator: ``WorkItem -> TextBatch`` (JSON lines -> the text field).

    The lines of a plain-text shard (``.txt``, ``.txt.zst``) are texts themselves: each
    non-blank line is a document (UTF-8, a CRLF line's carriage return dropped).

    Raises :class:`~zephon_nodes.core.errors.DataError` naming the dataset, file, line and reason
    for invalid UTF-8, invalid JSON, a record that is not an object, or a missing or
    non-string field. For datasets in ``skip`` such records are dropped instead and counted
    per reason in :attr:`TextBatch.skipped` (a pure function of the work item, so the same
    records are skipped at any number of workers or ranks).

    A pre-tokenized shard's records are documents of token ids
    (:mod:`zephon_nodes.io.formats.pretokenized`): they come out as a ``DocBatch`` that the
    tokenizer passes through, an id at or above ``vocab_size`` refused naming file and record.

    Args:
        name: Operator name (messages).
        skip: Indexes of the datasets whose ``on_error`` is ``"skip"``.
        vocab_size: The recipe tokenizer's vocabulary (0: ids are not checked).
    """

    name: str = "parse"
    skip: frozenset[int] = field(default_factory=frozenset)
    vocab_size: int = 0

    def __call__(self, item: WorkItem) -> TextBatch | DocBatch:
        """Read and parse the records of ``item`` (the ids of a pre-tokenized one)."""
        skipping = item.dataset in self.skip
        skipped: Skipped = ()
        try:
            try:
                rows = item.shard.read(item.start, item.stop)
            except OSError as e:
                # A file deleted or made unreadable after it was indexed: the same policy as
                # one truncated after it was indexed (raise, or skip and count).
                raise DataError(
                    f"{item.shard.path}: cannot read: {e}", kind=os_error_kind(e)
                ) from None
        except DataError as e:
            if not skipping or getattr(e, "refused_under_skip", False):
                raise DataError(f"dataset {item.dataset_name!r}: {e}", kind=e.kind) from None
            skipped = add_skipped((), skip_reason(e, item.shard.path), item.stop - item.start)
            return TextBatch([], item.describe(), item.dataset, skipped, item.shard_index)
        if getattr(item.shard, "token_ids", False):  # pre-tokenized: no text, no tokenizer
            return token_batch(item, rows, self.vocab_size, skipped)
        texts = []
        records = []
        plain = is_text_lines(item.shard.path)  # .txt: a line is a document's text
        for record_no, raw in rows:
            text, reason, message = _line_text(raw) if plain else _text_of(raw, item.text_field)
            if text is not None:
                texts.append(text)
                records.append(record_no)
            elif skipping:
                skipped = add_skipped(skipped, reason, 1)
            else:
                raise DataError(
                    f"dataset {item.dataset_name!r}: {item.shard.where(record_no)}: {message}"
                )
        return TextBatch(
            texts,
            item.describe(),
            item.dataset,
            skipped,
            item.shard_index,
            np.asarray(records, dtype=np.int64),
        )


def token_batch(item: WorkItem, rows: Any, vocab_size: int, skipped: Skipped = ()) -> DocBatch:
    """A pre-tokenized work item's documents as they are (no bos/eos added).

    Raises:
        DataError: An id below 0 or at or above ``vocab_size`` (when set), naming the file
            and record, under either ``on_error``: the corpus is not of this tokenizer.
    """
    docs = [np.asarray(ids) for _, ids in rows]
    lengths = np.fromiter((len(d) for d in docs), dtype=np.int64, count=len(docs))
    wide = np.concatenate(docs).astype(np.int64) if docs else np.empty(0, np.int64)
    out_of_range = (wide < 0) | (wide >= (vocab_size or 2**31))
    bad = np.flatnonzero(out_of_range)
    if len(bad):
        ends = np.cumsum(lengths)
        k = int(np.searchsorted(ends, bad[0], side="right"))
        # the id as stored (a uint64 id of 2**63 or more wraps negative in ``wide``)
        stored = docs[k][int(bad[0] - (ends[k] - lengths[k]))]
        raise DataError(
            f"dataset {item.dataset_name!r}: {item.shard.where(rows[k][0])}: token id "
            f"{int(stored)} is outside the recipe tokenizer's vocabulary of "
            f"{vocab_size} (the corpus was tokenized with another tokenizer)",
            refused_under_skip=True,
        )
    records = np.asarray([r for r, _ in rows], dtype=np.int64)
    tokens = wide.astype(np.int32)
    return DocBatch(tokens, lengths, item.dataset, skipped, None, item.shard_index, records)
