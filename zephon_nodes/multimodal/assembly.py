"""Assemble a multimodal recipe's stateless chain and packer."""

from __future__ import annotations

from zephon_nodes.core.errors import RecipeError
from zephon_nodes.multimodal.decode import DecodeImages
from zephon_nodes.multimodal.pack import MultimodalPacker
from zephon_nodes.multimodal.records import DEFAULT_IMAGE_FIELD, ParseMultimodal
from zephon_nodes.multimodal.tokenize import TokenizeMultimodal
from zephon_nodes.operators.chain import Chain
from zephon_nodes.operators.tokenize import Tokenizer, loaded_sha256
from zephon_nodes.recipe import Recipe
from zephon_nodes.recipe.image import ImageSpec

__all__ = ["make_packer", "multimodal_chain", "placeholder_id"]


def _image(recipe: Recipe) -> ImageSpec:
    if recipe.image is None:
        raise RecipeError("this recipe has no [image] table")
    return recipe.image


def placeholder_id(recipe: Recipe, tokenizer: Tokenizer) -> int:
    """The recipe's placeholder id: ``image.placeholder_id``, else the tokenizer's vocab size."""
    image = _image(recipe)
    if image.placeholder_id is not None:
        return image.placeholder_id
    size = getattr(tokenizer, "vocab_size", None)
    if not isinstance(size, int):
        raise RecipeError(
            "image.placeholder_id is required: the tokenizer does not say its vocab_size"
        )
    return size


def multimodal_chain(recipe: Recipe, tokenizer: Tokenizer) -> Chain:
    """Return the pool-side operators of a multimodal recipe: parse, decode, tokenize."""
    image = _image(recipe)
    skip = frozenset(i for i, d in enumerate(recipe.datasets) if d.on_error == "skip")
    fields = tuple(d.image_field or DEFAULT_IMAGE_FIELD for d in recipe.datasets)
    custom = tokenizer if recipe.tokenizer.kind == "custom" else None
    return Chain(
        [
            ParseMultimodal(fields, skip),
            DecodeImages(image, skip),
            TokenizeMultimodal(
                recipe.tokenizer,
                placeholder_id(recipe, tokenizer),
                image.merge,
                tokenizer=custom,
                sha256=loaded_sha256(recipe.tokenizer, tokenizer),
            ),
        ]
    )


def make_packer(
    recipe: Recipe, pad_id: int, placeholder: int, provenance: bool = False
) -> MultimodalPacker:
    """Return a fresh packer for one flush window."""
    return MultimodalPacker(recipe.seq_len, pad_id, _image(recipe), placeholder, provenance)
