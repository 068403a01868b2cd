"""Inputs for the docs' TOML recipes: the files a recipe names, made when the page does not.

``materialize(data, root)`` fills every local ``paths`` glob of a recipe (its datasets and its
stages' datasets) that matches nothing under ``root`` with one shard of the glob's format
(``.jsonl``, ``.jsonl.zst``, ``.parquet``, WebDataset ``.tar``), large enough for a few steps,
and trains the tokenizer file it names if that file is missing (a sentencepiece model or a
Hugging Face ``tokenizer.json``). Files the page made itself are left as they are: a page whose
recipe points at a file of the wrong format still fails.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

__all__ = ["FORMATS", "materialize"]

FORMATS = (".jsonl", ".jsonl.zst", ".parquet", ".tar")

WORDS = [
    "data",
    "lane",
    "token",
    "batch",
    "model",
    "shard",
    "step",
    "rank",
    "flush",
    "seed",
    "window",
    "replay",
    "recipe",
    "mixture",
    "packing",
    "shuffle",
    "buffer",
    "worker",
    "runner",
    "checkpoint",
    "resume",
    "storage",
    "bucket",
    "index",
    "cache",
]


def _documents(n_chars: int, seed: int, n_docs: int = 1) -> list[str]:
    """At least ``n_docs`` documents and ``n_chars`` characters (of at least 200 each)."""
    rng = random.Random(seed)
    words = max(30, n_chars // max(n_docs, 1) // 6)
    docs, total = [], 0
    while total < n_chars or len(docs) < n_docs:
        doc = " ".join(rng.choice(WORDS) for _ in range(words + rng.randrange(words)))
        docs.append(doc)
        total += len(doc)
    return docs


def _datasets(data: dict[str, Any]) -> list[dict[str, Any]]:
    out = list(data.get("datasets", []))
    for stage in data.get("stages", []):
        out += stage.get("datasets", [])
    return out


def _write_shard(
    path: Path, spec: dict[str, Any], data: dict[str, Any], n_chars: int, n_docs: int
) -> None:
    name = path.name
    # A name of no format this makes (a plain .txt, say) is the page's to create, not ours.
    assert name.endswith(FORMATS), f"{path}: no file of this name, and not one of {FORMATS}"
    path.parent.mkdir(parents=True, exist_ok=True)
    docs = _documents(n_chars, len(str(path)), n_docs)
    if "image" in data:
        from zephon_nodes.multimodal.corpus import write_jsonl, write_tar_shards

        if name.endswith(".tar"):
            (written,) = write_tar_shards(path.parent, 1, n_docs, use_photos=False, max_side=32)
            written.rename(path)
        else:
            write_jsonl(path, n_docs, max_side=32, use_photos=False)
        return
    if "chat" in data:
        field = data["chat"].get("messages_field", "messages")
        rows = [
            {field: [{"role": "user", "content": d[:60]}, {"role": "assistant", "content": d}]}
            for d in docs
        ]
    else:
        rows = [{spec.get("text_field", "text"): d} for d in docs]
    if name.endswith(".parquet"):
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(rows), path)
        return
    text = "".join(json.dumps(r) + "\n" for r in rows).encode()
    if name.endswith(".zst"):
        import zstandard

        text = zstandard.ZstdCompressor().compress(text)
    path.write_bytes(text)


def _train_tokenizer(spec: dict[str, Any], root: Path) -> None:
    path = root / spec["path"]
    if path.exists() or spec.get("kind") not in ("sentencepiece", "hf"):
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    corpus = root / "tokenizer-corpus.txt"
    corpus.write_text("\n".join(_documents(200_000, 1, n_docs=2000)))
    if spec["kind"] == "sentencepiece":
        import sentencepiece as spm

        spm.SentencePieceTrainer.train(
            input=str(corpus), model_prefix=str(path.with_suffix("")), vocab_size=120,
            model_type="bpe", pad_id=0, bos_id=1, eos_id=2, unk_id=3, minloglevel=2,
        )  # fmt: skip
        return
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=["<unk>", "<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train([str(corpus)], trainer)
    tok.save(str(path))


def materialize(data: dict[str, Any], root: Path) -> list[str]:
    """Make the missing local inputs of the recipe ``data`` under ``root``; return what was made."""
    made = []
    # Bytes of the first step, three times over: every dataset can give it on its own (only
    # step 1 runs: later stages' sizes do not matter).
    n_chars = 3 * int(data.get("global_batch_size", 8)) * int(data.get("seq_len", 128))
    lanes = int(data.get("num_lanes", 8))
    for spec in _datasets(data):
        # Three work items per lane, so that every lane has data for the first step.
        chunk = int(spec.get("chunk_size", data.get("work", {}).get("chunk_size", 64)))
        for pattern in spec.get("paths", []):
            if "://" in pattern or list(root.glob(pattern)):
                continue
            path = root / pattern.replace("**/", "").replace("*", "part-0")
            _write_shard(path, spec, data, n_chars, 3 * lanes * chunk)
            made.append(pattern)
    if "path" in data.get("tokenizer", {}):
        _train_tokenizer(data["tokenizer"], root)
    return made
