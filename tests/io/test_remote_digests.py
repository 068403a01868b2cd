"""The same recipe over local, s3:// and http:// copies of a corpus gives the same digests."""

from __future__ import annotations

import json
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import zstandard

from tests.io.conftest import HttpServer, OutageProxy, S3Server, s3_put_tree
from zephon_nodes import DatasetSpec, Pipeline, Recipe, TokenizerSpec, WorkSpec, simulate
from zephon_nodes.errors import CheckpointError
from zephon_nodes.io.storage import storage

STEPS = 6


def _doc(i: int) -> str:
    return json.dumps({"text": f"doc {i} " + "word " * (i % 9 + 1)})


def write_corpus(root: Path, sizes: tuple[int, ...] = (23, 0, 17, 31)) -> list[str]:
    """Shards a.jsonl (with a blank line), b.jsonl (empty), c.jsonl.zst (2 frames), d.jsonl."""
    root.mkdir(parents=True, exist_ok=True)
    names = []
    start = 0
    for k, n in enumerate(sizes):
        lines = [_doc(start + i) for i in range(n)]
        start += n
        name = "abcdefgh"[k % 8] + str(k // 8)
        if k % 3 == 2:
            half = len(lines) // 2
            blob = b"".join(
                zstandard.ZstdCompressor().compress(("\n".join(part) + "\n").encode())
                for part in (lines[:half], lines[half:])
            )
            (root / f"{name}.jsonl.zst").write_bytes(blob)
            names.append(f"{name}.jsonl.zst")
        else:
            text = "\n".join([*lines[:3], "", *lines[3:]]) + ("\n" if lines else "")
            (root / f"{name}.jsonl").write_text(text)
            names.append(f"{name}.jsonl")
    return names


def recipe(paths: list[str], **kw: Any) -> Recipe:
    """A tiny byte-tokenizer recipe over ``paths``."""
    base: dict[str, Any] = {
        "datasets": (DatasetSpec("web", paths=tuple(paths)),),
        "tokenizer": TokenizerSpec(kind="bytes"),
        "seed": 5,
        "num_lanes": 4,
        "global_batch_size": 8,
        "seq_len": 24,
        "flush_every": 2,
        "work": WorkSpec(chunk_size=4),
    }
    base.update(kw)
    return Recipe(**base)


def run(r: Recipe, world: int = 1, steps: int = STEPS, **kw: Any) -> list[str]:
    """Digests of a simulated run."""
    return [x.digest for x, _ in simulate(Pipeline(r), world, steps, **kw)]


@pytest.fixture(scope="module")
def corpus(
    tmp_path_factory: pytest.TempPathFactory, s3_server: S3Server, http_server: HttpServer
) -> Iterator[dict[str, Any]]:
    """The corpus on local disk, in S3 and behind nginx; the local reference digests."""
    root = tmp_path_factory.mktemp("corpus")
    names = write_corpus(root)
    with pytest.MonkeyPatch.context() as mp:
        for k, v in s3_server.env.items():
            mp.setenv(k, v)
        storage._forget_filesystems()
        base = s3_put_tree(s3_server, "corpus", root, "v1")
        shutil.copytree(root, http_server.root / "corpus")
        local = recipe([str(root / "*.jsonl*")])
        yield {
            "root": root,
            "local": local,
            "s3": recipe([base + "/*.jsonl*"]),
            "http": recipe([http_server.url(f"corpus/{n}") for n in names]),
            "reference": run(local, 1, num_workers=1),
        }
    storage._forget_filesystems()


def test_reference_is_not_trivial(corpus):
    """The reference run has STEPS distinct batches."""
    assert len(corpus["reference"]) == STEPS and len(set(corpus["reference"])) == STEPS


@pytest.mark.parametrize(
    ("source", "world", "workers", "runner"),
    [
        (source, *case)
        for source in ("s3", "http")
        for case in ((1, 1, "thread"), (2, 2, "thread"), (4, 2, "thread"))
    ]
    + [("s3", 2, 1, "process")],
)
def test_remote_copies_give_the_local_digests(corpus, source, world, workers, runner):
    """s3:// and http:// copies: identical digests at dp 1, 2, 4, 1-2 workers, both runners."""
    got = run(corpus[source], world, num_workers=workers, runner=runner)
    assert got == corpus["reference"]


def test_fingerprint_is_the_same_for_every_copy(corpus):
    """Where the bytes live is not part of the fingerprint."""
    fps = {Pipeline(corpus[k]).fingerprint for k in ("local", "s3", "http")}
    assert len(fps) == 1


def test_resume_on_another_copy_at_another_dp(corpus):
    """Saved over S3 at dp 2, resumed over http at dp 4 and locally at dp 1: same digests."""
    saved: dict[str, Any] = {}
    list(simulate(Pipeline(corpus["s3"]), 2, 3, save_at=3, on_save=saved.update))
    assert run(corpus["http"], 4, STEPS - 3, resume_state=saved) == corpus["reference"][3:]
    assert run(corpus["local"], 1, STEPS - 3, resume_state=saved) == corpus["reference"][3:]


def test_copy_in_another_folder_resumes(corpus, tmp_path):
    """The same shards copied elsewhere (new paths, new mtimes) resume the run."""
    saved: dict[str, Any] = {}
    list(simulate(Pipeline(corpus["local"]), 2, 2, save_at=2, on_save=saved.update))
    copy = tmp_path / "elsewhere" / "data"
    shutil.copytree(corpus["root"], copy)
    moved = recipe([str(copy / "*.jsonl*")])
    assert run(moved, 4, STEPS - 2, resume_state=saved) == corpus["reference"][2:]


def test_changed_remote_file_is_refused_at_resume(corpus, s3_env, tmp_path):
    """A same-size edit of one S3 object is refused at resume, naming the file."""
    root = tmp_path / "c"
    write_corpus(root)
    base = s3_put_tree(s3_env, "changing", root)
    r = recipe([base + "/*.jsonl*"])
    saved: dict[str, Any] = {}
    list(simulate(Pipeline(r), 2, 2, save_at=2, on_save=saved.update))
    text = (root / "d0.jsonl").read_bytes()
    (root / "d0.jsonl").write_bytes(text.replace(b"doc 40", b"doc 04"))
    assert len((root / "d0.jsonl").read_bytes()) == len(text)
    s3_put_tree(s3_env, "changing", root)
    with pytest.raises(CheckpointError, match=r"content changed in d0\.jsonl"):
        next(simulate(Pipeline(r), 2, 1, resume_state=saved))


def test_s3_outage_mid_run_costs_time_not_bytes(corpus, s3_server, monkeypatch):
    """The S3 endpoint vanishes for ~3 s mid-run and comes back: the same digests."""
    proxy = OutageProxy(s3_server.port)
    try:
        for k, v in s3_server.env.items():
            monkeypatch.setenv(k, v)
        monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{proxy.port}")
        monkeypatch.setenv("ZEPHON_STORAGE_BACKOFF_MAX_S", "0.5")
        monkeypatch.setenv("ZEPHON_READ_CACHE_MB", "0")  # every read goes to the endpoint
        storage._forget_filesystems()
        pipeline = Pipeline(corpus["s3"])  # indexed before the outage (fetched once)
        got = []
        outage: threading.Thread | None = None
        for k, (x, _) in enumerate(simulate(pipeline, 2, STEPS, num_workers=2)):
            got.append(x.digest)
            if k == 1:
                before = proxy.accepted
                outage = threading.Thread(target=proxy.outage, args=(3.0,))
                outage.start()
        assert outage is not None
        outage.join()
        assert got == corpus["reference"]
        # The endpoint really went away and came back, and reads went through it after.
        assert proxy.restarts == 1 and proxy.accepted > before
    finally:
        proxy.stop()
        storage._forget_filesystems()


def test_corrupt_remote_shard_is_skipped_like_a_local_one(s3_env: S3Server, tmp_path):
    """Under on_error = "skip", a truncated .zst in S3 is left out exactly as locally."""
    root = tmp_path / "c"
    write_corpus(root)
    blob = (root / "c0.jsonl.zst").read_bytes()
    (root / "c0.jsonl.zst").write_bytes(blob[: len(blob) - 7])
    base = s3_put_tree(s3_env, "corrupt", root)
    spec = DatasetSpec("web", paths=(str(root / "*.jsonl*"),), on_error="skip")
    local = recipe([str(root / "*.jsonl*")]).replace(datasets=(spec,))
    remote = local.replace(datasets=(DatasetSpec("web", paths=(base + "/*",), on_error="skip"),))
    p_local, p_remote = Pipeline(local), Pipeline(remote)
    assert p_local.skipped_files == p_remote.skipped_files
    assert sum(p_local.skipped_files["web"].values()) >= 2  # the empty file and the corrupt one
    assert p_local.fingerprint == p_remote.fingerprint
    assert run(remote, 2, 3) == run(local, 2, 3)
