"""hf:// version tags, against a stub of the Hub at the fsspec level (no Hub server here).

What is and is not tested: huggingface_hub's ``HfFileSystem`` takes an ``endpoint`` (or
``HF_ENDPOINT``), so a local server could stand in for the Hub, but no Hub server exists as a
package to run on 127.0.0.1, and its REST API (tree, paths-info, resolve, Xet) is too wide to
fake honestly. So these tests replace the ``hf`` fsspec protocol by :class:`HubStub`, which
answers as ``HfFileSystem`` does (read in huggingface_hub 1.33's ``hf_file_system.py``): a
listing gives each file's ``blob_id`` (and ``lfs``/``xet_hash``), and ``info`` without
``expand_info=True`` and without a listings cache gives only name, size and type. They test
zephon's side: the version tag it derives, change detection, digests equal to local ones.
They do not test huggingface_hub's HTTP client, authentication, or the Hub's answers.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import fsspec
import pytest
from fsspec.registry import _registry
from fsspec.spec import AbstractFileSystem

from tests.io.test_remote_digests import recipe, run, write_corpus
from zephon_nodes import Pipeline, simulate
from zephon_nodes.core.errors import CheckpointError, DataError
from zephon_nodes.io.storage import storage


def git_blob_id(data: bytes) -> str:
    """The git object id of a file's bytes (what the Hub reports as ``blob_id``)."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


class HubStub(AbstractFileSystem):
    """The Hub's files in memory, listed and described the way ``HfFileSystem`` does."""

    protocol = "hf"
    files: ClassVar[dict[str, bytes]] = {}
    report_blob_id: ClassVar[bool] = True

    @classmethod
    def _strip_protocol(cls, path: Any) -> str:
        text = str(path)
        return (text[len("hf://") :] if text.startswith("hf://") else text).strip("/")

    def _entry(self, name: str, listing: bool) -> dict[str, Any]:
        data = self.files[name]
        out: dict[str, Any] = {"name": name, "size": len(data), "type": "file"}
        if listing and self.report_blob_id:
            out.update(blob_id=git_blob_id(data), lfs=None, xet_hash=None, last_commit=None)
        return out

    def ls(self, path: str, detail: bool = True, **kwargs: Any) -> list[Any]:
        path = self._strip_protocol(path)
        prefix = path + "/" if path else ""
        out: dict[str, dict[str, Any]] = {}
        for name in self.files:
            if not name.startswith(prefix):
                continue
            head, sep, _ = name[len(prefix) :].partition("/")
            if sep:
                folder = {"name": prefix + head, "size": 0, "type": "directory"}
                out.setdefault(prefix + head, folder)
            else:
                out[name] = self._entry(name, listing=True)
        if not out and path in self.files:
            out[path] = self._entry(path, listing=True)
        entries = [out[k] for k in sorted(out)]
        return entries if detail else [e["name"] for e in entries]

    def info(self, path: str, **kwargs: Any) -> dict[str, Any]:
        path = self._strip_protocol(path)
        if path in self.files:
            # Without a listings cache, HfFileSystem.info asks paths-info and keeps only
            # name, size and type unless expand_info=True.
            return self._entry(path, listing=bool(kwargs.get("expand_info")))
        if any(n.startswith(path + "/") for n in self.files):
            return {"name": path, "size": 0, "type": "directory"}
        raise FileNotFoundError(path)

    def cat_file(
        self, path: str, start: int | None = None, end: int | None = None, **kwargs: Any
    ) -> bytes:
        path = self._strip_protocol(path)
        if path not in self.files:
            raise FileNotFoundError(path)
        return self.files[path][start:end]


@pytest.fixture
def hub() -> Iterator[type[HubStub]]:
    """The ``hf`` protocol served by :class:`HubStub` for one test."""
    HubStub.files = {}
    HubStub.report_blob_id = True
    fsspec.register_implementation("hf", HubStub, clobber=True)
    storage._forget_filesystems()
    try:
        yield HubStub
    finally:
        _registry.pop("hf", None)  # back to huggingface_hub's
        storage._forget_filesystems()


def upload(hub: type[HubStub], root: Path, repo: str = "datasets/org/corpus") -> str:
    for p in sorted(root.rglob("*")):
        if p.is_file():
            hub.files[f"{repo}/data/{p.relative_to(root).as_posix()}"] = p.read_bytes()
    return f"hf://{repo}/data"


def test_version_tag_is_the_content_blob_id(hub, tmp_path):
    """stat gives the git blob id even where info() alone would not; a same-size edit
    changes it."""
    (tmp_path / "a.jsonl").write_bytes(b'{"text": "one"}\n')
    base = upload(hub, tmp_path)
    assert "blob_id" not in HubStub().info(base + "/a.jsonl")  # what a bare info() gives
    st = storage.stat(base + "/a.jsonl")
    assert st.version == "blob_id:" + git_blob_id(b'{"text": "one"}\n')
    hub.files["datasets/org/corpus/data/a.jsonl"] = b'{"text": "two"}\n'
    assert storage.stat(base + "/a.jsonl").version != st.version


@pytest.mark.parametrize("listed", [True, False], ids=["glob", "named-files"])
def test_hf_copy_gives_local_digests_and_a_change_is_refused(hub, tmp_path, listed):
    """The corpus on the (stub) Hub: local digests; a same-size edit refused at resume,
    whether the files come from a listing (blob ids in it) or are named one by one (each
    stat'ed: info() alone would give no version tag, and the old checksum would be kept)."""
    root = tmp_path / "c"
    names = write_corpus(root)
    reference = run(recipe([str(root / "*.jsonl*")]), 2, 4)
    base = upload(hub, root)
    r = recipe([base + "/*.jsonl*"] if listed else [f"{base}/{n}" for n in names])
    assert run(r, 2, 4) == reference
    saved: dict[str, Any] = {}
    list(simulate(Pipeline(r), 2, 2, save_at=2, on_save=saved.update))
    key = "datasets/org/corpus/data/d0.jsonl"
    text = hub.files[key]
    hub.files[key] = text.replace(b"doc 40", b"doc 04")
    assert len(hub.files[key]) == len(text)
    with pytest.raises(CheckpointError, match=r"content changed in d0\.jsonl"):
        next(simulate(Pipeline(r), 2, 1, resume_state=saved))


def test_no_version_from_the_hub_is_refused(hub, tmp_path):
    """A Hub answer without a blob id cannot show a change: refused, naming the file."""
    (tmp_path / "a.jsonl").write_bytes(b'{"text": "one"}\n')
    base = upload(hub, tmp_path)
    hub.report_blob_id = False
    with pytest.raises(DataError, match=r"a\.jsonl: the Hub reported no blob id"):
        storage.stat(base + "/a.jsonl")
