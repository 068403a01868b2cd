"""The [image] recipe table: parsing, validation, fingerprint."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from tests.multimodal.helpers import mm_recipe, records
from zephon_nodes.errors import RecipeError
from zephon_nodes.recipe import OperatorSpec, PackSpec, Recipe
from zephon_nodes.recipe.image import ImageSpec

TOML = """\
seq_len = 128
[tokenizer]
kind = "bytes"
[image]
mode = "fixed"
size = [64, 96]
patch_size = 16
merge = 2
max_images = 3
placeholder_id = 300
[[datasets]]
name = "caps"
paths = ["c.jsonl"]
image_field = "jpeg_b64"
"""


def load(tmp_path: Path, text: str) -> Recipe:
    (tmp_path / "c.jsonl").write_text("{}\n")
    (tmp_path / "r.toml").write_text(text)
    return Recipe.from_toml(tmp_path / "r.toml")


def test_toml(tmp_path: Path) -> None:
    r = load(tmp_path, TOML)
    assert r.image == ImageSpec(
        mode="fixed", size=(64, 96), patch_size=16, merge=2, max_images=3, placeholder_id=300
    )
    assert r.image.tokens_per_image == 6 and r.image.patches_per_sample == 3 * 24
    assert r.datasets[0].image_field == "jpeg_b64"
    assert r.canonical()["image"]["size"] == [64, 96]
    assert r.canonical()["datasets"][0]["image_field"] == "jpeg_b64"


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (('mode = "fixed"', 'mode = "tiles"'), "image.mode"),
        (("max_images = 3", "max_images = 3\ncolour = true"), "unknown key"),
        (("size = [64, 96]", "size = [64, 90]"), "multiples of patch_size"),
        (("size = [64, 96]", "size = [64]"), "height, width"),
        (("patch_size = 16", 'patch_size = "16"'), "patch_size"),
        (("max_images = 3", "max_images = 0"), "max_images"),
        (("seq_len = 128", "seq_len = 6"), "seq_len=6 must be at least 7"),
        (("merge = 2", "merge = true"), "merge"),
        (("merge = 2", 'merge = 2\ndtype = "float16"'), "image.dtype"),
    ],
)
def test_invalid_tables_are_refused(tmp_path: Path, edit: tuple[str, str], message: str) -> None:
    with pytest.raises(RecipeError, match=message):
        load(tmp_path, TOML.replace(*edit))


def test_patch_budget_and_sample_patches() -> None:
    with pytest.raises(RecipeError, match="max_patches=3 must be >= merge"):
        ImageSpec(mode="patches", merge=2, max_patches=3)
    with pytest.raises(RecipeError, match="must hold one whole image"):
        ImageSpec(mode="patches", max_patches=64, sample_patches=63)


def test_text_recipes_are_unchanged() -> None:
    text = mm_recipe([{"text": "a"}]).replace(image=None)
    canonical = text.canonical()
    assert "image" not in canonical and "image_field" not in canonical["datasets"][0]


def test_fingerprint_covers_every_image_field() -> None:
    base = mm_recipe(records(4))
    assert base.image is not None
    seen = {base.fingerprint()}
    for change in (
        {"patch_size": 4},
        {"max_patches": 12},
        {"merge": 2, "max_patches": 16},
        {"placeholder_id": 400},
        {"max_images": 2},
        {"sample_patches": 20},
        {"max_pixels": 10_000},
        {"dtype": "float32"},
        {"mode": "fixed", "size": (16, 16)},
    ):
        fp = base.replace(image=dataclasses.replace(base.image, **change)).fingerprint()
        assert fp not in seen, change
        seen.add(fp)


def test_unsupported_combinations() -> None:
    with pytest.raises(RecipeError, match=r"pack\.mode='bestfit'"):
        mm_recipe(records(2), pack=PackSpec(mode="bestfit"))
    with pytest.raises(RecipeError, match="operators"):
        mm_recipe(records(2), operators=(OperatorSpec("filter", "min_chars", {"chars": 1}),))
