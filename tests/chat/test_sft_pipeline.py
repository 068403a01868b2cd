"""Chat recipes end to end: labels on trained turns, document ids, the elastic guarantee."""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.core.helpers import digests
from tests.strategies import conversations
from zephon_nodes import (
    DatasetSpec,
    PackSpec,
    Pipeline,
    Recipe,
    RecipeError,
    TokenizerSpec,
    WorkSpec,
    simulate,
)
from zephon_nodes.recipe.chat import ChatSpec

# A ChatML template for the byte tokenizer; `reference` below renders it by hand.
TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|im_start|>{{ m.role }}\n"
    "{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@pytest.fixture(scope="module")
def tpl(tmp_path_factory) -> Path:
    """A folder holding the template (module scope: Hypothesis tests reuse it)."""
    return tmp_path_factory.mktemp("chat")


def reference(messages: list[dict], train_on: str) -> tuple[list[int], list[bool]]:
    """Byte-tokenizer ids and trained flags of a conversation, computed without the library."""
    ids, trained = [1], [train_on == "all"]  # "<s>" is the byte tokenizer's bos (1)
    last = max((k for k, m in enumerate(messages) if m["role"] == "assistant"), default=-1)
    for k, m in enumerate(messages):
        head = f"<|im_start|>{m['role']}\n".encode()
        body = f"{m['content']}<|im_end|>\n".encode()
        on = train_on == "all" or (
            m["role"] == "assistant" and (train_on == "assistant" or k == last)
        )
        ids += [b + 3 for b in head] + [b + 3 for b in body]
        trained += [train_on == "all"] * len(head) + [on] * len(body)
    return ids, trained


def pairs(ids: list[int], trained: list[bool]) -> list[tuple[int, int]]:
    """(input, label) pairs of one document, -100 on untrained labels."""
    return [(ids[i], ids[i + 1] if trained[i + 1] else -100) for i in range(len(ids) - 1)]


def chat_recipe(tmp_path: Path, convs, mode="concat", train_on="assistant", **kw) -> Recipe:
    (tmp_path / "chat.jinja").write_text(TEMPLATE, encoding="utf-8")
    args = {
        "datasets": (DatasetSpec("chat", records=tuple({"messages": c} for c in convs)),),
        "tokenizer": TokenizerSpec(kind="bytes"),
        "seed": 3,
        "num_lanes": 4,
        "global_batch_size": 4,
        "seq_len": 96,
        "flush_every": 2,
        "work": WorkSpec(chunk_size=2),
        "pack": PackSpec(mode=mode, bins=4),
        "chat": ChatSpec(template=tmp_path / "chat.jinja", train_on=train_on, bos_token="<s>"),
    }
    args.update(kw)
    return Recipe(**args)


def segments(sample: dict) -> list[list[tuple[int, int]]]:
    """Split a sample's (input, label) pairs by document id (padding left out)."""
    doc = sample["document_ids"].tolist()
    inp, lab = sample["input"].tolist(), sample["labels"].tolist()
    out: dict[int, list[tuple[int, int]]] = {}
    for d, i, la in zip(doc, inp, lab, strict=True):
        if d >= 0:
            out.setdefault(d, []).append((i, la))
    assert list(out) == list(range(len(out)))  # ids 0, 1, ... in order
    return list(out.values())


def run_samples(pipeline: Pipeline, world: int, steps: int) -> list[dict]:
    rows = []
    for _, mbs in simulate(pipeline, world, steps, keep_batches=True):
        assert mbs is not None
        for mb in mbs:
            for r in range(mb["input"].shape[0]):
                rows.append({k: v[r].numpy() for k, v in mb.items()})
    return rows


def as_bytes(run: list[tuple[int, int]]) -> bytes:
    return np.asarray(run, dtype="<i8").reshape(-1).tobytes()


def with_answer(convs: list[list[dict]]) -> list[list[dict]]:
    """Each conversation ends with an assistant turn, so none is dropped as untrained."""
    return [[*c, {"role": "assistant", "content": "ok"}] for c in convs]


class TestSamples:
    """Samples hold the reference ids with labels only on trained tokens."""

    @settings(max_examples=8)
    @given(
        convs=st.lists(conversations(), min_size=4, max_size=14),
        train_on=st.sampled_from(["assistant", "last", "all"]),
    )
    def test_bestfit_documents_are_reference_conversations(self, tpl, convs, train_on):
        want = [pairs(*reference(c, train_on)) for c in convs]
        want = [w for w in want if any(label != -100 for _, label in w)]
        r = chat_recipe(tpl, convs, "bestfit", train_on, seq_len=4096, global_batch_size=4)
        got = [seg for s in run_samples(Pipeline(r), 2, 50) for seg in segments(s)]
        # Every document is one whole reference conversation, none repeated.
        left = Counter(tuple(w) for w in want)
        for seg in got:
            assert left[tuple(seg)] > 0
            left[tuple(seg)] -= 1

    @pytest.mark.parametrize("mode", ["concat", "bestfit"])
    @settings(max_examples=5)
    @given(convs=st.lists(conversations(), min_size=6, max_size=14).map(with_answer))
    def test_segments_are_runs_of_reference_conversations(self, tpl, mode, convs):
        """Long conversations continue (concat) or are split (best fit) with their labels."""
        want = [as_bytes(pairs(*reference(c, "assistant"))) for c in convs]
        r = chat_recipe(tpl, convs, mode, num_lanes=2, global_batch_size=2)
        rows = run_samples(Pipeline(r), 1, 50)
        assert rows
        for s in rows:
            pos = s["positions"].tolist()
            for k, seg in enumerate(segments(s)):
                assert any(as_bytes(seg) in w for w in want)
                if k > 0:  # a document that starts inside the sample starts at position 0
                    start = s["document_ids"].tolist().index(k)
                    assert pos[start] == 0

    def test_hand_checked_sample(self, tmp_path):
        convs = [[{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]]
        r = chat_recipe(
            tmp_path, convs * 4, "bestfit", num_lanes=1, global_batch_size=1, seq_len=140
        )
        (sample,) = run_samples(Pipeline(r), 1, 1)
        text = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nyo<|im_end|>\n"
        ids = [1] + [b + 3 for b in text.encode()]
        n = len(ids) - 1
        trained_from = len("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
        # Label i is token i + 1 of the text; trained from "yo" on.
        labels = [ids[i + 1] if i >= trained_from else -100 for i in range(n)]
        assert sample["input"][:n].tolist() == ids[:-1]
        assert sample["labels"][:n].tolist() == labels
        assert sample["document_ids"][: 2 * n].tolist() == [0] * n + [1] * n
        assert sample["positions"][: 2 * n].tolist() == list(range(n)) * 2


class TestGuarantee:
    """Identical global batches at any dp size, worker count and resume."""

    @pytest.mark.parametrize("mode", ["concat", "bestfit"])
    @settings(max_examples=5)
    @given(
        convs=st.lists(conversations(), min_size=10, max_size=24).map(with_answer),
        world=st.sampled_from([2, 4]),
        resume_world=st.sampled_from([1, 2, 4]),
        save_at=st.integers(1, 3),
    )
    def test_dp_sizes_workers_and_resume(self, tpl, convs, mode, world, resume_world, save_at):
        pipeline = Pipeline(chat_recipe(tpl, convs, mode))
        reference_run = digests(pipeline, 1, 8, num_workers=1)
        assert digests(pipeline, world, 8, num_workers=2) == reference_run
        saved: list[dict] = []
        head = [
            r.digest
            for r, _ in simulate(pipeline, world, save_at, save_at=save_at, on_save=saved.append)
        ]
        if len(head) < save_at:
            return  # the data ended before the save
        (state,) = saved
        state = json.loads(json.dumps(state))  # plain JSON data
        rest = len(reference_run) - save_at
        tail = [r.digest for r, _ in simulate(pipeline, resume_world, rest, resume_state=state)]
        assert head + tail == reference_run


class TestRecipe:
    """The [chat] table: keys, fingerprint, refusals."""

    def write(self, tmp_path: Path, chat: str, extra: str = "") -> Path:
        (tmp_path / "chat.jinja").write_text(TEMPLATE, encoding="utf-8")
        (tmp_path / "c.jsonl").write_text(
            json.dumps(
                {"conv": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]}
            )
            + "\n"
        )
        path = tmp_path / "r.toml"
        path.write_text(
            f"num_lanes = 1\nglobal_batch_size = 1\nseq_len = 8\n{extra}\n"
            f'[tokenizer]\nkind = "bytes"\n[[datasets]]\nname = "c"\npaths = ["c.jsonl"]\n'
            f"[chat]\n{chat}\n"
        )
        return path

    def test_toml_keys(self, tmp_path):
        r = Recipe.from_toml(
            self.write(
                tmp_path,
                'messages_field = "conv"\ntemplate = "chat.jinja"\n'
                'train_on = "last"\nroles = ["user", "assistant"]\n'
                'bos_token = "<s>"',
            )
        )
        assert r.chat == ChatSpec(
            "conv", tmp_path / "chat.jinja", "last", ("user", "assistant"), "<s>", None
        )
        p = Pipeline(r)
        item = p.work_source.work(0, 0)
        assert item is not None and p.stateless(item).mask is not None

    def test_fingerprint_follows_template_and_settings(self, tmp_path):
        path = self.write(tmp_path, 'messages_field = "conv"\ntemplate = "chat.jinja"')
        base = Recipe.from_toml(path).fingerprint()
        other = Recipe.from_toml(
            self.write(
                tmp_path, 'messages_field = "conv"\ntemplate = "chat.jinja"\ntrain_on = "all"'
            )
        )
        assert other.fingerprint() != base
        (tmp_path / "chat.jinja").write_text(TEMPLATE + " ", encoding="utf-8")
        assert Recipe.from_toml(path).fingerprint() != base

    @pytest.mark.parametrize(
        ("chat", "extra", "match"),
        [
            ('template = "chat.jinja"\ncolour = 1', "", r"chat: unknown key\(s\) \['colour'\]"),
            ('template = "chat.jinja"\ntrain_on = "some"', "", "train_on='some' must be one of"),
            ('template = "nope.jinja"', "", "chat template file not found"),
            ("", "", "chat.template is required"),
            ('template = "chat.jinja"\nroles = ["user"]', "", "lacks 'assistant'"),
        ],
    )
    def test_refused(self, tmp_path, chat, extra, match):
        with pytest.raises(RecipeError, match=match):
            Recipe.from_toml(self.write(tmp_path, chat, extra)).fingerprint()

    def test_chat_with_operators_is_refused(self, tmp_path):
        path = self.write(tmp_path, 'template = "chat.jinja"')
        path.write_text(path.read_text() + '[[operators]]\nfilter = "min_chars"\n')
        with pytest.raises(RecipeError, match=r"\[chat\] recipe cannot have"):
            Recipe.from_toml(path)


def test_arrow_and_jsonl_give_the_same_batches(tmp_path, monkeypatch):
    """Conversations saved with `datasets` (list of structs) read like jsonl ones."""
    datasets = pytest.importorskip("datasets")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    datasets.disable_progress_bars()
    convs = [
        [{"role": "user", "content": f"question {i}"}, {"role": "assistant", "content": "ok " * i}]
        for i in range(40)
    ]
    with open(tmp_path / "c.jsonl", "w") as f:
        f.writelines(json.dumps({"messages": c}) + "\n" for c in convs)
    datasets.Dataset.from_list([{"messages": c} for c in convs]).save_to_disk(str(tmp_path / "hf"))
    (tmp_path / "chat.jinja").write_text(TEMPLATE, encoding="utf-8")

    def recipe(pattern: str) -> Recipe:
        return chat_recipe(
            tmp_path, [], datasets=(DatasetSpec("chat", (pattern,), base_dir=tmp_path),)
        )

    want = digests(Pipeline(recipe("c.jsonl")), 1, 6)
    assert len(want) == 6
    assert digests(Pipeline(recipe("hf")), 2, 6) == want
    assert not np.array_equal(want, digests(Pipeline(recipe("c.jsonl").replace(seed=4)), 1, 6))


def test_process_runner_gives_the_same_batches(tpl):
    """The chat operator (template, tokenizer) travels to worker processes unchanged."""
    convs = with_answer([[{"role": "user", "content": f"q{i} " * (i % 9)}] for i in range(40)])
    pipeline = Pipeline(chat_recipe(tpl, convs, "bestfit"))
    want = digests(pipeline, 1, 6, num_workers=1)
    assert len(want) == 6
    assert digests(pipeline, 2, 6, num_workers=2, runner="process") == want


def test_stats_padding_is_padding_not_masked_turns(tpl):
    """``zephon stats`` counts padding positions only; untrained turns are not padding."""
    from zephon_nodes.commands.stats import compute_stats

    convs = with_answer([[{"role": "user", "content": "question " * (i % 5)}] for i in range(40)])
    convs[7][0]["role"] = "robot"
    r = chat_recipe(tpl, convs, "bestfit")
    r = r.replace(datasets=(dataclasses.replace(r.datasets[0], on_error="skip"),))
    rows = run_samples(Pipeline(r), 1, 5)
    pad = sum(int((s["document_ids"] < 0).sum()) for s in rows)
    cells = sum(s["document_ids"].size for s in rows)
    stats = compute_stats(r, 5)
    assert stats["padding_fraction"] == pad / cells
    assert stats["tokens"] == sum(int((s["labels"] != -100).sum()) for s in rows)
    assert stats["skipped_records"]["chat"] == {"unknown_role": 1}
    # Trained tokens are fewer than the non-padding tokens: prompts are input, not targets.
    assert stats["non_padding_tokens"] == cells - pad
    assert stats["tokens"] < stats["non_padding_tokens"]
