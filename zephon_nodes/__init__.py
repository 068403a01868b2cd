"""zephon-nodes: elastically deterministic LLM training data on torchdata.nodes.

The same recipe yields the same global batches, byte for byte, whatever the number of
data-parallel ranks, loader workers or restarts.
"""

from zephon_nodes.core.flush import Flush
from zephon_nodes.engine.accumulate import AccumulatorNode
from zephon_nodes.engine.checkpoint import load_state, merge_states, save_state
from zephon_nodes.engine.lane import Lane, WorkItemNode
from zephon_nodes.engine.multiplexer import Multiplexer
from zephon_nodes.engine.parallel_map import OrderedParallelMap
from zephon_nodes.engine.pipeline import Pipeline, lanes_for_rank
from zephon_nodes.engine.pool import WorkerPool
from zephon_nodes.engine.torchdata_stage import TorchdataStage
from zephon_nodes.engine.work import DatasetWorkSource, WorkItem, WorkSource
from zephon_nodes.errors import CheckpointError, DataError, RecipeError, WorkerError, ZephonError
from zephon_nodes.io.dataset import Dataset
from zephon_nodes.recipe.datasets import DatasetSpec
from zephon_nodes.recipe.mixture import MixtureSpec
from zephon_nodes.recipe.operators import OperatorSpec
from zephon_nodes.recipe.packing import PackSpec
from zephon_nodes.recipe.recipe import Recipe
from zephon_nodes.recipe.registry import register_filter, register_map, register_tokenizer
from zephon_nodes.recipe.shuffle import ShuffleSpec
from zephon_nodes.recipe.tokenizer import TokenizerSpec
from zephon_nodes.recipe.work import WorkSpec
from zephon_nodes.verification.digest import digest_microbatches, global_batch_digest
from zephon_nodes.verification.simulate import simulate

__version__ = "0.1.0"

__all__ = [
    "AccumulatorNode",
    "CheckpointError",
    "DataError",
    "Dataset",
    "DatasetSpec",
    "DatasetWorkSource",
    "Flush",
    "Lane",
    "MixtureSpec",
    "Multiplexer",
    "OperatorSpec",
    "OrderedParallelMap",
    "PackSpec",
    "Pipeline",
    "Recipe",
    "RecipeError",
    "ShuffleSpec",
    "TokenizerSpec",
    "TorchdataStage",
    "WorkItem",
    "WorkItemNode",
    "WorkSource",
    "WorkSpec",
    "WorkerError",
    "WorkerPool",
    "ZephonError",
    "__version__",
    "digest_microbatches",
    "global_batch_digest",
    "lanes_for_rank",
    "load_state",
    "merge_states",
    "register_filter",
    "register_map",
    "register_tokenizer",
    "save_state",
    "simulate",
]
