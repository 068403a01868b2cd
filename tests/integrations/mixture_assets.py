"""A two-dataset recipe over the TorchTitan test assets (for dynamic mixtures)."""

from __future__ import annotations

import json
from pathlib import Path

from tests.integrations.assets import Assets


def write_two_dataset_recipe(path: Path, assets: Assets) -> Path:
    """Split the stdlib corpus into ``prose`` (even lines) and ``code`` (odd lines)."""
    lines = assets.corpus.read_text(encoding="utf-8").splitlines()
    for name, part in (("prose", lines[0::2]), ("code", lines[1::2])):
        (path.parent / f"{name}.jsonl").write_text("\n".join(part) + "\n", encoding="utf-8")
    text = f"""\
seed = 7
num_lanes = 4
global_batch_size = 8
seq_len = 64
flush_every = 2

[tokenizer]
kind = "sentencepiece"
path = {json.dumps(str(assets.sp_model))}

[[datasets]]
name = "prose"
paths = ["prose.jsonl"]
weight = 0.5

[[datasets]]
name = "code"
paths = ["code.jsonl"]
weight = 0.5

[work]
chunk_size = 2
epochs = "inf"

[shuffle]
buffer_size = 4
"""
    path.write_text(text, encoding="utf-8")
    return path
