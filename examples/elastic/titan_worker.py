"""One worker of the real-Trainer elastic job (launched by ``torchrun``; see ``titan.py``).

It is ``zephon_nodes.integrations.torchtitan.train`` (TorchTitan's ``train``, with the CPU
patches when no GPU is visible) plus one thing the drill needs: each start of the worker group
dumps its batches into a folder of its own, ``DUMP_ROOT/group-<world>-<master port>``, so that
a step trained again after a restart (at another world size) does not mix its rank files with
those of the group that trained it first. Every rank of a group sees the same ``WORLD_SIZE``
and ``MASTER_PORT`` (a new port per rendezvous round), hence the same folder.

Usage (by the drill): ``torchrun ... -m examples.elastic.titan_worker DUMP_ROOT <train args>``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path


def main() -> None:
    root = Path(sys.argv.pop(1))
    group = f"group-{os.environ['WORLD_SIZE']}-{os.environ['MASTER_PORT']}"
    sys.argv += ["--dataloader.dump-batches", str(root / group)]
    from zephon_nodes.integrations.torchtitan.train import main as train

    train()


if __name__ == "__main__":
    main()
