"""Four ranks on one node read single-frame .zst shards over HTTP: one GET per shard.

The shards are served by nginx (honours ``Range``, as a web server or object store does);
the GETs are counted in nginx's access log, at the server.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import zstandard

from tests.io.conftest import HttpServer
from zephon_nodes import DatasetSpec, Pipeline, Recipe, TokenizerSpec, WorkSpec
from zephon_nodes.cli import main
from zephon_nodes.engine.pool import WorkerPool
from zephon_nodes.io.nodecache.nodecache import LIMIT_ENV

SHARDS = 8
ROOT = Path(__file__).resolve().parents[2]

_RANKS = """
import hashlib, json, sys
from pathlib import Path
from zephon_nodes import DatasetSpec, Pipeline, Recipe, TokenizerSpec, WorkSpec
from zephon_nodes.engine.pool import WorkerPool

paths, index, ranks = json.loads(sys.argv[1]), sys.argv[2], [int(r) for r in sys.argv[3].split(",")]
recipe = Recipe(
    datasets=(DatasetSpec("web", paths=tuple(paths), index=index or None),),
    tokenizer=TokenizerSpec(kind="bytes"), seed=9, num_lanes=4, global_batch_size=8,
    seq_len=32, flush_every=2, work=WorkSpec(chunk_size=4, epochs=1),
)
pipeline = Pipeline(recipe)
with WorkerPool(2, "thread") as pool:
    nodes = {r: pipeline.rank_node(4, r, pool=pool) for r in ranks}
    for node in nodes.values():
        node.reset(None)
    hashes = {r: hashlib.sha256() for r in ranks}
    live = dict(nodes)
    while live:
        for r, node in list(live.items()):
            try:
                batch = next(node)
            except StopIteration:
                del live[r]
                continue
            for key in sorted(batch):
                hashes[r].update(key.encode())
                hashes[r].update(batch[key].numpy().tobytes())
print(json.dumps({"digests": {r: h.hexdigest() for r, h in hashes.items()},
                  "cache": pipeline.cache_stats()}))
"""


def write_zst(root: Path) -> list[str]:
    root.mkdir(parents=True, exist_ok=True)
    names = []
    for s in range(SHARDS):
        rows = [json.dumps({"text": f"http shard {s} doc {r} " * (1 + r % 4)}) for r in range(20)]
        blob = zstandard.ZstdCompressor().compress(("\n".join(rows) + "\n").encode())
        name = f"part-{s:02d}.jsonl.zst"
        (root / name).write_bytes(blob)
        names.append(name)
    return names


def gets(log: Path, path: str) -> int:
    """GET requests for ``path`` in nginx's access log."""
    return sum(f'"GET {path} ' in line for line in log.read_text().splitlines())


def test_four_ranks_get_each_shard_once(http_server: HttpServer, tmp_path: Path) -> None:
    """Two processes x two ranks, a node cache: every shard GET once; batches as local."""
    local = tmp_path / "local"
    names = write_zst(local)
    served = http_server.root / "nodecache-http"
    served.mkdir()
    for n in names:
        (served / n).write_bytes((local / n).read_bytes())
    urls = [http_server.url(f"nodecache-http/{n}") for n in names]
    index = tmp_path / "index.json"
    assert main(["index", *urls, "--output", str(index)]) == 0
    access = http_server.root.parent / "access.log"
    before = {n: gets(access, f"/nodecache-http/{n}") for n in names}

    env = {**os.environ, "PYTHONPATH": str(ROOT), LIMIT_ENV: "1M"}
    env["ZEPHON_CACHE_DIR"] = str(tmp_path / "zc")
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _RANKS, json.dumps(urls), str(index), ranks],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for ranks in ("0,2", "1,3")
    ]
    reference = {}
    plain = Pipeline(
        Recipe(
            datasets=(DatasetSpec("web", paths=(str(local / "*.jsonl.zst"),)),),
            tokenizer=TokenizerSpec(kind="bytes"),
            seed=9,
            num_lanes=4,
            global_batch_size=8,
            seq_len=32,
            flush_every=2,
            work=WorkSpec(chunk_size=4, epochs=1),
        )
    )
    for r in range(4):
        h = hashlib.sha256()
        with WorkerPool(2, "thread") as pool:
            node = plain.rank_node(4, r, pool=pool)
            node.reset(None)
            for batch in node:
                for key in sorted(batch):
                    h.update(key.encode())
                    h.update(batch[key].numpy().tobytes())
        reference[str(r)] = h.hexdigest()
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-2000:]
        outs.append(json.loads(out.strip().splitlines()[-1]))
    assert {**outs[0]["digests"], **outs[1]["digests"]} == reference
    after = {n: gets(access, f"/nodecache-http/{n}") - before[n] for n in names}
    assert after == dict.fromkeys(names, 1)
    assert sum(o["cache"]["fetches"] for o in outs) == SHARDS
