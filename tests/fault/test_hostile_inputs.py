"""Hostile inputs: pickles are never loaded, recipes never run code, paths stay the recipe's,
and fuzzed recipes and states raise nothing but ZephonError."""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import pickle
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.fault.common import INLINE, memory_pipeline, texts, write_jsonl
from zephon_nodes import CheckpointError, Recipe, RecipeError, ZephonError, simulate
from zephon_nodes.state import (
    COMMIT_FILE,
    checkpoint_path,
    load_checkpoint,
    load_state,
    validate_state,
)


class _Payload:
    """Unpickling this object creates ``path`` (a stand-in for arbitrary code execution)."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)

    def __reduce__(self) -> tuple[Any, ...]:
        return (open, (self.path, "w"))


def _payload(marker: Path) -> bytes:
    return pickle.dumps({"format": "zephon-nodes/1", "x": _Payload(marker)}, protocol=2)


def test_the_payload_is_live(tmp_path: Path) -> None:
    """Control: unpickling the payload really does create the marker file."""
    marker = tmp_path / "control-marker"
    pickle.loads(_payload(marker)).get("x").close()
    assert marker.exists()


@pytest.mark.parametrize("protocol_blob", ["pickle", "torch"])
def test_pickle_state_file_is_rejected_not_executed(tmp_path: Path, protocol_blob: str) -> None:
    marker = tmp_path / "pwned"
    target = tmp_path / "zephon_state.json"
    if protocol_blob == "pickle":
        target.write_bytes(_payload(marker))
    else:
        import torch

        torch.save({"state": _Payload(marker)}, target)  # a zip holding a pickle
    with pytest.raises(CheckpointError, match="not a zephon-nodes state"):
        load_state(tmp_path)
    assert not marker.exists()


def test_pickle_rank_file_in_a_committed_checkpoint(tmp_path: Path) -> None:
    """Even with a commit marker whose digest matches the pickle, nothing is unpickled."""
    marker = tmp_path / "pwned"
    d = checkpoint_path(tmp_path, 3)
    d.mkdir(parents=True)
    blob = _payload(marker)
    (d / "rank_00000.json").write_bytes(blob)
    (d / COMMIT_FILE).write_text(
        json.dumps(
            {
                "format": "zephon-nodes-checkpoint/1",
                "step": 3,
                "world_size": 1,
                "files": {"rank_00000.json": hashlib.sha256(blob).hexdigest()},
            }
        )
    )
    with pytest.raises(CheckpointError, match=r"not UTF-8|invalid JSON"):
        load_checkpoint(tmp_path)
    assert not marker.exists()


def test_pickle_bytes_inside_a_state_are_refused(tmp_path: Path) -> None:
    pipe = memory_pipeline()
    marker = tmp_path / "pwned"
    saved: dict[str, Any] = {}
    for _ in simulate(pipe, 1, 2, save_at=2, on_save=saved.update):
        pass
    for where in ("lanes", "fingerprint", "step"):
        bad = copy.deepcopy(saved)
        bad[where] = _payload(marker)
        node = pipe.rank_node(1, 0, pool=INLINE)
        with pytest.raises(CheckpointError):
            node.reset(bad)
    assert not marker.exists()


# -- recipes -----------------------------------------------------------------------------

BASE_TOML = """
seed = 3
num_lanes = 4
global_batch_size = 8
seq_len = 16
flush_every = 2
[tokenizer]
kind = "bytes"
[[datasets]]
name = "d"
paths = ["data/*.jsonl"]
[work]
chunk_size = 5
epochs = 1
[shuffle]
buffer_size = 4
"""


def _make_recipe_dir(path: Path) -> Path:
    write_jsonl(path / "data" / "a.jsonl", texts(30, seed=1))
    write_jsonl(path / "data" / "b.jsonl", texts(30, seed=2))
    (path / "recipe.toml").write_text(BASE_TOML)
    return path


@pytest.fixture
def recipe_dir(tmp_path: Path) -> Path:
    return _make_recipe_dir(tmp_path)


@pytest.fixture(scope="module")
def fuzz_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _make_recipe_dir(tmp_path_factory.mktemp("fuzz"))


@pytest.mark.parametrize(
    "extra",
    [
        'operator = "os.system"\n',
        '[[operators]]\nmap = "os.system"\nparams = {command = "touch {marker}"}\n',
        "[[operators]]\nfilter = \"builtins.eval\"\nparams = {source = \"open('{marker}','w')\"}\n",
        "[[operators]]\nmap = \"__import__('os').system('touch {marker}')\"\n",
        "[hooks]\non_load = \"import os; os.system('touch {marker}')\"\n",
    ],
)
def test_recipe_cannot_import_or_run_code(recipe_dir: Path, extra: str) -> None:
    marker = recipe_dir / "pwned"
    text = BASE_TOML.replace("[tokenizer]", extra.replace("{marker}", str(marker)) + "[tokenizer]")
    if extra.startswith("[[operators]]") or extra.startswith("[hooks]"):
        text = BASE_TOML + extra.replace("{marker}", str(marker))
    (recipe_dir / "evil.toml").write_text(text)
    with pytest.raises(RecipeError):
        recipe = Recipe.from_toml(recipe_dir / "evil.toml")
        recipe.fingerprint()  # an unregistered operator may be refused only when resolved
        from zephon_nodes import Pipeline

        Pipeline(recipe)
    assert not marker.exists()


@pytest.mark.parametrize(
    "tokenizer",
    [
        'kind = "os.system"',
        'kind = "sentencepiece"\npath = "/bin/sh"',
        'kind = "registered"\nname = "builtins.eval"',
    ],
)
def test_tokenizer_cannot_name_code(recipe_dir: Path, tokenizer: str) -> None:
    text = BASE_TOML.replace('kind = "bytes"', tokenizer)
    (recipe_dir / "evil.toml").write_text(text)
    with pytest.raises(ZephonError):
        from zephon_nodes import Pipeline

        Pipeline(Recipe.from_toml(recipe_dir / "evil.toml"))


def test_paths_resolve_relative_to_the_recipe(
    recipe_dir: Path, tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    elsewhere = tmp_path_factory.mktemp("cwd")
    write_jsonl(elsewhere / "data" / "a.jsonl", ["a decoy that must not be read"] * 50)
    monkeypatch.chdir(elsewhere)
    recipe = Recipe.from_toml(recipe_dir / "recipe.toml")
    files = recipe.datasets[0].files()
    assert [f.resolve() for f in files] == [
        (recipe_dir / "data" / "a.jsonl").resolve(),
        (recipe_dir / "data" / "b.jsonl").resolve(),
    ]
    # and the canonical form holds their content checksums, not where they live
    canon = json.dumps(recipe.canonical())
    assert str(recipe_dir) not in canon and "a.jsonl" not in canon and "xxh3_128:" in canon


def test_missing_data_file_is_reported_by_name(recipe_dir: Path) -> None:
    text = BASE_TOML.replace('paths = ["data/*.jsonl"]', 'paths = ["data/nope-*.jsonl"]')
    (recipe_dir / "r2.toml").write_text(text)
    with pytest.raises(ZephonError, match=r"data/nope-\*\.jsonl"):
        from zephon_nodes import Pipeline

        Pipeline(Recipe.from_toml(recipe_dir / "r2.toml"))


def test_missing_tokenizer_file_is_reported_by_name(recipe_dir: Path) -> None:
    text = BASE_TOML.replace('kind = "bytes"', 'kind = "sentencepiece"\npath = "tok/missing.model"')
    (recipe_dir / "r3.toml").write_text(text)
    with pytest.raises(ZephonError, match=r"tok/missing\.model"):
        from zephon_nodes import Pipeline

        Pipeline(Recipe.from_toml(recipe_dir / "r3.toml"))


def test_missing_recipe_is_reported_by_name(tmp_path: Path) -> None:
    with pytest.raises(RecipeError, match=r"recipe file not found: .*absent\.toml"):
        Recipe.from_toml(tmp_path / "absent.toml")


# -- Hypothesis: fuzz recipes and states ---------------------------------------------------

json_scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=True)
    | st.text(max_size=12)
    | st.sampled_from(["bytes", "sentencepiece", "inf", "concat", "raise", "skip", "*.jsonl"])
)
json_values = st.recursive(
    json_scalars,
    lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=8), c, max_size=4),
    max_leaves=12,
)


def _field(valid: Any) -> st.SearchStrategy[Any]:
    return st.one_of(st.just(valid), json_values)


recipe_dicts = st.fixed_dictionaries(
    {},
    optional={
        "seed": _field(3),
        "num_lanes": _field(4),
        "global_batch_size": _field(8),
        "seq_len": _field(16),
        "flush_every": _field(2),
        "on_error": _field("raise"),
        "tokenizer": st.fixed_dictionaries(
            {"kind": _field("bytes")},
            optional={"path": _field("tok.model"), "add_bos": _field(True), "name": json_values},
        )
        | json_values,
        "datasets": st.lists(
            st.fixed_dictionaries(
                {"paths": _field(["data/*.jsonl"])},
                optional={
                    "name": _field("d"),
                    "text_field": _field("text"),
                    "weight": _field(1.0),
                    "on_error": _field("skip"),
                    "on_exhausted": _field("end"),
                },
            )
            | json_values,
            max_size=3,
        )
        | json_values,
        "work": st.fixed_dictionaries(
            {}, optional={"chunk_size": _field(5), "epochs": _field("inf")}
        )
        | json_values,
        "shuffle": st.fixed_dictionaries({}, optional={"buffer_size": _field(4)}) | json_values,
        "pack": st.fixed_dictionaries(
            {}, optional={"mode": _field("concat"), "pad_id": _field(0), "bins": _field(4)}
        )
        | json_values,
        "mixture": st.fixed_dictionaries(
            {}, optional={"weights": json_values, "unit": _field("steps")}
        )
        | json_values,
        "operators": st.lists(
            st.fixed_dictionaries(
                {}, optional={"filter": _field("min_chars"), "params": json_values}
            ),
            max_size=2,
        )
        | json_values,
        "extra_key": json_values,
    },
)


@given(data=recipe_dicts)
def test_fuzz_recipe_from_dict(fuzz_dir: Path, data: dict[str, Any]) -> None:
    from zephon_nodes import Pipeline

    try:
        recipe = Recipe.from_dict(data, base_dir=fuzz_dir)
        recipe.fingerprint()
        Pipeline(recipe)
    except ZephonError:
        pass


@given(text=st.text(max_size=300) | st.sampled_from([BASE_TOML, BASE_TOML[:100]]))
def test_fuzz_recipe_from_toml(fuzz_dir: Path, text: str) -> None:
    path = fuzz_dir / "fuzz.toml"
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    with contextlib.suppress(ZephonError):
        Recipe.from_toml(path).fingerprint()


PIPE = memory_pipeline()
_SAVED: dict[str, Any] = {}
for _ in simulate(PIPE, 2, 3, save_at=3, on_save=_SAVED.update):
    pass

lane_keys = st.sampled_from(["0", "1", "2", "3", "4", "-1", "01", "x", " 1", "1.0"])
lane_values = st.one_of(
    st.lists(st.integers(min_value=-3, max_value=60), min_size=2, max_size=2),
    st.lists(st.integers(), min_size=0, max_size=3),
    json_values,
)
state_dicts = st.fixed_dictionaries(
    {},
    optional={
        "format": _field(_SAVED["format"]),
        "fingerprint": _field(_SAVED["fingerprint"]),
        "recipe": _field(_SAVED["recipe"]),
        "num_lanes": _field(4),
        "step": _field(3),
        "micro": st.one_of(st.just(0), st.integers(min_value=-1, max_value=4), json_values),
        "lanes": st.one_of(
            st.just(_SAVED["lanes"]),
            st.dictionaries(lane_keys, lane_values, max_size=6),
            json_values,
        ),
        "layout": json_values,
        "other": json_values,
    },
)


@given(state=state_dicts | json_values)
def test_fuzz_validate_state_and_reset(state: Any) -> None:
    with contextlib.suppress(ZephonError):
        validate_state(
            state,
            fingerprint=PIPE.fingerprint,
            summary=PIPE.summary,
            num_lanes=PIPE.num_lanes,
            lanes=[0, 1],
        )
    node = PIPE.rank_node(2, 0, local_batch_size=2, pool=INLINE)
    try:
        node.reset(state)
        for _ in range(3):
            next(node)
    except (ZephonError, StopIteration):
        pass


@given(
    blob=st.binary(max_size=400)
    | st.sampled_from([json.dumps(_SAVED).encode()[:n] for n in (0, 1, 50, 200)])
)
def test_fuzz_load_state(tmp_path_factory: pytest.TempPathFactory, blob: bytes) -> None:
    d = tmp_path_factory.mktemp("state")
    (d / "zephon_state.json").write_bytes(blob)
    with contextlib.suppress(ZephonError):
        load_state(d)
