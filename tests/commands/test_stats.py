"""``zephon stats`` counts what the batches hold: checked against the corpus, not the library.

Each dataset writes its own letters (byte tokenizer, bos and eos once per document), so a
delivered (input, label) pair names its dataset, and a ``(bos, letter)`` pair is the start of
a document of that letter's dataset. Over static weights, decisions (``set_mixture``) and the
end of ``"end"`` datasets, at every dp size:

- ``tokens_per_dataset`` is the pairs of each dataset the batches delivered (decoded here
  from a run at another dp size, never from ``dataset_ids``);
- ``documents_per_dataset`` counts the documents of the work items the lanes read (whole
  flush windows): at least the documents whose start was delivered, at most that plus what
  one flush window per lane holds, and the same at every dp size;
- ``end_of_data`` (when the data ends) counts the samples: delivered plus unused is every
  sample the lanes made, and the unused ones hold exactly the pairs not delivered.
"""

from __future__ import annotations

import concurrent.futures as cf
import itertools
import os
from collections import Counter
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

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
from zephon_nodes.commands.stats import compute_stats
from zephon_nodes.operators.pack import IGNORE_INDEX

ALPHABETS = ("abcdefgh", "nopqrstu", "IJKLMNOP")
BOS, EOS = 1, 2
#: The dataset of each byte-tokenizer id of the alphabets (id = byte + 3).
OWNER = {ch + 3: k for k, a in enumerate(ALPHABETS) for ch in a.encode()}


def _text(k: int, record: int, pad: int) -> str:
    """Record ``record`` of dataset ``k``: its number in octal, in the dataset's letters."""
    a = ALPHABETS[k]
    return "".join(a[int(c)] for c in format(record, "o")) + a[0] * pad


def _recipe(sizes: tuple[int, ...], ends: tuple[str, ...], weights: tuple[float, ...]) -> Recipe:
    datasets = tuple(
        DatasetSpec(
            f"d{k}",
            records=tuple({"text": _text(k, r, (r * 7) % 13)} for r in range(n)),
            weight=w,
            on_exhausted=end,
        )
        for k, (n, end, w) in enumerate(zip(sizes, ends, weights, strict=True))
    )
    return Recipe(
        datasets=datasets,
        tokenizer=TokenizerSpec(kind="bytes", add_bos=True, add_eos=True),
        seed=3,
        num_lanes=4,
        global_batch_size=8,
        seq_len=16,
        flush_every=2,
        work=WorkSpec(chunk_size=2, epochs=1),
        shuffle=ShuffleSpec(2),
    )


def _decoded(
    recipe: Recipe, dp: int, steps: int, updates: list[tuple[int, dict[str, float]]]
) -> tuple[int, Counter, Counter]:
    """Steps, then per dataset the pairs and the document starts delivered."""
    pairs: Counter = Counter()
    starts: Counter = Counter()
    produced = 0
    for _, mbs in simulate(
        Pipeline(recipe), dp, steps, num_workers=0, keep_batches=True, mixture_updates=updates
    ):
        produced += 1
        for mb in mbs or []:
            inputs, labels = mb["input"].numpy(), mb["labels"].numpy()
            keep = labels != IGNORE_INDEX
            for i, lab in zip(inputs[keep].tolist(), labels[keep].tolist(), strict=True):
                k = OWNER[lab] if lab in OWNER else OWNER[i]
                pairs[f"d{k}"] += 1
                starts[f"d{k}"] += i == BOS
    return produced, pairs, starts


def _held(recipe: Recipe, state: dict[str, Any]) -> tuple[int, Counter]:
    """Samples and pairs the lanes still hold at ``state`` (drained to the end of the pass)."""
    p = Pipeline(recipe)
    held: Counter = Counter()
    samples = 0
    with WorkerPool(0, "thread") as pool:
        node = p.rank_node(lanes=list(range(p.num_lanes)), pool=pool)
        try:
            node.reset(state)
            for lane in node.lanes.values():
                for sample in lane:
                    samples += 1
                    keep = sample["labels"] != IGNORE_INDEX
                    held.update(
                        zip(
                            sample["input"][keep].tolist(),
                            sample["labels"][keep].tolist(),
                            strict=True,
                        )
                    )
        finally:
            node.close()
    return samples, held


@st.composite
def _cases(draw: st.DrawFn) -> dict[str, Any]:
    n = draw(st.integers(2, 3), label="datasets")
    sizes = tuple(draw(st.integers(8, 50), label=f"records {k}") for k in range(n))
    ends = tuple(draw(st.sampled_from(["end", "repeat"])) for _ in range(n))
    weights = tuple(draw(st.sampled_from([1.0, 2.0, 3.0])) for _ in range(n))
    updates = []
    for step in sorted(draw(st.sets(st.integers(1, 6), max_size=2), label="decision steps")):
        w = [draw(st.sampled_from([0.0, 1.0, 4.0])) for _ in range(n)]
        if not any(w):
            w[0] = 1.0
        updates.append((step, {f"d{k}": x for k, x in enumerate(w)}))
    return {
        "recipe": _recipe(sizes, ends, weights),
        "updates": updates,
        "steps": draw(st.integers(1, 10), label="steps"),
    }


def _docs_bound(recipe: Recipe) -> int:
    """The documents one flush window of every lane holds, at most."""
    return recipe.num_lanes * recipe.flush_every * recipe.work.chunk_size


@settings(max_examples=12)
@given(case=_cases())
def test_stats_counts_are_what_the_batches_hold(case: dict[str, Any]) -> None:
    recipe, updates, steps = case["recipe"], case["updates"], case["steps"]
    produced, pairs, starts = _decoded(recipe, 4, steps, updates)
    by_dp = []
    for dp in (1, 2):
        stats = compute_stats(recipe, steps, dp, 0, mixture_updates=updates)
        assert stats["steps"] == produced
        names = [d.name for d in recipe.datasets]
        assert stats["tokens_per_dataset"] == {n: pairs[n] for n in names}
        docs = stats["documents_per_dataset"]
        for n in names:
            assert starts[n] <= docs[n] <= starts[n] + _docs_bound(recipe), (n, docs, starts)
        by_dp.append({k: v for k, v in stats.items() if k != "dp_world_size"})
    assert by_dp[0] == by_dp[1], "zephon stats differs between dp sizes"


def test_documents_of_a_paused_dataset_stop_growing() -> None:
    """Found by the property: after a decision pausing ``d0`` (weight 0), ``zephon stats``
    counted documents over the recipe's static plan, not the items the lanes read: ``d0``
    went on gaining documents (80 of them over 12 steps, 8 delivered)."""
    recipe = _recipe((40, 60), ("repeat", "repeat"), (1.0, 1.0))
    updates = [(1, {"d0": 0.0, "d1": 1.0})]
    _, _, starts = _decoded(recipe, 1, 12, updates)
    stats = compute_stats(recipe, 12, 1, 0, mixture_updates=updates)
    docs = stats["documents_per_dataset"]
    for n in ("d0", "d1"):
        assert starts[n] <= docs[n] <= starts[n] + _docs_bound(recipe), (n, docs, starts)


def test_documents_at_the_end_of_data_do_not_depend_on_the_dp_size() -> None:
    """Found by the property: when the data ended, ``zephon stats`` counted documents over
    the lanes' positions after the step that could not be filled, where the ranks before
    the one that ran dry had already read on (d1: 28 documents at dp 1, 32 at dp 2)."""
    recipe = _recipe((40, 60), ("end", "end"), (1.0, 1.0))
    updates = [(1, {"d0": 0.0, "d1": 1.0})]
    got = [
        compute_stats(recipe, 12, dp, 0, mixture_updates=updates)["documents_per_dataset"]
        for dp in (1, 2, 4)
    ]
    assert got[0] == got[1] == got[2]


def _corpus(recipe: Recipe) -> Counter:
    """Every (input, label) pair of the recipe's documents, from first principles."""
    out: Counter = Counter()
    for d in recipe.datasets:
        for r in d.records:
            ids = [BOS] + [b + 3 for b in r["text"].encode()] + [EOS]
            out.update(itertools.pairwise(ids))
    return out


@settings(max_examples=12)
@given(case=_cases(), dp=st.sampled_from([1, 2, 4]))
def test_end_of_data_counts_every_sample_once(case: dict[str, Any], dp: int) -> None:
    """Run to the end of ``"end"`` data: the unused samples are those the lanes hold after
    the last full step, they hold only pairs never delivered, and with one dataset the
    delivered and unused pairs are the corpus."""
    sizes = tuple(len(d.records) for d in case["recipe"].datasets)
    n = 1 if case["steps"] % 3 == 0 else len(sizes)  # one dataset in a third of the cases
    recipe = _recipe(sizes[:n], ("end",) * n, (1.0,) * n)
    updates = [(s, {f"d{k}": w[f"d{k}"] for k in range(n)}) for s, w in case["updates"]]
    updates = [(s, w) for s, w in updates if any(w.values())] if n > 1 else []
    ended: dict[str, Any] = {}
    produced = 0
    delivered: Counter = Counter()
    for _, mbs in simulate(
        Pipeline(recipe),
        dp,
        1000,
        num_workers=0,
        keep_batches=True,
        mixture_updates=updates,
        on_end=ended.update,
    ):
        produced += 1
        for mb in mbs or []:
            keep = mb["labels"] != IGNORE_INDEX
            delivered.update(
                zip(mb["input"][keep].tolist(), mb["labels"][keep].tolist(), strict=True)
            )
    assert ended, "finite data ends"
    stats = compute_stats(recipe, 1000, 2, 0, mixture_updates=updates)
    end = stats["end_of_data"]
    assert end is not None and stats["steps"] == produced
    assert end["delivered_samples"] == produced * recipe.global_batch_size
    samples, held = _held(recipe, ended)
    assert end["unused_samples"] == samples
    want = _corpus(recipe)
    assert not delivered + held - want, "a pair delivered or held twice, or not in the corpus"
    if n == 1:
        assert delivered + held == want


def _paused_end_dataset() -> tuple[Recipe, list[tuple[int, dict[str, float]]]]:
    """Found by the property: ``d1`` ("end") paused after step 3, when one lane had already
    reached its end and the others never will (they read only the repeating ``d0``)."""
    recipe = _recipe((30, 26), ("repeat", "end"), (3.0, 3.0))
    return recipe, [(1, {"d0": 4.0, "d1": 4.0}), (3, {"d0": 1.0, "d1": 0.0})]


def _within(seconds: int, fn: Any) -> Any:
    """``fn()``, failing (not hanging) when it takes longer than ``seconds``."""
    with cf.ThreadPoolExecutor(1) as ex:
        future = ex.submit(fn)
        try:
            return future.result(timeout=seconds)
        except cf.TimeoutError:
            os._exit(3)  # the hung thread cannot be stopped: end the test process, red


def test_the_end_of_data_report_names_lanes_that_never_end() -> None:
    """The data ends where the first lane runs dry; counting what the others hold drained
    them without end (``zephon digest`` and ``zephon stats`` hung after the last step). A
    lane that never ends is named instead, and the counts are of the lanes that end."""
    recipe, updates = _paused_end_dataset()
    stats = _within(60, lambda: compute_stats(recipe, 100, 2, 0, mixture_updates=updates))
    end = stats["end_of_data"]
    assert stats["steps"] == 3
    ended: dict[str, Any] = {}
    for _ in simulate(
        Pipeline(recipe), 1, 100, num_workers=0, mixture_updates=updates, on_end=ended.update
    ):
        pass
    bound = 2000  # samples: far more than the corpus makes in one pass
    drained = {}
    with WorkerPool(0, "thread") as pool:
        node = Pipeline(recipe).rank_node(lanes=list(range(recipe.num_lanes)), pool=pool)
        try:
            node.reset(ended)
            for lane, it in node.lanes.items():
                drained[lane] = sum(1 for _ in itertools.islice(it, bound + 1))
        finally:
            node.close()
    endless = sorted(lane for lane, n in drained.items() if n > bound)
    assert endless and len(endless) < recipe.num_lanes  # the case: some lanes end, some not
    assert end["endless_lanes"] == endless
    counts = {lane: n for lane, n in drained.items() if n <= bound}
    assert end["unused_per_lane"] == {str(lane): n for lane, n in counts.items()}
    assert end["unused_samples"] == sum(counts.values())
