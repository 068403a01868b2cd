"""`zephon recompress`: the same records in many zstd frames, read frame by frame."""

from __future__ import annotations

import json

import zstandard

from tests.commands.run import zephon
from tests.io.test_remote_digests import recipe, run
from zephon_nodes.io.index import index


def test_recompressed_shards_give_the_same_batches(tmp_path):
    """One-frame shards re-compressed into frames: more frames, same text, same digests."""
    src = tmp_path / "src"
    src.mkdir()
    for k in range(2):
        text = "".join(json.dumps({"text": f"s{k} doc {i} " * 5}) + "\n" for i in range(400))
        (src / f"p{k}.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(text.encode()))
    out = tmp_path / "framed"
    args = ("--output-dir", str(out), "--frame-mb", "0.01")
    assert zephon("recompress", str(src / "*.jsonl.zst"), *args) == 0
    for k in range(2):
        entry = index.build_entry(str(out / f"p{k}.jsonl.zst"))
        assert len(entry["frames"]) > 1 and entry["records"] == 400
    reference = run(recipe([str(src / "*.jsonl.zst")]), 2, 4)
    assert zephon("index", str(out / "*.jsonl.zst"), "--quiet") == 0
    index.forget()
    assert run(recipe([str(out / "*.jsonl.zst")]), 2, 4) == reference
    index.forget()


def test_bad_settings_are_named(tmp_path, capsys):
    """A frame size out of range exits 2 naming the option."""
    (tmp_path / "a.jsonl").write_text('{"text": "x"}\n')
    assert (
        zephon("recompress", str(tmp_path / "a.jsonl"), "--output-dir", "o", "--frame-mb", "0") == 2
    )
    assert "--frame-mb=0" in capsys.readouterr().out
