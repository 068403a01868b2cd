"""Vision-language data: image sources, decode, placeholder tokenization, multimodal packing.

Only the recipe table is imported here (the recipe module imports it); the operators live
in :mod:`zephon_nodes.multimodal.decode`, :mod:`~zephon_nodes.multimodal.records`,
:mod:`~zephon_nodes.multimodal.tokenize` and :mod:`~zephon_nodes.multimodal.pack`.
"""

from zephon_nodes.recipe.image import ImageSpec

__all__ = ["ImageSpec"]
