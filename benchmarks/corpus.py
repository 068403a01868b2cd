"""Benchmark corpus, built offline from text that ships with Python.

Sources, in order: the Python documentation sources (``python3.11-doc``'s ``_sources/*.txt``,
English reStructuredText; optional, installed with ``apt-get install python3.11-doc``) and
the standard library's ``.py`` files. Files are cut at blank lines into documents of about
``doc_bytes`` bytes, shuffled (seeded) and written as ``jsonl.zst`` shards (``{"text": ...}``
per line), plus one uncompressed ``all.jsonl`` for loaders that cannot read zstd. A
sentencepiece BPE model is trained once on the documents. Everything is cached under
``root`` and keyed by the sizes.
"""

from __future__ import annotations

import glob
import json
import os
import random
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DOC_SOURCES = "/usr/share/doc/python3.11/html/_sources"
# Test suites and codec tables are mostly data, not prose or typical code.
_SKIP_DIRS = frozenset({"site-packages", "dist-packages", "test", "tests", "encodings"})


def default_root() -> Path:
    """Cache directory of the benchmark (``$ZEPHON_BENCH_DIR`` or ``~/.cache/zephon_bench``)."""
    root = os.environ.get("ZEPHON_BENCH_DIR") or os.path.join(
        os.path.expanduser("~"), ".cache", "zephon_bench"
    )
    return Path(root)


@dataclass(frozen=True)
class Corpus:
    """A built corpus: shards, the plain jsonl copy and the tokenizer model."""

    root: Path
    shards: tuple[Path, ...]
    jsonl: Path
    model: Path
    num_docs: int
    num_bytes: int
    sources: tuple[str, ...]

    @property
    def shard_glob(self) -> str:
        """Glob pattern of the shards (for a recipe)."""
        return str(self.root / "shards" / "*.jsonl.zst")


def _source_files(max_bytes: int | None) -> tuple[list[Path], list[str]]:
    used: list[str] = []
    docs = [
        Path(p) for p in sorted(glob.glob(os.path.join(DOC_SOURCES, "**", "*.txt"), recursive=True))
    ]
    if docs:
        used.append("python3.11-doc reST sources")
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    py = sorted(
        p
        for p in stdlib.rglob("*.py")
        if not _SKIP_DIRS.intersection(p.relative_to(stdlib).parts[:-1])
    )
    used.append(f"Python {stdlib.name} standard library sources")
    if max_bytes is None:
        return docs + py, used
    # A small corpus takes documentation and code files alternately, so it holds both.
    files: list[Path] = []
    total = 0
    for i in range(max(len(docs), len(py))):
        for group in (docs, py):
            if i < len(group) and total < max_bytes:
                files.append(group[i])
                total += group[i].stat().st_size
    return files, used


def split_documents(text: str, doc_bytes: int) -> list[str]:
    """Cut ``text`` at blank lines into pieces of about ``doc_bytes`` bytes (never empty)."""
    out: list[str] = []
    cur: list[str] = []
    size = 0
    for para in text.split("\n\n"):
        cur.append(para)
        size += len(para) + 2
        if size >= doc_bytes:
            out.append("\n\n".join(cur).strip("\n"))
            cur, size = [], 0
    if cur:
        out.append("\n\n".join(cur).strip("\n"))
    return [d for d in out if d.strip()]


def build_corpus(
    root: Path | None = None,
    *,
    max_bytes: int | None = None,
    doc_bytes: int = 4096,
    docs_per_shard: int = 1000,
    vocab_size: int = 32000,
    train_lines: int = 300_000,
    log: bool = True,
) -> Corpus:
    """Build (or reuse) the corpus and tokenizer under ``root``.

    Args:
        root: Cache directory (default :func:`default_root`).
        max_bytes: Stop reading source files after about this many bytes (tiny smoke runs).
        doc_bytes: Target document size.
        docs_per_shard: Documents per ``jsonl.zst`` shard.
        vocab_size: BPE vocabulary size.
        train_lines: Lines sampled to train the tokenizer.
        log: Print progress to stderr.
    """
    import sys

    base = root if root is not None else default_root()
    key = f"mix-c{max_bytes or 'all'}-d{doc_bytes}-v{vocab_size}"
    out = base / key
    meta_path = out / "meta.json"
    if meta_path.is_file():
        meta = json.loads(meta_path.read_text())
        return Corpus(
            root=out,
            shards=tuple(out / s for s in meta["shards"]),
            jsonl=out / "all.jsonl",
            model=out / "tok.model",
            num_docs=meta["num_docs"],
            num_bytes=meta["num_bytes"],
            sources=tuple(meta["sources"]),
        )
    (out / "shards").mkdir(parents=True, exist_ok=True)
    files, sources = _source_files(max_bytes)
    docs: list[str] = []
    for p in files:
        try:
            text = p.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        docs.extend(split_documents(text, doc_bytes))
    # Interleave prose and code (seeded), so that any stretch of the files, such as the
    # part a pipeline reads in a few seconds in file order, has the corpus's overall mix.
    random.Random(0).shuffle(docs)
    if log:
        print(f"corpus: {len(docs)} documents from {len(files)} files", file=sys.stderr)
    import zstandard

    cctx = zstandard.ZstdCompressor(level=3)
    shards = []
    with open(out / "all.jsonl", "w", encoding="utf-8") as plain:
        for k in range(0, len(docs), docs_per_shard):
            lines = "".join(json.dumps({"text": d}) + "\n" for d in docs[k : k + docs_per_shard])
            plain.write(lines)
            name = f"shards/part-{k // docs_per_shard:05d}.jsonl.zst"
            (out / name).write_bytes(cctx.compress(lines.encode("utf-8")))
            shards.append(name)
    _train_tokenizer(docs, out / "tok", vocab_size, train_lines, log)
    meta = {
        "shards": shards,
        "num_docs": len(docs),
        "num_bytes": sum(len(d.encode("utf-8")) for d in docs),
        "sources": sources,
    }
    meta_path.write_text(json.dumps(meta, indent=1))
    return build_corpus(root, max_bytes=max_bytes, doc_bytes=doc_bytes, vocab_size=vocab_size)


def _train_tokenizer(
    docs: list[str], prefix: Path, vocab_size: int, train_lines: int, log: bool
) -> None:
    import sys
    import time

    import sentencepiece as spm

    lines = [ln for d in docs for ln in d.split("\n") if ln.strip()]
    step = max(1, len(lines) // train_lines)
    sample = lines[::step][:train_lines]
    t0 = time.perf_counter()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(sample),
        model_prefix=str(prefix),
        model_type="bpe",
        vocab_size=vocab_size,
        character_coverage=1.0,
        num_threads=2,
        pad_id=3,
        minloglevel=2,
        max_sentence_length=16384,
        hard_vocab_limit=False,
    )
    if log:
        print(
            f"tokenizer: {vocab_size}-vocab BPE trained on {len(sample)} lines in "
            f"{time.perf_counter() - t0:.0f} s",
            file=sys.stderr,
        )


HF_VOCAB = 128_256  # Llama 3's vocabulary size
HF_BOS = "<|begin_of_text|>"
HF_EOS = "<|end_of_text|>"


def hf_tokenizer(
    corpus: Corpus, vocab_size: int = HF_VOCAB, extra_bytes: int = 96 << 20, log: bool = True
) -> Path:
    """Train (once) a byte-level BPE ``tokenizer.json`` on the corpus; return its directory.

    The tokenizer is the kind TorchTitan users load for Llama 3 (Hugging Face ``tokenizers``,
    byte-level pre-tokenizer and decoder, ``<|begin_of_text|>`` / ``<|end_of_text|>``), trained
    offline on the benchmark's own documents plus about ``extra_bytes`` of other Python sources
    found on this machine (the installed packages': the corpus alone, 11 MB, has too few
    distinct words for 128k entries, and a real tokenizer is trained on far more text than any
    one job reads). The directory also holds the
    ``tokenizer_config.json`` TorchTitan main's ``HuggingFaceTokenizer`` reads. Cached under
    the corpus directory (never in git). A small corpus may end with fewer entries than asked
    (BPE stops when no pair repeats); the vocabulary size is in ``meta.json`` there.
    """
    import sys
    import time

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    out = corpus.root / f"hf-bpe-v{vocab_size}-x{extra_bytes >> 20}"
    path = out / "tokenizer.json"
    if path.is_file():
        return out
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=1,
        special_tokens=[HF_BOS, HF_EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )

    def texts() -> Any:
        with open(corpus.jsonl, encoding="utf-8") as f:
            for line in f:
                yield json.loads(line)["text"]
        yield from _extra_training_text(extra_bytes)

    tok.train_from_iterator(texts(), trainer=trainer)
    tmp = out / "tokenizer.json.tmp"
    tok.save(str(tmp))
    config = {"bos_token": HF_BOS, "eos_token": HF_EOS, "add_bos_token": True}
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=1))
    got = tok.get_vocab_size(with_added_tokens=True)
    (out / "meta.json").write_text(json.dumps({"vocab_size": got, "asked": vocab_size}))
    tmp.rename(path)
    if log:
        print(
            f"hf tokenizer: byte-level BPE, {got} entries (asked {vocab_size}), trained in "
            f"{time.perf_counter() - t0:.0f} s",
            file=sys.stderr,
        )
    return out


def _extra_training_text(limit: int) -> Any:
    """Yield Python sources of the installed packages (sorted paths) up to ``limit`` bytes."""
    total = 0
    site = Path(sysconfig.get_paths()["purelib"])
    for p in sorted(site.rglob("*.py")):
        if total >= limit:
            return
        try:
            text = p.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        total += len(text)
        yield text


def hf_dir(corpus: Corpus) -> str:
    """Directory of the corpus's ``tokenizer.json`` (trained once, cached).

    A tiny corpus (smoke runs, < 4 MB) gets a small tokenizer trained on it alone.
    """
    if corpus.num_bytes < 4 << 20:
        return str(hf_tokenizer(corpus, vocab_size=4000, extra_bytes=0, log=False))
    return str(hf_tokenizer(corpus))


class BenchTokenizer:
    """``encode(text, add_bos, add_eos)`` over either tokenizer; picklable (loads lazily)."""

    def __init__(self, kind: str, path: str) -> None:
        self.kind = kind
        self.path = path
        self._tok: Any = None
        self.bos_id, self.eos_id = self._special()

    def _load(self) -> Any:
        if self._tok is None:
            if self.kind == "hf":
                from tokenizers import Tokenizer

                self._tok = Tokenizer.from_file(os.path.join(self.path, "tokenizer.json"))
            else:
                import sentencepiece as spm

                self._tok = spm.SentencePieceProcessor(model_file=self.path)
        return self._tok

    def _special(self) -> tuple[int, int]:
        tok = self._load()
        if self.kind == "hf":
            from benchmarks.corpus import HF_BOS, HF_EOS

            return int(tok.token_to_id(HF_BOS)), int(tok.token_to_id(HF_EOS))
        return int(tok.bos_id()), int(tok.eos_id())

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        """Ids of each text, no specials (the raw limit: one call per group of documents)."""
        tok = self._load()
        if self.kind == "hf":
            return [e.ids for e in tok.encode_batch(texts, add_special_tokens=False)]
        return tok.encode(texts, out_type=int, num_threads=1)

    def encode(self, text: str, add_bos: bool = True, add_eos: bool = True) -> list[int]:
        """Ids of one text with bos/eos as asked."""
        tok = self._load()
        if self.kind == "hf":
            ids = tok.encode(text, add_special_tokens=False).ids
        else:
            ids = tok.encode(text, out_type=int)
        return [self.bos_id] * add_bos + ids + [self.eos_id] * add_eos

    def decode(self, ids: list[int]) -> str:
        return str(self._load().decode(ids))

    def get_vocab_size(self) -> int:
        tok = self._load()
        return int(tok.get_vocab_size() if self.kind == "hf" else tok.get_piece_size())

    def __getstate__(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "path": self.path,
            "_tok": None,
            "bos_id": self.bos_id,
            "eos_id": self.eos_id,
        }
