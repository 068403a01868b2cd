"""Make everything a TorchTitan job with zephon-nodes needs: data, tokenizer, recipe, hf_assets.

    python examples/torchtitan/make_assets.py work/

writes, offline (the text is Python's own documentation and sources):

* ``work/data/stdlib-NN.jsonl.zst``: the corpus, 4 shards;
* ``work/tok.model``: a sentencepiece BPE tokenizer trained on it (the recipe's tokenizer);
* ``work/recipe.toml``: the recipe (endless: ``work.epochs = "inf"``);
* ``work/hf_assets/``: the same vocabulary as TorchTitan's ``--hf_assets_path`` wants it.

With your own data, keep the last two steps: write a recipe that names your shards and
tokenizer, and make ``hf_assets`` with ``python -m zephon_nodes.integrations.torchtitan.hf_assets``
(or point both at one Hugging Face ``tokenizer.json``, see docs/torchtitan.md).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from zephon_nodes.commands.demo_corpus import build_corpus, train_tokenizer
from zephon_nodes.integrations.torchtitan.hf_assets import write_hf_assets

RECIPE = """\
# The walk-through's recipe (examples/torchtitan). Lanes: a common multiple of every dp size
# the job will run on (1, 2, 4 here); global_batch_size: a multiple of num_lanes.
seed = 7
num_lanes = {num_lanes}
global_batch_size = {global_batch_size}
seq_len = {seq_len}
flush_every = 2

[tokenizer]
kind = "sentencepiece"
path = "tok.model"

[[datasets]]
name = "stdlib"
paths = ["data/*.jsonl.zst"]

[work]
chunk_size = 8
epochs = "inf"

[shuffle]
buffer_size = 8
"""


def make_assets(
    out: Path,
    *,
    seq_len: int = 64,
    num_lanes: int = 4,
    global_batch_size: int = 8,
    vocab_size: int = 512,
    documents: int = 2000,
) -> Path:
    """Build data, tokenizer, recipe and hf_assets under ``out``; return the recipe path."""
    out.mkdir(parents=True, exist_ok=True)
    build_corpus(out / "data", num_shards=4, max_documents=documents)
    train_tokenizer(out / "tok.model", vocab_size=vocab_size, max_documents=documents)
    write_hf_assets(out / "tok.model", out / "hf_assets")
    recipe = out / "recipe.toml"
    recipe.write_text(
        RECIPE.format(seq_len=seq_len, num_lanes=num_lanes, global_batch_size=global_batch_size),
        encoding="utf-8",
    )
    return recipe


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out", type=Path, help="output folder")
    ap.add_argument("--seq-len", type=int, default=64, help="recipe seq_len (GPU: e.g. 2048)")
    ap.add_argument("--num-lanes", type=int, default=4, help="recipe num_lanes")
    ap.add_argument("--global-batch-size", type=int, default=8, help="samples per step")
    ap.add_argument("--vocab-size", type=int, default=512, help="tokenizer vocabulary")
    ap.add_argument("--documents", type=int, default=2000, help="corpus documents")
    args = ap.parse_args()
    recipe = make_assets(
        args.out,
        seq_len=args.seq_len,
        num_lanes=args.num_lanes,
        global_batch_size=args.global_batch_size,
        vocab_size=args.vocab_size,
        documents=args.documents,
    )
    print(
        f"wrote {recipe}, {args.out / 'tok.model'}, {args.out / 'data'}/, {args.out / 'hf_assets'}/"
    )


if __name__ == "__main__":
    main()
