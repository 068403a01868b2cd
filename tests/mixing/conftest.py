"""Fixtures of the mixing tests: a tiny trained Hugging Face tokenizer."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.mixing.helpers import texts


def train_hf_tokenizer(path: Path, vocab_size: int = 120, seed: int = 0) -> Path:
    """Train a small BPE tokenizer.json (with <pad>, <s>, </s>, <unk>) into ``path``."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=["<pad>", "<s>", "</s>", "<unk>"]
    )
    corpus = [" ".join(texts("abcdefgh", 12, 2, 6, seed + k)) for k in range(200)]
    tok.train_from_iterator(corpus, trainer)
    tok.save(str(path))
    return path


@pytest.fixture
def hf_tokenizer(tmp_path: Path) -> Path:
    return train_hf_tokenizer(tmp_path / "tokenizer.json")
