"""Build the demo corpus and tokenizer offline, from text that ships with Python itself.

Documents are the documentation topics of ``pydoc_data`` (the text of the Python reference
manual shipped with the interpreter) and the docstrings and sources of standard-library
modules. The tokenizer is a small sentencepiece BPE trained on that corpus. Both are
deterministic for a given Python installation.
"""

from __future__ import annotations

import io
import json
import sys
import sysconfig
from collections.abc import Iterator
from pathlib import Path

import zstandard

__all__ = ["build_corpus", "stdlib_documents", "train_tokenizer"]


def stdlib_documents(max_documents: int = 6000) -> Iterator[str]:
    """Yield documents from Python's documentation topics and standard-library sources."""
    from pydoc_data.topics import topics

    count = 0
    for key in sorted(topics):
        yield topics[key]
        count += 1
    lib = Path(sysconfig.get_paths()["stdlib"])
    for path in sorted(lib.glob("*.py")):
        if count >= max_documents:
            return
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        # One document per top-level block (class/def), so lengths vary like web pages.
        block: list[str] = []
        for line in text.splitlines():
            if line.startswith(("def ", "class ")) and block:
                yield "\n".join(block)
                count += 1
                block = []
            block.append(line)
        if block:
            yield "\n".join(block)
            count += 1


def build_corpus(out_dir: Path, num_shards: int = 4, max_documents: int = 6000) -> list[Path]:
    """Write the documents into ``num_shards`` ``.jsonl.zst`` shards (round-robin)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    buffers = [io.BytesIO() for _ in range(num_shards)]
    for i, doc in enumerate(stdlib_documents(max_documents)):
        line = json.dumps({"text": doc, "id": i}, ensure_ascii=False) + "\n"
        buffers[i % num_shards].write(line.encode("utf-8"))
    paths = []
    cctx = zstandard.ZstdCompressor(level=3)
    for k, buf in enumerate(buffers):
        path = out_dir / f"stdlib-{k:02d}.jsonl.zst"
        tmp = path.with_suffix(".tmp")
        tmp.write_bytes(cctx.compress(buf.getvalue()))
        tmp.replace(path)
        paths.append(path)
    return paths


def train_tokenizer(model_path: Path, vocab_size: int = 2000, max_documents: int = 6000) -> Path:
    """Train a sentencepiece BPE model on the corpus (bos=1, eos=2, pad=0, unk=3)."""
    import sentencepiece as spm

    model_path.parent.mkdir(parents=True, exist_ok=True)
    sentences = (
        line for doc in stdlib_documents(max_documents) for line in doc.splitlines() if line.strip()
    )
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=sentences,
        model_writer=model,
        vocab_size=vocab_size,
        model_type="bpe",
        pad_id=0,
        bos_id=1,
        eos_id=2,
        unk_id=3,
        character_coverage=1.0,
        input_sentence_size=200_000,
        shuffle_input_sentence=False,
        num_threads=1,
        minloglevel=2,
    )
    tmp = model_path.with_suffix(".tmp")
    tmp.write_bytes(model.getvalue())
    tmp.replace(model_path)
    return model_path


if __name__ == "__main__":
    root = Path(sys.argv[1] if len(sys.argv) > 1 else "examples/default")
    build_corpus(root / "data")
    train_tokenizer(root / "tok.model")
