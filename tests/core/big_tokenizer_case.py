"""Fresh-process case for tests/core/test_big_tokenizers.py: one big document, peak RSS.

``python -m tests.core.big_tokenizer_case KIND MODEL MIB DIR`` writes a jsonl shard holding a
``MIB`` MiB document between two small ones, runs every step of a one-lane recipe tokenizing
with ``KIND`` (``sentencepiece`` or ``hf``, model file ``MODEL``) and prints one JSON line:
label tokens, the tokenizer's own count of the document's ids, and peak RSS before/after.
"""

from __future__ import annotations

import json
import resource
import sys
import time
from pathlib import Path


def _rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main() -> None:
    kind, model, mib, d = sys.argv[1], sys.argv[2], float(sys.argv[3]), Path(sys.argv[4])
    from zephon_nodes import (
        DatasetSpec,
        Pipeline,
        Recipe,
        ShuffleSpec,
        TokenizerSpec,
        WorkSpec,
        simulate,
    )
    from zephon_nodes.operators.tokenize import load_tokenizer

    d.mkdir(parents=True, exist_ok=True)
    unit = "the quick brown fox, jumps over: the lazy dog. caf\u00e9 0123456789\n"
    reps = int(mib * 2**20) // len(unit.encode())
    with open(d / "big.jsonl", "w", encoding="utf-8") as f:
        f.write('{"text": "small one"}\n{"text": "')
        for lo in range(0, reps, 20_000):
            f.write(json.dumps(unit * min(20_000, reps - lo))[1:-1])
        f.write('"}\n{"text": "small two"}\n')
    spec = TokenizerSpec(kind=kind, path=model, add_bos=False, add_eos=True)
    tok = load_tokenizer(spec)
    # Expected ids, counted by the tokenizer itself on the unit (ends with a newline, where
    # the pieces are cut) and on the small documents.
    unit_ids = len(tok.encode_batch([unit])[0])
    small = sum(len(x) for x in tok.encode_batch(["small one", "small two"]))
    recipe = Recipe(
        datasets=(DatasetSpec("r", paths=("big.jsonl",), base_dir=d),),
        tokenizer=spec,
        seed=1,
        num_lanes=1,
        global_batch_size=1,
        seq_len=4096,
        flush_every=4,
        work=WorkSpec(chunk_size=1, epochs=1, deal="round_robin"),  # one lane: no sizing pass
        shuffle=ShuffleSpec(0),
    )
    base, t0, tokens = _rss_mib(), time.monotonic(), 0
    for res, _ in simulate(Pipeline(recipe), 1, 10**9, num_workers=1):
        tokens += res.tokens
    out = {
        "tokens": tokens,
        "unit_ids": unit_ids,
        "reps": reps,
        "small_ids": small,
        "doc_bytes": reps * len(unit.encode()),
        "rss_before_mib": base,
        "peak_rss_mib": _rss_mib(),
        "seconds": round(time.monotonic() - t0, 1),
    }
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
