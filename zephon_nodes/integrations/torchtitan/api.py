"""Which TorchTitan data-loader API is installed, found by its features (never its version).

Two APIs are supported:

* ``"0.3"`` (TorchTitan 0.3.0): ``torchtitan.components.dataloader.BaseDataLoader``, built
  with ``seq_len`` and ``local_batch_size`` (``TrainingConfig`` has both fields);
* ``"main"`` (TorchTitan's main branch since the Grain loader, b5bcd76 and later):
  ``torchtitan.components.data.loader.BaseDataLoader`` with ``DataloaderExhaustedError``,
  built with ``max_context_length`` and ``num_tokens_per_batch`` (``TrainingConfig`` has
  ``num_tokens_per_microbatch_per_dp_rank``).
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
from typing import Literal

__all__ = ["SUPPORTED", "UnsupportedTorchTitanError", "detect_api"]

Api = Literal["0.3", "main"]

SUPPORTED = (
    "TorchTitan 0.3.0 (torchtitan.components.dataloader.BaseDataLoader; "
    "training.seq_len / training.local_batch_size) or TorchTitan main "
    "(torchtitan.components.data.loader.BaseDataLoader and DataloaderExhaustedError; "
    "training.num_tokens_per_microbatch_per_dp_rank / training.max_context_length)"
)


class UnsupportedTorchTitanError(ImportError):
    """The installed TorchTitan has neither data-loader API this package supports."""


def _has_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:
        return False


def _training_fields() -> set[str]:
    try:
        configs = importlib.import_module("torchtitan.config.configs")
    except ImportError:
        return set()
    cls = getattr(configs, "TrainingConfig", None)
    if cls is None or not dataclasses.is_dataclass(cls):
        return set()
    return {f.name for f in dataclasses.fields(cls)}


def detect_api() -> Api:
    """Return the installed TorchTitan's data-loader API.

    Raises:
        UnsupportedTorchTitanError: When TorchTitan is missing or has neither API, naming
            what was found and what is supported.
    """
    try:
        torchtitan = importlib.import_module("torchtitan")
    except ImportError as e:
        raise UnsupportedTorchTitanError(
            f"zephon_nodes.integrations.torchtitan needs TorchTitan ({e}); supported: "
            f"{SUPPORTED}. Install `zephon-nodes[torchtitan]` for 0.3.0, or TorchTitan main "
            f"from source (docs/torchtitan.md)"
        ) from None
    training = _training_fields()
    found = []
    if _has_module("torchtitan.components.data.loader"):
        loader = importlib.import_module("torchtitan.components.data.loader")
        base = getattr(loader, "BaseDataLoader", None)
        ok = (
            base is not None
            and hasattr(loader, "DataloaderExhaustedError")
            and hasattr(base, "close")
            and "num_tokens_per_microbatch_per_dp_rank" in training
            and "max_context_length" in training
        )
        if ok:
            return "main"
        found.append("torchtitan.components.data.loader")
    if _has_module("torchtitan.components.dataloader"):
        loader = importlib.import_module("torchtitan.components.dataloader")
        if hasattr(loader, "BaseDataLoader") and {"seq_len", "local_batch_size"} <= training:
            return "0.3"
        found.append("torchtitan.components.dataloader")
    where = getattr(torchtitan, "__file__", "?")
    version = getattr(torchtitan, "__version__", "unknown")
    have = ", ".join(found) or "no data-loader module"
    fields = ", ".join(sorted(f for f in training if "token" in f or "len" in f or "batch" in f))
    raise UnsupportedTorchTitanError(
        f"unsupported TorchTitan at {where} (version label {version!r}): found {have} and "
        f"training fields [{fields or 'none'}]; supported: {SUPPORTED}"
    )
