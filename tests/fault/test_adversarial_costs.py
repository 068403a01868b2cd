"""Costs and modes (issue 27, case 11): a huge chat message is encoded as arrays, with the
same ids and offsets; files zephon writes get the umask's mode, not 0600."""

from __future__ import annotations

import json
import os
import stat

import numpy as np
import pytest
import zstandard

from zephon_nodes.chat.render import _char_index_of_bytes, encode_with_offsets
from zephon_nodes.operators.tokenize import ByteTokenizer


@pytest.mark.parametrize("text", ["", "abc", "héllo wörld", "日本語 \U0001f600 x", "é" * 1000])
def test_char_index_of_bytes_is_the_naive_one(text):
    naive = [k for k, c in enumerate(text) for _ in c.encode("utf-8")] + [len(text)]
    assert _char_index_of_bytes(text).tolist() == naive


def test_a_long_message_encodes_to_the_reference():
    """Ids are UTF-8 bytes + 3, offsets the character of each byte, specials in place."""
    body = "ab é \U0001f600 " * 50_000
    text = "<s>" + body + "</s>"
    ids, starts, ends = encode_with_offsets(ByteTokenizer(), text, {"<s>": 1, "</s>": 2})
    raw = list(body.encode("utf-8"))
    assert ids.tolist() == [1, *(b + 3 for b in raw), 2]
    chars = [k for k, c in enumerate(body) for _ in c.encode("utf-8")]
    assert starts.tolist() == [0, *(c + 3 for c in chars), 3 + len(body)]
    assert ends.tolist() == [3, *(c + 4 for c in chars), len(text)]
    assert ids.dtype == np.int64 and starts.dtype == np.int64


@pytest.fixture
def umask_022():
    old = os.umask(0o022)
    yield
    os.umask(old)


def _mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_recompress_output_has_the_umask_mode(tmp_path, umask_022):
    from zephon_nodes.io.formats.recompress import recompress_file

    text = "".join(json.dumps({"text": f"d {i}"}) + "\n" for i in range(100))
    (tmp_path / "a.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(text.encode()))
    recompress_file(str(tmp_path / "a.jsonl.zst"), str(tmp_path / "o" / "a.jsonl.zst"), 1 << 10)
    assert _mode(tmp_path / "o" / "a.jsonl.zst") == 0o644


def test_checkpoint_files_have_the_umask_mode(tmp_path, umask_022):
    from zephon_nodes.state import save_rank_state

    state = {"step": 3, "lanes": {}}
    path = save_rank_state(tmp_path, 3, 0, state)
    assert _mode(path) == 0o644
    os.umask(0o077)
    path2 = save_rank_state(tmp_path, 4, 0, {"step": 4, "lanes": {}})
    assert _mode(path2) == 0o600  # the umask decides, as for open()
