"""TorchTitan integration: ``ZephonDataLoader`` for TorchTitan 0.3.0 and for TorchTitan main.

``from zephon_nodes.integrations.torchtitan import ZephonDataLoader`` gives the adapter of
the installed TorchTitan, chosen by the features of its API (:mod:`.api`, never a version
string): :mod:`.adapter_030` (``[rows, seq_len]`` micro-batches) or :mod:`.adapter_main`
(flat token batches). Both store the same DCP keys (:mod:`zephon_nodes.state.dcp`), so a
checkpoint of one resumes under the other. An unsupported TorchTitan fails at the first use
of ``ZephonDataLoader``, ``API``, ``check_launch`` or ``TitanDataLoader`` (the installed
TorchTitan's ``BaseDataLoader``), naming what it found and what is supported; importing a
module of the package (:mod:`.cpu`, :mod:`.hf_assets`) imports no TorchTitan module.
:mod:`.override` plugs the loader into any TorchTitan job with one ``--override.imports``
argument; :mod:`.configs` is a config module of TorchTitan's debug model with the loader.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from zephon_nodes.integrations.torchtitan.api import (
    SUPPORTED,
    Api,
    UnsupportedTorchTitanError,
    detect_api,
)

if TYPE_CHECKING:  # the 0.3.0 names stand for both adapters' (the same interface)
    from torchtitan.components.dataloader import BaseDataLoader as TitanDataLoader

    from zephon_nodes.integrations.torchtitan.adapter_030 import ZephonDataLoader, check_launch
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

    API: Api
    """The installed TorchTitan's data-loader API: ``"0.3"`` or ``"main"``."""

_ADAPTER_NAMES = ("ZephonDataLoader", "check_launch", "TitanDataLoader", "API")
_COMMON_NAMES = (
    "check_agreement",
    "check_stages",
    "check_tokenizer",
    "from_dcp_state",
    "loader_metrics",
)
_DCP_NAMES = (
    "DCP_FORMAT",
    "DCP_FORMAT_RELANED",
    "DCP_FORMAT_STAGED",
    "LANE_PREFIX",
    "MIXTURE_LANE_PREFIX",
    "RECIPE_PREFIX",
    "STAGE_LANE_PREFIX",
    "lane_check",
    "lane_key",
    "mixture_digest",
    "mixture_lane_key",
    "to_dcp_state",
)


def __getattr__(name: str) -> Any:
    """Resolve the installed TorchTitan's adapter at first use (PEP 562).

    Importing a module of this package (the CPU patches, ``hf_assets``, the launcher) imports
    neither TorchTitan nor torch: the CPU patches must run before TorchTitan's first import,
    and the launcher refuses a bad path before torch's seconds of import.
    """
    if name in _COMMON_NAMES or name in _DCP_NAMES:
        where = f"{__name__}.common" if name in _COMMON_NAMES else "zephon_nodes.state.dcp"
        value = getattr(importlib.import_module(where), name)
        globals()[name] = value
        return value
    if name not in _ADAPTER_NAMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    api = detect_api()
    loader, adapter = (
        ("torchtitan.components.data.loader", "adapter_main")
        if api == "main"
        else ("torchtitan.components.dataloader", "adapter_030")
    )
    module = importlib.import_module(f"{__name__}.{adapter}")
    found = {
        "API": api,
        "ZephonDataLoader": module.ZephonDataLoader,
        "check_launch": module.check_launch,
        "TitanDataLoader": importlib.import_module(loader).BaseDataLoader,
    }
    globals().update(found)
    return found[name]


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
    "TitanDataLoader",
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
