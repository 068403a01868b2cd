"""Opt-in patches that let TorchTitan's real Trainer (0.3.0 and main) run on a CPU with gloo.

Neither TorchTitan 0.3.0 nor main (b5bcd76) has a CPU training path; the same four patches
serve both (the patched names are the same on main). These patches make one, for trying a job, the
walk-through in ``examples/torchtitan`` and tests on a machine without a GPU; a job on GPUs
never needs them, and nothing in the library applies them on import. Use the launcher
:mod:`zephon_nodes.integrations.torchtitan.train`, which applies them only when no GPU is
visible, or call :func:`apply` before any other torchtitan import (many of its modules copy
``device_type`` / ``device_module`` when they are imported). The four patches:

1. a CPU ``device_type`` and a stand-in ``device_module`` (TorchTitan falls back to "cuda");
2. FlexAttention has no CPU backward in torch 2.13: eager attention over the dense mask
   of the block mask's ``mask_mod``, and the uncompiled ``create_block_mask``;
3. gloo rejects FSDP's ``PREMUL_SUM``: force sum reduction once the divide factor is set
   (the same math at TorchTitan's divide factor 1.0);
4. ``torch.distributed.set_timeout`` is missing in torch 2.13: map it to the c10d helper.
"""

from __future__ import annotations

import collections
from types import SimpleNamespace
from typing import Any

import torch

__all__ = ["apply"]


class _CpuDeviceModule:
    """The parts of ``torch.cuda`` TorchTitan calls, answered for the CPU."""

    @staticmethod
    def set_device(*_: Any) -> None:
        pass

    @staticmethod
    def current_device() -> int:
        return 0

    @staticmethod
    def device_count() -> int:
        return 1

    @staticmethod
    def synchronize(*_: Any) -> None:
        pass

    @staticmethod
    def get_device_name(*_: Any) -> str:
        return "cpu"

    @staticmethod
    def get_device_properties(*_: Any) -> Any:
        return SimpleNamespace(name="cpu", total_memory=64 << 30)

    @staticmethod
    def memory_stats(*_: Any) -> dict[str, int]:
        return collections.defaultdict(int)

    @staticmethod
    def reset_peak_memory_stats(*_: Any) -> None:
        pass

    @staticmethod
    def empty_cache() -> None:
        pass

    @staticmethod
    def manual_seed(seed: int) -> None:
        torch.manual_seed(seed)

    @staticmethod
    def manual_seed_all(seed: int) -> None:
        torch.manual_seed(seed)

    @staticmethod
    def is_available() -> bool:
        return True


def _eager_flex_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    score_mod: Any = None,
    block_mask: Any = None,
    scale: float | None = None,
    enable_gqa: bool = False,
    return_aux: Any = None,
    kernel_options: Any = None,
) -> tuple[torch.Tensor, Any]:
    """FlexAttention's math, eagerly, over the dense mask of ``block_mask.mask_mod``."""
    from torch.nn.attention.flex_attention import AuxOutput, create_mask

    assert score_mod is None, "score_mod is not supported by the CPU patch"
    B, H, L, E = q.shape
    if enable_gqa and k.shape[1] != H:
        k = k.repeat_interleave(H // k.shape[1], dim=1)
        v = v.repeat_interleave(H // v.shape[1], dim=1)
    scores = (q @ k.transpose(-2, -1)) * (scale if scale is not None else E**-0.5)
    if block_mask is not None:
        mask = create_mask(block_mask.mask_mod, B, None, L, k.shape[2], device=q.device)
        scores = scores.masked_fill(~mask, float("-inf"))
    lse = torch.logsumexp(scores.float(), dim=-1)
    out = torch.softmax(scores.float(), dim=-1).to(v.dtype) @ v
    want_lse = return_aux is not None and getattr(return_aux, "lse", False)
    return out, AuxOutput(lse=lse if want_lse else None)


def apply() -> None:
    """Apply the four CPU patches (idempotent)."""
    import torchtitan.tools.utils as tt_utils

    tt_utils.device_type = "cpu"
    tt_utils.device_module = _CpuDeviceModule()  # type: ignore[assignment]

    import torch.distributed as dist
    from torch.distributed import distributed_c10d

    if not hasattr(dist, "set_timeout"):

        def set_timeout(timeout: Any, group: Any = None) -> None:
            distributed_c10d._set_pg_timeout(timeout, group)

        dist.set_timeout = set_timeout  # type: ignore[attr-defined]

    from torch.distributed.fsdp import FSDPModule

    if not getattr(FSDPModule.set_gradient_divide_factor, "_zephon_cpu", False):
        original = FSDPModule.set_gradient_divide_factor

        def set_gradient_divide_factor(self: Any, factor: float) -> None:
            original(self, factor)
            self.set_force_sum_reduction_for_comms(True)

        set_gradient_divide_factor._zephon_cpu = True  # type: ignore[attr-defined]
        FSDPModule.set_gradient_divide_factor = set_gradient_divide_factor  # type: ignore[method-assign]

    from torch.nn.attention.flex_attention import create_block_mask
    from torchtitan.models.common import attention

    attention.FlexAttention._compiled_flex_attn = staticmethod(_eager_flex_attention)
    attention._compiled_create_block_mask = create_block_mask
