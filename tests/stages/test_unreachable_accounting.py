"""What a change reports unreachable against what the run then never reads.

``zephon amend`` and ``zephon relane`` report, for finite data, the work items past the end of
the shortest lane (:func:`zephon_nodes.engine.timeline.unreachable`): per lane, the items from
the start of its current flush window to its end; what exceeds the shortest lane's count. A
step takes samples from every lane, so the lanes run out in step with each other in
*samples*, not items: the count is exact only as far as every work item makes the same number
of samples. Here every document has the same length and every work item the same number of
documents, over chains of re-lanes and ``seq_len`` amendments at random steps (one dataset,
or a two-dataset mixture): the changed run is run to the end of its data, recording which
work item each lane reads by the end of the last full step; what each lane had not read
then, beyond what the lane that ran out first had not (less than a step of its own: what the
end of the data leaves in every lane), is the report, to within the flush windows a lane was
part-way through (``K`` items per lane, at the change and at the end).

With documents of random length the report is an estimate: :func:`survey` (run by hand,
``python -m tests.stages.test_unreachable_accounting``) prints both counts per case.
"""

from __future__ import annotations

import contextlib
import io
import json
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from hypothesis import Phase, assume, example, given, settings
from hypothesis import strategies as st

from tests.core.test_relane import run
from tests.stages.test_drop_accounting import _held_and_reported
from tests.strategies import divisors
from zephon_nodes import (
    DatasetSpec,
    Pipeline,
    Recipe,
    ShuffleSpec,
    TokenizerSpec,
    WorkSpec,
)
from zephon_nodes.cli import main
from zephon_nodes.core.errors import RecipeError
from zephon_nodes.engine.lane import WorkItemNode
from zephon_nodes.engine.relane import pipeline_at, relane_state
from zephon_nodes.engine.relane.nodes import RelanedWorkItemNode
from zephon_nodes.engine.stages import amend_state
from zephon_nodes.engine.timeline import unreachable
from zephon_nodes.engine.work import WorkItem
from zephon_nodes.recipe import MixtureSpec, PackSpec
from zephon_nodes.state.files import save_state
from zephon_nodes.state.schema import LANES_KEY
from zephon_nodes.verification.simulate import simulate

OUTCOMES: Counter[str] = Counter()


@contextlib.contextmanager
def reads() -> Iterator[dict[int, set[tuple[str, int]]]]:
    """Record, per lane, the ``(dataset, work item)`` every lane node hands on while open."""
    seen: dict[int, set[tuple[str, int]]] = {}
    originals = {cls: cls.next for cls in (WorkItemNode, RelanedWorkItemNode)}

    def recording(cls: type[WorkItemNode]) -> Any:
        def next_(self: Any) -> Any:
            out = originals[cls](self)
            if isinstance(out, WorkItem):
                seen.setdefault(self.lane, set()).add((out.dataset_name, out.item))
            return out

        return next_

    try:
        for cls in originals:
            cls.next = recording(cls)  # type: ignore[method-assign]
        yield seen
    finally:
        for cls, original in originals.items():
            cls.next = original  # type: ignore[method-assign]


def _recipe(draw: st.DrawFn, uniform: bool) -> Recipe:
    G = draw(st.sampled_from([4, 6, 8, 12, 24]))
    chunk = draw(st.integers(1, 3))
    size = draw(st.integers(0, 60))

    def records(alphabet: str) -> tuple[dict[str, str], ...]:
        n = chunk * draw(st.integers(60, 120))  # whole work items only
        if uniform:
            return tuple({"text": alphabet[0] * size} for _ in range(n))
        lengths = draw(st.lists(st.integers(0, 70), min_size=n, max_size=n))
        return tuple({"text": alphabet[0] * k} for k in lengths)

    datasets = [DatasetSpec("a", records=records("a"))]
    mixture = MixtureSpec()
    if draw(st.booleans()):
        datasets.append(DatasetSpec("b", records=records("b"), on_exhausted="end"))
        mixture = MixtureSpec(block=draw(st.sampled_from([4, 16])))
    return Recipe(
        datasets=tuple(datasets),
        tokenizer=TokenizerSpec(kind="bytes", add_bos=True, add_eos=True),
        seed=draw(st.integers(0, 2**32)),
        num_lanes=draw(st.sampled_from([d for d in divisors(G) if d <= 8])),
        global_batch_size=G,
        seq_len=draw(st.integers(8, 40)),
        flush_every=draw(st.integers(1, 4)),
        # An amendment continues round-robin streams only (amend_state).
        work=WorkSpec(chunk_size=chunk, epochs=1, deal="round_robin"),
        shuffle=ShuffleSpec(draw(st.sampled_from([0, 1, 4]))),
        pack=PackSpec(
            mode=draw(st.sampled_from(["concat", "bestfit"])), bins=draw(st.sampled_from([1, 4]))
        ),
        mixture=mixture,
    )


@st.composite
def chains(draw: st.DrawFn, uniform: bool = True) -> dict[str, Any]:
    """A finite recipe and a chain of 1-3 changes (re-lanes, seq_len amendments) at random steps."""
    recipe = _recipe(draw, uniform)
    lanes = [d for d in divisors(recipe.global_batch_size) if d <= 8]
    changes = [("relane", n) for n in lanes] + [("seq_len", s) for s in (8, 16, 24, 33)]
    k = draw(st.integers(1, 3))
    return {
        "recipe": recipe,
        "chain": [(draw(st.integers(1, 6)), draw(st.sampled_from(changes))) for _ in range(k)],
    }


def change(pipeline: Pipeline, state: dict[str, Any], kind: str, value: int) -> Any:
    """The changed state, its pipeline, and what the CLI reports for it (as the CLI does)."""
    if kind == "relane":
        new = relane_state(pipeline, state, value)
        left = unreachable(pipeline_at(pipeline, value), new)
        return new, Pipeline(pipeline.recipe.replace(num_lanes=value)), left
    after = Pipeline(pipeline.recipe.replace(seq_len=value))
    new = amend_state(pipeline, state, after)
    return new, after, unreachable(after, new)


def measure(case: dict[str, Any]) -> dict[str, Any] | None:
    """Run a case's chain, then its last segment to the end of the data.

    Returns the report at the last change and, from the run itself, per lane: the work items
    it reads from where it resumes to its own end (``stream``) and those of them it had not
    read by the end of the last full step; None when the data or a change ran out first.
    """
    pipeline, state, step = Pipeline(case["recipe"]), None, 0
    with reads() as before:
        for steps, (kind, value) in case["chain"]:
            saved: list[dict[str, Any]] = []
            run(pipeline, 1, steps, state, save_at=step + steps, on_save=saved.append)
            if not saved:
                return None
            state, step = saved[0], step + steps
            try:
                state, pipeline, left = change(pipeline, state, kind, value)
            except RecipeError as e:  # refused at the change (one line): not this case
                assert "\n" not in str(e)
                OUTCOMES[str(e)[:60]] += 1
                return None
    assert state is not None and left is not None
    K = pipeline.recipe.flush_every
    # Each lane's stream from where it resumes: every lane read to its own end, one by one.
    with reads() as held:
        _, dropped = _held_and_reported(pipeline, state)
    stream = {int(lane): held.get(int(lane), set()) for lane in state[LANES_KEY]}
    full: dict[int, set[tuple[str, int]]] = {}  # read by the end of the last full step
    with reads() as after:
        for _ in simulate(pipeline, 1, 10**6, num_workers=0, resume_state=state):
            full = {lane: set(items) for lane, items in after.items()}
    unread = {lane: items - full.get(lane, set()) for lane, items in stream.items()}
    read_before = set().union(*before.values())
    return {
        "left": left,
        "K": K,
        "stream": stream,
        "unread": unread,
        "after": after,
        "dropped": dropped,
        "read_before": read_before,
        "corpus": {
            (d.name, i)
            for d in case["recipe"].datasets
            for i in range(len(d.records) // case["recipe"].work.chunk_size)
        },
        "mixed": len(case["recipe"].datasets) > 1,
    }


def past_the_first_to_end(unread: dict[int, set[Any]]) -> int:
    """What the lanes never read beyond what the lane that ran out first left unread."""
    counts = [len(u) for u in unread.values()]
    return sum(counts) - min(counts) * len(counts)


#: One lane, K = 3, documents of one sample each, amended after step 1: the change's cut read
#: the window's next item (never read by the run) and dropped it, counted in its tokens.
CUT_READS_AHEAD = {
    "recipe": Recipe(
        datasets=(DatasetSpec("a", records=tuple({"text": "aaaaaaa"} for _ in range(60))),),
        tokenizer=TokenizerSpec(kind="bytes", add_bos=True, add_eos=True),
        seed=0,
        num_lanes=1,
        global_batch_size=4,
        seq_len=8,
        flush_every=3,
        work=WorkSpec(chunk_size=1, epochs=1, deal="round_robin"),
    ),
    "chain": [(1, ("seq_len", 8))],
}


@settings(max_examples=10)
@given(case=chains())
@example(case=CUT_READS_AHEAD)
def test_unreachable_items_are_those_the_run_never_reads(case: dict[str, Any]) -> None:
    got = measure(case)
    assume(got is not None)
    assert got is not None
    left, stream, after = got["left"], got["stream"], got["after"]
    L = len(stream)
    # The lanes read their own streams, nothing else, and the report counts those streams.
    for lane, items in after.items():
        assert items <= set(stream[lane]), f"lane {lane} read items outside its stream"
    assert left.remaining == sum(len(s) for s in stream.values())
    if not got["mixed"]:
        # From the corpus: every item is read before the change, or in a lane's stream after,
        # or dropped by a change that cut its flush window (and counted in its dropped tokens:
        # a document's input/label pairs are its bytes + 1, with bos and eos).
        held = set().union(*(set(s) for s in stream.values()))
        records, chunk = case["recipe"].datasets[0].records, case["recipe"].work.chunk_size
        missing = got["corpus"] - got["read_before"] - held
        pairs = sum(
            len(r["text"].encode()) + 1
            for _, i in missing
            for r in records[i * chunk : (i + 1) * chunk]
        )
        assert pairs <= got["dropped"], (sorted(missing), got["dropped"])
    truth = past_the_first_to_end(got["unread"])
    # Equal work items: lanes read items in step, to within the flush window each was part-way
    # through at the change and at the end (K items each, the lanes but the first to end).
    assert abs(left.items - truth) <= 2 * got["K"] * (L - 1), (left, truth, got["unread"])


def _to_files(recipe: Recipe, root: Path) -> Path:
    """The recipe as a TOML file over jsonl shards (what the CLI reads)."""
    lines = [
        f"seed = {recipe.seed}",
        f"num_lanes = {recipe.num_lanes}",
        f"global_batch_size = {recipe.global_batch_size}",
        f"seq_len = {recipe.seq_len}",
        f"flush_every = {recipe.flush_every}",
        '[tokenizer]\nkind = "bytes"\nadd_bos = true\nadd_eos = true',
        f'[work]\nchunk_size = {recipe.work.chunk_size}\nepochs = 1\ndeal = "round_robin"',
        f"[shuffle]\nbuffer_size = {recipe.shuffle.buffer_size}",
        f'[pack]\nmode = "{recipe.pack.mode}"\nbins = {recipe.pack.bins}',
    ]
    if len(recipe.datasets) > 1:
        lines.append(f"[mixture]\nblock = {recipe.mixture.block}")
    for d in recipe.datasets:
        shard = root / f"{d.name}.jsonl"
        shard.write_text("".join(json.dumps(dict(r)) + "\n" for r in d.records or ()))
        lines.append(
            f'[[datasets]]\nname = "{d.name}"\npaths = ["{shard}"]\n'
            f'on_exhausted = "{d.on_exhausted}"'
        )
    path = root / "recipe.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def _cli(argv: list[str]) -> tuple[str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        assert main(argv) == 0
    return out.getvalue(), err.getvalue()


@settings(max_examples=6)
@given(case=chains(uniform=False))
def test_the_cli_reports_the_count_and_warns_from_ten_percent(
    case: dict[str, Any], tmp_path_factory: Any
) -> None:
    """``zephon amend``/``zephon relane --json`` print the count, and the warning exactly when
    it is 10% or more of what the lanes hold (docs/changing-recipes.md), saying that it is an
    estimate in work items (it said "go unused" as a fact; see the module docstring)."""
    tmp = tmp_path_factory.mktemp("cli")
    old = _to_files(case["recipe"], tmp)
    p = Pipeline(Recipe.from_toml(old))
    steps, (kind, value) = case["chain"][0]
    saved: list[dict[str, Any]] = []
    run(p, 1, steps, None, save_at=steps, on_save=saved.append)
    assume(saved)
    try:
        _, _, left = change(p, saved[0], kind, value)
    except RecipeError:
        assume(False)
    ckpt = save_state(tmp / "ck", saved[0])
    if kind == "relane":
        args = ["relane", str(old), str(ckpt), "--num-lanes", str(value)]
    else:
        new = tmp / "new.toml"
        new.write_text(
            old.read_text().replace(f"seq_len = {p.recipe.seq_len}\n", f"seq_len = {value}\n")
        )
        args = ["amend", str(old), str(ckpt), str(new)]
    out, err = _cli([*args, "--output", str(tmp / "o"), "--json"])
    assert json.loads(out)["unreachable_work_items"] == left.items
    warned = "lie past the end of the shortest lane" in err
    if warned:  # counted in work items: the warning says what it counts and that it estimates
        assert "counted in work items" in err and "an estimate" in err, err
    if "get no untouched work item" not in err:  # a starved re-lane warns about that instead
        assert warned == (10 * left.items >= left.remaining), (left, err)
        OUTCOMES[f"cli {kind} warned={warned}"] += 1


def survey(n: int) -> None:  # pragma: no cover - run by hand
    """Print, for ``n`` cases of random-length documents (the same ``n`` on every run): the
    report, the count from the run, the items the lanes held, and both as shares."""

    @settings(
        database=None, deadline=None, derandomize=True, max_examples=n, phases=[Phase.generate]
    )
    @given(chains(uniform=False))
    def one(case: dict[str, Any]) -> None:
        got = measure(case)
        if got is None:
            return
        left = got["left"]
        truth = past_the_first_to_end(got["unread"])
        share = truth / left.remaining if left.remaining else 0.0
        print(left.items, truth, left.remaining, f"{left.share:.3f} {share:.3f}", flush=True)
        tally["cases"] += 1
        tally[
            "exact" if left.items == truth else "too low" if left.items < truth else "too high"
        ] += 1
        tally["warning on the other side"] += (left.share >= 0.1) != (share >= 0.1)

    tally: Counter[str] = Counter()
    print("reported  from-the-run  held  reported-share  run-share")
    one()
    print(", ".join(f"{k}: {v}" for k, v in tally.items()))


def test_an_amendment_that_leaves_30_percent_warns_and_says_it_estimates(tmp_path: Path) -> None:
    """4 lanes of 60 short documents amended after step 1, when the lanes' streams differ by
    whole flush windows: the warning says what it counts and that it is an estimate."""
    recipe = Recipe(
        datasets=(DatasetSpec("a", records=tuple({"text": "a" * (k % 7)} for k in range(60))),),
        tokenizer=TokenizerSpec(kind="bytes", add_bos=True, add_eos=True),
        num_lanes=4,
        global_batch_size=8,
        seq_len=16,
        flush_every=4,
        work=WorkSpec(chunk_size=1, epochs=1, deal="round_robin"),
    )
    old = _to_files(recipe, tmp_path)
    new = tmp_path / "new.toml"
    new.write_text(old.read_text().replace("seq_len = 16\n", "seq_len = 24\n"))
    saved: list[dict[str, Any]] = []
    run(Pipeline(Recipe.from_toml(old)), 1, 1, None, save_at=1, on_save=saved.append)
    ckpt = save_state(tmp_path / "ck", saved[0])
    _, err = _cli(["amend", str(old), str(ckpt), str(new), "--output", str(tmp_path / "o")])
    head = "warning: after the amendment after step 1, "
    assert err.startswith(head), err
    count, _, _, remaining = err[len(head) :].split()[:4]  # "N of the M remaining ..."
    assert 10 * int(count) >= int(remaining) > 0
    assert "counted in work items" in err and "an estimate" in err, err


if __name__ == "__main__":  # pragma: no cover
    survey(int(sys.argv[1]) if len(sys.argv) > 1 else 60)
