"""Decode: formats, EXIF orientation, RGB, fixed crop, patch grids and patch layout."""

from __future__ import annotations

import io

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from PIL import Image

from tests.multimodal.helpers import encode, noise, png_header_only
from zephon_nodes.multimodal.decode import ImageError, decode_image, patch_grid
from zephon_nodes.recipe.image import ImageSpec

BLOCKS = ImageSpec(mode="fixed", size=(16, 24), patch_size=8)


def blocky() -> np.ndarray:
    """A 16x24 image whose 8x8 blocks each have their own color (block r, c -> value)."""
    arr = np.zeros((16, 24, 3), dtype=np.uint8)
    for r in range(2):
        for c in range(3):
            arr[r * 8 : (r + 1) * 8, c * 8 : (c + 1) * 8] = (40 * r, 60 * c + 10, 200)
    return arr


def unpatchify(patches: np.ndarray, rows: int, cols: int) -> np.ndarray:
    p = patches.shape[1]
    return patches.reshape(rows, cols, p, p, 3).transpose(0, 2, 1, 3, 4).reshape(rows * p, -1, 3)


def test_patches_are_row_major_blocks() -> None:
    img = decode_image(encode(blocky(), "PNG"), BLOCKS)
    assert (img.rows, img.cols) == (2, 3)
    assert img.patches.shape == (6, 8, 8, 3) and img.patches.dtype == np.uint8
    for k in range(6):
        r, c = divmod(k, 3)
        assert (img.patches[k] == (40 * r, 60 * c + 10, 200)).all()
    assert (unpatchify(img.patches, 2, 3) == blocky()).all()


@pytest.mark.parametrize("fmt", ["PNG", "WEBP"])
def test_lossless_formats_round_trip(fmt: str) -> None:
    arr = noise(16, 24, 3)
    kw = {"lossless": True} if fmt == "WEBP" else {}
    img = decode_image(encode(arr, fmt, **kw), BLOCKS)
    assert (unpatchify(img.patches, 2, 3) == arr).all()


def test_jpeg_decodes_close_to_the_original() -> None:
    arr = np.full((16, 24, 3), (200, 30, 90), dtype=np.uint8)
    img = decode_image(encode(arr, "JPEG", quality=95), BLOCKS)
    assert np.abs(unpatchify(img.patches, 2, 3).astype(int) - arr).max() <= 4


def test_exif_orientation_is_applied() -> None:
    upright = blocky()
    stored = Image.fromarray(upright).transpose(Image.Transpose.ROTATE_90)
    assert stored.size == (16, 24)  # stored sideways
    exif = Image.Exif()
    exif[0x0112] = 6  # "rotate 90 degrees clockwise to view"
    buf = io.BytesIO()
    stored.save(buf, format="PNG", exif=exif)
    img = decode_image(buf.getvalue(), BLOCKS)
    assert (unpatchify(img.patches, 2, 3) == upright).all()


@pytest.mark.parametrize("mode", ["L", "RGBA", "P", "LA"])
def test_other_modes_become_rgb(mode: str) -> None:
    im = Image.fromarray(blocky()).convert(mode)
    buf = io.BytesIO()
    im.save(buf, format="PNG")
    img = decode_image(buf.getvalue(), BLOCKS)
    expected = np.asarray(im.convert("RGB"))
    assert (unpatchify(img.patches, 2, 3) == expected).all()


def test_fixed_mode_center_crops() -> None:
    # 16 x 48: the middle 24 columns are kept at scale 1.
    arr = np.zeros((16, 48, 3), dtype=np.uint8)
    arr[:, 12:36] = 255
    img = decode_image(encode(arr, "PNG"), BLOCKS)
    assert (unpatchify(img.patches, 2, 3) == 255).all()


def test_unknown_format_corrupt_and_bomb() -> None:
    with pytest.raises(ImageError) as e:
        decode_image(b"GIF89a" + bytes(40), BLOCKS)
    assert e.value.reason == "unknown_format"
    gif = encode(blocky(), "GIF")
    with pytest.raises(ImageError, match="not a JPEG, PNG or WebP"):
        decode_image(gif, BLOCKS)
    good = encode(noise(64, 64, 1), "JPEG")
    with pytest.raises(ImageError) as e:
        decode_image(good[: len(good) // 2], BLOCKS)
    assert e.value.reason == "corrupt_image"
    small = ImageSpec(mode="fixed", size=(16, 24), patch_size=8, max_pixels=1000)
    with pytest.raises(ImageError, match="decompression bomb") as e:
        decode_image(encode(noise(40, 40, 2), "PNG"), small)
    assert e.value.reason == "decompression_bomb"
    # A header claiming 30000 x 30000 pixels: refused before any pixel is decoded.
    with pytest.raises(ImageError) as e:
        decode_image(png_header_only(30_000, 30_000), BLOCKS)
    assert e.value.reason == "decompression_bomb"


@given(
    w=st.integers(1, 3000),
    h=st.integers(1, 3000),
    patch=st.sampled_from([7, 14, 16]),
    merge=st.sampled_from([1, 2, 3]),
    budget=st.integers(9, 1024),
)
def test_patch_grid_respects_budget_and_merge(
    w: int, h: int, patch: int, merge: int, budget: int
) -> None:
    spec = ImageSpec(mode="patches", patch_size=patch, merge=merge, max_patches=budget)
    rows, cols = patch_grid(w, h, spec)
    assert rows >= merge and cols >= merge
    assert rows % merge == 0 and cols % merge == 0
    assert rows * cols <= budget
    # Never enlarged beyond one merge block per side.
    assert rows * patch <= max(h, merge * patch) and cols * patch <= max(w, merge * patch)


def test_patch_grid_keeps_aspect_and_fills_budget() -> None:
    spec = ImageSpec(mode="patches", patch_size=16, max_patches=256)
    assert patch_grid(4096, 4096, spec) == (16, 16)
    assert patch_grid(1024, 256, spec) == (8, 32)
    assert patch_grid(160, 96, spec) == (6, 10)  # small: native size, not enlarged


def test_float32_is_uint8_over_255() -> None:
    blob = encode(noise(16, 24, 9), "PNG")
    ints = decode_image(blob, BLOCKS)
    floats = decode_image(
        blob, ImageSpec(mode="fixed", size=(16, 24), patch_size=8, dtype="float32")
    )
    assert floats.patches.dtype == np.float32
    assert (floats.patches == ints.patches.astype(np.float32) / np.float32(255)).all()


def test_16_bit_grayscale_keeps_the_high_byte() -> None:
    values = (np.arange(16 * 24) % 256).astype(np.uint16).reshape(16, 24)
    im = Image.fromarray(values * 257)  # 16-bit: v * 257 has high byte v
    assert im.mode == "I;16"
    buf = io.BytesIO()
    im.save(buf, format="PNG")
    img = decode_image(buf.getvalue(), BLOCKS)
    expected = np.repeat(values.astype(np.uint8)[:, :, None], 3, axis=2)
    assert (unpatchify(img.patches, 2, 3) == expected).all()
