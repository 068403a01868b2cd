"""Parse: read a work item's samples (tar, jsonl with base64 images, in-memory records)."""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass, field
from typing import Any

from zephon_nodes.core.errors import DataError
from zephon_nodes.core.work_item import WorkItem
from zephon_nodes.io.formats.tar import TarSample
from zephon_nodes.operators.documents import Skipped, add_skipped
from zephon_nodes.operators.parse import record_object, skip_reason

__all__ = ["DEFAULT_IMAGE_FIELD", "MMBatch", "MMRecord", "ParseMultimodal"]

DEFAULT_IMAGE_FIELD = "image"


@dataclass(frozen=True, slots=True)
class MMRecord:
    """One sample: its text, its images and where it is (for messages).

    Attributes:
        text: The text.
        images: Encoded image bytes after parsing; decoded images after decoding.
        dataset_name: Dataset name.
        shard: The shard it was read from.
        record: Its record (sample) number in the shard.
    """

    text: str
    images: tuple[Any, ...]
    dataset_name: str
    shard: Any
    record: int

    @property
    def where(self) -> str:
        """``dataset 'name': path key 'KEY'`` (tar) or ``dataset 'name': path:line``."""
        return f"dataset {self.dataset_name!r}: {self.shard.where(self.record)}"


@dataclass(frozen=True, slots=True)
class MMBatch:
    """The samples of one work item, in order.

    Attributes:
        records: The samples.
        dataset: Index of the dataset in the recipe.
        skipped: Samples dropped so far, by reason.
    """

    records: list[MMRecord]
    dataset: int = -1
    skipped: Skipped = ()

    @property
    def lengths(self) -> list[int]:
        """One entry per record (so document counts work on parsed batches too)."""
        return [1] * len(self.records)


class _Bad(Exception):
    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def _decode_b64(value: Any, name: str) -> bytes:
    if isinstance(value, bytes):
        return value
    if not isinstance(value, str):
        raise _Bad(
            "invalid_image_field",
            f"field {name!r} must hold base64 strings, got {type(value).__name__}",
        )
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError) as e:
        raise _Bad("invalid_base64", f"field {name!r}: invalid base64: {e}") from None


def _from_record(raw: Any, text_field: str, image_field: str) -> tuple[str, tuple[bytes, ...]]:
    record, reason, message = record_object(raw)
    if record is None:
        raise _Bad(reason, message)
    text = record.get(text_field)
    if text is None:
        raise _Bad("missing_text", f"image without text: no field {text_field!r}")
    if not isinstance(text, str):
        raise _Bad(
            "non_string_field",
            f"field {text_field!r} must be a string, got {type(text).__name__}",
        )
    value = record.get(image_field)
    values = value if isinstance(value, list) else [] if value is None else [value]
    if not values:
        raise _Bad("missing_image", f"text without image: no field {image_field!r}")
    return text, tuple(_decode_b64(v, image_field) for v in values)


def _from_tar(sample: TarSample, text_field: str) -> tuple[str, tuple[bytes, ...]]:
    if not sample.images:
        raise _Bad("missing_image", "text without image (no .jpg, .jpeg, .png or .webp member)")
    if sample.text is not None:
        try:
            return sample.text.decode("utf-8"), tuple(b for _, b in sample.images)
        except UnicodeDecodeError as e:
            raise _Bad("invalid_utf8", f".txt member: invalid UTF-8 at byte {e.start}") from None
    if sample.json is None:
        raise _Bad("missing_text", "image without text (no .txt or .json member)")
    try:
        record = json.loads(sample.json.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise _Bad("invalid_json", f".json member: {str(e)[:200]}") from None
    text = record.get(text_field) if isinstance(record, dict) else None
    if not isinstance(text, str):
        raise _Bad("missing_text", f"image without text: .json member has no string {text_field!r}")
    return text, tuple(b for _, b in sample.images)


@dataclass(frozen=True)
class ParseMultimodal:
    """Stateless operator: ``WorkItem -> MMBatch`` (text and encoded images per sample).

    Tar shards: a sample's text is its ``.txt`` member, else ``text_field`` of its ``.json``
    member; its images are its image members in archive order. jsonl shards and in-memory
    records: ``text_field`` and ``image_field`` (one base64 string, or a list of them; raw
    bytes in memory). A sample with text but no image or the reverse, or an unreadable record,
    raises :class:`DataError` naming the dataset, shard and key (or line), or under
    ``on_error = "skip"`` is dropped and counted by reason.

    Args:
        image_fields: Image field of each dataset (recipe order).
        skip: Indexes of the datasets whose ``on_error`` is ``"skip"``.
    """

    image_fields: tuple[str, ...]
    skip: frozenset[int] = field(default_factory=frozenset)
    name: str = "parse_multimodal"

    def __call__(self, item: WorkItem) -> MMBatch:
        """Read and parse the samples of ``item``."""
        skipping = item.dataset in self.skip
        image_field = self.image_fields[item.dataset]
        prefix = f"dataset {item.dataset_name!r}"
        try:
            rows = item.shard.read(item.start, item.stop)
        except DataError as e:
            if not skipping or getattr(e, "refused_under_skip", False):
                raise DataError(f"{prefix}: {e}", kind=e.kind) from None
            reason = skip_reason(e, item.shard.path)
            return MMBatch([], item.dataset, add_skipped((), reason, item.stop - item.start))
        out: list[MMRecord] = []
        skipped: Skipped = ()
        for record_no, raw in rows:
            try:
                if isinstance(raw, TarSample):
                    text, images = _from_tar(raw, item.text_field)
                else:
                    text, images = _from_record(raw, item.text_field, image_field)
            except _Bad as e:
                if not skipping:
                    raise DataError(f"{prefix}: {item.shard.where(record_no)}: {e}") from None
                skipped = add_skipped(skipped, e.reason, 1)
                continue
            out.append(MMRecord(text, images, item.dataset_name, item.shard, record_no))
        return MMBatch(out, item.dataset, skipped)
