"""Decode images (Pillow) and cut them into patches: the expensive stateless step."""

from __future__ import annotations

import io
import math
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from zephon_nodes.errors import DataError
from zephon_nodes.multimodal.records import MMBatch, MMRecord
from zephon_nodes.operators.documents import Skipped, add_skipped
from zephon_nodes.recipe.image import ImageSpec

__all__ = ["DecodeImages", "DecodedImage", "ImageError", "decode_image", "patch_grid"]

FORMATS = ("JPEG", "PNG", "WEBP")


class DecodedImage(NamedTuple):
    """An image as patches.

    Attributes:
        rows: Patch rows.
        cols: Patch columns.
        patches: ``[rows * cols, patch, patch, 3]``, row-major; uint8, or float32 in 0..1.
    """

    rows: int
    cols: int
    patches: np.ndarray


class ImageError(Exception):
    """Why one image cannot be decoded: ``reason`` (a skip-count key) and a message."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def patch_grid(width: int, height: int, spec: ImageSpec) -> tuple[int, int]:
    """Return the ``(rows, cols)`` patch grid an upright ``width`` x ``height`` image gets.

    ``"fixed"``: the grid of ``size``. ``"patches"``: the largest grid, never larger than the
    image, that keeps its aspect ratio within ``max_patches`` patches, each side a multiple of
    ``merge`` (at least ``merge``).
    """
    p, m = spec.patch_size, spec.merge
    if spec.mode == "fixed":
        return spec.size[0] // p, spec.size[1] // p
    scale = min(1.0, math.sqrt(spec.max_patches * p * p / (width * height)))
    rows = max(m, int(height * scale / (p * m)) * m)
    cols = max(m, int(width * scale / (p * m)) * m)
    while rows * cols > spec.max_patches:
        if rows >= cols:
            rows -= m
        else:
            cols -= m
    return rows, cols


def decode_image(data: bytes, spec: ImageSpec) -> DecodedImage:
    """Decode one JPEG, PNG or WebP image into patches (see :class:`ImageSpec`).

    Raises:
        ImageError: ``unknown_format``, ``decompression_bomb`` or ``corrupt_image``.
    """
    from PIL import Image, ImageOps, UnidentifiedImageError

    try:
        im = Image.open(io.BytesIO(data), formats=FORMATS)
    except UnidentifiedImageError:
        head = data[:8].hex()
        raise ImageError(
            "unknown_format", f"not a JPEG, PNG or WebP image (first bytes {head})"
        ) from None
    except Image.DecompressionBombError as e:
        raise ImageError("decompression_bomb", f"decompression bomb: {e}") from None
    except (OSError, SyntaxError, ValueError) as e:
        raise ImageError("corrupt_image", f"corrupt image: {e}") from None
    with im:
        width, height = im.size
        if width * height > spec.max_pixels:
            raise ImageError(
                "decompression_bomb",
                f"decompression bomb: {width}x{height} = {width * height} pixels > "
                f"image.max_pixels={spec.max_pixels}",
            )
        if width < 1 or height < 1:
            raise ImageError("corrupt_image", f"corrupt image: size {width}x{height}")
        try:
            if im.format == "JPEG":
                # DCT scaling: decode at the smallest scale still covering the target.
                need = (
                    max(spec.size)
                    if spec.mode == "fixed"
                    else spec.patch_size * int(math.isqrt(spec.max_patches) + 1)
                )
                im.draft("RGB", (need, need))
            # In place: the copy exif_transpose makes of an upright image costs ~3% of a
            # decode, and so does convert("RGB") of an RGB image (both are plain copies).
            ImageOps.exif_transpose(im, in_place=True)
            upright: Image.Image = im
            if upright.mode.startswith("I"):
                # 16-bit grayscale: keep the high byte (Pillow's convert would clip at 255).
                wide = np.asarray(upright).astype(np.int64)
                upright = Image.fromarray(np.clip(wide >> 8, 0, 255).astype(np.uint8), "L")
            rgb = upright if upright.mode == "RGB" else upright.convert("RGB")
            width, height = rgb.size
            rows, cols = patch_grid(width, height, spec)
            p = spec.patch_size
            target = (cols * p, rows * p)
            if spec.mode == "fixed":
                out = ImageOps.fit(rgb, target, Image.Resampling.BICUBIC)
            else:
                out = rgb.resize(target, Image.Resampling.BICUBIC)
            pixels = np.asarray(out, dtype=np.uint8)
        except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as e:
            raise ImageError("corrupt_image", f"corrupt image: {e}") from None
    patches = (
        pixels.reshape(rows, p, cols, p, 3).transpose(0, 2, 1, 3, 4).reshape(rows * cols, p, p, 3)
    )
    if spec.dtype == "float32":
        return DecodedImage(rows, cols, patches.astype(np.float32) / np.float32(255.0))
    return DecodedImage(rows, cols, np.ascontiguousarray(patches))


@dataclass(frozen=True)
class DecodeImages:
    """Stateless operator: ``MMBatch`` of image bytes -> ``MMBatch`` of :class:`DecodedImage`.

    A record with a bad image (corrupt, unknown format, decompression bomb) raises
    :class:`DataError` naming the dataset, shard and key, or, for a dataset whose
    ``on_error`` is ``"skip"``, is dropped and counted under the reason.

    Args:
        spec: The recipe's image table.
        skip: Indexes of the datasets whose ``on_error`` is ``"skip"``.
    """

    spec: ImageSpec
    skip: frozenset[int] = frozenset()
    name: str = "decode_images"

    def __call__(self, batch: MMBatch) -> MMBatch:
        """Decode every image of the batch."""
        skipping = batch.dataset in self.skip
        skipped: Skipped = batch.skipped
        out: list[MMRecord] = []
        for rec in batch.records:
            try:
                images = tuple(decode_image(b, self.spec) for b in rec.images)
            except ImageError as e:
                if not skipping:
                    raise DataError(f"{rec.where}: {e}") from None
                skipped = add_skipped(skipped, e.reason, 1)
                continue
            out.append(MMRecord(rec.text, images, rec.dataset_name, rec.shard, rec.record))
        return MMBatch(out, batch.dataset, skipped)
