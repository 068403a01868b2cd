"""ZephonDataLoader in one process: launch checks, batches, and the DCP state conversion.

DCP across ranks is simulated here by the union of the ranks' state dicts (what DCP keeps
when replicated keys are identical and lane keys unique); the torchrun tests use the real
CheckpointManager.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from torchtitan.components.tokenizer import HuggingFaceTokenizer

from tests.integrations.assets import Assets, write_hf_assets, write_recipe
from tests.integrations.tt_helpers import Row, rows_of, step_digest, take_steps
from zephon_nodes.core.errors import CheckpointError, RecipeError
from zephon_nodes.engine.pipeline import Pipeline
from zephon_nodes.integrations.torchtitan import ZephonDataLoader, lane_key
from zephon_nodes.recipe import Recipe
from zephon_nodes.verification.simulate import simulate

SPL = 2  # samples per lane per step in the default recipe (G=8, L=4)


def build(recipe: Path | str, world: int, rank: int, lbs: int = 2, tok: Any = None, **cfg: Any):
    """Build the loader the way TorchTitan's trainer does (seq_len 64, one worker)."""
    config = ZephonDataLoader.Config(recipe=str(recipe), num_workers=1, **cfg)
    return config.build(
        dp_world_size=world,
        dp_rank=rank,
        tokenizer=tok,
        seq_len=64,
        local_batch_size=lbs,
        snapshot_every_n_steps=None,
    )


def expected_digests(recipe: Path, steps: int) -> list[str]:
    pipeline = Pipeline(Recipe.from_toml(recipe), provenance=False)  # TorchTitan rows: no ids
    return [r.digest for r, _ in simulate(pipeline, 2, steps, num_workers=1)]


def run_ranks(loaders: list[ZephonDataLoader], iters: list[Any], steps: int) -> list[str]:
    per_rank: list[list[list[Row]]] = []
    for loader, it in zip(loaders, iters, strict=True):
        share = loader.pipeline.recipe.global_batch_size // loader.dp_world_size
        per_rank.append(take_steps(it, steps, share // loader.local_batch_size))
    return [step_digest([rr[t] for rr in per_rank], SPL) for t in range(steps)]


def union(states: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
    """What DCP stores from several ranks: replicated keys must agree, lane keys are unique."""
    out: dict[str, torch.Tensor] = {}
    for sd in states:
        for k, v in sd.items():
            lane = k.startswith(("lane_", "mixture_lane_", "stage_lane_"))
            if k in out and not lane:
                assert torch.equal(out[k], v), f"replicated key {k} differs between ranks"
            assert not (k in out and lane), f"lane key {k} saved twice"
            out[k] = v.clone()
    return out


def dcp_load(loader: ZephonDataLoader, stored: dict[str, torch.Tensor]) -> None:
    """Mimic DCP: ask the new loader for its keys, fill them in place, hand them back."""
    wanted = loader.state_dict()
    for k, v in wanted.items():
        if k not in stored:
            raise KeyError(f"Missing key in checkpoint state_dict: dataloader.{k}")
        assert v.shape == stored[k].shape and v.dtype == stored[k].dtype, k
        v.copy_(stored[k])
    loader.load_state_dict(wanted)


class TestLaunchChecks:
    """Every bad combination fails at build time with a message naming what to change."""

    def test_lanes_not_divisible_by_dp(self, recipe_path: Path) -> None:
        with pytest.raises(
            RecipeError, match=r"num_lanes=4 must be a multiple of .*dp_world_size=3"
        ):
            build(recipe_path, 3, 0)

    def test_global_batch_not_divisible_by_lanes(self, assets: Assets, tmp_path: Path) -> None:
        bad = write_recipe(tmp_path / "r.toml", assets, global_batch_size=6)
        with pytest.raises(
            RecipeError, match=r"global_batch_size=6 must be a multiple of num_lanes=4"
        ):
            build(bad, 2, 0)

    def test_rank_share_not_divisible_by_local_batch(self, recipe_path: Path) -> None:
        with pytest.raises(RecipeError, match=r"= 4 samples per step.*local_batch_size=3"):
            build(recipe_path, 2, 0, lbs=3)

    def test_seq_len_mismatch(self, recipe_path: Path) -> None:
        config = ZephonDataLoader.Config(recipe=str(recipe_path))
        with pytest.raises(RecipeError, match=r"training.seq_len=128 but the recipe's seq_len=64"):
            config.build(
                dp_world_size=1, dp_rank=0, tokenizer=None, seq_len=128, local_batch_size=8
            )

    def test_tokenizer_vocab_mismatch(
        self, assets: Assets, recipe_path: Path, tmp_path: Path
    ) -> None:
        other = HuggingFaceTokenizer(
            tokenizer_path=str(write_hf_assets(assets.sp_model, tmp_path / "hf", vocab_size=500))
        )
        with pytest.raises(RecipeError, match=r"vocab_size=500, the recipe tokenizer .* has 512"):
            build(recipe_path, 2, 0, tok=other)

    def test_tokenizer_bos_mismatch(self, recipe_path: Path) -> None:
        fake = SimpleNamespace(get_vocab_size=lambda: 512, bos_id=5, eos_id=2)
        with pytest.raises(RecipeError, match=r"bos_id=5, the recipe tokenizer .* bos_id=1"):
            build(recipe_path, 2, 0, tok=fake)

    def test_tokenizer_eos_mismatch(self, recipe_path: Path) -> None:
        fake = SimpleNamespace(get_vocab_size=lambda: 512, bos_id=1, eos_id=0)
        with pytest.raises(RecipeError, match=r"eos_id=0, the recipe tokenizer .* eos_id=2"):
            build(recipe_path, 2, 0, tok=fake)

    def test_matching_tokenizer_accepted(self, assets: Assets, recipe_path: Path) -> None:
        tok = HuggingFaceTokenizer(tokenizer_path=str(assets.hf_assets))
        assert build(recipe_path, 2, 1, tok=tok).lanes == [2, 3]

    def test_same_tokenizer_json_accepted(self, assets: Assets, tmp_path: Path) -> None:
        """The simplest relation: the recipe names TorchTitan's own tokenizer.json."""
        path = write_recipe(
            tmp_path / "hf.toml", assets, tokenizer=("hf", assets.hf_assets / "tokenizer.json")
        )
        tok = HuggingFaceTokenizer(tokenizer_path=str(assets.hf_assets))
        inputs, _ = next(iter(build(path, 2, 0, tok=tok)))
        is_bos = inputs["input"] == tok.bos_id  # documents start with TorchTitan's bos id
        assert is_bos.any() and bool((inputs["positions"][is_bos] == 0).all())

    def test_other_tokenizer_json_refused(self, assets: Assets, tmp_path: Path) -> None:
        small = write_hf_assets(assets.sp_model, tmp_path / "small", vocab_size=500)
        path = write_recipe(
            tmp_path / "hf.toml", assets, tokenizer=("hf", small / "tokenizer.json")
        )
        tok = HuggingFaceTokenizer(tokenizer_path=str(assets.hf_assets))
        with pytest.raises(
            RecipeError, match=r"vocab_size=512, the recipe tokenizer \(hf .* has 500"
        ):
            build(path, 2, 0, tok=tok)

    def test_tokenizer_check_can_be_disabled(self, recipe_path: Path) -> None:
        fake = SimpleNamespace(get_vocab_size=lambda: 7, bos_id=5, eos_id=6)
        assert build(recipe_path, 1, 0, tok=fake, check_tokenizer=False).lanes == [0, 1, 2, 3]

    def test_endless_recipe_refused_when_not_infinite(self, recipe_path: Path) -> None:
        with pytest.raises(RecipeError, match=r"infinite=False .* never ends .*validator.steps"):
            build(recipe_path, 2, 0, infinite=False)

    def test_finite_recipe_accepted_when_not_infinite(self, assets: Assets, tmp_path: Path) -> None:
        path = write_recipe(tmp_path / "finite.toml", assets, epochs=1)
        loader = build(path, 1, 0, lbs=8, infinite=False)
        pipeline = Pipeline(Recipe.from_toml(path))
        steps = sum(1 for _ in simulate(pipeline, 1, 10**6, num_workers=1))
        assert steps > 10
        assert sum(1 for _ in loader) == steps  # one micro-batch per step, then the end

    def test_recipe_required(self) -> None:
        with pytest.raises(RecipeError, match=r"--dataloader.recipe"):
            ZephonDataLoader.Config().build(
                dp_world_size=1, dp_rank=0, tokenizer=None, seq_len=64, local_batch_size=8
            )

    def test_dataset_path_refused(self, recipe_path: Path) -> None:
        config = ZephonDataLoader.Config(recipe=str(recipe_path), dataset_path="/data/c4")
        with pytest.raises(RecipeError, match=r"dataset_path='/data/c4'.*not used"):
            config.build(dp_world_size=1, dp_rank=0, tokenizer=None, seq_len=64, local_batch_size=8)

    @pytest.mark.parametrize(
        ("field", "value", "match"),
        [
            ("runner", "gpu", "runner='gpu'"),
            ("num_workers", -1, "num_workers=-1"),
            ("prefetch", -2, "prefetch=-2"),
            ("lookahead", 0, "lookahead=0"),
            ("worker_timeout_s", 0.0, "worker_timeout_s=0.0"),
            ("operator_workers", "tokenize=gpu:1", "operator_workers: .*runner 'gpu'"),
        ],
    )
    def test_bad_physical_settings(self, field: str, value: Any, match: str) -> None:
        with pytest.raises(RecipeError, match=match):
            ZephonDataLoader.Config(recipe="r.toml", **{field: value})


class TestConfig:
    """The Config follows TorchTitan's Configurable rules."""

    def test_slots_kw_only_and_owner(self) -> None:
        assert "__slots__" in ZephonDataLoader.Config.__dict__
        assert all(f.kw_only for f in dataclasses.fields(ZephonDataLoader.Config))
        assert ZephonDataLoader.Config._owner is ZephonDataLoader

    def test_validator_can_replace_infinite(self) -> None:
        config = dataclasses.replace(ZephonDataLoader.Config(recipe="r.toml"), infinite=False)
        assert config.infinite is False

    def test_every_field_documented(self) -> None:
        """Each field has a docstring line where it is defined (the shared base or the
        adapter's own Config): TorchTitan's ``--help`` shows it."""
        import inspect
        import re

        for f in dataclasses.fields(ZephonDataLoader.Config):
            if f.name in ("dataset", "dataset_path"):
                continue  # inherited from TorchTitan's BaseDataLoader.Config
            owner = next(
                c for c in ZephonDataLoader.Config.__mro__ if f.name in inspect.get_annotations(c)
            )
            source = inspect.getsource(owner)
            after = re.split(rf"\n +{f.name}:", source, maxsplit=1)[1].split("\n", 2)[1]
            assert after.strip().startswith('"""'), f"field {f.name} has no docstring line"


class TestBatches:
    """The loader yields exactly the recipe's global batches, at any dp size and prefetch."""

    @pytest.mark.parametrize(
        ("world", "lbs", "prefetch"), [(2, 2, 2), (2, 4, 0), (1, 4, 1), (4, 1, 2)]
    )
    def test_digests_match_simulation(
        self, recipe_path: Path, world: int, lbs: int, prefetch: int
    ) -> None:
        loaders = [build(recipe_path, world, r, lbs=lbs, prefetch=prefetch) for r in range(world)]
        got = run_ranks(loaders, [iter(x) for x in loaders], 4)
        assert got == expected_digests(recipe_path, 4)

    def test_operator_workers(self, recipe_path: Path) -> None:
        """Per-operator pools from the config: same batches; close() stops them."""
        loaders = [
            build(recipe_path, 2, r, operator_workers="parse=inline,tokenize=thread:2")
            for r in range(2)
        ]
        got = run_ranks(loaders, [iter(x) for x in loaders], 4)
        assert got == expected_digests(recipe_path, 4)
        for loader in loaders:
            loader.close()
            assert all(p._executor is None for p in loader.multiplexer._owned)

    def test_dropped_loader_stops_its_threads(self, recipe_path: Path) -> None:
        import gc
        import threading
        import time

        before = threading.active_count()
        loader = build(recipe_path, 1, 0, lbs=4, operator_workers="tokenize=thread:2")
        next(iter(loader))
        assert threading.active_count() > before
        del loader
        deadline = time.monotonic() + 10
        while threading.active_count() > before and time.monotonic() < deadline:
            gc.collect()
            time.sleep(0.05)
        assert threading.active_count() == before

    def test_batch_format(self, recipe_path: Path) -> None:
        inputs, labels = next(iter(build(recipe_path, 2, 0)))
        assert set(inputs) == {"input", "positions"}
        assert inputs["input"].shape == labels.shape == inputs["positions"].shape == (2, 64)
        assert inputs["input"].dtype == labels.dtype == torch.int64


class TestState:
    """State through DCP-style dicts: per-lane keys, replicated keys, any new dp size."""

    def test_keys_and_dtypes(self, recipe_path: Path) -> None:
        sd = build(recipe_path, 2, 1).state_dict()
        lanes = sorted(k for k in sd if k.startswith("lane_"))
        assert lanes == [lane_key(2), lane_key(3)] == ["lane_00002", "lane_00003"]
        # One dataset: no mixture to change, so no mixture keys; a lane is 32 bytes.
        assert not any(k.startswith("mixture") for k in sd)
        assert all(sd[k].numel() * sd[k].element_size() == 32 for k in lanes)
        roomy = build(recipe_path, 2, 1, max_decisions=256).state_dict()
        assert sorted(k for k in roomy if k.startswith("mixture_lane_")) == [
            "mixture_lane_00002",
            "mixture_lane_00003",
        ]
        assert roomy["mixture_lane_00002"].shape == (256,)
        sd.update(roomy)
        for k, v in sd.items():
            assert isinstance(v, torch.Tensor), k
            want = {"fingerprint": torch.uint8, "mixture_log": torch.float64}.get(k, torch.int64)
            assert v.dtype == want, k
        assert sd["fingerprint"].shape == (32,)
        assert {"zephon_format", "num_lanes", "step", "micro", "recipe_seq_len"} <= set(sd)

    @pytest.mark.parametrize(("world", "lbs"), [(1, 4), (4, 1), (2, 2)])
    def test_resume_at_another_dp_size(self, recipe_path: Path, world: int, lbs: int) -> None:
        first = [build(recipe_path, 2, r) for r in range(2)]
        run_ranks(first, [iter(x) for x in first], 3)
        stored = union([x.state_dict() for x in first])
        assert int(stored["step"]) == 3
        resumed = [build(recipe_path, world, r, lbs=lbs) for r in range(world)]
        for r, loader in enumerate(resumed):
            per = 4 // world
            expected = {lane_key(i) for i in range(r * per, (r + 1) * per)}
            assert {k for k in loader.state_dict() if k.startswith("lane_")} == expected
            dcp_load(loader, stored)
        got = run_ranks(resumed, [iter(x) for x in resumed], 3)
        assert got == expected_digests(recipe_path, 6)[3:]

    def test_state_after_load_is_the_loaded_state(self, recipe_path: Path) -> None:
        first = [build(recipe_path, 2, r) for r in range(2)]
        run_ranks(first, [iter(x) for x in first], 2)
        stored = union([x.state_dict() for x in first])
        again = build(recipe_path, 1, 0, lbs=8)
        dcp_load(again, stored)
        resaved = again.state_dict()
        assert set(resaved) == set(stored)
        assert all(
            torch.equal(resaved[k], stored[k])
            for k in stored
            if k not in ("dp_world_size", "local_batch_size") and not k.startswith("lane_")
        )
        # Lane tensors: the same [window, consumed, step]; the check value covers the layout.
        lanes = [k for k in stored if k.startswith("lane_")]
        assert len(lanes) == 4
        assert all(torch.equal(resaved[k][:3], stored[k][:3]) for k in lanes)
        assert all(not torch.equal(resaved[k][3:], stored[k][3:]) for k in lanes)

    @pytest.mark.parametrize(
        ("override", "match"),
        [
            ({"seed": 8}, r"seed: checkpoint has 7, recipe has 8"),
            ({"flush_every": 3}, r"flush_every: checkpoint has 2, recipe has 3"),
            ({"global_batch_size": 16}, r"global_batch_size: checkpoint has 8, recipe has 16"),
        ],
    )
    def test_other_recipe_names_the_field(
        self,
        assets: Assets,
        recipe_path: Path,
        tmp_path: Path,
        override: dict[str, Any],
        match: str,
    ) -> None:
        first = [build(recipe_path, 2, r) for r in range(2)]
        run_ranks(first, [iter(x) for x in first], 1)
        stored = union([x.state_dict() for x in first])
        other = build(write_recipe(tmp_path / "other.toml", assets, **override), 2, 0)
        with pytest.raises(CheckpointError, match=match):
            dcp_load(other, stored)

    def test_other_seq_len_names_the_field(
        self, assets: Assets, recipe_path: Path, tmp_path: Path
    ) -> None:
        first = build(recipe_path, 1, 0, lbs=8)
        stored = union([first.state_dict()])
        path = write_recipe(tmp_path / "other.toml", assets, seq_len=32)
        other = ZephonDataLoader.Config(recipe=str(path)).build(
            dp_world_size=1, dp_rank=0, tokenizer=None, seq_len=32, local_batch_size=8
        )
        with pytest.raises(CheckpointError, match=r"seq_len: checkpoint has 64, recipe has 32"):
            dcp_load(other, stored)

    def test_other_data_names_the_field(
        self, assets: Assets, recipe_path: Path, tmp_path: Path
    ) -> None:
        stored = union([build(recipe_path, 1, 0, lbs=8).state_dict()])
        corpus = tmp_path / "corpus.jsonl"
        corpus.write_text(
            assets.corpus.read_text(encoding="utf-8")[:-200].rsplit("\n", 1)[0] + "\n"
        )
        path = write_recipe(tmp_path / "other.toml", dataclasses.replace(assets, corpus=corpus))
        # `contents` (the files' content checksums) and `datasets` both differ.
        with pytest.raises(CheckpointError, match=r"different recipe .*contents differs; datasets"):
            dcp_load(build(path, 1, 0, lbs=8), stored)

    def test_default_loader_state_refused(self, recipe_path: Path) -> None:
        loader = build(recipe_path, 1, 0, lbs=8)
        with pytest.raises(CheckpointError, match=r"not written by ZephonDataLoader"):
            loader.load_state_dict({"dp_rank_0": b"...", "world_size": 1})

    def test_inconsistent_lane_step_refused(self, recipe_path: Path) -> None:
        stored = union([build(recipe_path, 1, 0, lbs=8).state_dict()])
        stored["lane_00002"] = torch.tensor([0, 0, 5, 0])
        with pytest.raises(
            CheckpointError, match=r"lane 2 was saved at step 5, the checkpoint is at step 0"
        ):
            dcp_load(build(recipe_path, 1, 0, lbs=8), stored)

    def test_mid_step_state_resumes_on_same_layout_only(self, recipe_path: Path) -> None:
        first = [build(recipe_path, 2, r, lbs=2) for r in range(2)]
        iters = [iter(x) for x in first]
        run_ranks(first, iters, 2)
        head = [rows_of(next(it)) for it in iters]  # the first of two micro-batches of step 3
        stored = union([x.state_dict() for x in first])
        assert int(stored["micro"]) == 1
        with pytest.raises(
            CheckpointError, match=r"after micro-batch 1 of step 3.*only at dp_world_size=2"
        ):
            dcp_load(build(recipe_path, 4, 0, lbs=1), stored)
        with pytest.raises(
            CheckpointError, match=r"local_batch_size=2, this job has .*local_batch_size=1"
        ):
            dcp_load(build(recipe_path, 2, 0, lbs=1), stored)
        same = [build(recipe_path, 2, r, lbs=2) for r in range(2)]
        for loader in same:
            dcp_load(loader, stored)
        iters = [iter(x) for x in same]
        tails = [rows_of(next(it)) for it in iters]  # the second micro-batch of step 3
        want = expected_digests(recipe_path, 5)
        assert step_digest([h + t for h, t in zip(head, tails, strict=True)], SPL) == want[2]
        assert run_ranks(same, iters, 2) == want[3:]

    def test_malformed_values_refused(self, recipe_path: Path) -> None:
        stored = union([build(recipe_path, 1, 0, lbs=8).state_dict()])
        stored["step"] = torch.tensor([1.0])
        with pytest.raises(CheckpointError, match=r"dataloader.step: expected an int64 tensor"):
            build(recipe_path, 1, 0, lbs=8).load_state_dict(stored)


class TestRealDcp:
    """torch.distributed.checkpoint in one process (no process group), as TorchTitan saves."""

    @pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")
    def test_round_trip_and_no_pickled_items(self, recipe_path: Path, tmp_path: Path) -> None:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint import FileSystemReader

        loader = build(recipe_path, 1, 0, lbs=4)
        run_ranks([loader], [iter(loader)], 3)
        dcp.save({"dataloader": loader}, checkpoint_id=str(tmp_path / "ckpt"), no_dist=True)
        meta = FileSystemReader(str(tmp_path / "ckpt")).read_metadata()
        kinds = {type(v).__name__ for v in meta.state_dict_metadata.values()}
        assert kinds == {"TensorStorageMetadata"}
        resumed = build(recipe_path, 1, 0, lbs=8)
        dcp.load({"dataloader": resumed}, checkpoint_id=str(tmp_path / "ckpt"), no_dist=True)
        got = run_ranks([resumed], [iter(resumed)], 3)
        assert got == expected_digests(recipe_path, 6)[3:]


class TestMetrics:
    """loader.metrics(): the steps the trainer took, after the prefetcher."""

    def test_metrics_follow_the_trainer_steps(self, recipe_path: Path) -> None:
        loader = build(recipe_path, 2, 0, lbs=2, prefetch=2)
        it = iter(loader)
        taken = [next(it) for _ in range(4)]  # 2 steps of 2 micro-batches (G/2 = 4 rows)
        m = loader.metrics()
        assert m["step"] == 2
        assert m["samples"] == 4 and m["samples_total"] == 8
        labels = torch.cat([lab for _, lab in taken[2:]])
        assert m["tokens"] == int((labels != -100).sum())
        assert m["data_wait_s"] > 0
        assert m["operators"]["tokenize"]["busy_s"] > 0
        from zephon_nodes.integrations.torchtitan import loader_metrics

        assert loader_metrics()["zephon/step"] >= 0  # the first live loader's, flattened
