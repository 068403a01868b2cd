"""Assemble a ``[chat]`` recipe's template and stateless operator chain."""

from __future__ import annotations

from typing import Any

from zephon_nodes.chat.render import RenderChat
from zephon_nodes.chat.template import ChatTemplate
from zephon_nodes.core.errors import RecipeError
from zephon_nodes.operators.bestfit import LongDocuments
from zephon_nodes.operators.chain import Chain
from zephon_nodes.operators.tokenize import (
    HFTokenizer,
    SentencePieceTokenizer,
    Tokenizer,
    loaded_sha256,
)
from zephon_nodes.recipe import Recipe

__all__ = ["chat_chain", "chat_template"]


def _piece(tok: Tokenizer, token_id: int) -> str | None:
    if token_id < 0:
        return None
    if isinstance(tok, HFTokenizer):
        piece = tok.tok.id_to_token(token_id)
        return str(piece) if piece is not None else None
    if isinstance(tok, SentencePieceTokenizer):
        return str(tok.sp.id_to_piece(token_id))
    return None


def chat_template(recipe: Recipe, tok: Tokenizer) -> ChatTemplate:
    """Load the recipe's chat template with its bos/eos token texts.

    The texts come from ``[chat]`` ``bos_token`` / ``eos_token``, else from the
    ``tokenizer_config.json``, else from the tokenizer's bos/eos pieces.
    """
    chat = recipe.chat
    assert chat is not None
    path = chat.template_path(recipe.chat_tokenizer_path())
    template = ChatTemplate.load(path, bos_token=chat.bos_token, eos_token=chat.eos_token)
    defaults: dict[str, Any] = {}
    for key, token_id in (("bos_token", tok.bos_id), ("eos_token", tok.eos_id)):
        piece = _piece(tok, token_id)
        if piece is not None:
            defaults[key] = piece
    return template.with_tokens(**defaults)


def chat_chain(recipe: Recipe, tok: Tokenizer) -> Chain:
    """Return a chat recipe's stateless operators.

    Render+tokenize+mask, then (best-fit packing only) the long-document rule.
    """
    assert recipe.chat is not None
    skip = frozenset(i for i, d in enumerate(recipe.datasets) if d.on_error == "skip")
    custom = tok if recipe.tokenizer.kind == "custom" else None
    if custom is not None and not hasattr(custom, "encode_with_offsets"):
        raise RecipeError(
            f"custom tokenizer {recipe.tokenizer.name!r} ({type(custom).__name__}) cannot be "
            f"used with [chat]: it needs encode_with_offsets(text) -> (ids, [(start, end) "
            f"character offsets])"
        )
    sha256 = loaded_sha256(recipe.tokenizer, tok)
    template = chat_template(recipe, tok)
    ops: list[Any] = [
        RenderChat(recipe.tokenizer, recipe.chat, template, skip, custom, sha256=sha256)
    ]
    if recipe.pack.mode == "bestfit":
        ops.append(LongDocuments(recipe.seq_len, recipe.pack.long_documents))
    return Chain(ops)
