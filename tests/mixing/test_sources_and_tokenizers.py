"""Parquet shards, Hugging Face tokenizer files and user tokenizers."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.mixing.helpers import digests, texts, write_jsonl
from zephon_nodes import DatasetSpec, Pipeline, RecipeError, TokenizerSpec, WorkerPool, simulate
from zephon_nodes.operators.documents import TextBatch
from zephon_nodes.operators.tokenize import Tokenize
from zephon_nodes.recipe import Recipe, WorkSpec
from zephon_nodes.recipe.registry import register_tokenizer

DOCS = [" ".join(texts("abcdefgh", 8, 2, 6, k)) for k in range(90)]


def recipe(dataset: DatasetSpec, tokenizer: TokenizerSpec | None = None) -> Recipe:
    return Recipe(
        datasets=(dataset,),
        tokenizer=tokenizer or TokenizerSpec(kind="bytes"),
        seed=4,
        num_lanes=4,
        global_batch_size=8,
        seq_len=32,
        flush_every=2,
        work=WorkSpec(chunk_size=5, epochs=1),
    )


def write_parquet(path, column, values, row_group_size=7):
    table = pa.table({column: values, "id": list(range(len(values)))})
    pq.write_table(table, path, row_group_size=row_group_size)
    return path


class TestParquet:
    """Parquet shards give exactly the batches of the same records in jsonl."""

    def test_same_batches_as_jsonl(self, tmp_path):
        write_jsonl(tmp_path / "a.jsonl", DOCS[:50])
        write_jsonl(tmp_path / "b.jsonl", DOCS[50:])
        write_parquet(tmp_path / "a.parquet", "text", DOCS[:50])
        write_parquet(tmp_path / "b.parquet", "text", DOCS[50:], row_group_size=4)
        as_jsonl = recipe(DatasetSpec("d", paths=("*.jsonl",), base_dir=tmp_path))
        as_parquet = recipe(DatasetSpec("d", paths=("*.parquet",), base_dir=tmp_path))
        reference = digests(Pipeline(as_jsonl), 1, 100)
        assert len(reference) > 3
        assert digests(Pipeline(as_parquet), 2, 100, num_workers=2) == reference

    @pytest.mark.parametrize(
        ("values", "column", "reason"),
        [
            (DOCS[:20], "body", "missing_field"),
            (list(range(20)), "text", "non_string_field"),
            ([*DOCS[:10], None, *DOCS[11:20]], "text", "non_string_field"),
        ],
    )
    def test_bad_columns_follow_the_policy(self, tmp_path, values, column, reason):
        write_parquet(tmp_path / "x.parquet", column, values)
        spec = DatasetSpec("d", paths=("x.parquet",), base_dir=tmp_path)
        with pytest.raises(Exception, match=r"dataset 'd': .*x\.parquet row \d+"):
            list(simulate(Pipeline(recipe(spec)), 1, 100))
        skipping = Pipeline(recipe(dataclasses.replace(spec, on_error="skip")))
        item = skipping.work_source.work(0, 0)
        assert item is not None
        batch = skipping.stateless(item)
        bad = sum(1 for v in values[item.start : item.stop] if not isinstance(v, str))
        if column != "text":
            bad = item.stop - item.start
        assert dict(batch.skipped).get(reason, 0) == bad


class TestHFTokenizer:
    """kind = "hf": a tokenizer.json file, encoded in groups."""

    def test_ids_match_the_tokenizers_library(self, hf_tokenizer):
        from tokenizers import Tokenizer

        ref = Tokenizer.from_file(str(hf_tokenizer))
        vocab = ref.get_vocab()
        spec = TokenizerSpec(kind="hf", path=hf_tokenizer)
        out = Tokenize(spec)(TextBatch(DOCS[:5]))
        want = [
            [vocab["<s>"], *ref.encode(t, add_special_tokens=False).ids, vocab["</s>"]]
            for t in DOCS[:5]
        ]
        assert [d.tolist() for d in out.documents()] == want

    def test_pipeline_with_hf_is_elastic(self, tmp_path, hf_tokenizer):
        write_jsonl(tmp_path / "a.jsonl", DOCS)
        r = recipe(
            DatasetSpec("d", paths=("a.jsonl",), base_dir=tmp_path),
            TokenizerSpec(kind="hf", path=hf_tokenizer),
        )
        p = Pipeline(r)
        assert p.pad_id == json.loads(hf_tokenizer.read_text())["model"]["vocab"]["<pad>"]
        reference = digests(p, 1, 100, num_workers=0)
        assert len(reference) > 3
        assert digests(p, 4, 100, num_workers=2) == reference

    def test_missing_bos_is_refused(self, tmp_path):
        from tokenizers import Tokenizer, models, pre_tokenizers, trainers

        tok = Tokenizer(models.BPE(unk_token="<unk>"))
        tok.pre_tokenizer = pre_tokenizers.Whitespace()
        tok.train_from_iterator(DOCS, trainers.BpeTrainer(vocab_size=60, special_tokens=["<unk>"]))
        tok.save(str(tmp_path / "t.json"))
        r = recipe(
            DatasetSpec("d", records=({"text": "ab"},)),
            TokenizerSpec(kind="hf", path=tmp_path / "t.json"),
        )
        with pytest.raises(RecipeError, match="no bos token"):
            Pipeline(r)

    def test_missing_bos_is_refused_after_the_file_was_loaded_without_bos(self, tmp_path):
        """A process that ran the file with add_bos off: a recipe asking for bos is refused.

        (It was checked only when the file was first loaded in the process: the second
        recipe's documents then began with id -1, the "bos id" of a tokenizer without one.)
        """
        from tokenizers import Tokenizer, models, pre_tokenizers, trainers

        tok = Tokenizer(models.BPE(unk_token="<unk>"))
        tok.pre_tokenizer = pre_tokenizers.Whitespace()
        tok.train_from_iterator(DOCS, trainers.BpeTrainer(vocab_size=60, special_tokens=["<unk>"]))
        tok.save(str(tmp_path / "t.json"))
        plain = TokenizerSpec(kind="hf", path=tmp_path / "t.json", add_bos=False, add_eos=False)
        records = DatasetSpec("d", records=({"text": "ab"},))
        Pipeline(recipe(records, plain))
        with pytest.raises(RecipeError, match="no bos token"):
            Pipeline(recipe(records, TokenizerSpec(kind="hf", path=tmp_path / "t.json")))


class VowelTokenizer:
    """A user tokenizer: 1 for a vowel, 2 otherwise (module level, so it pickles)."""

    bos_id, eos_id, pad_id, vocab_size = 5, 6, 0, 7

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [[1 if c in "aeiou" else 2 for c in t] for t in texts]


class TestCustomTokenizer:
    """kind = "custom": an object registered in Python under a name."""

    def test_registered_tokenizer_is_used_in_threads_and_processes(self):
        register_tokenizer("test-vowels", VowelTokenizer, version="1")
        r = recipe(
            DatasetSpec("d", records=tuple({"text": t} for t in DOCS)),
            TokenizerSpec(kind="custom", name="test-vowels"),
        )
        p = Pipeline(r)
        batch = next(iter(simulate(p, 1, 1, keep_batches=True)))[1]
        assert batch is not None
        assert set(np.unique(batch[0]["input"].numpy())) <= {0, 1, 2, 5, 6}
        reference = digests(p, 1, 100, num_workers=0)
        with WorkerPool(2, "process", timeout_s=120) as pool:
            assert [x.digest for x, _ in simulate(p, 2, 100, pool=pool)] == reference

    def test_version_is_part_of_the_fingerprint(self):
        r = recipe(
            DatasetSpec("d", records=({"text": "abc"},)),
            TokenizerSpec(kind="custom", name="test-vowels-v"),
        )
        register_tokenizer("test-vowels-v", VowelTokenizer(), version="1")
        before = r.fingerprint()
        register_tokenizer("test-vowels-v", VowelTokenizer(), version="2")
        assert r.fingerprint() != before

    def test_unregistered_name_is_refused(self):
        r = recipe(
            DatasetSpec("d", records=({"text": "abc"},)),
            TokenizerSpec(kind="custom", name="never-registered"),
        )
        with pytest.raises(RecipeError, match="register_tokenizer"):
            Pipeline(r)
