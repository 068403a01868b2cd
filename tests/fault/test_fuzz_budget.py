"""Time-bounded mutation fuzzing: recipes, state files, states and multi-rank checkpoints.

Every target gets ``ZEPHON_FUZZ_SECONDS`` seconds (default 8) of seeded random mutations of a
valid input; any exception other than a ZephonError subclass fails the test with the input.
Run with ``-s`` to see how many inputs each target tried.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.fault.common import INLINE, memory_pipeline, texts, write_jsonl
from tests.fault.fuzzing import mutate, mutate_bytes
from zephon_nodes import Pipeline, Recipe, ZephonError, simulate
from zephon_nodes.state import (
    COMMIT_FILE,
    commit_checkpoint,
    decode_checked,
    encode_checked,
    load_checkpoint,
    load_state,
    save_rank_state,
)

SECONDS = float(os.environ.get("ZEPHON_FUZZ_SECONDS", "8"))
BASE_DICT: dict[str, Any] = {
    "seed": 3,
    "num_lanes": 4,
    "global_batch_size": 8,
    "seq_len": 16,
    "flush_every": 2,
    "tokenizer": {"kind": "bytes", "add_bos": True, "add_eos": True},
    "datasets": [{"name": "d", "paths": ["data/*.jsonl"], "text_field": "text", "weight": 1.0}],
    "work": {"chunk_size": 5, "epochs": 1},
    "shuffle": {"buffer_size": 4},
    "pack": {"mode": "concat", "pad_id": 0},
}
BASE_TOML = b"""seed = 3
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
[pack]
mode = "concat"
"""
PIPE = memory_pipeline()


def _valid_state() -> dict[str, Any]:
    saved: dict[str, Any] = {}
    for _ in simulate(PIPE, 2, 3, save_at=3, on_save=saved.update):
        pass
    return saved


STATE = _valid_state()


def _fuzz(name: str, seed: int, one: Callable[[random.Random], Any]) -> int:
    """Run ``one(rng)`` until the budget is spent; fail on a non-ZephonError exception."""
    rng = random.Random(seed)
    deadline = time.monotonic() + SECONDS
    n = 0
    while time.monotonic() < deadline:
        n += 1
        try:
            one(rng)
        except (ZephonError, StopIteration):
            pass
        except Exception as e:
            raise AssertionError(f"{name}: input #{n} (seed {seed}) raised {e!r}") from e
    print(f"\nfuzz {name}: {n} inputs in {SECONDS:.0f}s, only ZephonError raised")
    assert n >= 20, f"{name}: only {n} inputs in {SECONDS}s"
    return n


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("fuzzdata")
    write_jsonl(d / "data" / "a.jsonl", texts(25, seed=1))
    write_jsonl(d / "data" / "b.jsonl", texts(25, seed=2))
    return d


@pytest.mark.slow
def test_fuzz_recipe_dicts(data_dir: Path) -> None:
    def one(rng: random.Random) -> None:
        recipe = Recipe.from_dict(mutate(rng, BASE_DICT, rounds=4), base_dir=data_dir)
        recipe.fingerprint()
        Pipeline(recipe)

    _fuzz("Recipe.from_dict+Pipeline", 1, one)


@pytest.mark.slow
def test_fuzz_recipe_toml_bytes(data_dir: Path) -> None:
    path = data_dir / "fuzz.toml"

    def one(rng: random.Random) -> None:
        path.write_bytes(mutate_bytes(rng, BASE_TOML))
        Recipe.from_toml(path).fingerprint()

    _fuzz("Recipe.from_toml", 2, one)


@pytest.mark.slow
def test_fuzz_state_file_bytes(tmp_path: Path) -> None:
    """Mutated bytes of checksummed and of plain (allow_unchecked) state files."""
    checked = encode_checked(STATE)
    plain = json.dumps(STATE).encode()
    target = tmp_path / "zephon_state.json"
    accepted = 0

    def one(rng: random.Random) -> None:
        nonlocal accepted
        unchecked = rng.random() < 0.5
        blob = mutate_bytes(rng, plain if unchecked else checked)
        target.write_bytes(blob)
        state = load_state(tmp_path, allow_unchecked=unchecked)
        if not unchecked:  # a mutated checksummed file must never load
            assert blob == checked, "a mutated checksummed state file was accepted"
            accepted += 1
        PIPE.rank_node(1, 0, pool=INLINE).reset(state)

    _fuzz("load_state+reset", 3, one)


@pytest.mark.slow
def test_fuzz_resealed_state_files(tmp_path: Path) -> None:
    """Mutated states with a correct checksum (an editor who recomputes it): still refused
    or resumed, never a crash; values are checked against the recipe."""

    def one(rng: random.Random) -> None:
        state = mutate(rng, STATE, rounds=3)
        (tmp_path / "zephon_state.json").write_bytes(
            encode_checked(state) if isinstance(state, dict) else json.dumps(state).encode()
        )
        node = PIPE.rank_node(2, rng.randrange(2), pool=INLINE)
        node.reset(load_state(tmp_path))
        next(node)

    _fuzz("encode_checked(mutated)+load_state+reset", 6, one)


@pytest.mark.slow
def test_fuzz_states_reset_and_run() -> None:
    def one(rng: random.Random) -> None:
        state = mutate(rng, STATE, rounds=3)
        world = rng.choice((1, 2, 4))
        node = PIPE.rank_node(
            world, rng.randrange(world), local_batch_size=rng.choice((1, 2)), pool=INLINE
        )
        node.reset(state)
        for _ in range(2):
            next(node)

    _fuzz("validate_state+Multiplexer.reset+next", 4, one)


@pytest.mark.slow
def test_fuzz_multi_rank_checkpoints() -> None:
    root = Path(tempfile.mkdtemp(prefix="zephon-fuzz-ckpt-"))
    nodes = [PIPE.rank_node(2, r, pool=INLINE) for r in range(2)]
    for n in nodes:
        n.reset(None)
        next(n)
    for r, n in enumerate(nodes):
        save_rank_state(root, 1, r, n.state_dict())
    step_dir = commit_checkpoint(root, 1, 2)
    marker_bytes = (step_dir / COMMIT_FILE).read_bytes()
    marker = decode_checked(marker_bytes, COMMIT_FILE, allow_unchecked=False)
    rank_files = {f.name: f.read_bytes() for f in step_dir.glob("rank_*.json")}

    def reseal(obj: Any) -> bytes:
        """A correct checksum for any dict, else plain JSON (refused or read as legacy)."""
        try:
            return encode_checked(obj)
        except ZephonError:
            return json.dumps(obj).encode()

    def one(rng: random.Random) -> None:
        files = dict(rank_files)
        m = marker
        if rng.random() < 0.5:
            name = rng.choice(sorted(files))
            state = decode_checked(files[name], name, allow_unchecked=False)
            files[name] = reseal(mutate(rng, state))
            m = dict(marker, files=dict(marker["files"]))
            m["files"][name] = hashlib.sha256(files[name]).hexdigest()  # a "valid" commit
        if rng.random() < 0.5:
            m = mutate(rng, m)
        blob = reseal(m) if rng.random() < 0.8 else json.dumps(m).encode()
        if rng.random() < 0.2:
            blob = mutate_bytes(rng, marker_bytes)
        for name, data in files.items():
            (step_dir / name).write_bytes(data)
        (step_dir / COMMIT_FILE).write_bytes(blob)
        state = load_checkpoint(root)
        node = PIPE.rank_node(1, 0, pool=INLINE)
        node.reset(state)
        next(node)

    _fuzz("load_checkpoint+reset", 5, one)
