"""Hugging Face ``datasets`` Arrow files: save_to_disk folders and load_dataset caches."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import pytest

from tests.core.helpers import digests
from tests.mixing.helpers import texts, write_jsonl
from zephon_nodes import DatasetSpec, Pipeline, RecipeError, TokenizerSpec, simulate
from zephon_nodes.io.formats.arrow import ArrowShard, expand_dataset_dirs
from zephon_nodes.recipe import Recipe, WorkSpec

datasets = pytest.importorskip("datasets")

DOCS = [" ".join(texts("abcdefgh", 8, 2, 6, k)) for k in range(90)]


@pytest.fixture(autouse=True)
def _offline(monkeypatch, tmp_path):
    # `datasets` never reaches a hub in these tests, and keeps its cache in tmp_path.
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    datasets.disable_progress_bars()


def recipe(dataset: DatasetSpec) -> Recipe:
    return Recipe(
        datasets=(dataset,),
        tokenizer=TokenizerSpec(kind="bytes"),
        seed=4,
        num_lanes=4,
        global_batch_size=8,
        seq_len=32,
        flush_every=2,
        work=WorkSpec(chunk_size=5, epochs=1),
    )


def save(folder: Path, rows: list[dict], num_shards: int = 1) -> Path:
    datasets.Dataset.from_list(rows).save_to_disk(str(folder), num_shards=num_shards)
    return folder


class TestSameBatches:
    """The same records from jsonl, Parquet and `datasets` Arrow give identical digests."""

    def test_jsonl_parquet_save_to_disk_and_cache(self, tmp_path):
        write_jsonl(tmp_path / "d.jsonl", DOCS)
        rows = [{"text": t, "id": i} for i, t in enumerate(DOCS)]
        ds = datasets.Dataset.from_list(rows)
        ds.to_parquet(str(tmp_path / "d.parquet"))
        ds.save_to_disk(str(tmp_path / "saved"))
        loaded = datasets.load_dataset(
            "json", data_files={"train": str(tmp_path / "d.jsonl")}, cache_dir=str(tmp_path / "c")
        )["train"]
        (cache_file,) = [f["filename"] for f in loaded.cache_files]
        assert cache_file.endswith(".arrow")

        reference = digests(Pipeline(recipe(DatasetSpec("d", ("d.jsonl",), base_dir=tmp_path))), 1)
        assert len(reference) >= 5
        for pattern in ("d.parquet", "saved", os.path.relpath(cache_file, tmp_path)):
            spec = DatasetSpec("d", (pattern,), base_dir=tmp_path)
            assert digests(Pipeline(recipe(spec)), 2, num_workers=2) == reference, pattern

    def test_sharded_folder_reads_shards_in_state_order(self, tmp_path):
        half = len(DOCS) // 2
        write_jsonl(tmp_path / "a.jsonl", DOCS[:half])
        write_jsonl(tmp_path / "b.jsonl", DOCS[half:])
        save(tmp_path / "saved", [{"text": t} for t in DOCS], num_shards=2)
        files = DatasetSpec("d", ("saved",), base_dir=tmp_path).files()
        assert [f.name for f in files] == ["data-00000-of-00002.arrow", "data-00001-of-00002.arrow"]
        reference = digests(Pipeline(recipe(DatasetSpec("d", ("*.jsonl",), base_dir=tmp_path))), 1)
        spec = DatasetSpec("d", ("saved",), base_dir=tmp_path)
        assert digests(Pipeline(recipe(spec)), 4) == reference

    def test_glob_of_arrow_files(self, tmp_path):
        save(tmp_path / "saved", [{"text": t} for t in DOCS], num_shards=3)
        by_folder = digests(Pipeline(recipe(DatasetSpec("d", ("saved",), base_dir=tmp_path))), 1)
        spec = DatasetSpec("d", ("saved/*.arrow",), base_dir=tmp_path)
        assert digests(Pipeline(recipe(spec)), 2) == by_folder


class TestRandomAccess:
    """Rows are read by range, without the rows before them."""

    def test_read_ranges(self, tmp_path):
        save(tmp_path / "s", [{"text": t, "n": i} for i, t in enumerate(DOCS)])
        (path,) = expand_dataset_dirs([str(tmp_path / "s")])
        from zephon_nodes.io.formats.arrow import open_arrow_shard

        shard = open_arrow_shard(path, ("text", "absent"))
        assert isinstance(shard, ArrowShard)
        assert shard.num_records == len(DOCS)
        assert shard.columns == ("text",)
        assert shard.read(37, 40) == [
            (37, {"text": DOCS[37]}),
            (38, {"text": DOCS[38]}),
            (39, {"text": DOCS[39]}),
        ]
        assert shard.read(5, 5) == []
        assert shard.where(7).endswith("row 7")
        with pytest.raises(Exception, match="out of range"):
            shard.read(80, 91)

    def test_nested_columns_come_back_as_python(self, tmp_path):
        msgs = [[{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]]
        save(tmp_path / "s", [{"messages": msgs[0]}])
        (path,) = expand_dataset_dirs([str(tmp_path / "s")])
        from zephon_nodes.io.formats.arrow import open_arrow_shard

        assert open_arrow_shard(path, ("messages",)).read(0, 1) == [(0, {"messages": msgs[0]})]


class TestErrors:
    """Bad folders and files: clear errors, or skipped and counted under on_error = skip."""

    def test_datasetdict_folder_names_its_splits(self, tmp_path):
        ds = datasets.Dataset.from_list([{"text": "a"}])
        datasets.DatasetDict({"train": ds, "test": ds}).save_to_disk(str(tmp_path / "dd"))
        with pytest.raises(RecipeError, match=r"DatasetDict folder.*dd/test.*dd/train"):
            DatasetSpec("d", ("dd",), base_dir=tmp_path).files()
        assert len(DatasetSpec("d", ("dd/train",), base_dir=tmp_path).files()) == 1

    def test_cache_folder_with_several_splits_is_refused(self, tmp_path):
        write_jsonl(tmp_path / "a.jsonl", DOCS[:5])
        loaded = datasets.load_dataset(
            "json",
            data_files={"train": str(tmp_path / "a.jsonl"), "test": str(tmp_path / "a.jsonl")},
            cache_dir=str(tmp_path / "c"),
        )
        folder = Path(loaded["train"].cache_files[0]["filename"]).parent
        with pytest.raises(RecipeError, match=r"splits \['test', 'train'\].*-test\*\.arrow"):
            DatasetSpec("d", (str(folder),)).files()
        spec = DatasetSpec("d", (str(folder / "*-train*.arrow"),))
        assert [f.name for f in spec.files()] == ["json-train.arrow"]

    def test_broken_state_json(self, tmp_path):
        save(tmp_path / "s", [{"text": "a"}])
        (tmp_path / "s" / "state.json").write_text("{not json")
        with pytest.raises(RecipeError, match=r"state\.json: not a readable Hugging Face"):
            DatasetSpec("d", ("s",), base_dir=tmp_path).files()

    def test_bad_records_follow_the_policy(self, tmp_path):
        rows = [{"text": t} for t in DOCS[:20]]
        rows[3] = {"text": None}
        save(tmp_path / "s", rows)
        spec = DatasetSpec("d", ("s",), base_dir=tmp_path)
        with pytest.raises(Exception, match=r"dataset 'd': .*data-00000-of-00001\.arrow row 3"):
            list(simulate(Pipeline(recipe(spec)), 1, 100))
        skipping = Pipeline(recipe(dataclasses.replace(spec, on_error="skip")))
        item = next(
            w for lane in range(4) if (w := skipping.work_source.work(lane, 0)) and w.start == 0
        )
        assert dict(skipping.stateless(item).skipped) == {"non_string_field": 1}

    def test_missing_column_is_a_missing_field(self, tmp_path):
        save(tmp_path / "s", [{"body": t} for t in DOCS[:10]])
        spec = DatasetSpec("d", ("s",), base_dir=tmp_path, on_error="skip")
        p = Pipeline(recipe(spec))
        item = p.work_source.work(0, 0)
        assert item is not None
        assert dict(p.stateless(item).skipped) == {"missing_field": item.stop - item.start}

    def test_truncated_file(self, tmp_path):
        save(tmp_path / "good", [{"text": t} for t in DOCS])
        save(tmp_path / "bad", [{"text": t} for t in DOCS])
        (bad,) = expand_dataset_dirs([str(tmp_path / "bad")])
        data = Path(bad).read_bytes()
        Path(bad).write_bytes(data[: len(data) // 2])
        spec = DatasetSpec("d", ("good", "bad"), base_dir=tmp_path)
        with pytest.raises(Exception, match=r"dataset 'd': .*bad/data-00000-of-00001\.arrow: "):
            Pipeline(recipe(spec))
        p = Pipeline(recipe(dataclasses.replace(spec, on_error="skip")))
        assert p.skipped_files == {"d": {"unreadable_arrow": 1}}
        assert p.datasets[0].num_records == len(DOCS)

    def test_not_an_arrow_file(self, tmp_path):
        (tmp_path / "x.arrow").write_text(json.dumps({"text": "hello"}))
        with pytest.raises(Exception, match=r"x\.arrow: unreadable Arrow file"):
            Pipeline(recipe(DatasetSpec("d", ("x.arrow",), base_dir=tmp_path)))


class TestWildcards:
    """A wildcard expands save_to_disk folders; other folders it matches are left out."""

    def test_several_saved_folders_by_wildcard(self, tmp_path):
        save(tmp_path / "parts" / "p0", [{"text": t} for t in DOCS[:40]])
        save(tmp_path / "parts" / "p1", [{"text": t} for t in DOCS[40:]])
        (tmp_path / "parts" / "notes").mkdir()  # a plain folder: left out
        files = DatasetSpec("d", ("parts/*",), base_dir=tmp_path).files()
        assert [f.relative_to(tmp_path).as_posix() for f in files] == [
            "parts/p0/data-00000-of-00001.arrow",
            "parts/p1/data-00000-of-00001.arrow",
        ]

    def test_recursive_glob_over_a_cache_is_not_refused(self, tmp_path):
        write_jsonl(tmp_path / "a.jsonl", DOCS[:5])
        datasets.load_dataset(
            "json",
            data_files={"train": str(tmp_path / "a.jsonl"), "test": str(tmp_path / "a.jsonl")},
            cache_dir=str(tmp_path / "c"),
        )
        spec = DatasetSpec("d", ("c/**/*-train.arrow",), base_dir=tmp_path)
        assert [f.name for f in spec.files()] == ["json-train.arrow"]
        spec = DatasetSpec("d", ("c/**",), base_dir=tmp_path)
        assert sorted(f.name for f in spec.files() if f.suffix == ".arrow") == [
            "json-test.arrow",
            "json-train.arrow",
        ]
