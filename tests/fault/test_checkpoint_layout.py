"""Multi-rank checkpoint layout: rank files, commit marker, latest, merge; SIGKILL mid-save."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tests.fault.common import INLINE, memory_pipeline
from zephon_nodes import CheckpointError, simulate
from zephon_nodes.state import (
    COMMIT_FILE,
    checkpoint_path,
    commit_checkpoint,
    latest_checkpoint,
    layout,
    load_checkpoint,
    save_rank_state,
)

HERE = Path(__file__).resolve().parent
PIPE = memory_pipeline()


def _rank_states(world: int, steps: int) -> list[dict]:
    nodes = [PIPE.rank_node(world, r, pool=INLINE) for r in range(world)]
    for n in nodes:
        n.reset(None)
    for _ in range(steps):
        for n in nodes:
            for _ in range(n.micro_per_step):
                next(n)
    return [n.state_dict() for n in nodes]


def _save(root: Path, world: int, steps: int, commit: bool = True) -> None:
    for r, st in enumerate(_rank_states(world, steps)):
        save_rank_state(root, steps, r, st)
    if commit:
        commit_checkpoint(root, steps, world)


def test_round_trip_and_elastic_resume(tmp_path: Path) -> None:
    """Saved by 2 ranks, loaded as one merged state, resumed at dp 1 and 4: same digests."""
    _save(tmp_path, 2, 3)
    merged = load_checkpoint(tmp_path)
    assert merged["step"] == 3 and sorted(merged["lanes"], key=int) == ["0", "1", "2", "3"]
    ref = [r.digest for r, _ in simulate(PIPE, 2, 6)][3:]
    for world in (1, 4):
        got = [r.digest for r, _ in simulate(PIPE, world, 3, resume_state=merged)]
        assert got == ref


def test_latest_ignores_uncommitted_and_temp_files(tmp_path: Path) -> None:
    assert latest_checkpoint(tmp_path) is None
    assert latest_checkpoint(tmp_path / "absent") is None
    _save(tmp_path, 2, 2)
    _save(tmp_path, 2, 4, commit=False)  # killed before the commit
    d6 = checkpoint_path(tmp_path, 6)
    d6.mkdir()
    (d6 / "rank_00000.json.abc.tmp").write_text('{"trunc')  # killed mid-write
    (tmp_path / "step_12x").mkdir()  # not ours
    (tmp_path / "notes.txt").write_text("hello")
    assert latest_checkpoint(tmp_path) == checkpoint_path(tmp_path, 2)
    assert load_checkpoint(tmp_path)["step"] == 2
    with pytest.raises(CheckpointError, match="no committed checkpoint"):
        load_checkpoint(tmp_path / "nowhere")


def test_commit_refuses_missing_rank(tmp_path: Path) -> None:
    st = _rank_states(2, 2)
    save_rank_state(tmp_path, 2, 0, st[0])
    with pytest.raises(CheckpointError, match="rank 1 of 2 has not saved"):
        commit_checkpoint(tmp_path, 2, 2)
    assert latest_checkpoint(tmp_path) is None


def test_save_refuses_wrong_step_or_mid_step(tmp_path: Path) -> None:
    st = _rank_states(2, 2)[0]
    with pytest.raises(CheckpointError, match="the state is for step 2"):
        save_rank_state(tmp_path, 3, 0, st)
    node = PIPE.rank_node(2, 0, local_batch_size=1, pool=INLINE)
    node.reset(None)
    next(node)
    with pytest.raises(CheckpointError, match="middle of a step"):
        save_rank_state(tmp_path, 0, 0, node.state_dict())


def test_rank_file_damaged_after_commit(tmp_path: Path) -> None:
    _save(tmp_path, 2, 2)
    f = checkpoint_path(tmp_path, 2) / "rank_00001.json"
    f.write_bytes(f.read_bytes()[:-5])
    with pytest.raises(CheckpointError, match="changed after the checkpoint was committed"):
        load_checkpoint(tmp_path)


def test_rank_file_deleted_after_commit(tmp_path: Path) -> None:
    _save(tmp_path, 2, 2)
    (checkpoint_path(tmp_path, 2) / "rank_00000.json").unlink()
    with pytest.raises(CheckpointError, match=r"rank_00000\.json' listed in COMMITTED\.json is"):
        load_checkpoint(tmp_path)


def test_a_step_pruned_while_the_root_is_loaded_falls_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A retention policy removes the newest step between the listing and its load: the
    load falls back to the step before (a raw FileNotFoundError escaped the fallback)."""
    _save(tmp_path, 2, 2)
    _save(tmp_path, 2, 4)
    listed = layout._committed_steps

    def listed_then_pruned(root: Path) -> list[tuple[int, Path]]:
        out = listed(root)
        shutil.rmtree(checkpoint_path(tmp_path, 4))
        return out

    monkeypatch.setattr(layout, "_committed_steps", listed_then_pruned)
    assert load_checkpoint(tmp_path)["step"] == 2


def test_a_step_committed_again_while_it_is_read_loads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another attempt of the job (4 ranks) commits step 4 again between the reader's marker
    and its rank files: the reader loads step 4 under the new marker (it fell back to 2)."""
    _save(tmp_path, 2, 2)
    _save(tmp_path, 2, 4)
    read_bytes = layout.read_bytes
    marker_read, go_on = threading.Event(), threading.Event()

    def pause_after_the_marker(p: Path, what: str) -> bytes:
        out = read_bytes(p, what)
        if what == "commit marker" and threading.current_thread().name == "reader":
            marker_read.set()
            go_on.wait(10)
        return out

    monkeypatch.setattr(layout, "read_bytes", pause_after_the_marker)
    got: dict[str, Any] = {}
    reader = threading.Thread(
        target=lambda: got.setdefault("state", load_checkpoint(tmp_path)), name="reader"
    )
    reader.start()
    assert marker_read.wait(10)
    _save(tmp_path, 4, 4)
    go_on.set()
    reader.join(30)
    assert got["state"]["step"] == 4
    assert got["state"] == load_checkpoint(tmp_path)


@pytest.mark.parametrize(
    ("marker", "match"),
    [
        ('{"format": "other/1"}', "unsupported commit marker format 'other/1'"),
        ("[]", "unsupported commit marker format 'list'"),
        ("{not json", "invalid JSON"),
        ('{"format": "zephon-nodes-checkpoint/1", "step": 2}', "misses its 'files'"),
        (
            '{"format": "zephon-nodes-checkpoint/1", "step": 2, "world_size": 1, '
            '"files": {"../x": "0"}}',
            "missing",
        ),
    ],
)
def test_damaged_marker(tmp_path: Path, marker: str, match: str) -> None:
    _save(tmp_path, 2, 2)
    (checkpoint_path(tmp_path, 2) / COMMIT_FILE).write_text(marker)
    with pytest.raises(CheckpointError, match=match):
        load_checkpoint(tmp_path)


def test_ranks_that_overlap(tmp_path: Path) -> None:
    """Two rank files holding the same lanes (a bad hand-made commit) are refused."""
    st = _rank_states(2, 4)[0]
    save_rank_state(tmp_path, 4, 0, st)
    save_rank_state(tmp_path, 4, 1, st)
    with pytest.raises(CheckpointError, match=r"lanes \['0', '1'\] appear in more than one"):
        commit_checkpoint(tmp_path, 4, 2)
    assert not (checkpoint_path(tmp_path, 4) / COMMIT_FILE).exists()


def test_ranks_that_disagree_on_the_step(tmp_path: Path) -> None:
    a, b = _rank_states(2, 2)[0], _rank_states(2, 3)[1]
    save_rank_state(tmp_path, 2, 0, a)
    save_rank_state(tmp_path, 3, 1, b)
    d2, d3 = checkpoint_path(tmp_path, 2), checkpoint_path(tmp_path, 3)
    (d3 / "rank_00001.json").rename(d2 / "rank_00001.json")  # a file moved by hand
    with pytest.raises(CheckpointError, match="ranks disagree on step: 2 vs 3"):
        commit_checkpoint(tmp_path, 2, 2)
    assert not (d2 / COMMIT_FILE).exists()


def test_stale_rank_files_of_a_larger_world_are_ignored(tmp_path: Path) -> None:
    """A run at dp 4 killed before its commit, then dp 2 saves the same step: dp 2 wins."""
    for r, st in enumerate(_rank_states(4, 2)):
        save_rank_state(tmp_path, 2, r, st)
    _save(tmp_path, 2, 2)
    merged = load_checkpoint(tmp_path)
    assert merged["step"] == 2 and len(merged["lanes"]) == 4


@pytest.mark.slow
def test_sigkill_while_saving_never_exposes_a_partial_checkpoint(tmp_path: Path) -> None:
    """SIGKILL a process that saves big multi-rank checkpoints in a loop, at random moments.

    After every kill, the latest committed checkpoint loads completely and is internally
    consistent (every lane at the committed step); partial step directories are ignored.
    """
    rng = random.Random(7)
    kills, partial_seen, tmp_seen, last = 0, 0, 0, 0
    lanes = 40_000  # ~1.2 MB of JSON per checkpoint
    for _ in range(8):
        proc = subprocess.Popen(
            [sys.executable, str(HERE / "ckpt_writer.py"), str(tmp_path), str(lanes)],
            stdout=subprocess.PIPE,
            env={**os.environ, "PYTHONPATH": str(HERE.parent.parent)},
        )
        assert proc.stdout is not None
        first = proc.stdout.readline()  # at least one commit per launch
        assert first.startswith(b"committed"), first
        time.sleep(rng.uniform(0.0, 0.4))
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        kills += 1
        latest = latest_checkpoint(tmp_path)
        assert latest is not None
        merged = load_checkpoint(latest)
        step = merged["step"]
        assert step >= last
        last = step
        assert len(merged["lanes"]) == lanes
        assert all(v == [step, int(k)] for k, v in merged["lanes"].items())
        for d in tmp_path.iterdir():
            if not (d / COMMIT_FILE).exists():
                partial_seen += 1
            tmp_seen += sum(1 for f in d.iterdir() if f.name.endswith(".tmp"))
        # the writer resumes numbering from 1: clear the tree so steps keep growing
        for d in list(tmp_path.iterdir()):
            for f in d.iterdir():
                f.unlink()
            d.rmdir()
        last = 0
    print(
        f"\nsigkill-while-saving: {kills} kills, {partial_seen} partial step dirs and "
        f"{tmp_seen} temp files left behind, none picked as latest"
    )
    assert kills == 8
    assert json.dumps(merged)  # plain data
