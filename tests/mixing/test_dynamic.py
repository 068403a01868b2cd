"""Dynamic mixtures: set_mixture decisions, their effect point, the log, resume and the CLI."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from tests.commands.run import zephon
from tests.mixing.helpers import (
    ALPHABETS,
    base_recipe,
    digests,
    label_counts_by_alphabet,
    memory_dataset,
    texts,
    two_length_recipe,
)
from tests.mixing.test_recipe_and_fingerprint import write_mixed
from zephon_nodes import Pipeline, WorkSpec, simulate
from zephon_nodes.commands.stats import compute_stats
from zephon_nodes.core.errors import CheckpointError, RecipeError
from zephon_nodes.engine.mixture_log import updates_after
from zephon_nodes.engine.pool import WorkerPool
from zephon_nodes.operators.pack import IGNORE_INDEX
from zephon_nodes.state import merge_states

UPDATES = [
    (0, {"short": 0.9, "long": 0.1}),
    (3, {"short": 0.0, "long": 1.0}),
    (7, {"short": 0.5, "long": 0.5}),
]


def mixed_recipe(n: int, seed: int = 1, **kw: Any):
    """``n`` repeating datasets (2-4) of different lengths; dataset k writes alphabet k % 3."""
    specs = [
        memory_dataset(
            f"d{k}",
            texts(ALPHABETS[k % 3], 200, 5 + 20 * k, 30 + 40 * k, seed + k),
            on_exhausted="repeat",
        )
        for k in range(n)
    ]
    args: dict[str, Any] = {"seed": seed, "work": WorkSpec(chunk_size=3, epochs=1)}
    args.update(kw)
    return base_recipe(specs, **args)


class TestApi:
    """set_mixture validates its weights and is refused in the middle of a step."""

    @pytest.mark.parametrize(
        ("weights", "message"),
        [
            ({"short": 1.0, "long": 1.0, "web": 1.0}, "unknown dataset.*'web'"),
            ({"short": 1.0}, "no weight for dataset.*'long'"),
            ({"short": -1.0, "long": 1.0}, "weight of 'short' is -1.0"),
            ({"short": 0, "long": 0}, "sum to 0"),
            ({"short": float("nan"), "long": 1}, "weight of 'short'"),
            ([0.5, 0.5], "must be a mapping"),
        ],
    )
    def test_bad_weights_are_refused(self, weights, message):
        node = Pipeline(two_length_recipe(0.5)).rank_node()
        node.reset(None)
        with pytest.raises(RecipeError, match=message):
            node.set_mixture(weights)

    def test_refused_in_the_middle_of_a_step_and_renormalized(self):
        node = Pipeline(two_length_recipe(0.5)).rank_node(local_batch_size=8)
        node.reset(None)
        node.set_mixture({"short": 3, "long": 1})
        assert node.mixture_log == [(0, {"short": 0.75, "long": 0.25})]
        next(node)
        with pytest.raises(RecipeError, match="between steps"):
            node.set_mixture({"short": 1, "long": 1})
        next(node)
        node.set_mixture({"short": 0, "long": 2})
        assert node.mixture_log[-1] == (1, {"short": 0.0, "long": 1.0})
        state = node.get_state()
        assert json.loads(json.dumps(state)) == state  # plain JSON-safe data
        assert state["mixture"]["log"][1] == {"step": 1, "weights": {"short": 0.0, "long": 1.0}}


class TestEffectPoint:
    """A decision after step s starts in each lane at the window after its position at s."""

    def test_items_change_exactly_from_the_next_window(self):
        recipe = two_length_recipe(0.5)
        K = recipe.flush_every
        pipeline = Pipeline(recipe)
        node = pipeline.rank_node(2, 0)
        node.reset(None)
        for _ in range(4 * node.micro_per_step):
            next(node)
        windows = {int(k): v[0] for k, v in node.get_state()["lanes"].items()}
        node.set_mixture({"short": 0.0, "long": 1.0})
        assert node.get_state()["mixture"]["effects"] == {
            str(i): [w + 1] for i, w in windows.items()
        }
        fresh = pipeline.work_source  # the recipe's plan, without decisions
        for lane, w in windows.items():
            start = (w + 1) * K
            before = [node.work_source.work(lane, i) for i in range(start)]
            assert before == [fresh.work(lane, i) for i in range(start)]
            after = [node.work_source.work(lane, i) for i in range(start, start + 40)]
            assert {item.dataset_name for item in after} == {"long"}  # "short" is paused

    def test_paused_dataset_leaves_the_batches_after_the_latency(self):
        """A pause at step 3: within two flush windows per lane, no token of 'short'."""
        recipe = two_length_recipe(0.5)
        batches = [
            mbs
            for _, mbs in simulate(
                Pipeline(recipe), 2, 12, keep_batches=True, mixture_updates=[UPDATES[1]]
            )
        ]
        late = [mb for mbs in batches[6:] for mb in mbs or []]
        assert label_counts_by_alphabet(late)[0] == 0
        early = [mb for mbs in batches[:3] for mb in mbs or []]
        assert label_counts_by_alphabet(early)[0] > 0


@pytest.fixture(scope="module")
def process_pool() -> Iterator[WorkerPool]:
    """Two spawned worker processes shared by the property's examples (started once)."""
    pool = WorkerPool(2, "process", timeout_s=120)
    yield pool
    pool.close()


class TestElastic:
    """Digests with decisions are the dp 1, inline reference at every layout and resume."""

    @settings(max_examples=4, deadline=None)
    @given(
        n=st.integers(2, 4),
        seed=st.integers(0, 50),
        log=st.lists(
            st.tuples(
                st.integers(0, 7),
                st.lists(st.sampled_from([0.0, 0.0, 0.1, 0.5, 1.0, 3.0]), min_size=4, max_size=4),
            ),
            min_size=1,
            max_size=4,
        ),
        world=st.sampled_from([2, 4]),
        save_at=st.integers(1, 7),
        resume_world=st.sampled_from([1, 2, 4]),
        runners=st.tuples(*[st.sampled_from(["inline", "thread", "process"])] * 2),
    )
    @example(
        n=3, seed=5, log=[(2, [0.0, 1.0, 3.0, 0.0]), (5, [0.5, 0.0, 0.1, 0.0])], world=4,
        save_at=3, resume_world=2, runners=("process", "process"),
    )  # fmt: skip
    def test_random_logs(self, process_pool, n, seed, log, world, save_at, resume_world, runners):
        """Inline, 2 worker threads or 2 worker processes for the uninterrupted run and,
        drawn again, for the resume (the explicit example pauses datasets under processes)."""
        recipe = mixed_recipe(n, seed)
        names = [d.name for d in recipe.datasets]
        updates = []
        for step, ws in sorted(log, key=lambda e: e[0]):
            ws = ws[:n] if sum(ws[:n]) > 0 else [1.0] * n
            updates.append((step, dict(zip(names, ws, strict=True))))
        steps = 8
        pipeline = Pipeline(recipe)
        reference = digests(pipeline, 1, steps, num_workers=0, mixture_updates=updates)
        assert len(reference) == steps
        pools = [process_pool if r == "process" else None for r in runners]
        workers = [0 if r == "inline" else 2 for r in runners]
        got = digests(
            pipeline, world, steps, num_workers=workers[0], pool=pools[0], mixture_updates=updates
        )
        assert got == reference
        saved: dict[str, Any] = {}
        before = digests(
            pipeline, world, save_at, save_at=save_at, on_save=saved.update, mixture_updates=updates
        )
        assert before == reference[:save_at]
        later = [u for u in updates if u[0] > save_at]
        after = digests(
            Pipeline(recipe),
            resume_world,
            steps - save_at,
            num_workers=workers[1],
            pool=pools[1],
            resume_state=saved,
            mixture_updates=later,
        )
        assert after == reference[save_at:]

    @pytest.mark.parametrize("save_at", [2, 3, 4])
    def test_decisions_before_at_and_after_the_checkpoint(self, save_at):
        """Saved at dp 4 after step 2, 3 (a decision's step) or 4; resumed at dp 2 and 1."""
        recipe = two_length_recipe(0.5)
        reference = digests(Pipeline(recipe), 1, 10, num_workers=0, mixture_updates=UPDATES)
        saved: dict[str, Any] = {}
        digests(
            Pipeline(recipe), 4, save_at, save_at=save_at, on_save=saved.update,
            mixture_updates=UPDATES,
        )  # fmt: skip
        steps = [e["step"] for e in saved["mixture"]["log"]]
        assert steps == [s for s, _ in UPDATES if s <= save_at]
        for world in (2, 1):
            later = updates_after(UPDATES, saved, ["short", "long"], "test")
            got = digests(
                Pipeline(recipe), world, 10 - save_at, resume_state=saved, mixture_updates=later
            )
            assert got == reference[save_at:], world
        # The resumed run can go on deciding: a new decision after the end of UPDATES.
        extra = [*UPDATES, (8, {"short": 1.0, "long": 0.0})]
        full = digests(Pipeline(recipe), 2, 10, mixture_updates=extra)
        resumed = digests(
            Pipeline(recipe), 1, 10 - save_at, resume_state=saved,
            mixture_updates=updates_after(extra, saved, ["short", "long"], "test"),
        )  # fmt: skip
        assert resumed == full[save_at:]
        assert full[:8] == reference[:8]  # a decision after step 8 changes no earlier batch


class TestLog:
    """Logs that conflict with the checkpoint or the recipe are refused, naming what."""

    def _saved(self) -> dict[str, Any]:
        saved: dict[str, Any] = {}
        digests(
            Pipeline(two_length_recipe(0.5)), 2, 4, save_at=4, on_save=saved.update,
            mixture_updates=UPDATES,
        )  # fmt: skip
        return saved

    def test_conflicting_earlier_entry_is_refused(self):
        saved = self._saved()
        names = ["short", "long"]
        changed = [UPDATES[0], (3, {"short": 0.2, "long": 0.8}), UPDATES[2]]
        with pytest.raises(RecipeError, match=r"decision 1 .*step 3 .*0\.2.*checkpoint has step 3"):
            updates_after(changed, saved, names, "--mixture-updates f.json")
        with pytest.raises(RecipeError, match=r"decision 2 .*no entry"):
            updates_after([*UPDATES[:2], (4, {"short": 1, "long": 1})], saved, names, "x")
        assert updates_after(UPDATES, saved, names, "x") == [UPDATES[2]]

    def test_log_naming_another_dataset_is_refused(self):
        saved = self._saved()
        saved["mixture"]["log"][1]["weights"] = {"short": 0.5, "web": 0.5}
        node = Pipeline(two_length_recipe(0.5)).rank_node()
        with pytest.raises(CheckpointError, match="names dataset 'web'"):
            node.reset(saved)
        del saved["mixture"]["log"][1]["weights"]["web"]
        with pytest.raises(CheckpointError, match="no weight for the recipe's dataset 'long'"):
            node.reset(saved)

    def test_ranks_with_different_logs_do_not_merge(self):
        pipeline = Pipeline(two_length_recipe(0.5))
        a, b = pipeline.rank_node(2, 0), pipeline.rank_node(2, 1)
        a.reset(None)
        b.reset(None)
        a.set_mixture({"short": 1, "long": 1})
        b.set_mixture({"short": 1, "long": 2})
        with pytest.raises(CheckpointError, match="disagree on the mixture decision log"):
            merge_states([a.get_state(), b.get_state()])

    def test_effect_windows_are_validated(self):
        saved = self._saved()
        saved["mixture"]["effects"]["0"] = [1]
        with pytest.raises(CheckpointError, match="lane 0 needs 2 non-decreasing effect"):
            Pipeline(two_length_recipe(0.5)).rank_node().reset(saved)


class TestItems:
    """Decisions never skip or repeat an item: an 'end' dataset is read exactly once."""

    def test_end_dataset_read_once_across_decisions(self):
        small = memory_dataset("small", texts("abc", 120, 5, 10, 1))
        big = memory_dataset("big", texts("xyz", 400, 5, 10, 2), on_exhausted="repeat")
        recipe = base_recipe([small, big], work=WorkSpec(chunk_size=2, epochs=1))
        ws = Pipeline(recipe).rank_node().work_source
        K = recipe.flush_every
        starts = {lane: [K * (1 + lane), K * (3 + lane), K * (3 + lane)] for lane in range(4)}
        ws.set_decisions([(0.0, 1.0), (0.9, 0.1), (0.2, 0.8)], starts)  # type: ignore[attr-defined]
        seen = []
        for lane in range(recipe.num_lanes):
            i = 0
            while (item := ws.work(lane, i)) is not None:
                if item.dataset_name == "small":
                    seen.append(item.item)
                i += 1
        assert sorted(seen) == list(range(60))


class TestDatasetIds:
    """Every batch carries dataset_ids: the recipe index of each label token, -1 on padding."""

    def test_ids_match_the_alphabets(self):
        recipe = mixed_recipe(3, seq_len=48)
        lookup = np.full(512, -1, dtype=np.int64)
        for k, alphabet in enumerate(ALPHABETS):
            for ch in alphabet.encode():
                lookup[ch + 3] = k
        for _, mbs in simulate(Pipeline(recipe), 2, 5, keep_batches=True):
            for mb in mbs or []:
                ids, labels = mb["dataset_ids"].numpy(), mb["labels"].numpy()
                assert ids.dtype == np.int64 and ids.shape == labels.shape
                real = labels != IGNORE_INDEX
                assert (ids[~real] == -1).all()
                assert (ids[real] == lookup[labels[real]]).all()


class TestShares:
    """After a decision, token shares move to the new weights (numbers in docs/mixing.md)."""

    def test_shares_reach_the_new_weights(self, tmp_path):
        """Benchmark corpus, web/code 0.5/0.5 then 0.2/0.8 after step 4 (bounded version of
        ``python -m benchmarks.mixing``'s dynamic section): steps 9-40 within 0.03."""
        from benchmarks.mixing import dynamic_recipe, write_corpus

        write_corpus(tmp_path, 0.05)
        stats = compute_stats(
            dynamic_recipe(tmp_path),
            40,
            2,
            mixture_updates=[(4, {"web": 0.2, "code": 0.8})],
            window_steps=2,
        )
        windows = stats["token_shares_per_window"]
        assert windows[1]["weights"] == {"web": 0.5, "code": 0.5}
        assert abs(np.mean([w["token_shares"]["web"] for w in windows[:2]]) - 0.5) < 0.05
        assert windows[2]["weights"] == {"web": 0.2, "code": 0.8}
        late = [w["token_shares"]["web"] for w in windows[4:]]
        assert len(late) == 16
        assert abs(np.mean(late) - 0.2) < 0.03, late
        assert stats["mixture_log"] == [{"step": 4, "weights": {"web": 0.2, "code": 0.8}}]
        # The recipe's weights and those in force after the decision, told apart.
        assert stats["weights"] == {"web": 0.5, "code": 0.5}
        assert stats["weights_in_force"] == {"web": 0.2, "code": 0.8}


class TestCli:
    """zephon digest/stats --mixture-updates, with dp sizes, save and resume."""

    def test_digest_with_updates_save_and_resume(self, tmp_path, capsys):
        recipe = write_mixed(tmp_path)
        updates = tmp_path / "updates.json"
        updates.write_text(
            json.dumps(
                [
                    {"step": 1, "weights": {"web": 0.2, "code": 0.8}},
                    {"step": 4, "weights": {"web": 1, "code": 0}},
                ]
            )
        )
        args = [str(recipe), "--steps", "8", "--mixture-updates", str(updates)]

        def lines() -> list[str]:
            return capsys.readouterr().out.splitlines()

        assert zephon("digest", *args) == 0
        reference = lines()
        assert zephon("digest", *args, "--dp-world-size", "4", "--num-workers", "0") == 0
        assert lines() == reference
        assert zephon("digest", str(recipe), "--steps", "8") == 0
        assert lines() != reference
        ckpt = tmp_path / "ckpt"
        assert zephon("digest", *args, "--save-at", "4", "--checkpoint-dir", str(ckpt)) == 0
        lines()
        resumed = [str(recipe), "--steps", "4", "--resume-from", str(ckpt), "--dp-world-size", "2"]
        assert zephon("digest", *resumed, "--mixture-updates", str(updates)) == 0
        assert lines() == reference[4:]
        assert zephon("inspect", str(ckpt), "--json") == 0
        assert json.loads(capsys.readouterr().out)["mixture_log"] == [
            {"step": 1, "weights": {"web": 0.2, "code": 0.8}},
            {"step": 4, "weights": {"web": 1.0, "code": 0.0}},
        ]
        updates.write_text(json.dumps([{"step": 1, "weights": {"web": 0.3, "code": 0.7}}]))
        assert zephon("digest", *resumed, "--mixture-updates", str(updates)) == 2
        out = lines()
        assert len(out) == 1 and "decision 0" in out[0] and "differs" in out[0], out
        updates.write_text(json.dumps([{"step": 1, "weights": {"web": 1, "prose": 1}}]))
        assert zephon("digest", *args) == 2
        assert "unknown dataset(s) ['prose']" in lines()[0]

    def test_stats_per_window(self, tmp_path, capsys):
        recipe = write_mixed(tmp_path)
        updates = tmp_path / "updates.json"
        updates.write_text(json.dumps([{"step": 2, "weights": {"web": 0, "code": 1}}]))
        argv = ["stats", str(recipe), "--steps", "8", "--json", "--window-steps", "4"]
        assert zephon(*argv, "--mixture-updates", str(updates)) == 0
        out = json.loads(capsys.readouterr().out)
        first, last = out["token_shares_per_window"]
        assert first["steps"] == [1, 4] and last["steps"] == [5, 8]
        assert last["token_shares"] == {"web": 0.0, "code": 1.0}
        assert last["weights"] == {"web": 0.0, "code": 1.0}
        assert out["mixture_log"] == [{"step": 2, "weights": {"web": 0.0, "code": 1.0}}]
