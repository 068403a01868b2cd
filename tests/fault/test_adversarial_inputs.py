"""Inputs are honoured or refused, never silently dropped (issue 27, case 10)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from zephon_nodes import DatasetSpec, Pipeline, Recipe, TokenizerSpec, WorkerPool, WorkSpec
from zephon_nodes.core.errors import RecipeError
from zephon_nodes.state import (
    commit_checkpoint,
    latest_checkpoint,
    load_checkpoint,
    save_rank_state,
)
from zephon_nodes.verification.matrix import default_matrix


def test_a_micro_batch_size_dividing_no_rank_batch_is_refused():
    """`verify --micro-batch-sizes 3` with local batches 8, 4, 2: refused, not dropped."""
    with pytest.raises(
        RecipeError, match=r"micro-batch size 3 divides no rank's batch.*\[2, 4, 8\]"
    ):
        default_matrix(
            4, runners=["thread"], resume=False, micro_batch_sizes=[3], global_batch_size=8
        )


def test_the_verify_cli_refuses_it_in_one_line(tmp_path, capsys):
    from zephon_nodes.cli import main

    (tmp_path / "a.jsonl").write_text(
        "\n".join(json.dumps({"text": f"d {i} " * 3}) for i in range(80))
    )
    toml = tmp_path / "r.toml"
    toml.write_text(
        "seed = 1\nnum_lanes = 2\nglobal_batch_size = 4\nseq_len = 16\n"
        '[tokenizer]\nkind = "bytes"\n[work]\nchunk_size = 4\n'
        f'[[datasets]]\nname = "web"\npaths = ["{tmp_path}/a.jsonl"]\n'
    )
    assert main(["verify", str(toml), "--steps", "2", "--micro-batch-sizes", "3"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "micro-batch size 3 divides no rank's batch" in err, err


@pytest.mark.parametrize("value", ["infinite", "forever", "INF", ""])
def test_epochs_other_than_inf_are_refused(tmp_path, value):
    toml = tmp_path / "r.toml"
    toml.write_text(
        'seed = 1\nnum_lanes = 1\nglobal_batch_size = 2\nseq_len = 8\n[tokenizer]\nkind = "bytes"\n'
        f'[work]\nepochs = "{value}"\n[[datasets]]\nname = "d"\npaths = ["x.jsonl"]\n'
    )
    with pytest.raises(RecipeError, match=r'work\.epochs=.* must be an integer >= 1 or "inf"'):
        Recipe.from_toml(toml)


def test_the_documented_resume_loop_falls_back_past_a_damaged_newest_step(tmp_path):
    """docs/fault-tolerance.md's loop: a damaged newest committed step, the one before loads."""
    docs = tuple({"text": f"document {i} " * (1 + i % 7)} for i in range(300))
    recipe = Recipe(
        datasets=(DatasetSpec("demo", records=docs),),
        tokenizer=TokenizerSpec(kind="bytes"),
        num_lanes=2,
        global_batch_size=4,
        seq_len=32,
        flush_every=2,
        work=WorkSpec(chunk_size=4, epochs=None),
    )
    pipeline = Pipeline(recipe)
    root = tmp_path / "ckpt"
    node = pipeline.rank_node(1, 0, pool=WorkerPool(0))
    node.reset(None)
    for step in range(1, 7):
        for _ in range(node.micro_per_step):
            next(node)
        if step in (4, 6):
            save_rank_state(root, step, 0, node.state_dict())
            commit_checkpoint(root, step, 1)
    newest = latest_checkpoint(root)
    assert newest is not None and newest.name.endswith("06")
    rank_file = next(p for p in Path(newest).iterdir() if p.name.startswith("rank_"))
    blob = bytearray(rank_file.read_bytes())
    blob[len(blob) // 2] ^= 0x01
    rank_file.write_bytes(bytes(blob))
    # The documented loop, verbatim in substance:
    first_start = latest_checkpoint(root) is None
    state = None if first_start else load_checkpoint(root)
    assert state is not None and state["step"] == 4
    shutil.rmtree(root)
