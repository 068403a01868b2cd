"""Bad input under both policies: ``raise`` names the place, ``skip`` drops and counts."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import zstandard

from tests.mixing.helpers import digests, texts
from zephon_nodes import DataError, DatasetSpec, Pipeline, simulate
from zephon_nodes.commands.stats import compute_stats
from zephon_nodes.recipe import Recipe, ShuffleSpec, TokenizerSpec, WorkSpec

GOOD = [json.dumps({"text": t}) for t in texts("abcdefgh", 12, 20, 60, 9)]


def lines_with(bad: bytes, at: int = 3) -> bytes:
    """Twelve good JSON lines with ``bad`` as line ``at + 1``."""
    rows = [g.encode() for g in GOOD]
    rows.insert(at, bad)
    return b"\n".join(rows) + b"\n"


def zst(data: bytes) -> bytes:
    return zstandard.ZstdCompressor().compress(data)


# name -> (file name, file bytes, reason, records skipped or None for a whole file, where)
CASES = {
    "invalid_json": ("bad.jsonl", lines_with(b'{"text": "unterminated'), "invalid_json", 1, ":4"),
    "missing_field": ("bad.jsonl", lines_with(b'{"body": "x"}'), "missing_field", 1, ":4"),
    "non_string_field": ("bad.jsonl", lines_with(b'{"text": 42}'), "non_string_field", 1, ":4"),
    "null_field": ("bad.jsonl", lines_with(b'{"text": null}'), "non_string_field", 1, ":4"),
    "not_an_object": ("bad.jsonl", lines_with(b"[1, 2]"), "not_an_object", 1, ":4"),
    "invalid_utf8": ("bad.jsonl", lines_with(b'{"text": "\xff\xfe"}'), "invalid_utf8", 1, ":4"),
    "truncated_jsonl": (
        "bad.jsonl",
        lines_with(b"")[:-1] + b'{"text": "cut he',
        "invalid_json",
        1,
        ":13",
    ),
    "bad_line_in_zst": (
        "bad.jsonl.zst",
        zst(lines_with(b"{oops}")),
        "invalid_json",
        1,
        ":4",
    ),
    "corrupt_zstd_frame": (
        "bad.jsonl.zst",
        zst(lines_with(b"{}")[:200]) + b"\x28\xb5\x2f\xfd" + bytes(range(7, 120)),
        "corrupt_zstd",
        None,
        "zstd",
    ),
    "truncated_zst": (
        "bad.jsonl.zst",
        zst(lines_with(b'{"text": "fine"}'))[:-9],
        "truncated_file",
        None,
        "truncated",
    ),
    "empty_file": ("bad.jsonl", b"", "empty_file", None, "empty"),
    "blank_lines_only": ("bad.jsonl", b"\n\n\r\n", "empty_file", None, "empty"),
    "unreadable_parquet": (
        "bad.parquet",
        b"PAR1 this is not really parquet",
        "unreadable_parquet",
        None,
        "Parquet",
    ),
}


def recipe_for(tmp_path: Path, case: str, policy: str, mixed: bool = True) -> Recipe:
    name, blob, *_ = CASES[case]
    (tmp_path / name).write_bytes(blob)
    (tmp_path / "good.jsonl").write_text("\n".join(GOOD) + "\n", encoding="utf-8")
    bad = DatasetSpec(
        "web",
        paths=("good.jsonl", name),
        base_dir=tmp_path,
        on_error=policy,
        on_exhausted="repeat",
    )
    other = DatasetSpec(
        "books",
        records=tuple({"text": t} for t in texts("nopq", 30, 50, 200, 1)),
        on_exhausted="repeat",
    )
    return Recipe(
        datasets=(bad, other) if mixed else (bad,),
        tokenizer=TokenizerSpec(kind="bytes"),
        seed=2,
        num_lanes=4,
        global_batch_size=4,
        seq_len=32,
        flush_every=2,
        work=WorkSpec(chunk_size=2, epochs=1),
        shuffle=ShuffleSpec(2),
    )


def all_skipped(pipeline: Pipeline) -> dict[str, int]:
    """Skip counts over one pass of the dataset's work items (reading every record once)."""
    ds = pipeline.datasets[0]
    counts: dict[str, int] = {}
    from zephon_nodes.engine.work import WorkItem

    for item in range(ds.num_work_items):
        shard, start, stop = ds.locate(item)
        work = WorkItem(0, ds.name, ds.text_field, item, 0, ds.shards[shard], start, stop, 0, 0)
        for reason, n in pipeline.stateless(work).skipped:
            counts[reason] = counts.get(reason, 0) + n
    return counts


@pytest.mark.parametrize("case", sorted(CASES))
def test_raise_names_dataset_file_place_and_reason(tmp_path, case):
    """The default policy stops with an error naming dataset, file, line and reason."""
    name, _, reason, _, where = CASES[case]
    recipe = recipe_for(tmp_path, case, "raise", mixed=False)
    if reason == "empty_file":
        return  # valid under both policies: see test_empty_file_is_valid_and_reported
    with pytest.raises(DataError) as e:
        list(simulate(Pipeline(recipe), 1, 1000, num_workers=0))
    message = str(e.value)
    assert "dataset 'web'" in message
    assert name in message
    assert where in message


@pytest.mark.parametrize("case", sorted(CASES))
def test_skip_is_deterministic_and_counted(tmp_path, case):
    """Skip drops the bad input, counts it by reason, and every layout gets the same batches."""
    _, _, reason, records, _ = CASES[case]
    recipe = recipe_for(tmp_path, case, "skip")
    pipeline = Pipeline(recipe)
    if records is None:
        assert pipeline.skipped_files == {"web": {reason: 1}, "books": {}}
        assert all_skipped(pipeline) == {}
    else:
        assert pipeline.skipped_files == {"web": {}, "books": {}}
        assert all_skipped(pipeline) == {reason: records}
    reference = digests(pipeline, 1, 20, num_workers=0)
    assert len(reference) == 20
    for world, workers in ((2, 2), (4, 1)):
        assert digests(pipeline, world, 20, num_workers=workers) == reference


@pytest.mark.parametrize("case", ["invalid_json", "corrupt_zstd_frame"])
def test_stats_report_skips_identically_at_any_dp(tmp_path, case):
    """`zephon stats` reports the skipped records/files, the same at every dp and worker count."""
    _, _, reason, records, _ = CASES[case]
    recipe = recipe_for(tmp_path, case, "skip", mixed=False)
    a = compute_stats(recipe, 40, dp_world_size=1, num_workers=0)
    b = compute_stats(recipe, 40, dp_world_size=4, num_workers=2)
    assert a == {**b, "dp_world_size": 1}
    if records is None:
        assert a["skipped_files"]["web"] == {reason: 1}
    else:
        assert a["skipped_records"]["web"].get(reason, 0) >= 1


def test_a_dataset_with_no_readable_file_is_refused(tmp_path):
    (tmp_path / "only.parquet").write_bytes(b"not parquet")
    spec = DatasetSpec("web", paths=("only.parquet",), base_dir=tmp_path, on_error="skip")
    recipe = Recipe(datasets=(spec,), tokenizer=TokenizerSpec(kind="bytes"))
    with pytest.raises(DataError, match="no readable record"):
        Pipeline(recipe)


@pytest.mark.parametrize("policy", ["raise", "skip"])
@pytest.mark.parametrize("case", ["empty_file", "blank_lines_only"])
def test_empty_file_is_valid_and_reported(tmp_path, case, policy):
    """An empty file holds no record: no error, no change to the batches, counted in stats."""
    recipe = recipe_for(tmp_path, case, policy, mixed=False)
    with_empty = Pipeline(recipe)
    assert with_empty.skipped_files == {"web": {"empty_file": 1}}
    spec = recipe.datasets[0]
    only_good = dataclasses.replace(spec, paths=("good.jsonl",))
    without = Pipeline(recipe.replace(datasets=(only_good,)))
    assert digests(with_empty, 2, 20) == digests(without, 2, 20)
    assert compute_stats(recipe, 5)["skipped_files"] == {"web": {"empty_file": 1}}
