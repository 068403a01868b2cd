"""Images, corpora and recipes shared by the multimodal tests."""

from __future__ import annotations

import base64
import io
import struct
import tarfile
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from hypothesis import strategies as st
from PIL import Image

from zephon_nodes import DatasetSpec, Recipe, ShuffleSpec, TokenizerSpec, WorkSpec
from zephon_nodes.recipe.image import ImageSpec

FORMATS = ("PNG", "JPEG", "WEBP")


def encode(arr: np.ndarray, fmt: str = "PNG", **kw: Any) -> bytes:
    """Encode an ``[h, w, 3]`` (or ``[h, w]``) uint8 array."""
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, format=fmt, **kw)
    return buf.getvalue()


def noise(h: int, w: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)


def b64(blob: bytes) -> str:
    return base64.b64encode(blob).decode("ascii")


def png_header_only(width: int, height: int) -> bytes:
    """A PNG whose header claims ``width`` x ``height`` pixels, with no pixel data."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IEND", b"")


def records(n: int, seed: int = 0, max_side: int = 40, images: Sequence[int] = (1,)) -> list:
    """``n`` in-memory records: a short text and 1+ small base64 images of varied formats."""
    rng = np.random.default_rng(seed)
    out = []
    for k in range(n):
        imgs = []
        for j in range(images[k % len(images)]):
            h, w = (int(x) for x in rng.integers(4, max_side + 1, 2))
            imgs.append(b64(encode(noise(h, w, seed * 7919 + k * 31 + j), FORMATS[(k + j) % 3])))
        text = "".join(chr(97 + int(c)) for c in rng.integers(0, 26, int(rng.integers(0, 30))))
        out.append({"text": text, "image": imgs[0] if len(imgs) == 1 else imgs})
    return out


def mm_recipe(recs: Sequence[dict], image: ImageSpec | None = None, **kw: Any) -> Recipe:
    """A small multimodal recipe over in-memory records with the byte tokenizer."""
    args: dict[str, Any] = {
        "datasets": (DatasetSpec("mm", records=tuple(recs)),),
        "tokenizer": TokenizerSpec(kind="bytes"),
        "seed": 11,
        "num_lanes": 4,
        "global_batch_size": 8,
        "seq_len": 48,
        "flush_every": 2,
        "work": WorkSpec(chunk_size=3, epochs=1),
        "shuffle": ShuffleSpec(3),
        "image": image or ImageSpec(mode="patches", patch_size=8, max_patches=16, max_images=3),
    }
    args.update(kw)
    return Recipe(**args)


def add_member(tar: tarfile.TarFile, name: str, blob: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(blob)
    tar.addfile(info, io.BytesIO(blob))


def write_tar(path: Path, members: Sequence[tuple[str, bytes]]) -> Path:
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
        for name, blob in members:
            add_member(tar, name, blob)
    return path


@st.composite
def image_specs(draw: st.DrawFn) -> ImageSpec:
    dtype = draw(st.sampled_from(["uint8", "uint8", "float32"]))
    patch = draw(st.sampled_from([4, 8]))
    merge = draw(st.sampled_from([1, 2]))
    if draw(st.booleans()):
        unit = patch * merge
        size = (unit * draw(st.integers(1, 3)), unit * draw(st.integers(1, 3)))
        return ImageSpec(
            mode="fixed",
            size=size,
            patch_size=patch,
            merge=merge,
            max_images=draw(st.integers(1, 3)),
            dtype=dtype,
        )
    return ImageSpec(
        mode="patches",
        patch_size=patch,
        merge=merge,
        max_patches=draw(st.integers(merge * merge, 24)),
        max_images=draw(st.integers(1, 3)),
        dtype=dtype,
    )


@st.composite
def mm_recipes(draw: st.DrawFn) -> Recipe:
    """A small endless multimodal recipe: records, image counts and sizes, geometry drawn."""
    image = draw(image_specs())
    n = draw(st.integers(6, 30))
    counts = draw(st.lists(st.integers(1, 2), min_size=1, max_size=4))
    recs = records(
        n, seed=draw(st.integers(0, 10_000)), max_side=draw(st.sampled_from([8, 33])), images=counts
    )
    num_lanes = draw(st.sampled_from([1, 2, 4]))
    low = image.tokens_per_image + 2
    return mm_recipe(
        recs,
        image,
        seed=draw(st.integers(0, 2**32)),
        num_lanes=num_lanes,
        global_batch_size=num_lanes * draw(st.integers(1, 2)),
        seq_len=draw(st.integers(low, low + 40)),
        flush_every=draw(st.integers(1, 3)),
        work=WorkSpec(chunk_size=draw(st.integers(1, 4)), epochs=None),
        shuffle=ShuffleSpec(draw(st.sampled_from([0, 2]))),
        tokenizer=TokenizerSpec(
            kind="bytes", add_bos=draw(st.booleans()), add_eos=draw(st.booleans())
        ),
    )
