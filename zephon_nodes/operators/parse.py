"""Parse: read a work item's records and take the text field of each."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from zephon_nodes.errors import DataError
from zephon_nodes.operators.documents import TextBatch
from zephon_nodes.work import WorkItem

__all__ = ["ParseJsonl"]


@dataclass(frozen=True)
class ParseJsonl:
    """Stateless operator: ``WorkItem -> TextBatch`` (JSON lines -> the text field).

    Raises :class:`~zephon_nodes.errors.DataError` naming the file and line for invalid
    UTF-8, invalid JSON, a record that is not an object, or a missing or non-string field.
    """

    name: str = "parse"

    def __call__(self, item: WorkItem) -> TextBatch:
        """Read and parse the records of ``item``."""
        texts = []
        field = item.text_field
        for record_no, raw in item.shard.read(item.start, item.stop):
            record: Any
            if isinstance(raw, bytes):
                try:
                    line = raw.decode("utf-8")
                except UnicodeDecodeError as e:
                    raise DataError(
                        f"{item.shard.where(record_no)}: invalid UTF-8 at byte {e.start}"
                    ) from None
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as e:
                    raise DataError(
                        f"{item.shard.where(record_no)}: invalid JSON: {e.msg} (column {e.colno})"
                    ) from None
            else:
                record = raw
            if not isinstance(record, dict):
                raise DataError(
                    f"{item.shard.where(record_no)}: a record must be a JSON object, "
                    f"got {type(record).__name__}"
                )
            if field not in record:
                raise DataError(
                    f"{item.shard.where(record_no)}: missing text field {field!r} "
                    f"(keys: {sorted(record)[:8]})"
                )
            text = record[field]
            if not isinstance(text, str):
                raise DataError(
                    f"{item.shard.where(record_no)}: field {field!r} must be a string, "
                    f"got {type(text).__name__}"
                )
            texts.append(text)
        return TextBatch(texts, item.describe())
