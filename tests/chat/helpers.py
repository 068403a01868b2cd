"""A small ChatML tokenizer (tokenizer.json + tokenizer_config.json) and its templates."""

from __future__ import annotations

import json
from pathlib import Path

# ChatML with generation blocks: the text transformers' return_assistant_tokens_mask trains.
CHATML_GENERATION = (
    "{{ bos_token }}{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' }}"
    "{% if message['role'] == 'assistant' %}{% generation %}"
    "{{ message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endgeneration %}{% else %}"
    "{{ message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
# The same template without generation blocks (found by rendering prefixes).
CHATML = CHATML_GENERATION.replace("{% generation %}", "").replace("{% endgeneration %}", "")
SPECIALS = ["<pad>", "<s>", "</s>", "<unk>", "<|im_start|>", "<|im_end|>"]
CORPUS = [
    "hello there, how are you today? I am fine: thank you very much.",
    "Grüße aus Köln — ça va? 日本語のテキスト 🙂 emoji and unicode text",
    "system user assistant tool role content messages numbers 0123456789",
]


def write_chat_tokenizer(folder: Path, template: str = CHATML_GENERATION) -> Path:
    """Train a byte-level BPE ``tokenizer.json`` and write a ``tokenizer_config.json`` beside it.

    Byte-level: every character is covered by some token's offsets, so token/character
    alignment is the same in every implementation.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    folder.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(CORPUS * 20, trainer)
    tok.save(str(folder / "tokenizer.json"))
    config = {
        "bos_token": "<s>",
        "eos_token": {"content": "</s>", "special": True},
        "pad_token": "<pad>",
        "chat_template": template,
        "tokenizer_class": "PreTrainedTokenizerFast",
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    return folder / "tokenizer.json"
