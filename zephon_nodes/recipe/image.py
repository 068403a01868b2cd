"""The recipe's ``[image]`` table: how images are decoded, cut into patches and tokenized."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from zephon_nodes.core.errors import RecipeError
from zephon_nodes.recipe.bounds import check_setting, unknown_keys

__all__ = ["IMAGE_DTYPES", "IMAGE_MODES", "ImageSpec"]

IMAGE_MODES = ("fixed", "patches")
IMAGE_DTYPES = ("uint8", "float32")
# Pillow's default ``Image.MAX_IMAGE_PIXELS`` (a recipe value, so it never depends on a
# process-wide setting).
DEFAULT_MAX_PIXELS = 89_478_485


@dataclass(frozen=True)
class ImageSpec:
    """How images become patches and placeholder tokens (the ``[image]`` recipe table).

    Every image is decoded (JPEG, PNG or WebP), turned upright by its EXIF orientation,
    converted to RGB and resized; its pixels are cut into ``patch_size`` x ``patch_size``
    patches (row-major, uint8 ``[patch, patch, 3]``), and its document gets one placeholder
    token per ``merge`` x ``merge`` block of patches.

    Args:
        mode: ``"fixed"``: every image is scaled to cover ``size`` and center-cropped to it.
            ``"patches"``: the aspect ratio is kept and the image is resized (never enlarged)
            to a grid of at most ``max_patches`` patches, each side a multiple of
            ``merge`` patches.
        size: ``(height, width)`` in pixels (``"fixed"``); multiples of
            ``patch_size * merge``.
        patch_size: Side of a patch in pixels.
        max_patches: Patch budget per image (``"patches"``).
        merge: One placeholder token stands for ``merge`` x ``merge`` patches.
        placeholder_id: Token id of the image placeholder; ``None``: the tokenizer's
            ``vocab_size`` (an id no text produces).
        max_images: Images per packed sample (the padded ``image_*`` fields' length).
        sample_patches: Patches per packed sample (the padded ``patches`` field's length);
            ``None``: ``max_images`` times the patches of the largest image.
        max_pixels: Images with more pixels (width x height, read from the header before
            decoding) are refused as decompression bombs.
        dtype: ``"uint8"`` (0..255, default: 4x less to move) or ``"float32"`` (0.0..1.0,
            ``value / 255``).
    """

    mode: str = "fixed"
    size: tuple[int, int] = (224, 224)
    patch_size: int = 16
    max_patches: int = 256
    merge: int = 1
    placeholder_id: int | None = None
    max_images: int = 4
    sample_patches: int | None = None
    max_pixels: int = DEFAULT_MAX_PIXELS
    dtype: str = "uint8"

    def __post_init__(self) -> None:
        if self.mode not in IMAGE_MODES:
            raise RecipeError(f"image.mode={self.mode!r} must be one of {IMAGE_MODES}")
        if self.dtype not in IMAGE_DTYPES:
            raise RecipeError(f"image.dtype={self.dtype!r} must be one of {IMAGE_DTYPES}")
        for name in ("patch_size", "max_patches", "merge", "max_images", "max_pixels"):
            check_setting(f"image.{name}", getattr(self, name))
        if self.placeholder_id is not None:
            check_setting("image.placeholder_id", self.placeholder_id)
        if len(self.size) != 2 or not all(isinstance(v, int) and v > 0 for v in self.size):
            raise RecipeError(f"image.size={self.size!r} must be [height, width] in pixels")
        unit = self.patch_size * self.merge
        if self.mode == "fixed" and any(v % unit for v in self.size):
            raise RecipeError(
                f"image.size={list(self.size)} must be multiples of patch_size * merge = {unit}"
            )
        if self.mode == "patches" and self.max_patches < self.merge * self.merge:
            raise RecipeError(
                f"image.max_patches={self.max_patches} must be >= merge**2 = {self.merge**2}"
            )
        if self.placeholder_id is not None and self.placeholder_id < 0:
            raise RecipeError(f"image.placeholder_id={self.placeholder_id} must be >= 0")
        if self.sample_patches is not None and self.sample_patches < self.patches_per_image:
            raise RecipeError(
                f"image.sample_patches={self.sample_patches} must hold one whole image "
                f"({self.patches_per_image} patches)"
            )

    @property
    def patches_per_image(self) -> int:
        """The most patches one image can have."""
        if self.mode == "fixed":
            return (self.size[0] // self.patch_size) * (self.size[1] // self.patch_size)
        return self.max_patches

    @property
    def tokens_per_image(self) -> int:
        """The most placeholder tokens one image can bring."""
        return self.patches_per_image // (self.merge * self.merge)

    @property
    def patches_per_sample(self) -> int:
        """Length of a sample's ``patches`` field."""
        if self.sample_patches is not None:
            return self.sample_patches
        return self.max_images * self.patches_per_image

    def check(self, seq_len: int) -> None:
        """Check that the largest image fits one ``seq_len`` sample with a token after it."""
        if self.tokens_per_image + 1 > seq_len:
            raise RecipeError(
                f"an image brings up to {self.tokens_per_image} placeholder tokens; "
                f"seq_len={seq_len} must be at least {self.tokens_per_image + 1}"
            )

    def canonical(self) -> dict[str, Any]:
        """Data-defining fields (all of them)."""
        return {
            "mode": self.mode,
            "size": list(self.size) if self.mode == "fixed" else None,
            "patch_size": self.patch_size,
            "max_patches": self.max_patches if self.mode == "patches" else None,
            "merge": self.merge,
            "placeholder_id": self.placeholder_id,
            "max_images": self.max_images,
            "sample_patches": self.patches_per_sample,
            "max_pixels": self.max_pixels,
            "dtype": self.dtype,
        }

    @classmethod
    def from_table(cls, table: Mapping[str, Any], where: str = "image") -> ImageSpec:
        """Build from the parsed ``[image]`` TOML table (unknown keys are refused)."""
        known = {
            "mode": str,
            "size": list,
            "patch_size": int,
            "max_patches": int,
            "merge": int,
            "placeholder_id": int,
            "max_images": int,
            "sample_patches": int,
            "max_pixels": int,
            "dtype": str,
        }
        unknown = sorted(set(table) - set(known))
        if unknown:
            raise RecipeError(unknown_keys(where, unknown, known))
        kwargs: dict[str, Any] = {}
        for key, typ in known.items():
            if key not in table:
                continue
            value = table[key]
            if isinstance(value, bool) or not isinstance(value, typ):
                raise RecipeError(
                    f"{where}.{key}={value!r} must be {typ.__name__}, got {type(value).__name__}"
                )
            kwargs[key] = value
        if "size" in kwargs:
            size = kwargs["size"]
            if len(size) != 2 or not all(
                isinstance(v, int) and not isinstance(v, bool) for v in size
            ):
                raise RecipeError(f"{where}.size={size!r} must be [height, width]")
            kwargs["size"] = (size[0], size[1])
        return cls(**kwargs)
