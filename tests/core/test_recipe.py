"""Recipes: TOML loading, fingerprints, and refusing a resume with another recipe."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.core.helpers import digests, texts_recipe
from zephon_nodes import CheckpointError, DatasetSpec, Pipeline, Recipe, RecipeError, simulate

ISSUE_RECIPE = """
seed = 7
num_lanes = 8
global_batch_size = 16
seq_len = 128
flush_every = 4
[tokenizer]
kind = "sentencepiece"
path = "tok.model"
add_bos = true
add_eos = true
[[datasets]]
name = "web"
paths = ["data/*.jsonl.zst"]
text_field = "text"
weight = 1.0
[work]
chunk_size = 64
epochs = 1
[shuffle]
buffer_size = 32
"""


def test_issue_recipe_loads_with_paths_relative_to_the_file(tmp_path, monkeypatch):
    """The documented recipe parses; paths resolve against the recipe's directory."""
    (tmp_path / "r.toml").write_text(ISSUE_RECIPE)
    monkeypatch.chdir("/")
    r = Recipe.from_toml(tmp_path / "r.toml")
    assert (r.seed, r.num_lanes, r.global_batch_size, r.seq_len, r.flush_every) == (
        7,
        8,
        16,
        128,
        4,
    )
    assert r.tokenizer.path == tmp_path / "tok.model"
    assert r.datasets[0].base_dir == tmp_path
    assert (r.work.chunk_size, r.work.epochs, r.shuffle.buffer_size) == (64, 1, 32)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "num_lanes = 3\nglobal_batch_size = 16\n"
            "[tokenizer]\nkind='bytes'\n[[datasets]]\nname='a'\npaths=['x']",
            "global_batch_size=16 must be a multiple of\\s+num_lanes=3",
        ),
        (
            "seq_lenn = 3\n[tokenizer]\nkind='bytes'\n[[datasets]]\nname='a'\npaths=['x']",
            "unknown key",
        ),
        (
            "seq_len = 'long'\n[tokenizer]\nkind='bytes'\n[[datasets]]\nname='a'\npaths=['x']",
            "seq_len='long' must be int",
        ),
        ("[tokenizer]\nkind='bytes'\n", "at least one"),
        (
            "[tokenizer]\nkind='bytes'\n[[datasets]]\nname='a'\npaths=['x']\n[work]\nepochs=0",
            "work.epochs=0 must be an integer in",
        ),
        ("this is = not toml [", "not a valid TOML file"),
        ("", "the recipe is empty: it needs a \\[tokenizer\\] table"),
        ("# only a comment\n", "the recipe is empty"),
    ],
)
def test_invalid_recipes_are_refused_with_the_field(tmp_path, text, message):
    """Each invalid recipe names the file and the field."""
    (tmp_path / "r.toml").write_text(text)
    with pytest.raises(RecipeError, match=message) as info:
        Recipe.from_toml(tmp_path / "r.toml")
    assert "r.toml" in str(info.value)


def test_a_byte_order_mark_is_read_past(tmp_path):
    """A recipe saved with a UTF-8 byte-order mark (Windows editors) is the same recipe."""
    text = ISSUE_RECIPE.replace('kind = "sentencepiece"\npath = "tok.model"', 'kind = "bytes"')
    (tmp_path / "r.toml").write_text(text)
    (tmp_path / "bom.toml").write_bytes(b"\xef\xbb\xbf" + text.encode())
    with_mark = Recipe.from_toml(tmp_path / "bom.toml")
    assert with_mark.seed == 7
    assert with_mark == Recipe.from_toml(tmp_path / "r.toml")


def test_a_recipe_in_another_encoding_is_named(tmp_path):
    """UTF-16 is not TOML: one error naming the file, not a decoding traceback."""
    (tmp_path / "r.toml").write_bytes(ISSUE_RECIPE.encode("utf-16"))
    with pytest.raises(RecipeError, match=r"r\.toml: not a valid TOML file"):
        Recipe.from_toml(tmp_path / "r.toml")


def test_one_pattern_may_be_a_string(tmp_path):
    """``paths = "data/*.jsonl"`` is ``paths = ["data/*.jsonl"]`` (it was 'must be list')."""
    text = ISSUE_RECIPE.replace('kind = "sentencepiece"\npath = "tok.model"', 'kind = "bytes"')
    (tmp_path / "list.toml").write_text(text)
    (tmp_path / "one.toml").write_text(text.replace('["data/*.jsonl.zst"]', '"data/*.jsonl.zst"'))
    one = Recipe.from_toml(tmp_path / "one.toml")
    assert one.datasets[0].paths == ("data/*.jsonl.zst",)
    assert one == Recipe.from_toml(tmp_path / "list.toml")


def test_a_dataset_spec_takes_one_pattern_whole(tmp_path):
    """In Python, ``paths="data/*.jsonl"`` is one pattern, not its characters."""
    assert DatasetSpec("d", paths="data/*.jsonl").paths == ("data/*.jsonl",)  # type: ignore[arg-type]
    assert DatasetSpec("d", paths=Path("a/b.jsonl")).paths == ("a/b.jsonl",)  # type: ignore[arg-type]
    assert DatasetSpec("d", paths=["a", "b"]).paths == ("a", "b")  # type: ignore[arg-type]
    with pytest.raises(RecipeError, match=r"paths=\(5,\) must be patterns"):
        DatasetSpec("d", paths=[5])  # type: ignore[list-item]


def test_missing_recipe_file_is_named(tmp_path):
    with pytest.raises(RecipeError, match=r"nope\.toml"):
        Recipe.from_toml(tmp_path / "nope.toml")


def test_fingerprint_covers_every_data_defining_field():
    """Changing any data-defining field changes the fingerprint."""
    base = texts_recipe(["a b c"] * 5)
    fp = base.fingerprint()
    assert texts_recipe(["a b c"] * 5).fingerprint() == fp
    changed = [
        base.replace(seed=2),
        base.replace(num_lanes=8),
        base.replace(global_batch_size=16),
        base.replace(seq_len=17),
        base.replace(flush_every=3),
        base.replace(tokenizer=base.tokenizer.__class__(kind="bytes", add_bos=False)),
        base.replace(work=base.work.__class__(chunk_size=3)),
        base.replace(work=base.work.__class__(chunk_size=2, epochs=None)),
        base.replace(shuffle=base.shuffle.__class__(buffer_size=2)),
        texts_recipe(["a b d"] * 5),
    ]
    fps = [r.fingerprint() for r in changed]
    assert fp not in fps and len(set(fps)) == len(fps)


def test_fingerprint_covers_file_sizes_and_tokenizer_digest(tmp_path):
    """Appending to a data file or editing the tokenizer file changes the fingerprint."""
    (tmp_path / "d.jsonl").write_text('{"text": "x"}\n')
    (tmp_path / "tok.model").write_bytes(b"v1")
    text = ISSUE_RECIPE.replace("data/*.jsonl.zst", "d.jsonl")
    (tmp_path / "r.toml").write_text(text)
    fp = Recipe.from_toml(tmp_path / "r.toml").fingerprint()
    (tmp_path / "tok.model").write_bytes(b"v2")
    fp_tok = Recipe.from_toml(tmp_path / "r.toml").fingerprint()
    (tmp_path / "d.jsonl").write_text('{"text": "x"}\n{"text": "y"}\n')
    fp_data = Recipe.from_toml(tmp_path / "r.toml").fingerprint()
    assert len({fp, fp_tok, fp_data}) == 3
    canonical = json.dumps(Recipe.from_toml(tmp_path / "r.toml").canonical())
    assert str(tmp_path) not in canonical, "fingerprint must not depend on where the data lives"


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"seq_len": 32}, "seq_len: checkpoint has 16, recipe has 32"),
        ({"seed": 9}, "seed: checkpoint has 1, recipe has 9"),
        ({"global_batch_size": 16}, "global_batch_size: checkpoint has 8, recipe has 16"),
        ({"flush_every": 5}, "flush_every: checkpoint has 2, recipe has 5"),
    ],
)
def test_resume_with_another_recipe_names_the_field(change, field):
    """Loading a state into a pipeline of another recipe fails and says what differs."""
    texts = [f"document number {i} " * 3 for i in range(40)]
    pipeline = Pipeline(texts_recipe(texts))
    saved: dict = {}
    digests(pipeline, 2, 2, save_at=2, on_save=saved.update)
    other = Pipeline(texts_recipe(texts, **change))
    with pytest.raises(CheckpointError, match=field):
        next(simulate(other, 1, 1, resume_state=saved))


def test_resume_with_other_data_says_datasets_differ():
    texts = [f"document number {i} " * 3 for i in range(40)]
    saved: dict = {}
    digests(Pipeline(texts_recipe(texts)), 2, 2, save_at=2, on_save=saved.update)
    with pytest.raises(CheckpointError, match="datasets differ"):
        next(simulate(Pipeline(texts_recipe(texts[:-1])), 1, 1, resume_state=saved))


def test_physical_settings_are_not_in_the_recipe():
    """The canonical recipe has no rank, worker, runner or micro-batch field."""
    keys = json.dumps(texts_recipe(["x"]).canonical())
    for physical in ("world", "rank", "worker", "runner", "prefetch", "local_batch"):
        assert physical not in keys


def test_recipe_source_path_is_not_fingerprinted(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    for d in ("a", "b"):
        (tmp_path / d / "d.jsonl").write_text('{"text": "x"}\n')
        (tmp_path / d / "r.toml").write_text(
            "[tokenizer]\nkind='bytes'\n[[datasets]]\nname='w'\npaths=['d.jsonl']\n"
        )
    fa = Recipe.from_toml(tmp_path / "a" / "r.toml").fingerprint()
    fb = Recipe.from_toml(tmp_path / "b" / "r.toml").fingerprint()
    assert fa == fb
    assert Path(tmp_path / "a" / "r.toml") != Path(tmp_path / "b" / "r.toml")
