"""Damaged or foreign checkpoints are refused, with a message, before any batch is produced."""

from __future__ import annotations

import copy
import json
import pickle
from pathlib import Path
from typing import Any

import pytest

from tests.fault.common import INLINE, memory_pipeline
from zephon_nodes import CheckpointError, Pipeline, simulate
from zephon_nodes.state import load_state, save_state

PIPE = memory_pipeline()


def _state_after(pipe: Pipeline, steps: int, world: int = 2) -> dict[str, Any]:
    saved: dict[str, Any] = {}
    for _ in simulate(pipe, world, steps, save_at=steps, on_save=saved.update):
        pass
    assert saved["step"] == steps
    return saved


STATE = _state_after(PIPE, 3)


def _refused(state: Any, match: str, *, world: int = 2, rank: int = 0, lbs: int | None = None):
    """Reset a rank with ``state``; it must raise CheckpointError before yielding anything."""
    node = PIPE.rank_node(world, rank, local_batch_size=lbs, pool=INLINE)
    with pytest.raises(CheckpointError, match=match) as info:
        node.reset(state)
    return str(info.value)


def _mutated(**changes: Any) -> dict[str, Any]:
    s = copy.deepcopy(STATE)
    for k, v in changes.items():
        if v is KeyError:
            del s[k]
        else:
            s[k] = v
    return s


# -- the file itself -----------------------------------------------------------------------


def test_valid_state_resumes(tmp_path: Path) -> None:
    """Control: the undamaged state round-trips through a file and resumes."""
    save_state(tmp_path, STATE)
    node = PIPE.rank_node(2, 0, pool=INLINE)
    node.reset(load_state(tmp_path))
    assert node.step == 3
    next(node)


@pytest.mark.parametrize("keep", [0, 1, 10, 0.5, -1])
def test_truncated_file(tmp_path: Path, keep: float) -> None:
    target = save_state(tmp_path, STATE)
    blob = target.read_bytes()
    n = int(len(blob) * keep) if isinstance(keep, float) else keep
    target.write_bytes(blob[:n])
    with pytest.raises(CheckpointError, match=r"not a zephon-nodes state|checksum mismatch"):
        load_state(tmp_path)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="no checkpoint state at"):
        load_state(tmp_path / "nowhere")


def test_oversized_file_refused_without_parsing(tmp_path: Path) -> None:
    target = tmp_path / "zephon_state.json"
    with open(target, "wb") as f:
        f.truncate(17 << 20)  # sparse: 17 MiB of zeros
    with pytest.raises(CheckpointError, match="too large"):
        load_state(target)


@pytest.mark.parametrize(
    ("blob", "match"),
    [
        (b"[1, 2, 3]", "must be a JSON object, got list"),
        (b'"zephon"', "must be a JSON object, got str"),
        (b"\xff\xfe\x00garbage", "not UTF-8"),
        (b"[" * 100_000, "invalid JSON"),  # nesting bomb: RecursionError inside json
        (b'{"step": ' + b"9" * 5000 + b"}", "invalid JSON"),  # int beyond the digit limit
        (b'{"a": NaN', "invalid JSON"),
    ],
)
def test_not_a_state(tmp_path: Path, blob: bytes, match: str) -> None:
    (tmp_path / "zephon_state.json").write_bytes(blob)
    with pytest.raises(CheckpointError, match=match):
        load_state(tmp_path, allow_unchecked=True)
    with pytest.raises(CheckpointError, match=f"{match}|carries no checksum"):
        load_state(tmp_path)


# -- the content -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"format": "zephon-nodes/2"}, r"unsupported checkpoint format 'zephon-nodes/2'"),
        ({"format": KeyError}, r"unsupported checkpoint format None"),
        ({"num_lanes": 8}, r"checkpoint has num_lanes=8, recipe has num_lanes=4"),
        ({"fingerprint": "0" * 64}, r"different recipe"),
        ({"lanes": KeyError}, r"misses key\(s\): \['lanes'\]"),
        ({"step": KeyError}, r"misses key\(s\): \['step'\]"),
        ({"extra": 1}, r"unexpected key\(s\) in checkpoint state: \['extra'\]"),
        ({"step": -1}, r"step=-1 must be an integer in \[0, 2\*\*62\)"),
        ({"step": True}, r"step=True must be an integer in"),
        ({"step": 2.0}, r"step=2.0 must be an integer in"),
        ({"micro": "0"}, r"micro='0' must be an integer in"),
        ({"lanes": [[0, 0]] * 4}, r"'lanes' must be a dict, got list"),
    ],
)
def test_bad_fields(changes: dict[str, Any], match: str) -> None:
    _refused(_mutated(**changes), match)


def test_fingerprint_message_names_the_changed_field() -> None:
    other = memory_pipeline(seq_len=32)
    msg = _refused(_state_after(other, 2), "different recipe")
    assert "seq_len: checkpoint has 32, recipe has 16" in msg


@pytest.mark.parametrize(
    ("lanes", "match"),
    [
        ({"0": [0, 0], "1": [0, 0], "2": [0, 0], "3": [0, 0], "4": [0, 0]}, "lane '4' is out"),
        ({"0": [0, 0], "1": [0, 0], "2": [0, 0], "-1": [0, 0]}, "lane '-1' is out of range"),
        ({"0": [0, 0], "01": [0, 0], "2": [0, 0], "3": [0, 0]}, "lane '01' is out of range"),
        ({"0": [0, 0], "x": [0, 0], "2": [0, 0], "3": [0, 0]}, "lane key 'x' is not a lane"),
        ({"0": [0], "1": [0, 0], "2": [0, 0], "3": [0, 0]}, r"expected \[window, consumed\]"),
        ({"0": [0, -1], "1": [0, 0], "2": [0, 0], "3": [0, 0]}, r"expected \[window, consumed\]"),
        ({"0": [0, 1.5], "1": [0, 0], "2": [0, 0], "3": [0, 0]}, r"expected \[window, consumed\]"),
        ({"0": "00", "1": [0, 0], "2": [0, 0], "3": [0, 0]}, r"expected \[window, consumed\]"),
        ({"0": [2**63, 0], "1": [0, 0], "2": [0, 0], "3": [0, 0]}, r"expected \[window, cons"),
        ({"1": [0, 0], "2": [0, 0], "3": [0, 0]}, r"no state for lane\(s\) \[0\] owned by this"),
    ],
)
def test_bad_lanes(lanes: dict[str, Any], match: str) -> None:
    _refused(_mutated(lanes=lanes), match)


def test_window_beyond_the_stream() -> None:
    lanes = copy.deepcopy(STATE["lanes"])
    lanes["1"] = [10_000, 1]
    msg = _refused(_mutated(lanes=lanes), r"lane 1: window 10000 is beyond the end")
    assert "stream" in msg


def test_consumed_beyond_the_window() -> None:
    lanes = copy.deepcopy(STATE["lanes"])
    lane = PIPE.build_lane(0, INLINE)  # the lane's own check, below the step/position one
    with pytest.raises(CheckpointError, match="the checkpoint says 10000 samples of window 0"):
        lane.reset({"window": 0, "consumed": 10_000})
    lanes["0"] = [0, 10_000]
    _refused(_mutated(lanes=lanes), r"lane 0: position \[0, 10000\] is inconsistent with step=3")


def test_last_window_of_a_finite_stream_is_accepted_as_the_end() -> None:
    """Control for the range check: a lane at its very end (window = number of windows)."""
    pipe = memory_pipeline(n_docs=40)
    ws = pipe.work_source
    k = pipe.recipe.flush_every
    for lane in range(pipe.num_lanes):
        items = 0
        while ws.work(lane, items) is not None:
            items += 1
        end_window = -(-items // k)
        state = _state_after(pipe, 1)
        last = end_window - 1
        state["lanes"][str(lane)] = [last, 1 if last else pipe.recipe.samples_per_lane]
        node = pipe.rank_node(1, 0, pool=INLINE)
        node.reset(state)  # accepted: the lane is in its last window
        state["lanes"][str(lane)] = [end_window + 1, 1]
        with pytest.raises(CheckpointError, match="beyond the end"):
            pipe.rank_node(1, 0, pool=INLINE).reset(state)


def test_mid_step_state_on_another_layout() -> None:
    node = PIPE.rank_node(2, 0, local_batch_size=1, pool=INLINE)
    node.reset(None)
    next(node)
    state = node.state_dict()
    assert state["micro"] == 1
    _refused(state, "after micro-batch 1 of step 1; it can resume only on the same layout", lbs=2)
    same = PIPE.rank_node(2, 0, local_batch_size=1, pool=INLINE)
    same.reset(state)  # control: the same layout resumes


# -- states written by other libraries -----------------------------------------------------


def test_torchdata_loader_state() -> None:
    from torchdata.nodes import IterableWrapper, Loader

    loader = Loader(IterableWrapper(range(5)))
    it = iter(loader)
    next(it)
    foreign = loader.state_dict()
    msg = _refused(foreign, "unsupported checkpoint format None")
    assert "written by zephon-nodes" in msg


def test_torchtitan_default_loader_state() -> None:
    pytest.importorskip("torchtitan")
    import torch
    from torchtitan.components.dataloader import ParallelAwareDataloader

    class Tiny(torch.utils.data.IterableDataset):  # type: ignore[type-arg]
        def __iter__(self):  # type: ignore[no-untyped-def]
            return iter(range(10))

    dl = ParallelAwareDataloader(Tiny(), dp_rank=0, dp_world_size=2, batch_size=2)
    it = iter(dl)
    next(it)
    foreign = dl.state_dict()
    assert "dp_rank_0" in foreign and isinstance(foreign["dp_rank_0"], bytes)
    _refused(foreign, "unsupported checkpoint format None")


def test_state_of_another_library_in_a_file(tmp_path: Path) -> None:
    """A StatefulDataLoader-style pickle saved where a state is expected: refused as binary."""
    (tmp_path / "zephon_state.json").write_bytes(pickle.dumps({"_snapshot": {"x": 1}}))
    with pytest.raises(CheckpointError, match=r"not UTF-8|invalid JSON"):
        load_state(tmp_path)


def test_refusal_keeps_the_node_unusable_but_never_yields_wrong_data() -> None:
    """After a refused reset, a fresh reset(None) works; nothing was half-restored."""
    node = PIPE.rank_node(2, 0, pool=INLINE)
    bad = _mutated(num_lanes=8)
    with pytest.raises(CheckpointError):
        node.reset(bad)
    node.reset(json.loads(json.dumps(STATE)))
    assert node.step == 3
