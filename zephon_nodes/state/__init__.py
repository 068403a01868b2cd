"""Checkpoint state: the schema, codec, files, multi-rank layout, merge, lineage and DCP codec.

One package owns every byte of a saved state; the engine, the CLI and both TorchTitan adapters
read and write checkpoints only through it. It sits above ``recipe`` and ``io`` and below the
engine: nothing here imports the engine or the operators.

==================  ==========================================================================
module              concept
==================  ==========================================================================
``schema``          the version, the key names (defined once), :class:`RankState`
``identity``        the recipe's fingerprint and summary in a state, what differs
``validate``        a state against the recipe that resumes it (positions vs step)
``mixture``         the dynamic-mixture section (decision log, effect windows, their checks)
``lineage``         the lineage of a re-laned state
``codec``           checksummed canonical JSON
``files``           the single-file state, atomic writes
``layout``          the multi-rank layout, commit markers, newest-complete fallback
``merge``           merging rank states into one global state
``locate``          the library state inside a ``torchdata`` ``Loader`` state
``migrate``         upgrading what older versions wrote
==================  ==========================================================================

The stable import path of the load/save helpers is this package (``from zephon_nodes.state
import load_state, save_state, merge_states, load_checkpoint, ...``); the replay of a
``Loader`` state to a step boundary, which needs the pipeline, is
:func:`zephon_nodes.rank_state`.
"""

from zephon_nodes.state.codec import decode_checked, encode_checked
from zephon_nodes.state.files import STATE_FILE, check_writable, load_state, save_state
from zephon_nodes.state.identity import recipe_identity, recipe_summary, summary_diff
from zephon_nodes.state.layout import (
    COMMIT_FILE,
    checkpoint_path,
    commit_checkpoint,
    latest_checkpoint,
    load_checkpoint,
    save_rank_state,
)
from zephon_nodes.state.lineage import Lineage
from zephon_nodes.state.locate import unwrap_state
from zephon_nodes.state.merge import merge_states
from zephon_nodes.state.schema import FORMAT, SCHEMA_VERSION, RankState
from zephon_nodes.state.validate import validate_state

__all__ = [
    "COMMIT_FILE",
    "FORMAT",
    "SCHEMA_VERSION",
    "STATE_FILE",
    "Lineage",
    "RankState",
    "check_writable",
    "checkpoint_path",
    "commit_checkpoint",
    "decode_checked",
    "encode_checked",
    "latest_checkpoint",
    "load_checkpoint",
    "load_state",
    "merge_states",
    "recipe_identity",
    "recipe_summary",
    "save_rank_state",
    "save_state",
    "summary_diff",
    "unwrap_state",
    "validate_state",
]
