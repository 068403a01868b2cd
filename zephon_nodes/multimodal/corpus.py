"""Sample image-text data for tests, the example and the benchmark; no network.

Photos come from the images scikit-image ships (``skimage/data``, in the ``multimodal``
extra); generated Pillow images (gradients, shapes, grayscale, palette, RGBA, EXIF-rotated)
are added, and stand in for the photos when scikit-image is not installed. Everything is a
pure function of the seed.
"""

from __future__ import annotations

import base64
import io
import json
import tarfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np

__all__ = ["captions", "photos", "sample_images", "write_jsonl", "write_tar_shards"]

# Photos shipped inside the scikit-image wheel (not fetched).
PHOTO_FILES = (
    "astronaut.png",
    "chelsea.png",
    "coffee.png",
    "rocket.jpg",
    "hubble_deep_field.jpg",
    "retina.jpg",
    "motorcycle_left.png",
    "color.png",
    "ihc.png",
)

_TEXT = (
    "a photo of an astronaut a cat sitting on a chair with a cup of coffee next to a rocket "
    "launch pad deep field of galaxies the retina of an eye a motorcycle parked outside in the "
    "afternoon light colorful stripes and a gradient"
)
_WORDS = _TEXT.split(" ")


def photos() -> list[tuple[str, bytes]]:
    """Return ``(file name, bytes)`` of scikit-image's bundled photos (empty without it)."""
    try:
        import skimage
    except ImportError:
        return []
    root = Path(skimage.__file__).parent / "data"
    return [(n, (root / n).read_bytes()) for n in PHOTO_FILES if (root / n).is_file()]


def _encode(im: object, fmt: str, **kw: object) -> bytes:
    buf = io.BytesIO()
    im.save(buf, format=fmt, **kw)  # type: ignore[attr-defined]
    return buf.getvalue()


def _generated(rng: np.random.Generator, k: int, max_side: int) -> tuple[str, bytes]:
    from PIL import Image, ImageDraw

    w = int(rng.integers(max(8, max_side // 4), max_side + 1))
    h = int(rng.integers(max(8, max_side // 4), max_side + 1))
    yy, xx = np.mgrid[0:h, 0:w]
    base = np.stack(
        [(xx * 255 // max(w - 1, 1)), (yy * 255 // max(h - 1, 1)), ((xx + yy) * 7) % 256], -1
    ).astype(np.uint8)
    im = Image.fromarray(base)
    draw = ImageDraw.Draw(im)
    for _ in range(3):
        x0, y0 = int(rng.integers(0, w)), int(rng.integers(0, h))
        x1, y1 = x0 + int(rng.integers(1, w)), y0 + int(rng.integers(1, h))
        color = tuple(int(c) for c in rng.integers(0, 256, 3))
        draw.ellipse((x0, y0, x1, y1), fill=color)
    kind = k % 6
    if kind == 0:
        return "jpg", _encode(im, "JPEG", quality=85)
    if kind == 1:
        return "png", _encode(im, "PNG")
    if kind == 2:
        return "webp", _encode(im, "WEBP", quality=80)
    if kind == 3:
        return "png", _encode(im.convert("L"), "PNG")
    if kind == 4:
        return "png", _encode(im.convert("RGBA"), "PNG")
    # Stored rotated, with the EXIF orientation (6: rotate 90 degrees clockwise to view).
    exif = Image.Exif()
    exif[0x0112] = 6
    return "jpg", _encode(im.transpose(Image.Transpose.ROTATE_90), "JPEG", exif=exif)


def sample_images(
    n: int, seed: int = 0, max_side: int = 192, use_photos: bool = True
) -> list[tuple[str, bytes]]:
    """Return ``n`` encoded images ``(extension, bytes)``: photo crops and generated ones.

    Photos are cropped at seeded places and scaled to at most ``max_side`` pixels, then
    re-encoded as JPEG, PNG or WebP; every third image is generated.
    """
    from PIL import Image

    rng = np.random.default_rng(seed)
    pics = []
    if use_photos:
        for _, blob in photos():
            with Image.open(io.BytesIO(blob)) as im:
                pics.append(im.convert("RGB"))
    out = []
    for k in range(n):
        if not pics or k % 3 == 2:
            out.append(_generated(rng, k, max_side))
            continue
        pic = pics[int(rng.integers(0, len(pics)))]
        w, h = pic.size
        cw, ch = int(rng.integers(w // 3, w + 1)), int(rng.integers(h // 3, h + 1))
        x, y = int(rng.integers(0, w - cw + 1)), int(rng.integers(0, h - ch + 1))
        crop = pic.crop((x, y, x + cw, y + ch))
        crop.thumbnail((max_side, max_side))
        fmt = ("JPEG", "PNG", "WEBP")[k % 3]
        ext = {"JPEG": "jpg", "PNG": "png", "WEBP": "webp"}[fmt]
        out.append((ext, _encode(crop, fmt, **({"quality": 85} if fmt != "PNG" else {}))))
    return out


def captions(n: int, seed: int = 0, max_words: int = 24) -> list[str]:
    """Return ``n`` seeded captions of 1 to ``max_words`` words."""
    rng = np.random.default_rng(seed + 1)
    return [
        " ".join(
            _WORDS[int(i)]
            for i in rng.integers(0, len(_WORDS), int(rng.integers(1, max_words + 1)))
        )
        for _ in range(n)
    ]


def _add(tar: tarfile.TarFile, name: str, blob: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(blob)
    info.mtime = 0
    tar.addfile(info, io.BytesIO(blob))


def write_tar_shards(
    directory: str | Path,
    shards: int,
    per_shard: int,
    seed: int = 0,
    max_side: int = 192,
    json_every: int = 2,
    use_photos: bool = True,
) -> list[Path]:
    """Write WebDataset tar shards ``shard-00000.tar``, ... and return their paths.

    Sample ``KEY`` is ``KEY.<ext>`` plus ``KEY.json`` (``{"text": ...}``, every
    ``json_every``-th sample) or ``KEY.txt``.
    """
    out_dir = Path(directory)
    out_dir.mkdir(parents=True, exist_ok=True)
    total = shards * per_shard
    images = sample_images(total, seed, max_side, use_photos)
    texts = captions(total, seed)
    paths = []
    for s in range(shards):
        path = out_dir / f"shard-{s:05d}.tar"
        with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
            for k in range(s * per_shard, (s + 1) * per_shard):
                key = f"{k:08d}"
                ext, blob = images[k]
                _add(tar, f"{key}.{ext}", blob)
                if json_every and k % json_every == 0:
                    _add(tar, f"{key}.json", json.dumps({"text": texts[k]}).encode("utf-8"))
                else:
                    _add(tar, f"{key}.txt", texts[k].encode("utf-8"))
        paths.append(path)
    return paths


def write_jsonl(
    path: str | Path,
    records: int,
    seed: int = 0,
    max_side: int = 192,
    images_per_record: Sequence[int] = (1, 1, 2),
    use_photos: bool = True,
) -> Path:
    """Write a jsonl shard of ``{"text", "image"}`` records (base64; lists for several)."""
    counts = [images_per_record[k % len(images_per_record)] for k in range(records)]
    images = sample_images(sum(counts), seed, max_side, use_photos)
    texts = captions(records, seed)
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    at = 0
    with open(p, "w", encoding="utf-8") as f:
        for k, c in enumerate(counts):
            enc = [base64.b64encode(b).decode("ascii") for _, b in images[at : at + c]]
            at += c
            f.write(json.dumps({"text": texts[k], "image": enc[0] if c == 1 else enc}) + "\n")
    return p
