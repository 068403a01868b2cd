"""RenderChat: token ids and trained masks equal transformers' apply_chat_template."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.chat.helpers import CHATML, CHATML_GENERATION, write_chat_tokenizer
from tests.strategies import conversations
from zephon_nodes import DataError, DatasetSpec, RecipeError, TokenizerSpec
from zephon_nodes.chat.assembly import chat_chain
from zephon_nodes.chat.template import ChatTemplate
from zephon_nodes.engine.work import WorkItem
from zephon_nodes.io.formats.shards import memory_shard
from zephon_nodes.operators.tokenize import load_tokenizer
from zephon_nodes.recipe import Recipe
from zephon_nodes.recipe.chat import ChatSpec

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("chatml")
    write_chat_tokenizer(folder)
    (folder / "chatml.jinja").write_text(CHATML, encoding="utf-8")
    (folder / "chatml_generation.jinja").write_text(CHATML_GENERATION, encoding="utf-8")
    return folder


@pytest.fixture(scope="module")
def oracle(tok_dir):
    return transformers.PreTrainedTokenizerFast(
        tokenizer_file=str(tok_dir / "tokenizer.json"),
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
    )


def render(records, tok_dir: Path, template: str | None, train_on="assistant", on_error="raise"):
    """Run a chat recipe's stateless chain on one work item holding ``records``."""
    recipe = Recipe(
        datasets=(DatasetSpec("c", records=tuple(records), on_error=on_error),),
        tokenizer=TokenizerSpec(kind="hf", path=tok_dir / "tokenizer.json"),
        num_lanes=1,
        global_batch_size=1,
        seq_len=64,
        chat=ChatSpec(
            template=tok_dir / template if template else None,
            train_on=train_on,
        ),
    )
    chain = chat_chain(recipe, load_tokenizer(recipe.tokenizer))
    shard = memory_shard("c", records)
    item = WorkItem(0, "c", "messages", 0, 0, shard, 0, len(records), 0, 0)
    return chain(item)


def expected(oracle, messages, train_on):
    out = oracle.apply_chat_template(
        messages,
        chat_template=CHATML_GENERATION,
        tokenize=True,
        return_dict=True,
        return_assistant_tokens_mask=True,
    )
    ids = list(out["input_ids"])
    mask = np.asarray(out["assistant_masks"], dtype=bool)
    if train_on == "all":
        mask[:] = True
    elif train_on == "last":
        # Keep the last assistant turn's run of ones only.
        ones = np.flatnonzero(mask)
        if len(ones):
            starts = [i for i in ones.tolist() if i == 0 or not mask[i - 1]]
            mask[: starts[-1]] = False
    return ids, mask.tolist()


class TestAgainstTransformers:
    """Ids and masks equal apply_chat_template(..., return_assistant_tokens_mask=True)."""

    @settings(max_examples=12)
    @given(
        convs=st.lists(conversations(), min_size=1, max_size=3),
        template=st.sampled_from([None, "chatml.jinja", "chatml_generation.jinja"]),
        train_on=st.sampled_from(["assistant", "last", "all"]),
    )
    def test_ids_and_masks(self, tok_dir, oracle, convs, template, train_on):
        batch = render([{"messages": c} for c in convs], tok_dir, template, train_on)
        masks = np.split(batch.mask, np.cumsum(batch.lengths)[:-1]) if len(batch.lengths) else []
        got = list(zip(batch.documents(), masks, strict=True))
        want = [expected(oracle, c, train_on) for c in convs]
        kept = [w for w in want if any(w[1])]
        assert [(d.tolist(), m.tolist()) for d, m in got] == kept
        assert dict(batch.skipped).get("no_trained_tokens", 0) == len(want) - len(kept)

    def test_rendered_text_matches(self, tok_dir, oracle):
        messages = [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": "Grüße 🙂"},
            {"role": "assistant", "content": "ça va"},
        ]
        template = ChatTemplate.load(tok_dir / "tokenizer_config.json")
        for prompt in (False, True):
            want = oracle.apply_chat_template(
                messages,
                chat_template=CHATML_GENERATION,
                tokenize=False,
                add_generation_prompt=prompt,
            )
            assert template.render(messages, prompt) == want


class TestHandChecked:
    """A fixture checked by hand: the byte tokenizer and a template file."""

    def test_byte_tokenizer_fixture(self, tmp_path):
        (tmp_path / "t.jinja").write_text(
            "{{ bos_token }}{% for m in messages %}{{ m.role[0] }}:{{ m.content }}"
            "{% if m.role == 'assistant' %}{{ eos_token }}{% endif %}{% endfor %}"
            "{% if add_generation_prompt %}a:{% endif %}"
        )
        records = [
            {
                "messages": [
                    {"role": "user", "content": "hi"},
                    {"role": "assistant", "content": "yo"},
                ]
            }
        ]
        recipe = Recipe(
            datasets=(DatasetSpec("c", records=tuple(records)),),
            tokenizer=TokenizerSpec(kind="bytes"),
            num_lanes=1,
            global_batch_size=1,
            seq_len=8,
            chat=ChatSpec(template=tmp_path / "t.jinja", bos_token="<s>", eos_token="</s>"),
        )
        chain = chat_chain(recipe, load_tokenizer(recipe.tokenizer))
        item = WorkItem(0, "c", "messages", 0, 0, memory_shard("c", records), 0, 1, 0, 0)
        batch = chain(item)
        # "<s>u:hia:yo</s>": <s> is bos (1), </s> eos (2), other bytes + 3.
        b = lambda s: [c + 3 for c in s.encode()]  # noqa: E731
        assert batch.tokens.tolist() == [1, *b("u:hia:yo"), 2]
        # Trained: "yo</s>" (after the "a:" prefix the prompt would add).
        assert batch.mask.astype(int).tolist() == [0, 0, 0, 0, 0, 0, 0, 1, 1, 1]


class TestBadConversations:
    """Unknown role, missing content, a failing template: clear error, or skipped and counted."""

    @pytest.mark.parametrize(
        ("record", "reason", "message"),
        [
            ({"messages": [{"role": "robot", "content": "x"}]}, "unknown_role", "role 'robot'"),
            ({"messages": [{"role": "user"}]}, "missing_content", "message 0 \\(user\\) has no"),
            ({"messages": [{"role": "user", "content": 3}]}, "non_string_content", "string"),
            ({"messages": []}, "not_a_conversation", "non-empty list"),
            ({"text": "hello"}, "missing_field", "missing messages field 'messages'"),
            (
                {"messages": [{"role": "user", "content": "FAIL"}]},
                "template_error",
                "chat template .*fail.jinja: TemplateError: no FAIL here",
            ),
        ],
    )
    def test_error_or_skip(self, tok_dir, record, reason, message):
        (tok_dir / "fail.jinja").write_text(
            "{% for m in messages %}{% if m.content == 'FAIL' %}"
            "{{ raise_exception('no FAIL here') }}{% endif %}{{ m.content }}{% endfor %}"
        )
        good = {
            "messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]
        }
        with pytest.raises(DataError, match=rf"dataset 'c': <memory:c> record 1: .*{message}"):
            render([good, record], tok_dir, "fail.jinja")
        batch = render([good, record, good], tok_dir, "fail.jinja", on_error="skip")
        assert dict(batch.skipped) == {reason: 1}
        assert len(batch.lengths) == 2

    def test_not_prefix_stable_template(self, tok_dir):
        # Renders the last message differently: the prefix method cannot locate the turns.
        (tok_dir / "unstable.jinja").write_text(
            "{% for m in messages %}{% if loop.last %}[{{ m.content }}]"
            "{% else %}{{ m.content }};{% endif %}{% endfor %}"
        )
        record = {
            "messages": [
                {"role": "user", "content": "a"},
                {"role": "assistant", "content": "b"},
                {"role": "user", "content": "c"},
            ]
        }
        with pytest.raises(DataError, match=r"not prefix-stable at message 1.*generation"):
            render([record], tok_dir, "unstable.jinja")

    def test_template_that_does_not_compile(self, tok_dir):
        (tok_dir / "broken.jinja").write_text("{% for m in messages %}")
        with pytest.raises(RecipeError, match=r"broken\.jinja: the chat template does not compile"):
            render([{"messages": [{"role": "user", "content": "a"}]}], tok_dir, "broken.jinja")

    def test_no_template_in_config(self, tmp_path):
        (tmp_path / "tokenizer_config.json").write_text('{"bos_token": "<s>"}')
        with pytest.raises(RecipeError, match="no `chat_template` string"):
            ChatTemplate.load(tmp_path / "tokenizer_config.json")

    def test_sandbox_refuses_python_internals(self, tok_dir):
        (tok_dir / "evil.jinja").write_text("{{ messages.__class__.__mro__ }}")
        record = {"messages": [{"role": "assistant", "content": "a"}]}
        batch = render([record], tok_dir, "evil.jinja", on_error="skip")
        assert dict(batch.skipped) == {"template_error": 1}


def test_sentencepiece_recipe_names_a_template_file(tmp_path):
    """A sentencepiece tokenizer: bos/eos texts become their ids, the mask covers the answer."""
    import sentencepiece as spm

    with open(tmp_path / "tok.model", "wb") as f:
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(["[U] hello there [A] answer Grüße"] * 50),
            model_writer=f,
            vocab_size=40,
            model_type="bpe",
            minloglevel=2,
        )
    (tmp_path / "t.jinja").write_text(
        "{% for m in messages %}{% if m.role == 'user' %}{{ bos_token }}[U] {{ m.content }} "
        "{% else %}[A] {{ m.content }}{{ eos_token }}{% endif %}{% endfor %}"
        "{% if add_generation_prompt %}[A] {% endif %}"
    )
    records = [
        {
            "messages": [
                {"role": "user", "content": "hello there"},
                {"role": "assistant", "content": "Grüße answer"},
            ]
        }
    ]
    recipe = Recipe(
        datasets=(DatasetSpec("c", records=tuple(records)),),
        tokenizer=TokenizerSpec(kind="sentencepiece", path=tmp_path / "tok.model"),
        num_lanes=1,
        global_batch_size=1,
        seq_len=8,
        chat=ChatSpec(template=tmp_path / "t.jinja"),
    )
    tok = load_tokenizer(recipe.tokenizer)
    batch = chat_chain(recipe, tok)(
        WorkItem(0, "c", "messages", 0, 0, memory_shard("c", records), 0, 1, 0, 0)
    )
    ids = batch.tokens.tolist()
    # "<s>" and "</s>" (the model's own pieces) are its bos and eos ids, not their letters.
    assert ids[0] == tok.bos_id and ids[-1] == tok.eos_id
    assert ids.count(tok.bos_id) == 1 and ids.count(tok.eos_id) == 1
    trained = [i for i, m in zip(ids, batch.mask.tolist(), strict=True) if m]
    assert trained[-1] == tok.eos_id
    assert tok.sp.decode(trained[:-1]) == "Grüße answer"
    assert tok.sp.decode(ids[1:-1]) == "[U] hello there [A] Grüße answer"


class CharTokenizer:
    """A custom tokenizer: one id per character (its code point), with offsets."""

    bos_id, eos_id, pad_id, vocab_size = 1, 2, 0, 1 << 21

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [[ord(c) for c in t] for t in texts]

    def encode_with_offsets(self, text: str):
        return [ord(c) for c in text], [(i, i + 1) for i in range(len(text))]


class NoOffsets:
    """A custom tokenizer without character offsets."""

    bos_id, eos_id, pad_id, vocab_size = 1, 2, 0, 1 << 21

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [[ord(c) for c in t] for t in texts]


def test_custom_tokenizer_needs_offsets(tmp_path):
    from zephon_nodes.recipe.registry import register_tokenizer

    (tmp_path / "t.jinja").write_text(
        "{% for m in messages %}{{ m.role }}:{{ m.content }};{% endfor %}"
        "{% if add_generation_prompt %}assistant:{% endif %}"
    )
    records = [
        {"messages": [{"role": "user", "content": "é"}, {"role": "assistant", "content": "ok"}]}
    ]

    def recipe(name: str) -> Recipe:
        return Recipe(
            datasets=(DatasetSpec("c", records=tuple(records)),),
            tokenizer=TokenizerSpec(kind="custom", name=name),
            num_lanes=1,
            global_batch_size=1,
            seq_len=8,
            chat=ChatSpec(template=tmp_path / "t.jinja"),
        )

    register_tokenizer("chars-with-offsets", CharTokenizer())
    r = recipe("chars-with-offsets")
    batch = chat_chain(r, load_tokenizer(r.tokenizer))(
        WorkItem(0, "c", "messages", 0, 0, memory_shard("c", records), 0, 1, 0, 0)
    )
    text = "user:é;assistant:ok;"
    assert batch.tokens.tolist() == [ord(c) for c in text]
    assert "".join(c for c, m in zip(text, batch.mask.tolist(), strict=True) if m) == "ok;"
    register_tokenizer("chars-no-offsets", NoOffsets())
    r = recipe("chars-no-offsets")
    with pytest.raises(RecipeError, match=r"'chars-no-offsets' \(NoOffsets\) cannot be used"):
        chat_chain(r, load_tokenizer(r.tokenizer))
