"""The checkpoint helpers' former home; they live in :mod:`zephon_nodes.state` now.

Kept so that code written against ``zephon_nodes.engine.checkpoint`` keeps working; new code
imports from :mod:`zephon_nodes.state` (see ``docs/checkpoint.md``).
"""

from __future__ import annotations

from zephon_nodes.state.codec import CHECKSUM_KEY, decode_checked, encode_checked
from zephon_nodes.state.files import STATE_FILE, check_writable, load_state, save_state
from zephon_nodes.state.identity import contents_diff, fingerprint_pair, recipe_summary
from zephon_nodes.state.layout import (
    COMMIT_FILE,
    MAX_WORLD_SIZE,
    checkpoint_path,
    commit_checkpoint,
    latest_checkpoint,
    load_checkpoint,
    save_rank_state,
)
from zephon_nodes.state.locate import unwrap_state
from zephon_nodes.state.merge import merge_states
from zephon_nodes.state.schema import FORMAT
from zephon_nodes.state.validate import validate_state

__all__ = [
    "CHECKSUM_KEY",
    "COMMIT_FILE",
    "FORMAT",
    "MAX_WORLD_SIZE",
    "STATE_FILE",
    "check_writable",
    "checkpoint_path",
    "commit_checkpoint",
    "contents_diff",
    "decode_checked",
    "encode_checked",
    "fingerprint_pair",
    "latest_checkpoint",
    "load_checkpoint",
    "load_state",
    "merge_states",
    "recipe_summary",
    "save_rank_state",
    "save_state",
    "unwrap_state",
    "validate_state",
]
