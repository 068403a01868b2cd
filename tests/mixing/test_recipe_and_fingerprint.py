"""Mixture recipes in TOML, the issue-2 format unchanged, and fingerprints of what matters."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.mixing.conftest import train_hf_tokenizer
from tests.mixing.helpers import texts, write_jsonl
from zephon_nodes import (
    CheckpointError,
    DatasetSpec,
    Pipeline,
    Recipe,
    RecipeError,
    ShuffleSpec,
    TokenizerSpec,
    WorkSpec,
    simulate,
)

MIXED = """\
seed = 3
num_lanes = 4
global_batch_size = 8
seq_len = 64
flush_every = 2
on_error = "skip"

[tokenizer]
kind = "hf"
path = "tokenizer.json"

[[datasets]]
name = "web"
paths = ["web.jsonl"]
weight = 0.7
on_exhausted = "repeat"

[[datasets]]
name = "code"
paths = ["code.jsonl"]
weight = 0.3
on_exhausted = "repeat"
on_error = "raise"

[work]
chunk_size = 4

[pack]
mode = "bestfit"
long_documents = "drop"
bins = 8

[[operators]]
filter = "min_chars"
params = {n = 3}
datasets = ["web"]
"""

SCHEDULE = """
[mixture]
unit = "steps"
weights = [{at = 0, web = 0.9, code = 0.1}, {at = 5, web = 0.5, code = 0.5}]
"""


def write_mixed(tmp: Path, text: str = MIXED) -> Path:
    write_jsonl(tmp / "web.jsonl", [" ".join(texts("abcd", 6, 1, 5, k)) for k in range(80)])
    write_jsonl(tmp / "code.jsonl", [" ".join(texts("efgh", 30, 1, 5, k)) for k in range(40)])
    if not (tmp / "tokenizer.json").exists():
        train_hf_tokenizer(tmp / "tokenizer.json")
    path = tmp / "recipe.toml"
    path.write_text(text, encoding="utf-8")
    return path


class TestToml:
    """Several datasets, schedules, operators, policies and packing modes load from TOML."""

    def test_mixed_recipe_loads_every_field(self, tmp_path):
        r = Recipe.from_toml(write_mixed(tmp_path))
        web, code = r.datasets
        assert (web.weight, code.weight) == (0.7, 0.3)
        assert (web.on_error, code.on_error) == ("skip", "raise")
        assert web.on_exhausted == code.on_exhausted == "repeat"
        assert (r.pack.mode, r.pack.long_documents, r.pack.bins) == ("bestfit", "drop", 8)
        assert [(o.kind, o.name, dict(o.params), o.datasets) for o in r.operators] == [
            ("filter", "min_chars", {"n": 3}, ("web",))
        ]
        assert r.tokenizer.kind == "hf"
        assert len(list(simulate(Pipeline(r), 2, 5))) == 5

    def test_schedule_loads(self, tmp_path):
        text = MIXED.replace("weight = 0.7\n", "").replace("weight = 0.3\n", "") + SCHEDULE
        r = Recipe.from_toml(write_mixed(tmp_path, text))
        assert r.mixture.schedule == (
            (0, {"web": 0.9, "code": 0.1}),
            (5, {"web": 0.5, "code": 0.5}),
        )

    @pytest.mark.parametrize(
        ("change", "message"),
        [
            (lambda t: t + SCHEDULE, "either per dataset or as a schedule"),
            (
                lambda t: (
                    t.replace("weight = 0.7\n", "").replace("weight = 0.3\n", "")
                    + SCHEDULE.replace("code = 0.1", "books = 0.1")
                ),
                "every point must give a weight to each dataset",
            ),
            (lambda t: t.replace('mode = "bestfit"', 'mode = "stack"'), "pack.mode"),
            (lambda t: t.replace('on_exhausted = "repeat"', 'on_exhausted = "x"', 1), "on_exh"),
            (lambda t: t.replace('on_error = "skip"', 'on_error = "ignore"'), "on_error"),
            (lambda t: t.replace('filter = "min_chars"', 'filter = "nope"'), "register_filter"),
            (lambda t: t.replace('datasets = ["web"]', 'datasets = ["nope"]'), "not in the recipe"),
            (lambda t: t.replace("params = {n = 3}", 'module = "os"'), "unknown key"),
            (lambda t: t.replace("params = {n = 3}", 'map = "strip"'), "exactly one of"),
            (lambda t: t + "\n[mixture]\nblock = 1000\n", "power of two"),
        ],
    )
    def test_invalid_recipes_are_refused(self, tmp_path, change, message):
        with pytest.raises(RecipeError, match=message):
            Pipeline(Recipe.from_toml(write_mixed(tmp_path, change(MIXED))))


def test_single_dataset_recipes_keep_their_fingerprint_and_batches():
    """The issue-2 format: fingerprint and digests pinned from the version before mixing.

    Batches now carry ``dataset_ids`` by default (a new digested field); without it the
    batches are byte for byte those of the pinned version. Finite streams are now dealt by
    tokens by default (``work.deal = "auto"``): the pinned version's round-robin dealing is
    ``work.deal = "round_robin"``, and a recipe left at the default gets a new fingerprint
    (so a checkpoint of the old batches is refused, never silently resumed).
    """
    recs = tuple({"text": "word " * (i % 7 + 1)} for i in range(300))
    r = Recipe(
        datasets=(DatasetSpec("m", records=recs),),
        tokenizer=TokenizerSpec(kind="bytes"),
        seed=3,
        num_lanes=4,
        global_batch_size=8,
        seq_len=32,
        flush_every=3,
        work=WorkSpec(chunk_size=7, epochs=1, deal="round_robin"),
        shuffle=ShuffleSpec(4),
    )
    default = Pipeline(r.replace(work=WorkSpec(chunk_size=7, epochs=1)), provenance=False)
    assert default.fingerprint != "9b6ad73cae351c576aa3a94708d87fd8b54b3c4f3390b0c6c220ed9a2dd93d91"
    p = Pipeline(r, provenance=False)
    assert p.fingerprint == "9b6ad73cae351c576aa3a94708d87fd8b54b3c4f3390b0c6c220ed9a2dd93d91"
    for (_, mbs), (_, with_ids) in zip(
        simulate(p, 2, 3, keep_batches=True),
        simulate(Pipeline(r), 2, 3, keep_batches=True),
        strict=True,
    ):
        for mb, mb_ids in zip(mbs, with_ids, strict=True):
            assert set(mb_ids) - set(mb) == {"dataset_ids"}
            assert all(mb[k].equal(mb_ids[k]) for k in mb)
            real = mb_ids["labels"] != -100
            assert (mb_ids["dataset_ids"][real] == 0).all()
    assert [x.digest for x, _ in simulate(p, 2, 3)] == [
        "08718a9d3df2053bc11554f0a0b8f8fa72320f99df134e166c902dfd90958268",
        "b8e7f187785781fac95a45f4fdc94412e372e75cc23aeef59651403ab3e6d451",
        "c79aa901ce247ba4d12270161c46743a2d80db5ab8260709ea67541293bba94e",
    ]


def _retrain(tmp: Path) -> None:
    train_hf_tokenizer(tmp / "tokenizer.json", vocab_size=100)


def _add_data(tmp: Path) -> None:
    with open(tmp / "code.jsonl", "a", encoding="utf-8") as f:
        f.write('{"text": "efgh efgh"}\n')


SCHEDULED = MIXED.replace("weight = 0.7\n", "").replace("weight = 0.3\n", "") + SCHEDULE


@pytest.mark.parametrize(
    ("base", "change", "field"),
    [
        (MIXED, lambda t, d: t.replace("weight = 0.7", "weight = 0.6"), "datasets"),
        (SCHEDULED, lambda t, d: t.replace("at = 5", "at = 6"), "mixture"),
        (SCHEDULED, lambda t, d: t.replace("web = 0.5", "web = 0.4"), "mixture"),
        (
            MIXED,
            lambda t, d: (
                t
                + SCHEDULE.replace("[mixture]\n", "[mixture]\nblock = 512\n").replace(
                    "weights = [{at = 0, web = 0.9, code = 0.1}, {at = 5, web = 0.5, code = 0.5}]",
                    "",
                )
            ),
            "mixture",
        ),
        (MIXED, lambda t, d: _retrain(d) or t, "tokenizer"),
        (MIXED, lambda t, d: _add_data(d) or t, "datasets"),
        (MIXED, lambda t, d: t.replace("params = {n = 3}", "params = {n = 4}"), "operators"),
        (
            MIXED,
            lambda t, d: t.replace('long_documents = "drop"', 'long_documents = "split"'),
            "pack",
        ),
        (MIXED, lambda t, d: t.replace('on_error = "raise"', 'on_error = "skip"'), "datasets"),
    ],
)
def test_changes_change_the_fingerprint_and_refuse_resume(tmp_path, base, change, field):
    """Weights, schedule, tokenizer file, data files, operators: a resume names the field."""
    path = write_mixed(tmp_path, base)
    before = Pipeline(Recipe.from_toml(path))
    saved: dict = {}
    list(simulate(before, 2, 2, save_at=2, on_save=saved.update))
    path.write_text(change(path.read_text(), tmp_path), encoding="utf-8")
    after = Pipeline(Recipe.from_toml(path))
    assert after.fingerprint != before.fingerprint
    with pytest.raises(CheckpointError, match=field):
        list(simulate(after, 2, 1, resume_state=saved))


def test_stored_estimate_skips_sampling_and_is_fingerprinted(tmp_path):
    """tokens_per_record given in the recipe is used as is (and is part of the identity)."""
    path = write_mixed(tmp_path)
    estimated = Pipeline(Recipe.from_toml(path))
    est = estimated.canonical["mixture"]["estimate"]
    stored = path.read_text() + (
        f"\n[mixture]\ntokens_per_record = {{web = {est['web']}, code = {est['code']}}}\n"
    )
    path.write_text(stored, encoding="utf-8")
    p = Pipeline(Recipe.from_toml(path))
    assert "estimate" not in p.canonical["mixture"]
    assert [x.digest for x, _ in simulate(p, 1, 4)] == [
        x.digest for x, _ in simulate(estimated, 1, 4)
    ]


def test_per_dataset_chunk_size(tmp_path):
    """A dataset's own chunk_size cuts its work items and joins the fingerprint."""
    text = MIXED.replace('name = "code"\n', 'name = "code"\nchunk_size = 3\n')
    r = Recipe.from_toml(write_mixed(tmp_path, text))
    assert r.datasets[1].chunk_size == 3
    p = Pipeline(r)
    assert p.datasets[1].num_work_items == 14  # 40 records in items of 3
    assert p.datasets[0].num_work_items == 20  # 80 records in items of work.chunk_size = 4
    assert p.fingerprint != Pipeline(Recipe.from_toml(write_mixed(tmp_path))).fingerprint
    with pytest.raises(RecipeError, match="chunk_size=0"):
        Recipe.from_toml(write_mixed(tmp_path, text.replace("chunk_size = 3", "chunk_size = 0")))
