r"""Run ``torchtitan.train`` on GPUs, or on a CPU with the CPU patches when no GPU is visible.

Use it where the TorchTitan docs use ``-m torchtitan.train``; every argument is passed on::

    torchrun --nproc_per_node 2 -m zephon_nodes.integrations.torchtitan.train \
        --module zephon_nodes.integrations.torchtitan.configs \
        --config zephon_llama3_debugmodel --dataloader.recipe recipe.toml ...

With a GPU it is exactly ``torchtitan.train``. Without one it first applies
:mod:`zephon_nodes.integrations.torchtitan.cpu` and adds
``--parallelism.spmd-backend partial_dtensor`` unless the command line sets it: the CPU
path is for trying a job and for tests, not for training a real model.
"""

from __future__ import annotations

import os
import sys

__all__ = ["check_paths", "main"]

_SPMD = "--parallelism.spmd-backend"
_ABSOLUTE = ("--checkpoint.initial-load-path",)


def check_paths(argv: list[str]) -> str | None:
    """Return a one-line error for a relative path TorchTitan refuses late, else None.

    TorchTitan checks ``--checkpoint.initial-load-path`` only after building the model
    (tens of seconds into the job) and refuses a relative one; this says so at once.
    """
    spellings = {s: s for s in _ABSOLUTE} | {"--" + s[2:].replace("-", "_"): s for s in _ABSOLUTE}
    for i, arg in enumerate(argv):
        name, eq, value = arg.partition("=")
        if name not in spellings:
            continue
        if not eq:
            value = argv[i + 1] if i + 1 < len(argv) else ""
        if value and not os.path.isabs(value):
            return (
                f"{spellings[name]} {value!r} is a relative path; TorchTitan needs an absolute "
                f'one: pass "$PWD/{value}"'
            )
    return None


def main() -> None:
    """Apply the CPU patches when no GPU is visible, then run ``torchtitan.train.main``."""
    problem = check_paths(sys.argv[1:])
    if problem is not None:
        print(f"error: {problem}", file=sys.stderr)
        raise SystemExit(2)
    import torch  # after the path check: a wrong path is refused at once, not after ~5 s

    if not torch.cuda.is_available():
        from zephon_nodes.integrations.torchtitan.cpu import apply

        apply()
        argv = sys.argv[1:]
        spellings = (_SPMD, _SPMD.replace("-", "_"))
        if not any(a.split("=")[0] in spellings for a in argv):
            sys.argv += [_SPMD, "partial_dtensor"]
    from torchtitan import train

    train.main()


if __name__ == "__main__":
    main()
