"""A manifest's shards kept compact answer every lookup as the parsed manifest did."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from zephon_nodes.io.index import index
from zephon_nodes.io.index.compact import CompactShards


def _entries() -> dict[str, dict[str, object]]:
    names = ["b/x.jsonl", "a.jsonl", "é/ü.jsonl", "z" * 40 + ".jsonl", "a/b/c.jsonl", "Zed.parquet"]
    return {
        name: {
            "bytes": 100 + i,
            "checksum": f"xxh3_128:{i:032x}",
            "kind": "jsonl",
            "records": i,
            "offsets": list(range(i)),
            "version": str(10**18 + i),
        }
        for i, name in enumerate(names)
    }


def test_every_lookup_matches_the_parsed_manifest() -> None:
    parsed = _entries()
    compact = CompactShards(json.loads(json.dumps(parsed)))
    assert len(compact) == len(parsed)
    assert list(compact) == sorted(parsed, key=lambda n: n.encode())
    for name, entry in parsed.items():
        assert name in compact and compact[name] == entry and compact.get(name) == entry
    for missing in ("", "a", "a.json", "b/x.jsonl ", "zz.jsonl", "é"):
        assert missing not in compact and compact.get(missing) is None
    # An entry looked up is the same object next time: a change to it (a re-hashed local
    # copy's version tag) holds for the process, as in the parsed manifest.
    compact["a.jsonl"]["version"] = "new"
    assert compact["a.jsonl"]["version"] == "new"


def test_compact_shards_hold_far_less_than_the_parsed_objects() -> None:
    parsed = {f"s{i:06d}.jsonl": e for i, e in enumerate(list(_entries().values()) * 200)}
    compact = CompactShards(parsed)

    def deep(x: object) -> int:
        if isinstance(x, dict):
            return sys.getsizeof(x) + sum(deep(k) + deep(v) for k, v in x.items())
        if isinstance(x, list):
            return sys.getsizeof(x) + sum(deep(v) for v in x)
        return sys.getsizeof(x)

    assert compact.nbytes() * 3 < deep(parsed)


def test_find_entry_reads_the_compact_manifest(tmp_path: Path) -> None:
    for i in range(3):
        (tmp_path / f"d{i}.jsonl").write_text(json.dumps({"text": f"doc {i}"}) + "\n")
    directory, manifest = index.build_index([str(tmp_path / "*.jsonl")], workers=1)
    index.write_index(manifest, str(tmp_path / index.INDEX_NAME), directory)
    index.forget()
    try:
        found = index.find_entry(str(tmp_path / "d1.jsonl"))
        assert found is not None
        entry, location = found
        assert location == str(tmp_path / index.INDEX_NAME)
        assert entry == manifest["shards"]["d1.jsonl"]
        assert isinstance(index._MANIFESTS[location][1], CompactShards)  # type: ignore[index]
        assert index.find_entry(str(tmp_path / "d9.jsonl")) is None
    finally:
        index.forget()
