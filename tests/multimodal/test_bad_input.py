"""Bad images and samples under both policies: raise names shard and key, skip counts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.multimodal.helpers import b64, encode, mm_recipe, noise, png_header_only, write_tar
from zephon_nodes import DataError, DatasetSpec, Pipeline, simulate
from zephon_nodes.commands.stats import compute_stats
from zephon_nodes.recipe import WorkSpec

JPEG = encode(noise(48, 48, 5), "JPEG")
GIF = encode(noise(16, 16, 6), "GIF")


def good_members(n: int = 10) -> list[tuple[str, bytes]]:
    out = []
    for k in range(n):
        out.append((f"g{k:03d}.png", encode(noise(12 + k, 20, k), "PNG")))
        out.append((f"g{k:03d}.txt", f"good sample {k}".encode()))
    return out


# name -> (members of the bad sample "bad", reason)
TAR_CASES = {
    "corrupt_image": ([("bad.jpg", JPEG[: len(JPEG) // 2]), ("bad.txt", b"x")], "corrupt_image"),
    "unknown_format": ([("bad.png", GIF), ("bad.txt", b"x")], "unknown_format"),
    "text_without_image": ([("bad.txt", b"only text")], "missing_image"),
    "image_without_text": ([("bad.png", encode(noise(9, 9, 1)))], "missing_text"),
    "bomb": (
        [("bad.png", png_header_only(30_000, 30_000)), ("bad.txt", b"x")],
        "decompression_bomb",
    ),
    "invalid_json": ([("bad.png", encode(noise(9, 9, 2))), ("bad.json", b"{oops")], "invalid_json"),
}

GOOD_LINE = json.dumps({"text": "fine " * 20, "image": b64(encode(noise(10, 10, 3)))})
JSONL_CASES = {
    "invalid_base64": (json.dumps({"text": "t", "image": "not base64!"}), "invalid_base64"),
    "missing_image_field": (json.dumps({"text": "t"}), "missing_image"),
    "missing_text_field": (json.dumps({"image": b64(encode(noise(9, 9, 4)))}), "missing_text"),
    "image_field_not_a_string": (json.dumps({"text": "t", "image": 7}), "invalid_image_field"),
}


def tar_recipe(tmp_path: Path, case: str, policy: str):
    members, _ = TAR_CASES[case]
    members = good_members()[:10] + members + good_members()[10:]
    write_tar(tmp_path / "a.tar", good_members())
    write_tar(tmp_path / "b.tar", members)
    spec = DatasetSpec("pics", paths=("*.tar",), base_dir=tmp_path, on_error=policy)
    return mm_recipe([], datasets=(spec,), work=WorkSpec(chunk_size=2, epochs=1))


def jsonl_recipe(tmp_path: Path, case: str, policy: str):
    bad, _ = JSONL_CASES[case]
    (tmp_path / "c.jsonl").write_text("\n".join([GOOD_LINE] * 5 + [bad] + [GOOD_LINE] * 30) + "\n")
    spec = DatasetSpec("caps", paths=("c.jsonl",), base_dir=tmp_path, on_error=policy)
    return mm_recipe([], datasets=(spec,), work=WorkSpec(chunk_size=2, epochs=1))


def all_counts(pipeline: Pipeline) -> tuple[int, dict[str, int]]:
    """Documents and skips over every work item of the (single) dataset, read once."""
    from zephon_nodes.engine.work import WorkItem

    ds = pipeline.datasets[0]
    docs, counts = 0, {}
    for item in range(ds.num_work_items):
        shard, start, stop = ds.locate(item)
        work = WorkItem(0, ds.name, ds.text_field, item, 0, ds.shards[shard], start, stop, 0, 0)
        batch = pipeline.stateless(work)
        docs += len(batch.lengths)
        for reason, n in batch.skipped:
            counts[reason] = counts.get(reason, 0) + n
    return docs, counts


def run(recipe, dp: int = 1, workers: int = 0) -> list[str]:
    return [r.digest for r, _ in simulate(Pipeline(recipe), dp, 1000, num_workers=workers)]


@pytest.mark.parametrize("case", sorted(TAR_CASES))
def test_tar_raise_names_shard_and_key(tmp_path: Path, case: str) -> None:
    with pytest.raises(DataError) as e:
        run(tar_recipe(tmp_path, case, "raise"))
    message = str(e.value)
    assert "dataset 'pics'" in message and "b.tar" in message and "key 'bad'" in message


@pytest.mark.parametrize("case", sorted(TAR_CASES))
def test_tar_skip_counts_and_is_elastic(tmp_path: Path, case: str) -> None:
    _, reason = TAR_CASES[case]
    recipe = tar_recipe(tmp_path, case, "skip")
    a = compute_stats(recipe, 1000, dp_world_size=1, num_workers=0)
    b = compute_stats(recipe, 1000, dp_world_size=2, num_workers=2)
    assert a == {**b, "dp_world_size": 1}
    assert a["skipped_records"]["pics"] == {reason: 1}
    reference = run(recipe)
    assert reference and run(recipe, 4, 2) == reference
    assert all_counts(Pipeline(recipe)) == (20, {reason: 1})


@pytest.mark.parametrize("case", sorted(JSONL_CASES))
def test_jsonl_raise_names_line_and_skip_counts(tmp_path: Path, case: str) -> None:
    _, reason = JSONL_CASES[case]
    with pytest.raises(DataError, match=r"dataset 'caps'.*c\.jsonl:6"):
        all_counts(Pipeline(jsonl_recipe(tmp_path, case, "raise")))
    recipe = jsonl_recipe(tmp_path, case, "skip")
    assert all_counts(Pipeline(recipe)) == (35, {reason: 1})
    reference = run(recipe)
    assert len(reference) >= 3 and run(recipe, 2, 2) == reference


def test_truncated_tar(tmp_path: Path) -> None:
    write_tar(tmp_path / "a.tar", good_members())
    blob = write_tar(tmp_path / "b.tar", good_members()).read_bytes()
    (tmp_path / "b.tar").write_bytes(blob[:1500])
    spec = DatasetSpec("pics", paths=("*.tar",), base_dir=tmp_path, on_error="raise")
    with pytest.raises(DataError, match=r"dataset 'pics'.*b\.tar: truncated tar"):
        Pipeline(mm_recipe([], datasets=(spec,)))
    skip = mm_recipe(
        [], datasets=(DatasetSpec("pics", paths=("*.tar",), base_dir=tmp_path, on_error="skip"),)
    )
    assert Pipeline(skip).skipped_files == {"pics": {"truncated_file": 1}}
    assert all_counts(Pipeline(skip)) == (10, {})


def test_text_recipe_refuses_tar_shards(tmp_path: Path) -> None:
    write_tar(tmp_path / "a.tar", good_members())
    spec = DatasetSpec("pics", paths=("a.tar",), base_dir=tmp_path)
    recipe = mm_recipe([], datasets=(spec,)).replace(image=None)
    from zephon_nodes.errors import RecipeError

    with pytest.raises(RecipeError, match=r"needs an \[image\] table"):
        Pipeline(recipe)
