"""A DataError's ``kind``, not its message, is the skip reason of a whole file (issue 23)."""

from __future__ import annotations

import io
import pickle
import tarfile
from pathlib import Path

import pytest
import zstandard

from zephon_nodes.core.errors import (
    CORRUPT_ZSTD,
    EMPTY_FILE,
    FILE_ERROR_KINDS,
    MISSING_FILE,
    TRUNCATED_FILE,
    UNREADABLE_ARROW,
    UNREADABLE_FILE,
    UNREADABLE_PARQUET,
    DataError,
    skip_reason,
)
from zephon_nodes.core.work_item import WorkItem
from zephon_nodes.io.formats.arrow import open_arrow_shard
from zephon_nodes.io.formats.parquet import open_parquet_shard
from zephon_nodes.io.formats.shards import ShardChanged, open_shard
from zephon_nodes.io.formats.tar import open_tar_shard
from zephon_nodes.operators.parse import ParseJsonl

LINES = b"".join(b'{"text": "record %d"}\n' % i for i in range(40))


def test_plain_data_error_still_works():
    assert DataError().args == ()
    e = DataError("x.jsonl: bad")
    assert str(e) == "x.jsonl: bad" and e.kind is None and not e.refused_under_skip
    assert DataError("m", refused_under_skip=True).refused_under_skip
    assert ShardChanged("m").refused_under_skip  # the class's default


def test_kind_survives_pickling():
    """Errors cross worker processes: the kind goes with them."""
    e = pickle.loads(pickle.dumps(DataError("f: gone", kind=MISSING_FILE)))
    assert isinstance(e, DataError) and e.kind == MISSING_FILE and str(e) == "f: gone"


def test_kind_not_message_decides_the_reason():
    e = DataError("a.jsonl.zst: corrupt zstd data, truncated, empty", kind=MISSING_FILE)
    assert skip_reason(e, "a.jsonl.zst") == MISSING_FILE
    # Without a kind (raised by other code) the message is classified, as before.
    assert skip_reason(DataError("a.jsonl.zst: corrupt zstd data"), "a.jsonl.zst") == CORRUPT_ZSTD
    assert skip_reason(DataError("a.jsonl: something else"), "a.jsonl") == UNREADABLE_FILE


class _Failing:
    """A shard whose read fails with a kind its message contradicts."""

    path = "web/a.jsonl.zst"
    num_records = 10

    def read(self, start: int, stop: int) -> list[tuple[int, bytes]]:
        raise DataError(f"{self.path}: corrupt zstd frame (truncated)", kind=MISSING_FILE)


def test_skip_site_counts_the_kind():
    item = WorkItem(0, "web", "text", 0, 0, _Failing(), 0, 4, 0, 0)  # type: ignore[arg-type]
    batch = ParseJsonl(skip=frozenset({0}))(item)
    assert batch.skipped == ((MISSING_FILE, 4),)
    with pytest.raises(DataError) as raised:
        ParseJsonl()(item)  # under "raise": the dataset named, the kind kept
    assert raised.value.kind == MISSING_FILE and "'web'" in str(raised.value)


def _tar(path: Path, keep: int = 0) -> None:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as t:
        for k in range(3):
            data = b"text %d" % k * 200
            info = tarfile.TarInfo(f"s{k}.txt")
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
    blob = buf.getvalue()
    path.write_bytes(blob[:keep] if keep else blob)


def _arrow(path: Path) -> None:
    pa = pytest.importorskip("pyarrow")
    table = pa.table({"text": ["a", "b", "c"]})
    sink = io.BytesIO()
    with pa.ipc.new_stream(sink, table.schema) as w:
        w.write_table(table)
    path.write_bytes(sink.getvalue()[:40])


BAD_FILES = {
    "missing_jsonl": ("gone.jsonl", None, lambda p: open_shard(p), MISSING_FILE),
    "corrupt_zstd": (
        "bad.jsonl.zst",
        zstandard.ZstdCompressor().compress(LINES[:200])
        + b"\x28\xb5\x2f\xfd"
        + bytes(range(7, 120)),
        lambda p: open_shard(p),
        CORRUPT_ZSTD,
    ),
    "truncated_zstd": (
        "cut.jsonl.zst",
        zstandard.ZstdCompressor().compress(LINES)[:-9],
        lambda p: open_shard(p),
        TRUNCATED_FILE,
    ),
    "missing_parquet": (
        "gone.parquet",
        None,
        lambda p: open_parquet_shard(p, "text"),
        MISSING_FILE,
    ),
    "bad_parquet": (
        "bad.parquet",
        b"PAR1 this is not really parquet",
        lambda p: open_parquet_shard(p, "text"),
        UNREADABLE_PARQUET,
    ),
    "missing_arrow": ("gone.arrow", None, lambda p: open_arrow_shard(p, ["text"]), MISSING_FILE),
    "bad_arrow": ("bad.arrow", _arrow, lambda p: open_arrow_shard(p, ["text"]), UNREADABLE_ARROW),
    "missing_tar": ("gone.tar", None, lambda p: open_tar_shard(p), MISSING_FILE),
    "truncated_tar": (
        "cut.tar",
        lambda p: _tar(p, keep=700),
        lambda p: open_tar_shard(p),
        TRUNCATED_FILE,
    ),
    "junk_tar": (
        "junk.tar",
        b"this is not a tar file at all" * 30,
        lambda p: open_tar_shard(p),
        UNREADABLE_FILE,
    ),
    "empty_tar": ("empty.tar", b"", lambda p: open_tar_shard(p), EMPTY_FILE),
}


@pytest.mark.parametrize("case", sorted(BAD_FILES))
def test_formats_raise_the_expected_kind(tmp_path, case):
    name, content, opener, kind = BAD_FILES[case]
    path = tmp_path / name
    if callable(content):
        content(path)
    elif content is not None:
        path.write_bytes(content)
    with pytest.raises(DataError) as raised:
        opener(path)
    assert raised.value.kind == kind, str(raised.value)
    assert kind in FILE_ERROR_KINDS
