"""Checkpoints verify themselves: every single-bit flip and every hand edit is refused.

The mutation counts are printed (run with ``-s``) and quoted in docs/checkpoint.md.
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.fault.common import INLINE, memory_pipeline, write_jsonl
from zephon_nodes import CheckpointError, Pipeline, simulate
from zephon_nodes.state import (
    COMMIT_FILE,
    check_writable,
    checkpoint_path,
    commit_checkpoint,
    decode_checked,
    encode_checked,
    latest_checkpoint,
    load_checkpoint,
    load_state,
    save_rank_state,
    save_state,
    validate_state,
)

# Two lanes of four: one rank's file is small, so flipping all its bits stays cheap.
PIPE = memory_pipeline(n_docs=160, num_lanes=2, global_batch_size=2, flush_every=64)


def _state_after(pipe: Pipeline, steps: int, world: int = 1) -> dict[str, Any]:
    saved: dict[str, Any] = {}
    for _ in simulate(pipe, world, steps, save_at=steps, on_save=saved.update, pool=INLINE):
        pass
    assert saved["step"] == steps
    return saved


STATE = _state_after(PIPE, 10)


def _accepts(state: Any, world: int = 1) -> bool:
    """Whether every rank of ``world`` resumes from ``state`` (validation + replay)."""
    try:
        for rank in range(world):
            PIPE.rank_node(world, rank, pool=INLINE).reset(state)
    except CheckpointError:
        return False
    return True


def _flips(blob: bytes) -> list[bytes]:
    out = []
    for i in range(len(blob)):
        for bit in range(8):
            b = bytearray(blob)
            b[i] ^= 1 << bit
            out.append(bytes(b))
    return out


def test_state_is_in_window_zero() -> None:
    """Control for the step checks below: each lane handed out 10 x 1 samples of window 0."""
    assert STATE["lanes"] == {"0": [0, 10], "1": [0, 10]}
    assert _accepts(STATE)


class TestSingleFile:
    """The file written by ``save_state`` and ``zephon digest --save-at``."""

    def test_round_trip(self, tmp_path: Path) -> None:
        """A saved state loads back equal and starts with its checksum."""
        path = save_state(tmp_path, STATE)
        assert path.read_bytes().startswith(b'{"checksum":"sha256:')
        assert load_state(tmp_path) == STATE

    def test_every_single_bit_flip_is_refused(self, tmp_path: Path) -> None:
        """All 8 x N one-bit flips of the file are refused by load_state."""
        blob = save_state(tmp_path, STATE).read_bytes()
        flips = _flips(blob)
        refused = 0
        for flipped in flips:
            try:
                state = decode_checked(flipped, "state", allow_unchecked=False)
            except CheckpointError:
                refused += 1
                continue
            assert not _accepts(state), "a flipped state was accepted"
            refused += 1
        print(f"single-file state: {len(blob)} bytes, {len(flips)} flips, {refused} refused")
        assert refused == len(flips) == 8 * len(blob)

    def test_flips_through_the_file(self, tmp_path: Path) -> None:
        """The same through real files, for a sample of bit positions (every 37th)."""
        blob = save_state(tmp_path, STATE).read_bytes()
        target = tmp_path / "zephon_state.json"
        flips = _flips(blob)[::37]
        for flipped in flips:
            target.write_bytes(flipped)
            with pytest.raises(CheckpointError):
                load_state(tmp_path)

    @pytest.mark.parametrize(
        ("old", "new"),
        [
            ('"0":[0,10]', '"0":[0,11]'),
            ('"0":[0,10]', '"0":[0,9]'),
            ('"0":[0,10]', '"0":[1,0]'),
            ('"step":10', '"step":5'),
            ('"step":10', '"step":0'),
            ('"step":10', '"step":1000'),
            ('"step":10', '"step":' + "1" + "0" * 30),
            ('"step":10', '"step":10,"step":10'),
            ('"micro":0,"num_lanes":2', '"micro":0,"num_lanes":2.0'),
            ('"micro":0', '"micro":1'),
        ],
    )
    def test_hand_edits_are_refused(self, tmp_path: Path, old: str, new: str) -> None:
        """Edits of the issue: refused by the checksum, and also when the checksum is redone."""
        target = save_state(tmp_path, STATE)
        text = target.read_text()
        assert text.count(old) == 1
        target.write_text(text.replace(old, new))
        with pytest.raises(CheckpointError, match="checksum mismatch"):
            load_state(tmp_path)
        # An editor who recomputes the checksum: the values are checked against the recipe.
        body = text.replace(old, new).split(",", 1)[1]
        if '"step":10,"step":10' in body:
            digest = hashlib.sha256(body.encode()).hexdigest().encode()
            target.write_bytes(b'{"checksum":"sha256:' + digest + b'",' + body.encode())
            with pytest.raises(CheckpointError, match="'step' appears more than once"):
                load_state(tmp_path)
            return
        edited = json.loads("{" + body)
        assert not _accepts(edited)
        resealed = encode_checked(edited)
        target.write_bytes(resealed)
        assert not _accepts(load_state(tmp_path))

    def test_duplicated_key_in_a_nested_object(self) -> None:
        """Duplicates are refused at every depth, with the key named."""
        raw = b'{"lanes":{"0":[0,1],"0":[0,2]}}'
        with pytest.raises(CheckpointError, match="'0' appears more than once"):
            decode_checked(raw, "state", allow_unchecked=True)

    def test_unchecked_file_is_refused_unless_allowed(self, tmp_path: Path) -> None:
        """A plain-JSON state (older versions) needs allow_unchecked=True."""
        (tmp_path / "zephon_state.json").write_text(json.dumps(STATE))
        with pytest.raises(CheckpointError, match="carries no checksum"):
            load_state(tmp_path)
        assert load_state(tmp_path, allow_unchecked=True) == STATE

    def test_checksum_key_elsewhere_is_refused(self, tmp_path: Path) -> None:
        """A re-serialized file (checksum not first) is refused, even when allowed unchecked."""
        state = dict(STATE) | {"checksum": "sha256:" + "0" * 64}  # last key
        (tmp_path / "zephon_state.json").write_text(json.dumps(state))
        with pytest.raises(CheckpointError, match="must come first"):
            load_state(tmp_path, allow_unchecked=True)
        (tmp_path / "zephon_state.json").write_text(json.dumps(state, sort_keys=True))
        with pytest.raises(CheckpointError, match="damaged checksum header"):
            load_state(tmp_path, allow_unchecked=True)


class TestPositionChecks:
    """Values checked against what the recipe makes possible (in-memory states too)."""

    @pytest.mark.parametrize(
        ("lanes", "step", "match"),
        [
            ({"0": [0, 9], "1": [0, 10]}, 10, r"lane 0: position \[0, 9\] is inconsistent"),
            ({"0": [1, 0], "1": [0, 10]}, 10, r"lane 0: position \[1, 0\] is inconsistent"),
            ({"0": [0, 10], "1": [0, 10]}, 5, "must be exactly 5"),
            ({"0": [0, 10], "1": [0, 10]}, 0, r"at step 0 \(before any step"),
            ({"0": [0, 10], "1": [0, 10]}, 1000, "must be exactly 1000"),
            ({"0": [0, 10], "1": [0, 10]}, 10**30, r"must be an integer in \[0, 2\*\*62\)"),
            ({"0": [3, 11], "1": [0, 10]}, 10, r"must be between 1 and 10"),
        ],
    )
    def test_inconsistent_positions(self, lanes: Any, step: int, match: str) -> None:
        """Each is refused by validate_state with the lane and the rule named."""
        state = dict(STATE) | {"lanes": lanes, "step": step}
        with pytest.raises(CheckpointError, match=match):
            validate_state(
                state,
                fingerprint=PIPE.fingerprint,
                summary=PIPE.summary,
                num_lanes=2,
                lanes=[0, 1],
                samples_per_lane=1,
            )

    def test_num_lanes_must_be_an_integer(self) -> None:
        """``num_lanes: 2.0`` equals 2 in Python but is not what zephon-nodes writes."""
        assert not _accepts(dict(STATE) | {"num_lanes": 2.0})

    def test_fingerprint_prefixes_differ_in_the_message(self) -> None:
        """A fingerprint changed beyond its first 12 characters: the message shows where."""
        fp = STATE["fingerprint"]
        edited = dict(STATE) | {"fingerprint": fp[:20] + ("0" if fp[20] != "0" else "1") + fp[21:]}
        node = PIPE.rank_node(1, 0, pool=INLINE)
        with pytest.raises(CheckpointError) as info:
            node.reset(edited)
        msg = str(info.value)
        assert "missing or unreadable" not in msg
        assert "the fingerprint itself was altered" in msg
        assert repr(fp[:28]) in msg and repr(edited["fingerprint"][:28]) in msg


# -- multi-rank layout --------------------------------------------------------------------


def _rank_states(world: int, step: int) -> list[dict[str, Any]]:
    ranks = [PIPE.rank_node(world, r, pool=INLINE) for r in range(world)]
    for node in ranks:
        node.reset(None)
    for _ in range(step):
        for node in ranks:
            for _ in range(node.micro_per_step):
                next(node)
    return [node.state_dict() for node in ranks]


def _save(root: Path, step: int, world: int) -> Path:
    for r, st in enumerate(_rank_states(world, step)):
        save_rank_state(root, step, r, st)
    return commit_checkpoint(root, step, world)


class TestMultiRank:
    """``save_rank_state`` + ``commit_checkpoint`` + ``load_checkpoint``."""

    def test_every_single_bit_flip_of_every_file_is_refused(self, tmp_path: Path) -> None:
        """All one-bit flips of the marker and of each rank file are refused."""
        d = _save(tmp_path, 4, 2)
        total = refused = 0
        sizes = {}
        for f in sorted(d.iterdir()):
            blob = f.read_bytes()
            sizes[f.name] = len(blob)
            fd = os.open(f, os.O_RDWR)  # flip bytes in place: same length, no reopen
            try:
                for i, byte in enumerate(blob):
                    for bit in range(8):
                        total += 1
                        os.pwrite(fd, bytes([byte ^ (1 << bit)]), i)
                        try:
                            state = load_checkpoint(d)
                        except CheckpointError:
                            refused += 1
                        else:
                            assert not _accepts(state), f"a flip of {f.name} was accepted"
                            refused += 1
                    os.pwrite(fd, bytes([byte]), i)
            finally:
                os.close(fd)
        print(f"multi-rank checkpoint: files {sizes}, {total} flips, {refused} refused")
        assert refused == total == 8 * sum(sizes.values())
        assert load_checkpoint(d)["step"] == 4  # control: restored files load

    def test_rank_files_carry_their_own_checksum(self, tmp_path: Path) -> None:
        """A rank file damaged before the commit is refused by the commit itself."""
        st = _rank_states(2, 4)
        for r, s in enumerate(st):
            save_rank_state(tmp_path, 4, r, s)
        f = checkpoint_path(tmp_path, 4) / "rank_00001.json"
        f.write_bytes(f.read_bytes().replace(b'"step":4', b'"step":5'))
        with pytest.raises(CheckpointError, match=r"rank_00001\.json: checksum mismatch"):
            commit_checkpoint(tmp_path, 4, 2)
        assert not (checkpoint_path(tmp_path, 4) / COMMIT_FILE).exists()

    @pytest.mark.parametrize("world", [0, -1, True, 2.0, 10**9])
    def test_impossible_world_sizes_write_nothing(self, tmp_path: Path, world: Any) -> None:
        """``commit_checkpoint(world_size=0)`` used to write a marker load_checkpoint refused."""
        for r, s in enumerate(_rank_states(2, 4)):
            save_rank_state(tmp_path, 4, r, s)
        with pytest.raises(CheckpointError, match=r"world_size=.* must be an integer in \[1, "):
            commit_checkpoint(tmp_path, 4, world)
        assert not (checkpoint_path(tmp_path, 4) / COMMIT_FILE).exists()
        assert latest_checkpoint(tmp_path) is None

    def test_falls_back_to_the_newest_complete_step(
        self, tmp_path: Path, caplog: pytest.LogCaptureFixture
    ) -> None:
        """Step 6's rank file overwritten by a later attempt at dp 1: step 3 is loaded."""
        _save(tmp_path, 3, 2)
        _save(tmp_path, 6, 2)
        (one,) = _rank_states(1, 6)
        save_rank_state(tmp_path, 6, 0, one)  # another world size, killed before its commit
        with pytest.raises(CheckpointError, match="SHA-256 mismatch"):
            load_checkpoint(checkpoint_path(tmp_path, 6))  # a step directory: no fallback
        with caplog.at_level(logging.WARNING, logger="zephon_nodes.state"):
            state = load_checkpoint(tmp_path)
        assert state["step"] == 3
        assert state == load_checkpoint(checkpoint_path(tmp_path, 3))
        text = caplog.text
        assert "skipping the checkpoint of step 6" in text and "SHA-256 mismatch" in text
        assert "loaded the checkpoint of step 3" in text
        assert _accepts(state, world=2)

    def test_no_loadable_step_names_every_reason(self, tmp_path: Path) -> None:
        """When every committed step is damaged the error lists each step and why."""
        for step in (3, 6):
            d = _save(tmp_path, step, 2)
            (d / "rank_00000.json").write_bytes(b"{}")
        with pytest.raises(CheckpointError, match="none of the 2 committed") as info:
            load_checkpoint(tmp_path)
        assert "step 6:" in str(info.value) and "step 3:" in str(info.value)


# -- writing: start-up check and full disk -------------------------------------------------


class TestWriting:
    """Unwritable directories fail at start-up; a failed save keeps the previous state."""

    def test_unwritable_directory_is_refused_at_start_up(self, tmp_path: Path) -> None:
        """A path under a regular file can never hold a checkpoint (root ignores chmod)."""
        blocker = tmp_path / "file"
        blocker.write_text("x")
        with pytest.raises(CheckpointError, match=r"checkpoint directory .*file/ckpt is not"):
            check_writable(blocker / "ckpt")
        assert check_writable(tmp_path / "new" / "ckpt").is_dir()
        assert list((tmp_path / "new" / "ckpt").iterdir()) == []  # the probe is removed

    @pytest.mark.parametrize("fail", ["fsync", "replace"])
    def test_full_disk_keeps_the_previous_state(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fail: str
    ) -> None:
        """ENOSPC while saving: a CheckpointError naming the file; the old state still loads."""
        save_state(tmp_path, STATE)
        newer = _state_after(PIPE, 12)

        def no_space(*args: Any) -> None:
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(os, fail, no_space)
        with pytest.raises(CheckpointError, match=r"zephon_state.json: .*No space left.*intact"):
            save_state(tmp_path, newer)
        monkeypatch.undo()
        assert load_state(tmp_path) == STATE
        assert [p.name for p in tmp_path.iterdir()] == ["zephon_state.json"]  # no temp file

    def test_real_write_failure_keeps_the_previous_state(self, tmp_path: Path) -> None:
        """A real OS write failure (a file-size limit, EFBIG) in a subprocess, not a mock."""
        save_state(tmp_path, STATE)
        newer = json.dumps(_state_after(PIPE, 12))
        script = (
            "import json, resource, signal, sys\n"
            "from zephon_nodes.state import save_state\n"
            "from zephon_nodes.core.errors import CheckpointError\n"
            "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
            "resource.setrlimit(resource.RLIMIT_FSIZE, (100, 100))\n"
            "try:\n"
            "    save_state(sys.argv[1], json.loads(sys.argv[2]))\n"
            "except CheckpointError as e:\n"
            "    print(e)\n"
            "    sys.exit(3)\n"
        )
        proc = subprocess.run(
            [sys.executable, "-c", script, str(tmp_path), newer],
            capture_output=True, text=True, timeout=120, check=False,
            env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
        )  # fmt: skip
        assert proc.returncode == 3, proc.stderr
        assert "cannot write the checkpoint file" in proc.stdout and "intact" in proc.stdout
        assert load_state(tmp_path) == STATE
        assert [p.name for p in tmp_path.iterdir()] == ["zephon_state.json"]


# -- skips: truncated and deleted files alike ----------------------------------------------


@pytest.mark.parametrize("damage", ["truncate", "delete"])
def test_files_damaged_mid_run_raise_or_are_counted(tmp_path: Path, damage: str) -> None:
    """Under raise: DataError naming the file; under skip: skipped and counted by reason."""
    from zephon_nodes import DataError, DatasetSpec, Recipe, TokenizerSpec, WorkSpec
    from zephon_nodes.operators.parse import ParseJsonl

    path = write_jsonl(tmp_path / "a.jsonl", [f"doc {i}" for i in range(20)])
    recipe = Recipe(
        datasets=(DatasetSpec("a", paths=("a.jsonl",), base_dir=tmp_path),),
        tokenizer=TokenizerSpec(kind="bytes"),
        num_lanes=1,
        global_batch_size=1,
        seq_len=8,
        work=WorkSpec(chunk_size=20),
    )
    item = Pipeline(recipe).work_source.work(0, 0)
    assert item is not None
    if damage == "truncate":
        path.write_bytes(path.read_bytes()[:10])
    else:
        path.unlink()
    with pytest.raises(DataError, match=r"dataset 'a': .*a\.jsonl"):
        ParseJsonl()(item)
    batch = ParseJsonl(skip=frozenset({0}))(item)
    reason = {"truncate": "changed_file", "delete": "missing_file"}[damage]
    assert batch.texts == [] and dict(batch.skipped) == {reason: 20}
