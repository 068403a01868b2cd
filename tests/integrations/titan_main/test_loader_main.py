"""The main adapter in one process: sizes, flat batches, optimizer steps, state at another dp.

Runs in the TorchTitan main venv (``make test-titan-main``); skipped in the 0.3.0 venv.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip(
    "torchtitan.components.data.loader",
    reason="needs TorchTitan main (the .venv-titan-main of `make test-titan-main`)",
)

from tests.integrations.assets import Assets, write_recipe
from tests.integrations.titan_main.helpers import (
    SEQ,
    build,
    dcp_load,
    expected_digests,
    optimizer_steps,
    union,
)
from zephon_nodes.errors import CheckpointError, RecipeError
from zephon_nodes.integrations.torchtitan import (
    API,
    ZephonDataLoader,
    check_launch,
    lane_key,
)
from zephon_nodes.recipe import Recipe

pytestmark = pytest.mark.titan_main


def test_the_main_adapter_is_chosen() -> None:
    from torchtitan.components.data.loader import BaseDataLoader

    assert API == "main"
    assert issubclass(ZephonDataLoader, BaseDataLoader)
    assert ZephonDataLoader.Config._owner is ZephonDataLoader
    assert issubclass(ZephonDataLoader.Config, BaseDataLoader.Config)


class TestSizes:
    """Every size is checked at launch, the message naming both settings and the fix."""

    @pytest.mark.parametrize(
        ("kw", "match"),
        [
            (
                {"max_context_length": 32},
                r"seq_len=64 is longer than training.max_context_length=32: set "
                r"--training.max-context-length 64",
            ),
            (
                {"num_tokens_per_batch": 100},
                r"num_tokens_per_microbatch_per_dp_rank=100 must be a multiple of the "
                r"recipe's seq_len=64",
            ),
            (
                {"num_tokens_per_batch": 192},
                r"= 4 samples per step, which must be a multiple of "
                r"training.num_tokens_per_microbatch_per_dp_rank / seq_len = 192 / 64 = 3",
            ),
            (
                {"num_tokens_per_train_step": 1000},
                r"num_tokens_per_train_step=1000 must be the recipe's global batch "
                r"global_batch_size x seq_len = 8 x 64 = 512",
            ),
            (
                {"dp_world_size": 3},
                r"num_lanes=4 must be a multiple of .*dp_world_size=3",
            ),
        ],
    )
    def test_refused(self, recipe_path: Path, kw: dict[str, Any], match: str) -> None:
        args: dict[str, Any] = {
            "dp_world_size": 2,
            "dp_rank": 0,
            "max_context_length": 64,
            "num_tokens_per_batch": 128,
        }
        args.update(kw)
        with pytest.raises(RecipeError, match=match):
            check_launch(Recipe.from_toml(recipe_path), **args)

    def test_refused_at_build(self, recipe_path: Path) -> None:
        config = ZephonDataLoader.Config(recipe=str(recipe_path))
        with pytest.raises(RecipeError, match=r"max_context_length=32"):
            config.build(
                dp_world_size=1,
                dp_rank=0,
                tokenizer=None,
                max_context_length=32,
                num_tokens_per_batch=128,
            )

    def test_accepted(self, recipe_path: Path) -> None:
        recipe = Recipe.from_toml(recipe_path)
        rows = check_launch(
            recipe,
            dp_world_size=2,
            dp_rank=1,
            max_context_length=64,
            num_tokens_per_batch=128,
            num_tokens_per_train_step=1024,  # two global batches per optimizer step
        )
        assert rows == 2

    def test_endless_recipe_refused_without_repeat(self, recipe_path: Path) -> None:
        with pytest.raises(RecipeError, match=r"dataloader.repeat=False .* never ends"):
            build(recipe_path, 1, 0, repeat=False)

    def test_validator_can_replace_repeat(self) -> None:
        import dataclasses

        config = dataclasses.replace(ZephonDataLoader.Config(recipe="r.toml"), repeat=False)
        assert config.repeat is False


class TestBatches:
    """Flat token batches; an optimizer step holds the recipe's global batch at any dp."""

    def test_flat_format(self, recipe_path: Path) -> None:
        inputs, labels = next(iter(build(recipe_path, 2, 0, rows=2)))
        assert set(inputs) == {"input", "positions"}
        assert inputs["input"].shape == labels.shape == inputs["positions"].shape == (2 * SEQ,)
        assert inputs["input"].dtype == labels.dtype == torch.int64
        from torchtitan.components.loss import IGNORE_INDEX

        pos = inputs["positions"]
        assert bool((pos[::SEQ] == 0).all())  # every packed sample starts a document
        starts = int((pos == 0).sum())
        assert starts >= 2  # and positions restart at each document inside a sample
        # Positions count up by one inside a document, so the model's document mask
        # (a new document where the position is 0) is the packer's.
        d = pos[1:] - pos[:-1]
        assert bool(((d == 1) | (pos[1:] == 0)).all())
        assert int(labels.min()) >= IGNORE_INDEX

    @pytest.mark.parametrize(
        ("world", "rows", "accum", "workers", "runner"),
        [
            (1, 2, 4, 1, "thread"),
            (2, 1, 4, 2, "thread"),  # dp 2, 4 micro-batches per optimizer step
            (4, 1, 2, 1, "thread"),  # dp 4, 2 micro-batches per optimizer step
            (2, 2, 2, 2, "process"),
        ],
    )
    def test_optimizer_steps_match_digest(
        self, recipe_path: Path, world: int, rows: int, accum: int, workers: int, runner: str
    ) -> None:
        loaders = [
            build(recipe_path, world, r, rows=rows, num_workers=workers, runner=runner)
            for r in range(world)
        ]
        try:
            got = optimizer_steps(loaders, [iter(x) for x in loaders], 3, accum)
        finally:
            for x in loaders:
                x.close()
        assert got == expected_digests(recipe_path, 3)


class TestState:
    """The 0.3.0 keys; a state saved at dp 2 resumes at dp 1 and dp 4."""

    def test_keys(self, recipe_path: Path) -> None:
        sd = build(recipe_path, 2, 1).state_dict()
        assert sorted(k for k in sd if k.startswith("lane_")) == [lane_key(2), lane_key(3)]
        assert {"zephon_format", "num_lanes", "step", "micro", "local_batch_size"} <= set(sd)
        assert int(sd["local_batch_size"]) == 2  # the rows of a micro-batch

    @pytest.mark.parametrize(("world", "rows", "accum"), [(1, 4, 2), (4, 1, 2), (4, 2, 1)])
    def test_resume_at_another_dp(
        self, recipe_path: Path, world: int, rows: int, accum: int
    ) -> None:
        first = [build(recipe_path, 2, r, rows=2) for r in range(2)]
        optimizer_steps(first, [iter(x) for x in first], 3, 2)
        stored = union([x.state_dict() for x in first])
        assert int(stored["step"]) == 3
        resumed = [build(recipe_path, world, r, rows=rows) for r in range(world)]
        for loader in resumed:
            dcp_load(loader, stored)
        got = optimizer_steps(resumed, [iter(x) for x in resumed], 3, accum)
        assert got == expected_digests(recipe_path, 6)[3:]

    def test_other_recipe_refused(self, assets: Assets, recipe_path: Path, tmp_path: Path) -> None:
        stored = union([build(recipe_path, 1, 0, rows=8).state_dict()])
        other = build(write_recipe(tmp_path / "o.toml", assets, seed=8), 1, 0, rows=8)
        with pytest.raises(CheckpointError, match=r"seed: checkpoint has 7, recipe has 8"):
            dcp_load(other, stored)


class TestEnd:
    """Finite data: ``DataloaderExhaustedError`` after the last full step."""

    def test_exhausted(self, assets: Assets, tmp_path: Path) -> None:
        from torchtitan.components.data.loader import DataloaderExhaustedError

        from zephon_nodes.engine.pipeline import Pipeline
        from zephon_nodes.verification.simulate import simulate

        path = write_recipe(tmp_path / "finite.toml", assets, epochs=1)
        steps = sum(1 for _ in simulate(Pipeline(Recipe.from_toml(path)), 1, 10**6))
        loader = build(path, 1, 0, rows=8, repeat=False)
        it = iter(loader)
        for _ in range(steps):
            next(it)
        with pytest.raises(DataloaderExhaustedError, match=rf"after step {steps}"):
            next(it)


def test_metrics(recipe_path: Path) -> None:
    loader = build(recipe_path, 2, 0, rows=2, prefetch=2)
    it = iter(loader)
    taken = [next(it) for _ in range(4)]
    m = loader.metrics()
    assert m["step"] == 2 and m["samples"] == 4
    labels = torch.cat([lab for _, lab in taken[2:]])
    assert m["tokens"] == int((labels != -100).sum())
    from zephon_nodes.integrations.torchtitan import loader_metrics

    assert loader_metrics()["zephon/step"] >= 0
