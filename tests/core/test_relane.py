"""Re-laning: every document used exactly once, and elastic determinism after the change."""

from __future__ import annotations

import itertools
from collections import Counter
from typing import Any

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from tests.strategies import divisors
from zephon_nodes import (
    DatasetSpec,
    Pipeline,
    Recipe,
    ShuffleSpec,
    TokenizerSpec,
    WorkerPool,
    WorkSpec,
    simulate,
)
from zephon_nodes.core.errors import CheckpointError, RecipeError
from zephon_nodes.engine.relane import for_state, relane_state
from zephon_nodes.operators import IGNORE_INDEX
from zephon_nodes.recipe import MixtureSpec, PackSpec
from zephon_nodes.state import merge_states
from zephon_nodes.verification.digest import digest_microbatches

# Each dataset writes its own letters (byte tokenizer: id = byte + 3, bos 1, eos 2).
ALPHABETS = ("abcdefgh ", "nopqrstu\n")
REACHED: list[int] = []


def _texts(draw: st.DrawFn, alphabet: str, n: int) -> list[str]:
    return draw(
        st.lists(st.text(alphabet=alphabet, min_size=0, max_size=70), min_size=n, max_size=n)
    )


@st.composite
def relane_cases(draw: st.DrawFn) -> dict[str, Any]:
    """A small finite recipe (one dataset or a mixture), lane counts, a save point and dps."""
    G = draw(st.sampled_from([4, 6, 12]))
    L = draw(st.sampled_from([d for d in divisors(G) if d <= 6]))
    L2 = draw(st.sampled_from([d for d in divisors(G) if d <= 6]))
    mixed = draw(st.booleans())
    n = draw(st.integers(20, 50))
    if mixed:
        datasets: tuple[DatasetSpec, ...] = (
            DatasetSpec("a", records=tuple({"text": t} for t in _texts(draw, ALPHABETS[0], n))),
            DatasetSpec(
                "b",
                records=tuple({"text": t} for t in _texts(draw, ALPHABETS[1], n)),
                on_exhausted=draw(st.sampled_from(["end", "repeat"])),
            ),
        )
        schedule = draw(
            st.sampled_from([None, ((0.0, {"a": 0.8, "b": 0.2}), (4.0, {"a": 0.3, "b": 0.7}))])
        )
        mixture = MixtureSpec(schedule=schedule, block=draw(st.sampled_from([4, 16])))
    else:
        datasets = (
            DatasetSpec("a", records=tuple({"text": t} for t in _texts(draw, ALPHABETS[0], n))),
        )
        mixture = MixtureSpec()
    mode = draw(st.sampled_from(["concat", "bestfit"]))
    recipe = Recipe(
        datasets=datasets,
        tokenizer=TokenizerSpec(kind="bytes", add_bos=True, add_eos=True),
        seed=draw(st.integers(0, 2**32)),
        num_lanes=L,
        global_batch_size=G,
        seq_len=draw(st.integers(8, 40)),
        flush_every=draw(st.integers(1, 4)),
        work=WorkSpec(chunk_size=draw(st.integers(1, 3)), epochs=1),
        shuffle=ShuffleSpec(draw(st.sampled_from([0, 1, 4]))),
        pack=PackSpec(mode=mode, bins=draw(st.sampled_from([1, 4]))),
        mixture=mixture,
    )
    return {
        "recipe": recipe,
        "L2": L2,
        "dp_old": draw(st.sampled_from(divisors(L))),
        "dps": draw(st.permutations(divisors(L2))),
        "after": draw(st.integers(1, 3)),
    }


def _pairs(rows: Any, counter: Counter) -> None:
    """Add the (input, label) pairs of samples (dicts of arrays, one row or many)."""
    inputs, labels = rows["input"], rows["labels"]
    if hasattr(inputs, "numpy"):
        inputs, labels = inputs.numpy(), labels.numpy()
    keep = labels != IGNORE_INDEX
    counter.update(zip(inputs[keep].tolist(), labels[keep].tolist(), strict=True))


def drain(pipeline: Pipeline, state: dict[str, Any], pool: WorkerPool) -> Counter:
    """Every (input, label) pair the lanes still hold at ``state``, to the end of the pass."""
    p = for_state(pipeline, state)
    node = p.rank_node(lanes=list(range(p.num_lanes)), pool=pool)
    node.reset(state)
    got: Counter = Counter()
    for lane in node.lanes.values():
        for sample in lane:
            _pairs(sample, got)
    return got


def run(pipeline: Pipeline, dp: int, steps: int, state: Any = None, **kw: Any) -> list[Any]:
    return list(simulate(pipeline, dp, steps, num_workers=0, resume_state=state, **kw))


def segment(
    pipeline: Pipeline,
    state: dict[str, Any] | None,
    step: int,
    steps: int,
    dp_pick: int,
    delivered: Counter,
) -> dict[str, Any] | None:
    """Run ``steps`` steps from ``state`` (after ``step``) at the dp size ``dp_pick`` picks;
    add the pairs delivered; return the state saved after them (None: the data ended)."""
    dps = divisors(pipeline.num_lanes)
    saved: list[dict[str, Any]] = []
    batches = run(
        pipeline,
        dps[dp_pick % len(dps)],
        steps,
        state,
        save_at=step + steps,
        on_save=saved.append,
        keep_batches=True,
    )
    for _, mbs in batches:
        for mb in mbs:
            _pairs(mb, delivered)
    return saved[0] if saved else None


def corpus_pairs(texts: list[str]) -> Counter:
    """Every (input, label) pair the documents hold, from first principles (bos/eos added)."""
    out: Counter = Counter()
    for t in texts:
        ids = [1] + [b + 3 for b in t.encode("utf-8")] + [2]
        out.update(itertools.pairwise(ids))
    return out


@settings(max_examples=30)
@given(case=relane_cases(), data=st.data())
def test_relane_keeps_every_document_once_and_is_elastic(
    case: dict[str, Any], data: st.DataObject
) -> None:
    """Delivered before + everything after a re-lane == without one; then dp-independent."""
    recipe, L2 = case["recipe"], case["L2"]
    pipeline = Pipeline(recipe)
    total = len(run(pipeline, 1, 1000))  # the finite stream's steps
    if total == 0:
        return
    case["save"] = data.draw(st.integers(1, total), label="save")
    saved: list[dict[str, Any]] = []
    before = run(pipeline, case["dp_old"], case["save"], save_at=case["save"], on_save=saved.append)
    REACHED.append(case["save"])
    state = saved[0]
    new = relane_state(pipeline, state, L2)
    assert new["num_lanes"] == L2 and new["step"] == case["save"]
    assert new["lineage"]["num_lanes"] == recipe.num_lanes
    assert new["lineage"]["lanes"] == [state["lanes"][str(i)] for i in range(recipe.num_lanes)]
    pipeline2 = Pipeline(recipe.replace(num_lanes=L2))
    with WorkerPool(2, "thread") as pool:
        # (a) What the old lanes still held is exactly what the new lanes hold.
        assert drain(pipeline2, new, pool) == drain(pipeline, state, pool)
        if len(recipe.datasets) == 1:
            delivered: Counter = Counter()
            for _, mbs in run(pipeline, 1, case["save"], keep_batches=True):
                for mb in mbs:
                    _pairs(mb, delivered)
            total = delivered + drain(pipeline2, new, pool)
            texts = [r["text"] for r in recipe.datasets[0].records]
            assert total == corpus_pairs(texts)  # bos and eos once per document, nothing lost
    # (b) After the change: the same global batches at every dp size dividing L'.
    steps = case["after"] + 2
    first = [r.digest for r, _ in run(pipeline2, case["dps"][0], steps, new)]
    for dp in case["dps"][1:]:
        assert [r.digest for r, _ in run(pipeline2, dp, steps, new)] == first
    if len(first) > case["after"]:
        # ... and across a later restart at another dp size.
        mid: list[dict[str, Any]] = []
        at = case["save"] + case["after"]
        run(pipeline2, case["dps"][0], case["after"], new, save_at=at, on_save=mid.append)
        rest = steps - case["after"]
        again = [r.digest for r, _ in run(pipeline2, case["dps"][-1], rest, mid[0])]
        assert again == first[case["after"] :]
    assert before  # the save point was reached


@st.composite
def change_chains(
    draw: st.DrawFn, deals: tuple[str, ...], kinds: tuple[str, ...], fewest: int
) -> dict[str, Any]:
    """A finite one-dataset recipe long enough for a chain of ``fewest``-4 changes, and the
    chain: ``(steps before the change, dp of the segment, change)``, the last change None;
    a change is ``("relane", lanes)`` or ``("seq_len", n)``, of the ``kinds`` given."""
    G = draw(st.sampled_from([4, 6, 8, 12, 24]))
    lanes = [d for d in divisors(G) if d <= 8]
    n = draw(st.integers(100, 250))
    recipe = Recipe(
        datasets=(
            DatasetSpec("a", records=tuple({"text": t} for t in _texts(draw, ALPHABETS[0], n))),
        ),
        tokenizer=TokenizerSpec(kind="bytes", add_bos=True, add_eos=True),
        seed=draw(st.integers(0, 2**32)),
        num_lanes=draw(st.sampled_from(lanes)),
        global_batch_size=G,
        seq_len=draw(st.integers(8, 40)),
        flush_every=draw(st.integers(1, 4)),
        work=WorkSpec(
            chunk_size=draw(st.integers(1, 3)), epochs=1, deal=draw(st.sampled_from(deals))
        ),
        shuffle=ShuffleSpec(draw(st.sampled_from([0, 1, 4]))),
        pack=PackSpec(
            mode=draw(st.sampled_from(["concat", "bestfit"])), bins=draw(st.sampled_from([1, 4]))
        ),
    )
    changes = [("relane", n) for n in lanes] if "relane" in kinds else []
    changes += [("seq_len", s) for s in (8, 16, 24, 33)] if "seq_len" in kinds else []
    k = draw(st.integers(fewest, 4), label="changes")
    return {
        "recipe": recipe,
        "chain": [
            (
                draw(st.integers(1, 3)),
                draw(st.integers(0, 7)),
                draw(st.sampled_from(changes)) if i < k else None,
            )
            for i in range(k + 1)
        ],
    }


@settings(max_examples=12)
@given(case=change_chains(("balanced", "round_robin"), ("relane",), 2))
def test_chains_of_relanes_lose_nothing(case: dict[str, Any]) -> None:
    """Re-laned 2-4 times at random steps and dp sizes: delivered + what the lanes still hold
    at the end is exactly the corpus (bos and eos once per document): no document lost or
    repeated by a chain (issue 32: some third re-lanes repeated documents)."""
    recipe = case["recipe"]
    pipeline, state, step = Pipeline(recipe), None, 0
    delivered: Counter = Counter()
    for steps, dp_pick, change in case["chain"]:
        state = segment(pipeline, state, step, steps, dp_pick, delivered)
        assume(state is not None)  # the data lasted to the change
        assert state is not None
        step += steps
        if change is not None:
            state = relane_state(pipeline, state, change[1])
            pipeline = Pipeline(recipe.replace(num_lanes=change[1]))
    with WorkerPool(2, "thread") as pool:
        rest = drain(pipeline, state, pool)
    texts = [r["text"] for r in recipe.datasets[0].records]
    assert delivered + rest == corpus_pairs(texts)


def _recipe(num_lanes: int = 4, **kw: Any) -> Recipe:
    texts = [("abc " * (k % 9)) + str(k) for k in range(120)]
    args: dict[str, Any] = {
        "datasets": (DatasetSpec("a", records=tuple({"text": t} for t in texts)),),
        "tokenizer": TokenizerSpec(kind="bytes", add_bos=True, add_eos=True),
        "seed": 11,
        "num_lanes": num_lanes,
        "global_batch_size": 12,
        "seq_len": 16,
        "flush_every": 2,
        "work": WorkSpec(chunk_size=2, epochs=None),
        "shuffle": ShuffleSpec(3),
    }
    args.update(kw)
    return Recipe(**args)


def _saved(pipeline: Pipeline, dp: int, step: int, state: Any = None) -> dict[str, Any]:
    out: list[dict[str, Any]] = []
    first = state["step"] if state else 0
    run(pipeline, dp, step - first, state, save_at=step, on_save=out.append)
    return out[0]


class TestRelaneTwice:
    def test_nested_lineage_resumes_at_every_dp(self) -> None:
        p4, p6, p3 = (Pipeline(_recipe(n)) for n in (4, 6, 3))
        s4 = _saved(p4, 2, 3)
        s6 = relane_state(p4, s4, 6)
        s6b = _saved(p6, 3, 5, s6)
        assert s6b["lineage"] == s6["lineage"]
        s3 = relane_state(p6, s6b, 3)
        assert s3["lineage"]["parent"] == s6["lineage"] and s3["lineage"]["num_lanes"] == 6
        digests = {dp: [r.digest for r, _ in run(p3, dp, 3, s3)] for dp in (1, 3)}
        assert digests[1] == digests[3] and len(digests[1]) == 3
        # The re-lane tool accepts the recipe at either lane count.
        assert relane_state(p3, s6b, 3) == s3


class TestRefusals:
    def test_new_lane_count_must_divide_the_global_batch(self) -> None:
        p = Pipeline(_recipe())
        with pytest.raises(RecipeError, match=r"num_lanes=5: global_batch_size=12 must be"):
            relane_state(p, _saved(p, 1, 2), 5)

    def test_recipe_changed_in_more_than_num_lanes(self) -> None:
        p = Pipeline(_recipe())
        state = _saved(p, 1, 2)
        with pytest.raises(CheckpointError, match="seq_len: checkpoint has 16, recipe has 32"):
            relane_state(Pipeline(_recipe(seq_len=32)), state, 6)
        new = relane_state(p, state, 6)
        other = Pipeline(_recipe(6, seq_len=32))
        with pytest.raises(CheckpointError, match="seq_len: checkpoint has 16, recipe has 32"):
            run(other, 1, 1, new)

    def test_lineage_must_match(self) -> None:
        p = Pipeline(_recipe())
        new = relane_state(p, _saved(p, 1, 2), 6)
        p6 = Pipeline(_recipe(6))
        # A lineage whose old recipe is another one is refused.
        forged = dict(new, lineage=dict(new["lineage"], fingerprint="0" * 64))
        with pytest.raises(CheckpointError, match="lineage does not match this recipe"):
            run(p6, 1, 1, forged)

    def test_any_node_of_the_run_reads_the_state_s_own_streams(self) -> None:
        """A node's timeline picks the streams of the state it resumes (issue 32): a plain
        node resumes a re-laned state, a node built for one lineage another lineage's state,
        each giving the batches of the pipeline built for that state."""
        p = Pipeline(_recipe())
        new = relane_state(p, _saved(p, 1, 2), 6)
        other = relane_state(p, _saved(p, 1, 3), 6)
        p6 = Pipeline(_recipe(6))

        def digests(node: Any, state: Any) -> list[str]:
            node.reset(dict(state))
            out = [digest_microbatches([next(node)]) for _ in range(3)]
            node.close()
            return out

        for built_for, state in ((p6, new), (for_state(p6, new), other)):
            expected = digests(for_state(p6, state).rank_node(), state)
            assert digests(built_for.rank_node(), state) == expected
        assert digests(p6.rank_node(), new) != digests(p6.rank_node(), other)

    def test_positions_beyond_the_relaned_streams(self) -> None:
        recipe = _recipe(work=WorkSpec(chunk_size=4, epochs=1))
        p = Pipeline(recipe)
        new = relane_state(p, _saved(p, 1, 2), 6)
        p6 = Pipeline(recipe.replace(num_lanes=6))
        bad = dict(new, lanes=dict(new["lanes"], **{"5": [999, 1]}))
        with pytest.raises(CheckpointError, match="lane 5: window 999 is beyond the end"):
            run(p6, 1, 1, bad)
        forged = dict(new, lineage=dict(new["lineage"], lanes=[[0, 10**6]] * 4))
        with pytest.raises(CheckpointError, match="1000000 samples of window 0 were consumed"):
            run(p6, 1, 1, forged)

    def test_mid_step_state_and_set_mixture_after_a_relane(self) -> None:
        p = Pipeline(_recipe())
        node = p.rank_node(local_batch_size=3)
        node.reset(None)
        next(node)
        with pytest.raises(CheckpointError, match="middle of a step"):
            relane_state(p, node.get_state(), 6)
        mixed = _recipe(
            datasets=(
                DatasetSpec("a", records=tuple({"text": "abc" * k} for k in range(1, 40))),
                DatasetSpec("b", records=tuple({"text": "xy" * k} for k in range(1, 40))),
            )
        )
        pm = Pipeline(mixed)
        new = relane_state(pm, _saved(pm, 1, 2), 6)
        node = for_state(Pipeline(mixed.replace(num_lanes=6)), new).rank_node()
        node.reset(new)
        with pytest.raises(RecipeError, match="set_mixture is not supported after a re-lane"):
            node.set_mixture({"a": 1, "b": 1})


def test_decisions_before_a_relane_keep_their_effect() -> None:
    """A dynamic-mixture decision made before the re-lane still shapes the untouched items."""
    mixed = _recipe(
        datasets=(
            DatasetSpec("a", records=tuple({"text": "abc" * k} for k in range(1, 60))),
            DatasetSpec("b", records=tuple({"text": "xyz" * k} for k in range(1, 60))),
        ),
        work=WorkSpec(chunk_size=2, epochs=1),
    )
    p = Pipeline(mixed)
    saved: list[dict[str, Any]] = []
    run(p, 2, 3, mixture_updates=[(1, {"a": 0.1, "b": 0.9})], save_at=3, on_save=saved.append)
    state = saved[0]
    assert state["mixture"]["log"]
    new = relane_state(p, state, 3)
    assert new["lineage"]["mixture"] == state["mixture"] and "mixture" not in new
    p3 = Pipeline(mixed.replace(num_lanes=3))
    with WorkerPool(2, "thread") as pool:
        assert drain(p3, new, pool) == drain(p, state, pool)
    assert merge_states([new]) == new


def test_balanced_dealing_of_jsonl_shards(tmp_path: Any) -> None:
    """Size-balanced dealing (lanes of different lengths): the remaining work is kept."""
    import json

    with open(tmp_path / "data.jsonl", "w", encoding="utf-8") as f:
        for k in range(150):
            f.write(json.dumps({"text": "word " * (k * 7 % 23) + str(k)}) + "\n")
    recipe = _recipe(
        datasets=(DatasetSpec("a", paths=(str(tmp_path / "data.jsonl"),)),),
        work=WorkSpec(chunk_size=3, epochs=1, deal="balanced"),
    )
    p = Pipeline(recipe)
    state = _saved(p, 2, 2)
    for lanes in (2, 6):
        new = relane_state(p, state, lanes)
        with WorkerPool(2, "thread") as pool:
            assert drain(Pipeline(recipe.replace(num_lanes=lanes)), new, pool) == drain(
                p, state, pool
            )


def test_relane_in_a_later_pass_and_twice() -> None:
    """A re-laned stream's next pass is the recipe's; re-laning it again keeps the work."""
    recipe = _recipe(work=WorkSpec(chunk_size=4, epochs=1))
    p4, p6, p3 = (Pipeline(recipe.replace(num_lanes=n)) for n in (4, 6, 3))
    node = p4.rank_node(lanes=[0, 1, 2, 3])
    node.reset(None)
    for _ in range(2):
        next(node)
    s6 = relane_state(p4, node.get_state(), 6)
    node6 = for_state(p6, s6).rank_node(lanes=list(range(6)))
    node6.reset(s6)
    for _ in node6:  # to the end of the re-laned pass
        pass
    node6.reset(None)  # the next pass
    for _ in range(2):
        next(node6)
    s6b = node6.get_state()
    assert s6b["pass"] == 1 and s6b["lineage"] == s6["lineage"]
    s3 = relane_state(p6, s6b, 3)
    assert s3["lineage"]["pass"] == 1 and s3["lineage"]["parent"] == s6["lineage"]
    with WorkerPool(2, "thread") as pool:
        assert drain(p3, s3, pool) == drain(p6, s6b, pool)
    a = [r.digest for r, _ in run(p3, 1, 2, s3)]
    assert a == [r.digest for r, _ in run(p3, 3, 2, s3)] and len(a) == 2


def test_loader_state_replay_of_a_relaned_rank() -> None:
    """rank_state replays a re-laned rank's lanes (the pipeline is re-laned for it)."""
    from zephon_nodes.engine.loader_state import rank_state

    p = Pipeline(_recipe())
    new = relane_state(p, _saved(p, 1, 2), 6)
    p6 = Pipeline(_recipe(6))
    node = for_state(p6, new).rank_node(2, 1)
    node.reset(new)
    start = node.get_state()
    for _ in range(node.micro_per_step * 2):
        next(node)
    # The plain pipeline is enough: rank_state builds the re-laned streams itself.
    assert rank_state(start, p6, step=start["step"] + 2) == node.get_state()


SKEWED = [f"d{i} " + "word " * ((i * 37) % 120) for i in range(240)]


def _lane_tokens(pipeline: Pipeline, state: dict[str, Any], pool: WorkerPool) -> list[int]:
    """Label tokens (not padding) each lane still holds at ``state``, counted on its output."""
    p = for_state(pipeline, state)
    node = p.rank_node(lanes=list(range(p.num_lanes)), pool=pool)
    node.reset(state)
    return [
        sum(int((s["labels"] != IGNORE_INDEX).sum()) for s in lane) for lane in node.lanes.values()
    ]


def test_relane_of_a_balanced_stream_keeps_the_lanes_balanced() -> None:
    """Dealt by tokens before a re-lane, the new lanes hold tokens within a quarter item.

    The tolerance comes from the documents alone: work items of 4 records, each record's
    bytes + bos + eos giving ``len + 1`` input/label pairs; a quarter of the largest item.
    Dealing the untouched items by count (as for round-robin streams) misses it by ~4x.
    """
    recipe = Recipe(
        datasets=(DatasetSpec("s", records=tuple({"text": t} for t in SKEWED)),),
        tokenizer=TokenizerSpec(kind="bytes", add_bos=True, add_eos=True),
        seed=11,
        num_lanes=4,
        global_batch_size=12,
        seq_len=32,
        flush_every=2,
        work=WorkSpec(chunk_size=4, epochs=1),
    )
    items = [sum(len(t.encode()) + 1 for t in SKEWED[k : k + 4]) for k in range(0, 240, 4)]
    tolerance = max(items) // 4  # 413 tokens, of ~12,000 per lane at 6 lanes
    p4 = Pipeline(recipe)
    state = _saved(p4, 2, 3)
    with WorkerPool(0) as pool:
        remaining = sum(drain(p4, state, pool).values())
        for lanes in (6, 12):
            new = relane_state(p4, state, lanes)
            got = _lane_tokens(Pipeline(recipe.replace(num_lanes=lanes)), new, pool)
            assert sum(got) == remaining
            assert max(got) - min(got) <= tolerance, (lanes, got, tolerance)
        # A second re-lane (6 -> 4, some steps later) deals by the same sizes.
        p6 = Pipeline(recipe.replace(num_lanes=6))
        later = _saved(p6, 3, 8, relane_state(p4, state, 6))
        again = relane_state(p6, later, 4)
        got = _lane_tokens(p4, again, pool)
        assert sum(got) == sum(drain(p6, later, pool).values())
        assert max(got) - min(got) <= tolerance, (got, tolerance)
