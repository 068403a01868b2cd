"""TorchTitan integration: ``ZephonDataLoader`` for TorchTitan 0.3.0 and for TorchTitan main.

``from zephon_nodes.integrations.torchtitan import ZephonDataLoader`` gives the adapter of
the installed TorchTitan, chosen by the features of its API (:mod:`.api`, never a version
string): :mod:`.adapter_030` (``[rows, seq_len]`` micro-batches) or :mod:`.adapter_main`
(flat token batches). Both store the same DCP keys (:mod:`zephon_nodes.state.dcp`), so a
checkpoint of one resumes under the other. An unsupported TorchTitan fails here, at import,
naming what it found and what is supported.
"""

from __future__ import annotations

from zephon_nodes.integrations.torchtitan.api import (
    SUPPORTED,
    UnsupportedTorchTitanError,
    detect_api,
)
from zephon_nodes.integrations.torchtitan.common import (
    check_agreement,
    check_stages,
    check_tokenizer,
    from_dcp_state,
    loader_metrics,
)
from zephon_nodes.state.dcp import (
    DCP_FORMAT,
    DCP_FORMAT_RELANED,
    DCP_FORMAT_STAGED,
    LANE_PREFIX,
    MIXTURE_LANE_PREFIX,
    RECIPE_PREFIX,
    STAGE_LANE_PREFIX,
    lane_check,
    lane_key,
    mixture_digest,
    mixture_lane_key,
    to_dcp_state,
)

API = detect_api()
"""The installed TorchTitan's data-loader API: ``"0.3"`` or ``"main"``."""

if API == "main":
    from zephon_nodes.integrations.torchtitan.adapter_main import (
        ZephonDataLoader,
        check_launch,
    )
else:
    from zephon_nodes.integrations.torchtitan.adapter_030 import (  # type: ignore[assignment]
        ZephonDataLoader,
        check_launch,
    )

__all__ = [
    "API",
    "DCP_FORMAT",
    "DCP_FORMAT_RELANED",
    "DCP_FORMAT_STAGED",
    "LANE_PREFIX",
    "MIXTURE_LANE_PREFIX",
    "RECIPE_PREFIX",
    "STAGE_LANE_PREFIX",
    "SUPPORTED",
    "UnsupportedTorchTitanError",
    "ZephonDataLoader",
    "check_agreement",
    "check_launch",
    "check_stages",
    "check_tokenizer",
    "detect_api",
    "from_dcp_state",
    "lane_check",
    "lane_key",
    "loader_metrics",
    "mixture_digest",
    "mixture_lane_key",
    "to_dcp_state",
]
