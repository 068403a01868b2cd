"""Start-up of the ``zephon`` command line: wall and CPU seconds per call, median of N runs.

    python -m benchmarks.cli_startup [--runs 5]

Commands that need no tensors (``--help``, ``lanes``, ``inspect``, ``index --help``, and the
``--help`` of ``relane``, ``amend`` and ``explain``) should not import torch; ``digest --help``
does, and is the peer measured beside them. Prints a Markdown table and the load average it
ran under.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _checkpoint(folder: Path) -> str:
    from zephon_nodes.state import save_state
    from zephon_nodes.state.schema import RankState

    state = RankState(
        fingerprint="0" * 64, recipe={}, num_lanes=2, step=3, micro=0, lanes={0: (0, 6), 1: (0, 6)}
    ).to_dict()
    save_state(folder / "ckpt", state)
    return str(folder / "ckpt")


def _time(argv: list[str]) -> tuple[float, float]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "zephon_nodes.cli", *argv],
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        check=False,
    )
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--runs", type=int, default=5)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = _checkpoint(Path(tmp))
        cases = {
            "zephon --help": ["--help"],
            "zephon lanes --dp 2,4 --global-batch 16": [
                "lanes",
                "--dp",
                "2,4",
                "--global-batch",
                "16",
            ],
            "zephon inspect CKPT": ["inspect", ckpt],
            "zephon index --help": ["index", "--help"],
            "zephon relane --help": ["relane", "--help"],
            "zephon amend --help": ["amend", "--help"],
            "zephon explain --help": ["explain", "--help"],
            "zephon digest --help (imports torch)": ["digest", "--help"],
        }
        load = os.getloadavg()[0]
        print(f"load average at start {load:.2f}; median of {args.runs} runs\n")
        print("| command | wall s | CPU s |")
        print("|---|---:|---:|")
        for name, argv in cases.items():
            runs = [_time(argv) for _ in range(args.runs)]
            wall = statistics.median(r[0] for r in runs)
            cpu = statistics.median(r[1] for r in runs)
            print(f"| `{name}` | {wall:.2f} | {cpu:.2f} |")
        print(f"\nload average at end {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
