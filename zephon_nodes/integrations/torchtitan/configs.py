r"""Example TorchTitan config registry (0.3.0 and main): llama3's debug model, ZephonDataLoader.

Use it as TorchTitan's ``--module``; every config function returns a ``Trainer.Config``::

    torchrun --nproc_per_node 2 -m torchtitan.train \
        --module zephon_nodes.integrations.torchtitan.configs \
        --config zephon_llama3_debugmodel \
        --dataloader.recipe data/recipe.toml --hf-assets-path data/hf_assets \
        --training.seq-len 256 --training.local-batch-size 4 \
        --training.global-batch-size 16

``--training.seq-len`` must equal the recipe's ``seq_len`` and ``--training.global-batch-size``
its ``global_batch_size`` (the loader checks seq_len at launch; see ``docs/torchtitan.md``).
On TorchTitan main the same module serves, with main's options instead:
``--training.max-context-length``, ``--training.num-tokens-per-microbatch-per-dp-rank`` and
``--training.num-tokens-per-train-step`` (``global_batch_size x seq_len``).
Importing this module imports ``torchtitan.trainer``, which needs ``triton`` (the
``trainer`` extra).
"""

from __future__ import annotations

from torchtitan.models.llama3.config_registry import llama3_debugmodel
from torchtitan.trainer import Trainer

from zephon_nodes.integrations.torchtitan import ZephonDataLoader
from zephon_nodes.integrations.torchtitan.metrics import with_zephon_metrics

__all__ = ["zephon_llama3_debugmodel"]


def zephon_llama3_debugmodel() -> Trainer.Config:
    """Llama3 ``debugmodel`` (6 layers, dim 256, vocab 2048) with :class:`ZephonDataLoader`.

    Everything but the dataloader and the metrics processor (which also logs the loader's
    metrics) is TorchTitan's ``llama3_debugmodel``; pass the recipe
    with ``--dataloader.recipe`` and the matching tokenizer folder with ``--hf-assets-path``.
    """
    config = llama3_debugmodel()
    config.dataloader = ZephonDataLoader.Config()
    config.metrics = with_zephon_metrics(config.metrics)  # logs the loader's metrics too
    return config
