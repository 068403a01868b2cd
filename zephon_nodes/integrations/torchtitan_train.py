r"""Run ``torchtitan.train`` on GPUs, or on a CPU with the CPU patches when no GPU is visible.

Use it where the TorchTitan docs use ``-m torchtitan.train``; every argument is passed on::

    torchrun --nproc_per_node 2 -m zephon_nodes.integrations.torchtitan_train \
        --module zephon_nodes.integrations.torchtitan_configs \
        --config zephon_llama3_debugmodel --dataloader.recipe recipe.toml ...

With a GPU it is exactly ``torchtitan.train``. Without one it first applies
:mod:`zephon_nodes.integrations.torchtitan_cpu` and adds
``--parallelism.spmd-backend partial_dtensor`` unless the command line sets it: the CPU
path is for trying a job and for tests, not for training a real model.
"""

from __future__ import annotations

import sys

import torch

__all__ = ["main"]

_SPMD = "--parallelism.spmd-backend"


def main() -> None:
    """Apply the CPU patches when no GPU is visible, then run ``torchtitan.train.main``."""
    if not torch.cuda.is_available():
        from zephon_nodes.integrations.torchtitan_cpu import apply

        apply()
        argv = sys.argv[1:]
        spellings = (_SPMD, _SPMD.replace("-", "_"))
        if not any(a.split("=")[0] in spellings for a in argv):
            sys.argv += [_SPMD, "partial_dtensor"]
    from torchtitan import train

    train.main()


if __name__ == "__main__":
    main()
