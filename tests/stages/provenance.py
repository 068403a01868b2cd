"""Read back which corpus documents a run delivered, from the tokens alone.

The test corpora of this package hold self-identifying documents: a document's text is its
tag ``<dataset.shard.record>`` repeated, tokenized by the byte tokenizer (ids = UTF-8 bytes
+ 3; 1 and 2 are bos and eos). A packed sample is cut into document fragments where the
positions restart at 0, and each fragment is identified by the tags it contains, so what a
run delivered is checked against the corpus itself, not against the engine's bookkeeping.
"""

from __future__ import annotations

import itertools
import json
import random
import re
from collections import Counter
from collections.abc import Iterable, Mapping
from pathlib import Path

import numpy as np

TAG = re.compile(r"<([a-z]+)\.(\d+)\.(\d+)>")


def write_corpus(
    root: Path, names: Iterable[str], shards: int = 2, records: int = 40, seed: int = 1
) -> dict[tuple[str, int, int], int]:
    """Write ``root/<name>/part-<s>.jsonl`` for each dataset; return each document's input tokens.

    The count of a document is the number of input positions it fills when packed
    (bos + bytes + eos, less one: the last token is only a label).
    """
    rnd = random.Random(seed)
    lengths: dict[tuple[str, int, int], int] = {}
    for name in names:
        (root / name).mkdir(parents=True, exist_ok=True)
        for s in range(shards):
            lines = []
            for r in range(records):
                tag = f"<{name}.{s}.{r}>"
                # At least 4 tags: a document cut over samples keeps a fragment holding a
                # whole tag (its largest), so every delivered document is identified.
                text = tag * rnd.randint(4, 8)
                lines.append(json.dumps({"text": text}))
                lengths[(name, s, r)] = len(text.encode()) + 1
            (root / name / f"part-{s}.jsonl").write_text("\n".join(lines) + "\n")
    return lengths


def fragments(
    batch: Mapping[str, np.ndarray],
) -> list[tuple[int, tuple[str, int, int] | None, int]]:
    """``(lane, document or None, input tokens)`` of every document fragment of a batch."""
    out = []
    inputs = np.asarray(batch["input"])
    positions = np.asarray(batch["positions"])
    labels = np.asarray(batch["labels"])
    lanes = np.asarray(batch["lane"])
    for row in range(inputs.shape[0]):
        real = labels[row] != -100
        starts = [*np.flatnonzero(positions[row] == 0).tolist(), inputs.shape[1]]
        for a, b in itertools.pairwise(starts):
            keep = real[a:b]
            n = int(keep.sum())
            if n == 0:
                continue
            ids = inputs[row, a:b][keep]
            text = bytes(int(t) - 3 for t in ids if t >= 3).decode("utf-8", "replace")
            tags = {(m.group(1), int(m.group(2)), int(m.group(3))) for m in TAG.finditer(text)}
            assert len(tags) <= 1, f"one fragment holds several documents: {tags}"
            out.append((int(lanes[row]), next(iter(tags)) if tags else None, n))
    return out


def delivered(batches: Iterable[Mapping[str, np.ndarray]]) -> Counter[tuple[str, int, int]]:
    """Input tokens delivered per identified document."""
    got: Counter[tuple[str, int, int]] = Counter()
    for batch in batches:
        for _, doc, n in fragments(batch):
            if doc is not None:
                got[doc] += n
    return got
