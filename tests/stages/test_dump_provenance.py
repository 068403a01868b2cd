"""``zephon digest --dump-batches`` says where every token came from; checked on the corpus.

Each token span of a dumped batch (a run of equal dataset, shard and record) is looked up in
the shard file itself: its tokens must be a piece of that record's document (bos + UTF-8
bytes + eos for the byte tokenizer). Over a run with a stage, no record's tokens exceed its
length (nothing delivered twice), the removed dataset is absent after the stage and the added
one present.
"""

from __future__ import annotations

import itertools
import json
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from tests.commands.run import zephon_process
from tests.stages.conftest import digests, recipe
from tests.stages.test_stages import STAGES
from zephon_nodes.engine.pipeline import Pipeline

RECIPE = """
seed = 7
num_lanes = 4
global_batch_size = 8
seq_len = 32
flush_every = 2
[tokenizer]
kind = "bytes"
[[datasets]]
name = "a"
paths = ["a/*.jsonl"]
[[datasets]]
name = "b"
paths = ["b/*.jsonl"]
[work]
chunk_size = 4
epochs = "inf"
[[stages]]
start_step = 4
seq_len = 64
remove_datasets = ["b"]
[[stages.datasets]]
name = "c"
paths = ["c/*.jsonl"]
[[stages]]
start_step = 7
global_batch_size = 16
weights = {a = 3.0}
"""


def _documents(path: str) -> list[np.ndarray]:
    """Each record of a jsonl shard as the byte tokenizer's ids (bos, bytes + 3, eos)."""
    out = []
    for line in Path(path).read_text().splitlines():
        body = np.frombuffer(json.loads(line)["text"].encode(), dtype=np.uint8).astype(np.int64)
        out.append(np.concatenate([[1], body + 3, [2]]))
    return out


def _spans(row: dict[str, np.ndarray]) -> list[tuple[int, int, int, int, int]]:
    """``(dataset, shard, record, start, stop)`` of each run of one source in a sample."""
    key = np.stack([row["dataset_ids"], row["source_shard"], row["source_record"]])
    cut = np.flatnonzero((key[:, 1:] != key[:, :-1]).any(axis=0)) + 1
    bounds = [0, *cut.tolist(), key.shape[1]]
    return [
        (int(key[0, a]), int(key[1, a]), int(key[2, a]), a, b)
        for a, b in itertools.pairwise(bounds)
    ]


def test_the_dump_names_every_tokens_source(corpus: tuple[Path, Any], tmp_path: Path) -> None:
    root, lengths = corpus
    path = root / "dump-recipe.toml"
    path.write_text(RECIPE)
    out = tmp_path / "dump"
    done = zephon_process("digest", path, "--steps", 9, "--dp-world-size", 2, "--dump-batches", out)
    assert done.returncode == 0, done.stderr
    # Tracing changes no digest: the same as the staged recipe run without a dump.
    got = [json.loads(x)["digest"] for x in done.stdout.splitlines()]
    assert got == digests(Pipeline(recipe(root, stages=STAGES)), 9, 1)
    sources = json.loads((out / "sources.json").read_text())["stages"]
    assert [s["after_step"] for s in sources] == [0, 4, 7]
    docs: dict[str, list[np.ndarray]] = {}
    used: Counter[tuple[str, int, int]] = Counter()
    names_per_step = []
    for step in range(1, 10):
        batch = dict(np.load(out / f"step-{step:08d}.npz"))
        stage = [s for s in sources if s["after_step"] < step][-1]
        names = set()
        for r in range(batch["input"].shape[0]):
            row = {k: v[r] for k, v in batch.items()}
            for d, shard, record, a, b in _spans(row):
                if d < 0:
                    assert (row["labels"][a:b] == -100).all()  # padding only
                    continue
                dataset = stage["datasets"][d]
                file = dataset["shards"][shard]
                doc = docs.setdefault(file, _documents(file))[record]
                piece = row["input"][a:b]
                # The span is a piece of that very record's tokens (inputs: the doc less its
                # last token, so the piece is found in doc[:-1]).
                window = np.lib.stride_tricks.sliding_window_view(doc[:-1], len(piece))
                assert (window == piece).all(axis=1).any(), (step, file, record)
                name = dataset["name"]
                shard_no = int(Path(file).stem.split("-")[1])
                used[(name, shard_no, record)] += b - a
                names.add(name)
        names_per_step.append(names)
    # No record delivered twice: its inputs never exceed its length less one.
    assert all(n <= lengths[key] for key, n in used.items())
    assert all("b" not in n for n in names_per_step[4:]) and any(
        "c" in n for n in names_per_step[4:]
    )
