"""Helper process for the SIGKILL-while-saving test: saves multi-rank checkpoints in a loop.

Usage: ``python ckpt_writer.py ROOT LANES``. For step 1, 2, ... it writes ``ranks`` rank files
(each holding a share of ``LANES`` lanes, a few MB in all) with ``save_rank_state``, then
commits, printing ``committed STEP`` after each commit. The parent SIGKILLs it at random.
"""

from __future__ import annotations

import sys

from zephon_nodes.state import FORMAT, commit_checkpoint, save_rank_state


def rank_state(step: int, rank: int, ranks: int, lanes: int) -> dict[str, object]:
    """A syntactically valid rank state whose positions encode the step."""
    per = lanes // ranks
    return {
        "format": FORMAT,
        "fingerprint": "f" * 64,
        "recipe": {},
        "num_lanes": lanes,
        "step": step,
        "micro": 0,
        "lanes": {str(i): [step, i] for i in range(rank * per, (rank + 1) * per)},
    }


def main() -> None:
    root, lanes = sys.argv[1], int(sys.argv[2])
    step = 0
    while True:
        step += 1
        ranks = (1, 2, 4)[step % 3]
        for r in range(ranks):
            save_rank_state(root, step, r, rank_state(step, r, ranks, lanes))
        commit_checkpoint(root, step, ranks)
        print(f"committed {step}", flush=True)


if __name__ == "__main__":
    main()
