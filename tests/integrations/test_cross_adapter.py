"""Cross-adapter resume: a checkpoint of the other TorchTitan adapter loads here, both ways.

Runs in both venvs: the 0.3.0 venv loads ``ckpt_main`` (written by the main adapter in
.venv-titan-main), the main venv (``make test-titan-main``) loads ``ckpt_030``. Each also
checks that its own adapter still writes its committed checkpoint's values exactly, so the
fixture the other venv reads is what this adapter writes today. See
:mod:`tests.integrations.cross_checkpoint`.
"""

from __future__ import annotations

import pytest
import torch

from tests.integrations import cross_checkpoint as cc
from zephon_nodes.errors import CheckpointError
from zephon_nodes.integrations.torchtitan import API

OTHER = cc.DATA / ("ckpt_030" if API == "main" else "ckpt_main")
MINE = cc.DATA / ("ckpt_main" if API == "main" else "ckpt_030")


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")
@pytest.mark.parametrize(("world", "rows"), [(1, 4), (2, 2), (4, 1)])
def test_other_adapters_checkpoint_resumes(world: int, rows: int) -> None:
    loaders = [cc.build(world, r, rows=rows) for r in range(world)]
    for loader in loaders:
        cc.load(OTHER, loader)
    try:
        got = cc.steps(loaders, 3)
    finally:
        for x in loaders:
            x.close()
    assert got == cc.expected(cc.SAVE_AT + 3)[cc.SAVE_AT :]


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")
def test_this_adapter_writes_its_committed_checkpoint() -> None:
    state = cc.state_after_steps()
    stored = cc.read(MINE, state)
    assert sorted(stored) == sorted(state)
    for key, value in state.items():
        assert torch.equal(stored[key], value), key


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")
def test_other_recipe_refused() -> None:
    """Control: the checkpoint is checked, not just read (a flipped fingerprint bit is refused)."""
    loader = cc.build(1, 0, rows=4)
    state = cc.read(OTHER, loader.state_dict())
    state["fingerprint"][0] ^= 1
    with pytest.raises(CheckpointError, match=r"different recipe"):
        loader.load_state_dict(state)
    loader.close()


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")
@pytest.mark.parametrize("name", ["old_room256_030", "old_room256_main"])
@pytest.mark.parametrize(("world", "rows"), [(1, 4), (4, 1)])
def test_checkpoint_with_mixture_room_still_loads(name: str, world: int, rows: int) -> None:
    """zephon_format 2 as written before the room followed the recipe (mixture keys with
    room for 256 decisions on a one-dataset recipe): it loads into today's loader, which
    asks DCP for no mixture key, and resumes with the same batches."""
    loaders = [cc.build(world, r, rows=rows) for r in range(world)]
    assert not any(k.startswith("mixture") for k in loaders[0].state_dict())
    for loader in loaders:
        cc.load(cc.DATA / name, loader)
    try:
        got = cc.steps(loaders, 2)
    finally:
        for x in loaders:
            x.close()
    assert got == cc.expected(cc.SAVE_AT + 2)[cc.SAVE_AT :]


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")
def test_format_1_refused() -> None:
    """A layout-1 checkpoint (three values per lane, before check values) is refused."""
    loader = cc.build(1, 0, rows=4)
    state = cc.read(cc.DATA / "ckpt_030", loader.state_dict())
    state["zephon_format"][0] = 1
    with pytest.raises(CheckpointError, match=r"zephon_format=1, expected 2"):
        loader.load_state_dict(state)
    loader.close()
