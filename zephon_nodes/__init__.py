"""zephon-nodes: elastically deterministic LLM training data on torchdata.nodes.

The same recipe yields the same global batches, byte for byte, whatever the number of
data-parallel ranks, loader workers or restarts.

This package exports what a user writes: the recipe and its tables, the registries of named
user code, the pipeline and its worker pool, checkpoint files, the checks (``simulate``, the
digests, the testing kit's ``assert_elastic``) and the errors. The parts are reached through
their packages (``zephon_nodes.engine.lane.Lane``, ``zephon_nodes.io``, ...); the TorchTitan
loader is ``zephon_nodes.integrations.torchtitan.ZephonDataLoader``. ``docs/architecture.md``
says where each concept lives.
"""

import importlib
from typing import TYPE_CHECKING, Any

from zephon_nodes.core.errors import (
    CheckpointError,
    DataError,
    RecipeError,
    WorkerError,
    ZephonError,
)
from zephon_nodes.recipe import (
    ChatSpec,
    DatasetSpec,
    ImageSpec,
    MixtureSpec,
    OperatorSpec,
    PackSpec,
    Recipe,
    ShuffleSpec,
    TokenizerSpec,
    WorkSpec,
)
from zephon_nodes.recipe.registry import register_filter, register_map, register_tokenizer
from zephon_nodes.state import load_state, merge_states, save_state

if TYPE_CHECKING:
    from zephon_nodes.engine.accumulate import AccumulatorNode
    from zephon_nodes.engine.loader_state import (
        load_rank_state,
        rank_state,
        reshard_loader_states,
    )
    from zephon_nodes.engine.parallel_map import OrderedParallelMap
    from zephon_nodes.engine.pipeline import Pipeline
    from zephon_nodes.engine.pool import WorkerPool
    from zephon_nodes.engine.torchdata_stage import TorchdataStage
    from zephon_nodes.testing import assert_elastic
    from zephon_nodes.verification.digest import digest_microbatches, global_batch_digest
    from zephon_nodes.verification.simulate import simulate

# What needs torch is imported on first use, so that `import zephon_nodes` (and the command
# line's `--help`, `lanes`, `inspect`, `index`) starts without it; the testing kit needs
# hypothesis (the `testing` extra).
_LAZY = {
    "AccumulatorNode": "zephon_nodes.engine.accumulate",
    "rank_state": "zephon_nodes.engine.loader_state",
    "reshard_loader_states": "zephon_nodes.engine.loader_state",
    "load_rank_state": "zephon_nodes.engine.loader_state",
    "OrderedParallelMap": "zephon_nodes.engine.parallel_map",
    "Pipeline": "zephon_nodes.engine.pipeline",
    "WorkerPool": "zephon_nodes.engine.pool",
    "TorchdataStage": "zephon_nodes.engine.torchdata_stage",
    "assert_elastic": "zephon_nodes.testing",
    "digest_microbatches": "zephon_nodes.verification.digest",
    "global_batch_digest": "zephon_nodes.verification.digest",
    "simulate": "zephon_nodes.verification.simulate",
}

__version__ = "0.1.0"

__all__ = [
    # The recipe and its tables
    "Recipe",
    "DatasetSpec",
    "TokenizerSpec",
    "WorkSpec",
    "ShuffleSpec",
    "PackSpec",
    "MixtureSpec",
    "OperatorSpec",
    "ImageSpec",
    "ChatSpec",
    # Named user code a recipe refers to
    "register_filter",
    "register_map",
    "register_tokenizer",
    # Running a recipe
    "Pipeline",
    "WorkerPool",
    # Nodes for custom operators inside lanes (docs/custom-operator.md, docs/torchdata.md)
    "AccumulatorNode",
    "OrderedParallelMap",
    "TorchdataStage",
    # Checkpoint files, and a rank's state inside a whole torchdata Loader state (restoring
    # the Loaders of one dp size at another: reshard_loader_states, then load_rank_state)
    "load_state",
    "merge_states",
    "save_state",
    "rank_state",
    "reshard_loader_states",
    "load_rank_state",
    # Checking a recipe
    "simulate",
    "global_batch_digest",
    "digest_microbatches",
    "assert_elastic",
    # Errors
    "ZephonError",
    "RecipeError",
    "DataError",
    "CheckpointError",
    "WorkerError",
    "__version__",
]


def __getattr__(name: str) -> Any:
    """Import a name of :data:`_LAZY` on first use (its module needs torch or hypothesis)."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'zephon_nodes' has no attribute {name!r}")

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
