"""Multi-turn SFT through the TorchTitan main adapter: labels on assistant turns, elastic dp.

    python examples/torchtitan/sft_main.py work-sft/

TorchTitan main's own ``ChatProcessor`` takes single-turn conversations only. This makes
multi-turn conversations (system, then 2-3 user/assistant exchanges), a ChatML tokenizer
and a ``[chat]`` recipe (``train_on = "assistant"``, whole conversations packed best-fit),
then builds ``ZephonDataLoader`` as TorchTitan main's Trainer does at dp 1, 2 and 4 and
checks that (a) every optimizer step holds the same tokens at every dp size and (b) the
supervised labels (not ``IGNORE_INDEX``) decode to assistant text only. Prints one line
per dp size and exits 1 on a mismatch. Needs TorchTitan main (``.venv-titan-main``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))  # the repository, for the test tokenizer helper

SEQ, G, LANES, ROWS, STEPS = 128, 8, 4, 2, 3
ASSISTANT = ["Sure, here it is.", "The answer is 42.", "Thank you, goodbye.", "Yes: 0123."]
USER = ["hello there", "how are you today?", "numbers 0123456789", "unicode text please"]


def make(work: Path) -> Path:
    """Write the tokenizer, the conversations and the recipe under ``work``."""
    from tests.chat.helpers import write_chat_tokenizer

    work.mkdir(parents=True, exist_ok=True)
    write_chat_tokenizer(work / "hf_assets")
    with open(work / "chats.jsonl", "w", encoding="utf-8") as f:
        for i in range(120):
            messages = [{"role": "system", "content": "You are terse."}]
            for turn in range(2 + i % 2):
                messages.append({"role": "user", "content": USER[(i + turn) % 4]})
                messages.append({"role": "assistant", "content": ASSISTANT[(i * 3 + turn) % 4]})
            f.write(json.dumps({"messages": messages}) + "\n")
    recipe = work / "sft.toml"
    recipe.write_text(
        f"seed = 5\nseq_len = {SEQ}\nnum_lanes = {LANES}\nglobal_batch_size = {G}\n\n"
        '[tokenizer]\nkind = "hf"\npath = "hf_assets/tokenizer.json"\n\n'
        '[[datasets]]\nname = "sft"\npaths = ["chats.jsonl"]\n\n'
        '[chat]\nmessages_field = "messages"\ntrain_on = "assistant"\n\n'
        '[pack]\nmode = "bestfit"\n\n[work]\nchunk_size = 8\nepochs = "inf"\n'
    )
    return recipe


def steps_at(recipe: Path, world: int) -> list[list[tuple[list[int], list[int]]]]:
    """Each optimizer step's (input, labels) of every rank's micro-batches, rank order."""
    from zephon_nodes.integrations.torchtitan import API, ZephonDataLoader

    if API != "main":
        raise SystemExit(f"needs TorchTitan main (found the {API!r} API)")
    loaders = [
        ZephonDataLoader.Config(recipe=str(recipe), num_workers=1).build(
            dp_world_size=world,
            dp_rank=r,
            tokenizer=None,
            max_context_length=SEQ,
            num_tokens_per_batch=ROWS * SEQ,
        )
        for r in range(world)
    ]
    accum = G // (world * ROWS)
    its = [iter(x) for x in loaders]
    out = []
    for _ in range(STEPS):
        step = []
        for it in its:
            for _ in range(accum):
                inputs, labels = next(it)
                step.append((inputs["input"].tolist(), labels.tolist()))
        out.append(step)
    for x in loaders:
        x.close()
    return out


def supervised_texts(recipe: Path, step: list[tuple[list[int], list[int]]]) -> list[str]:
    """Decode each run of supervised labels of a step."""
    from tokenizers import Tokenizer
    from torchtitan.components.loss import IGNORE_INDEX

    tok = Tokenizer.from_file(str(recipe.parent / "hf_assets" / "tokenizer.json"))
    texts, run = [], []
    for _, labels in step:
        for label in [*labels, IGNORE_INDEX]:
            if label != IGNORE_INDEX:
                run.append(label)
            elif run:
                texts.append(tok.decode(run, skip_special_tokens=True).strip())
                run = []
    return texts


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("work", type=Path)
    work = ap.parse_args().work.resolve()
    recipe = make(work)
    ok = True
    base = None
    for world in (1, 2, 4):
        steps = steps_at(recipe, world)
        tokens = [[t for inp, _ in s for t in inp] for s in steps]
        same = base is None or tokens == base
        base = base or tokens
        texts = [t for s in steps for t in supervised_texts(recipe, s)]
        assistant_only = bool(texts) and all(t in ASSISTANT for t in texts)
        ok &= same and assistant_only
        print(
            f"dp {world}: {G // (world * ROWS)} micro-batches/step, same tokens as dp 1: "
            f"{same}, {len(texts)} supervised runs, all assistant text: {assistant_only}"
        )
    print("elastic and assistant-only" if ok else "MISMATCH")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
