"""The recipe's ``[pack]`` table: how documents are packed into ``seq_len`` samples."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from zephon_nodes.errors import RecipeError
from zephon_nodes.recipe.bounds import check_setting

__all__ = ["LONG_DOCUMENTS", "PACK_MODES", "PackSpec"]

PACK_MODES = ("concat", "bestfit")
LONG_DOCUMENTS = ("split", "drop")


@dataclass(frozen=True)
class PackSpec:
    """How documents are packed into ``seq_len`` samples.

    Args:
        mode: ``"concat"``: TorchTitan-compatible concatenation (labels shifted inside each
            document, positions reset per document).
            ``"bestfit"``: documents are not split; each goes whole into the open sample with
            the least room that fits it (samples carry ``document_ids``).
        pad_id: Input id used to pad the partial sample emitted at a flush; ``None`` uses the
            tokenizer's pad id, or its eos id when it has none.
        long_documents: ``"bestfit"`` only: a document longer than ``seq_len`` is cut into
            ``seq_len`` pieces (``"split"``, default) or dropped and counted (``"drop"``).
        bins: ``"bestfit"`` only: samples held open at once (more: less padding).
    """

    mode: str = "concat"
    pad_id: int | None = None
    long_documents: str = "split"
    bins: int = 16

    def __post_init__(self) -> None:
        if self.mode not in PACK_MODES:
            raise RecipeError(f"pack.mode={self.mode!r} must be one of {PACK_MODES}")
        if self.long_documents not in LONG_DOCUMENTS:
            raise RecipeError(
                f"pack.long_documents={self.long_documents!r} must be one of {LONG_DOCUMENTS}"
            )
        check_setting("pack.bins", self.bins)
        if self.pad_id is not None:
            check_setting("pack.pad_id", self.pad_id)

    def canonical(self) -> dict[str, Any]:
        """Data-defining fields (best-fit settings only in best-fit mode)."""
        out: dict[str, Any] = {"mode": self.mode, "pad_id": self.pad_id}
        if self.mode == "bestfit":
            out["long_documents"] = self.long_documents
            out["bins"] = self.bins
        return out
