"""Vision-language data: image sources, decode, placeholder tokenization, multimodal packing.

The operators live in :mod:`zephon_nodes.multimodal.decode`,
:mod:`~zephon_nodes.multimodal.records`, :mod:`~zephon_nodes.multimodal.tokenize` and
:mod:`~zephon_nodes.multimodal.pack`; the recipe's ``[image]`` table is
:mod:`zephon_nodes.recipe.image` (re-exported here as :class:`ImageSpec`).
"""

from zephon_nodes.recipe.image import ImageSpec

__all__ = ["ImageSpec"]
