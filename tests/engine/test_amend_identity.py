"""Amendments join datasets to the run's streams by content, and refuse at the change.

Checked against a self-identifying corpus (``tests/stages/provenance.py``): a dataset renamed
over the same files continues its stream (no document of it delivered again); a name kept
over other data, or two datasets over the same data, is refused by the amendment itself in
one line, never accepted and then refused at the next resume (issue 32).
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tests.stages.conftest import batches, recipe
from tests.stages.provenance import delivered, write_corpus
from zephon_nodes import cli
from zephon_nodes.core.errors import RecipeError
from zephon_nodes.engine.pipeline import Pipeline
from zephon_nodes.engine.relane import relane_state
from zephon_nodes.engine.stages import amend_state
from zephon_nodes.state.files import load_state, save_state

A = {"name": "a", "paths": ["a/*.jsonl"]}
B = {"name": "b", "paths": ["b/*.jsonl"]}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[Any, int]]:
    """Datasets a, b and c (2 shards of 60 documents each) and each document's tokens."""
    root = tmp_path_factory.mktemp("amend-identity")
    return root, write_corpus(root, "abc", records=60)


@pytest.fixture(scope="module")
def saved(corpus: tuple[Path, Any]) -> tuple[Pipeline, dict[str, Any], Counter[Any]]:
    """The run over a and b saved at step 4, and what it delivered."""
    root, _ = corpus
    old = Pipeline(recipe(root, datasets=[A, B]))
    states: list[dict[str, Any]] = []
    got: Counter[Any] = Counter()
    for _, _, batch in batches(old, 4, save_at=4, saved=states):
        got.update(delivered([batch]))
    return old, states[0], got


def test_a_renamed_dataset_continues_its_stream(corpus: tuple[Path, Any], saved: Any) -> None:
    root, lengths = corpus
    old, state, before = saved
    new = Pipeline(recipe(root, datasets=[{"name": "a2", "paths": ["a/*.jsonl"]}, B]))
    amended = amend_state(old, state, new)
    assert amended["stage"]["names"] == ["a2", "b"]
    after: Counter[Any] = Counter()
    for _, _, batch in batches(new, 20, resume=amended):
        after.update(delivered([batch]))
    assert {doc[0] for doc in after} == {"a", "b"}  # a's files, read under the name a2
    assert not set(before) & set(after), "documents delivered before and again after"
    total = before + after
    assert all(n <= lengths[doc] for doc, n in total.items())


@pytest.mark.parametrize(
    ("datasets", "message"),
    [
        ([A, {"name": "a2", "paths": ["a/*.jsonl"]}, B], "'a' and 'a2' hold the same data"),
        ([{"name": "a", "paths": ["b/*.jsonl"]}], "'a' is not the data the run read"),
        ([{"name": "a", "paths": ["a/part-0.jsonl"]}, B], "'a' is not the data the run read"),
        ([{"name": "a", "paths": ["a/*.jsonl", "c/*.jsonl"]}, B], "'a' is not the data"),
        (
            [{"name": "a", "paths": ["a/part-1.jsonl", "a/part-0.jsonl"]}, B],
            "'a' is not the data the run read",
        ),
        ([{**A, "chunk_size": 2}, B], "'a' is not the data the run read"),
        ([A, {"name": "c", "paths": ["c/*.jsonl"]}, {"name": "c2", "paths": ["c/*"]}], "same"),
    ],
    ids=["both-names", "other-files", "subset", "superset", "reordered", "chunk", "two-new"],
)
def test_an_amendment_a_resume_would_refuse_is_refused_by_it(
    corpus: tuple[Path, Any], saved: Any, datasets: list[Any], message: str
) -> None:
    root, _ = corpus
    old, state, _ = saved
    with pytest.raises(RecipeError, match=message):
        amend_state(old, state, Pipeline(recipe(root, datasets=datasets)))


def _toml(root: Path, name: str, datasets: list[dict[str, Any]], lanes: int = 4) -> Path:
    lines = [
        "seed = 7",
        f"num_lanes = {lanes}",
        "global_batch_size = 8",
        "seq_len = 32",
        "flush_every = 2",
        '[tokenizer]\nkind = "bytes"',
        '[work]\nchunk_size = 4\nepochs = "inf"',
    ]
    for d in datasets:
        lines.append(f'[[datasets]]\nname = "{d["name"]}"\npaths = {json.dumps(d["paths"])}')
    path = root / name
    path.write_text("\n".join(lines) + "\n")
    return path


def test_zephon_amend_refuses_in_one_line(
    corpus: tuple[Path, Any], saved: Any, tmp_path: Path, capsys: Any
) -> None:
    root, _ = corpus
    _, state, _ = saved
    old_toml = _toml(tmp_path, "old.toml", [A, B])
    save_state(tmp_path / "ck", state)
    other = _toml(tmp_path, "new.toml", [{"name": "a", "paths": ["b/*.jsonl"]}, B])
    # The recipes name their data relative to themselves: point them at the corpus.
    for path in (old_toml, other):
        path.write_text(
            path.read_text().replace('["a/', f'["{root}/a/').replace('["b/', f'["{root}/b/')
        )
    capsys.readouterr()
    code = cli.main(
        ["amend", str(old_toml), str(tmp_path / "ck"), str(other), "--output", str(tmp_path / "x")]
    )
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    assert "'a' is not the data the run read" in err
    assert not (tmp_path / "x" / "zephon_state.json").exists()


def test_zephon_amend_after_a_relane_warns_about_unusable_data(
    corpus: tuple[Path, Any], tmp_path: Path, capsys: Any
) -> None:
    """Finite data re-laned 4 -> 8 then amended: the lanes left hold very unequal work."""
    root, _ = corpus
    finite = {"chunk_size": 4, "epochs": 1}
    r = recipe(root, datasets=[A, B], work=finite)
    states: list[dict[str, Any]] = []
    list(batches(Pipeline(r), 4, save_at=4, saved=states))
    p8 = Pipeline(r.replace(num_lanes=8))
    relaned = relane_state(Pipeline(r), states[0], 8)
    states = []
    list(batches(p8, 2, resume=relaned, save_at=6, saved=states))
    save_state(tmp_path / "ck", states[0])
    old_toml = _toml(tmp_path, "old.toml", [A, B], lanes=8)
    new_toml = _toml(tmp_path, "new.toml", [A, B], lanes=8)
    for path in (old_toml, new_toml):
        text = path.read_text().replace('epochs = "inf"', "epochs = 1")
        path.write_text(text.replace('["a/', f'["{root}/a/').replace('["b/', f'["{root}/b/'))
    new_toml.write_text(new_toml.read_text().replace("seq_len = 32", "seq_len = 64"))
    capsys.readouterr()
    args = [str(old_toml), str(tmp_path / "ck"), str(new_toml), "--output", str(tmp_path / "o")]
    assert cli.main(["amend", *args, "--json"]) == 0
    got = capsys.readouterr()
    unused = json.loads(got.out)["unreachable_work_items"]
    assert unused > 0
    assert f"warning: after the amendment after step 6, {unused} of the" in got.err
    # What is left is checked against the run itself: the lanes' remaining items differ.
    amended = load_state(tmp_path / "o" / "zephon_state.json")
    steps = sum(
        1 for _ in batches(Pipeline(r.replace(num_lanes=8, seq_len=64)), 100, resume=amended)
    )
    assert 0 < steps < 100
