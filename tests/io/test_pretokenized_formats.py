"""Megatron, MDS and LitData corpora written by their own libraries run as recipe datasets.

Each corpus holds the byte tokenizer's ids of texts naming their record (with eos), so what
comes out is compared with the corpus: the same documents as each library's own reader,
the same global batches at dp 1/2/4 and across a resume, mixed by token ratio with a jsonl
dataset, and refused when the recipe's tokenizer is not the corpus's.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.io import pretokenized_corpora as pc
from zephon_nodes import DatasetSpec, Pipeline, Recipe, TokenizerSpec, WorkSpec, simulate
from zephon_nodes.core.errors import DataError, RecipeError
from zephon_nodes.io.sources import open_dataset
from zephon_nodes.recipe.mixture import MixtureSpec

N = 48
STEPS = 6


def _megatron(root: Path, docs: list[np.ndarray]) -> str:
    pc.write_megatron(root / "corpus", docs)
    return "corpus.idx"


def _mds(root: Path, docs: list[np.ndarray]) -> str:
    pc.write_mds(root / "mds", docs, compression="zstd")
    return "mds"


def _litdata(root: Path, docs: list[np.ndarray]) -> str:
    pc.write_litdata(root / "lit", docs)
    return "lit"


WRITERS: dict[str, Callable[[Path, list[np.ndarray]], str]] = {
    "megatron": _megatron,
    "mds": _mds,
    "litdata": _litdata,
}
READERS: dict[str, Callable[[Path], list[np.ndarray]]] = {
    "megatron": lambda root: pc.read_megatron(root / "corpus"),
    "mds": lambda root: pc.read_mds(root / "mds"),
    "litdata": lambda root: pc.read_litdata(root / "lit"),
}


def recipe(datasets: tuple[DatasetSpec, ...], **kw: Any) -> Recipe:
    """A tiny byte-tokenizer recipe (no bos: the corpora's documents end with eos)."""
    base: dict[str, Any] = {
        "datasets": datasets,
        "tokenizer": TokenizerSpec(kind="bytes", add_bos=False, add_eos=True),
        "seed": 3,
        "num_lanes": 4,
        "global_batch_size": 8,
        "seq_len": 16,
        "flush_every": 2,
        "work": WorkSpec(chunk_size=3),
    }
    base.update(kw)
    return Recipe(**base)


def run(r: Recipe, world: int, steps: int = STEPS, **kw: Any) -> list[str]:
    """Digests of a simulated run."""
    return [x.digest for x, _ in simulate(Pipeline(r), world, steps, **kw)]


def _corpus(fmt: str, tmp_path: Path) -> tuple[list[np.ndarray], str]:
    docs = pc.documents(N)
    return docs, WRITERS[fmt](tmp_path, docs)


@pytest.mark.parametrize("fmt", list(WRITERS))
def test_same_documents_as_the_library(fmt: str, tmp_path: Path) -> None:
    """Our reader gives every document's ids as the library's own reader does."""
    docs, path = _corpus(fmt, tmp_path)
    theirs = READERS[fmt](tmp_path)
    # Detected from the pattern (no `format` key) and named explicitly: the same shards.
    for spec in (
        DatasetSpec("c", paths=(path,), base_dir=tmp_path),
        DatasetSpec("c", paths=(path,), base_dir=tmp_path, format=fmt),
    ):
        ds = open_dataset(spec, 5).dataset
        ours = [ids for s in ds.shards for _, ids in s.read(0, s.num_records)]
        assert len(ours) == len(theirs) == N
        for a, b, d in zip(ours, theirs, docs, strict=True):
            assert np.array_equal(a, b) and np.array_equal(a, d)
    if fmt != "megatron":
        assert len(ds.shards) > 1  # several shards or chunks: work items cross them


@pytest.mark.parametrize("fmt", list(WRITERS))
def test_elastic_and_resumed(fmt: str, tmp_path: Path) -> None:
    """Digests identical at dp 1/2/4 and across a resume at another dp."""
    _, path = _corpus(fmt, tmp_path)
    r = recipe((DatasetSpec("c", paths=(path,), base_dir=tmp_path),))
    reference = run(r, 1)
    assert len(reference) == STEPS and len(set(reference)) == STEPS
    assert run(r, 2) == reference
    assert run(r, 4) == reference
    saved: list[dict[str, Any]] = []
    list(simulate(Pipeline(r), 2, 3, save_at=3, on_save=saved.append))
    assert run(r, 4, STEPS - 3, resume_state=saved[0]) == reference[3:]


def test_megatron_is_the_jsonl_of_its_texts(tmp_path: Path) -> None:
    """A Megatron corpus of a jsonl file's ids gives that jsonl dataset's global batches."""
    docs, path = _corpus("megatron", tmp_path)
    lines = [json.dumps({"text": t}) for t in pc.texts(N)]
    (tmp_path / "same.jsonl").write_text("\n".join(lines) + "\n")
    assert all(np.array_equal(d, pc.byte_ids(t)) for d, t in zip(docs, pc.texts(N), strict=True))
    ours = run(recipe((DatasetSpec("c", paths=(path,), base_dir=tmp_path),)), 2)
    text = run(recipe((DatasetSpec("c", paths=("same.jsonl",), base_dir=tmp_path),)), 2)
    assert ours == text


@pytest.mark.parametrize("fmt", list(WRITERS))
def test_mixed_by_tokens_with_jsonl(fmt: str, tmp_path: Path) -> None:
    """Mixed 3:1 by tokens with a jsonl dataset: elastic, resumable, both in the batches."""
    _, path = _corpus(fmt, tmp_path)
    lines = [json.dumps({"text": t}) for t in pc.texts(3 * N, tag="web")]
    (tmp_path / "web.jsonl").write_text("\n".join(lines) + "\n")
    r = recipe(
        (
            DatasetSpec("c", paths=(path,), base_dir=tmp_path, weight=3.0, on_exhausted="repeat"),
            DatasetSpec("web", paths=("web.jsonl",), base_dir=tmp_path, on_exhausted="repeat"),
        ),
        work=WorkSpec(chunk_size=2),
        mixture=MixtureSpec(estimate_records=64),
    )
    out = list(simulate(Pipeline(r), 1, STEPS, keep_batches=True))
    reference = [x.digest for x, _ in out]
    assert run(r, 2) == reference and run(r, 4) == reference
    saved: list[dict[str, Any]] = []
    list(simulate(Pipeline(r), 4, 3, save_at=3, on_save=saved.append))
    assert run(r, 2, STEPS - 3, resume_state=saved[0]) == reference[3:]
    ids = np.concatenate([b["input"].numpy().ravel() for _, bs in out for b in bs or []])
    text = bytes(int(x) - 3 for x in ids if x >= 3).decode(errors="replace")
    corpus, web = text.count("doc "), text.count("web ")
    assert corpus > 0 and web > 0
    assert corpus > web  # 3:1 by tokens (the documents are of the same lengths)


def _bad_megatron(tmp_path: Path) -> str:
    docs = pc.documents(8)
    docs[5] = docs[5].copy()
    docs[5][2] = 300  # not an id of the byte tokenizer's 259
    pc.write_megatron(tmp_path / "corpus", docs)
    return "corpus.idx"


def test_id_outside_the_vocabulary_refused(tmp_path: Path) -> None:
    """An id >= the tokenizer's vocabulary is refused naming the file and document."""
    path = _bad_megatron(tmp_path)
    for on_error in ("raise", "skip"):
        spec = DatasetSpec("c", paths=(path,), base_dir=tmp_path, on_error=on_error)
        with pytest.raises(
            DataError,
            match=r"corpus \(\.bin/\.idx\) document 5: token id 300 "
            r"is outside the recipe tokenizer's vocabulary of 259",
        ):
            run(recipe((spec,), work=WorkSpec(chunk_size=2)), 1, 4)


def test_a_uint64_id_is_named_as_stored(tmp_path: Path) -> None:
    """An id of 2**63 or more in a uint64 column is named as stored, not wrapped to -1."""
    docs = [d.astype(np.uint64) for d in pc.documents(6)]
    docs[4][1] = np.uint64(2**64 - 1)
    pc.write_mds(tmp_path / "mds", docs, dtype="uint64")
    spec = DatasetSpec("c", paths=("mds",), base_dir=tmp_path)
    with pytest.raises(DataError, match=rf"token id {2**64 - 1} is outside the recipe"):
        run(recipe((spec,), work=WorkSpec(chunk_size=2)), 1, 4)


def test_tokenizer_mismatch_refused(tmp_path: Path) -> None:
    """A stated vocab_size or a tokenizer file beside the corpus that is not the recipe's."""
    _, path = _corpus("megatron", tmp_path)
    spec = DatasetSpec("c", paths=(path,), base_dir=tmp_path, vocab_size=32000)
    with pytest.raises(RecipeError, match=r"vocabulary is 32000 tokens .*tokenizer has 259"):
        Pipeline(recipe((spec,)))
    assert run(recipe((DatasetSpec("c", paths=(path,), base_dir=tmp_path, vocab_size=259),)), 1)
    (tmp_path / "tokenizer.json").write_text("{}")
    spec = DatasetSpec("c", paths=(path,), base_dir=tmp_path)
    with pytest.raises(
        RecipeError,
        match=r"tokenized with .*tokenizer\.json, the recipe's "
        r"tokenizer is the built-in one",
    ):
        Pipeline(recipe((spec,)))


def test_identity_covers_every_file(tmp_path: Path) -> None:
    """The fingerprint covers .bin and .idx; `format` joins it only when set."""
    _, path = _corpus("megatron", tmp_path)
    detected = recipe((DatasetSpec("c", paths=(path,), base_dir=tmp_path),))
    named = recipe((DatasetSpec("c", paths=("corpus",), base_dir=tmp_path, format="megatron"),))
    files = detected.canonical()["datasets"][0]["files"]
    assert len(files) == 2 and "format" not in detected.canonical()["datasets"][0]
    assert named.canonical()["datasets"][0]["files"] == files
    assert named.canonical()["datasets"][0]["format"] == "megatron"
    before = detected.fingerprint()
    blob = bytearray((tmp_path / "corpus.bin").read_bytes())
    blob[0] ^= 1
    (tmp_path / "corpus.bin").write_bytes(bytes(blob))
    assert recipe((DatasetSpec("c", paths=(path,), base_dir=tmp_path),)).fingerprint() != before


def test_text_operator_on_tokens_refused(tmp_path: Path) -> None:
    """A filter over a pre-tokenized dataset is refused: its records have no text."""
    from zephon_nodes.recipe.operators import OperatorSpec
    from zephon_nodes.recipe.registry import register_filter

    register_filter("pretok_keep", lambda text: True)
    _, path = _corpus("megatron", tmp_path)
    r = recipe(
        (DatasetSpec("c", paths=(path,), base_dir=tmp_path),),
        operators=(OperatorSpec(kind="filter", name="pretok_keep"),),
    )
    with pytest.raises(
        RecipeError,
        match=r"filter 'pretok_keep' works on text.*'c' is "
        r"pre-tokenized",
    ):
        Pipeline(r)


def test_a_stage_adds_a_corpus(tmp_path: Path) -> None:
    """A stage adds a Megatron corpus to a jsonl dataset: elastic and resumed across it."""
    _, path = _corpus("megatron", tmp_path)
    lines = [json.dumps({"text": t}) for t in pc.texts(3 * N, tag="web")]
    (tmp_path / "web.jsonl").write_text("\n".join(lines) + "\n")
    raw: dict[str, Any] = {
        "tokenizer": {"kind": "bytes", "add_bos": False},
        "seed": 3,
        "num_lanes": 4,
        "global_batch_size": 8,
        "seq_len": 16,
        "flush_every": 2,
        "work": {"chunk_size": 2},
        "datasets": [{"name": "web", "paths": ["web.jsonl"], "on_exhausted": "repeat"}],
        "stages": [
            {
                "start_step": 2,
                "seq_len": 24,
                "datasets": [
                    {"name": "c", "paths": [path], "on_exhausted": "repeat", "weight": 3.0}
                ],
            }
        ],
    }
    r = Recipe.from_dict(raw, base_dir=tmp_path)
    out = list(simulate(Pipeline(r), 1, STEPS, keep_batches=True))
    reference = [x.digest for x, _ in out]
    assert run(r, 4) == reference
    saved: list[dict[str, Any]] = []
    list(simulate(Pipeline(r), 2, 3, save_at=3, on_save=saved.append))
    assert run(r, 4, STEPS - 3, resume_state=saved[0]) == reference[3:]

    def text(steps: list[Any]) -> str:
        ids = np.concatenate([b["input"].numpy().ravel() for _, bs in steps for b in bs or []])
        return bytes(int(x) - 3 for x in ids if x >= 3).decode(errors="replace")

    assert "doc " not in text(out[:2]) and "web " in text(out[:2])
    assert "doc " in text(out[2:])  # the corpus's documents from the stage on


def test_process_runner(tmp_path: Path) -> None:
    """Shards travel to worker processes: the process runner gives the thread runner's."""
    _, path = _corpus("mds", tmp_path)
    r = recipe((DatasetSpec("c", paths=(path,), base_dir=tmp_path),))
    assert run(r, 2, runner="process", num_workers=2) == run(r, 1)


def test_litdata_zstd_frames(tmp_path: Path) -> None:
    """LitData's default zstd chunks (frames of items): the library's documents, elastic."""
    docs = pc.documents(N)
    pc.write_litdata(tmp_path / "lz", docs, compression="zstd")
    index = json.loads((tmp_path / "lz" / "index.json").read_text())
    assert index["config"]["compression_level"] == "batch"
    ds = open_dataset(DatasetSpec("c", paths=("lz",), base_dir=tmp_path), 5).dataset
    ours = [ids for s in ds.shards for _, ids in s.read(0, s.num_records)]
    theirs = pc.read_litdata(tmp_path / "lz")
    assert len(ours) == len(theirs) == N
    for a, b, d in zip(ours, theirs, docs, strict=True):
        assert np.array_equal(a, b) and np.array_equal(a, d)
    r = recipe((DatasetSpec("c", paths=("lz",), base_dir=tmp_path),))
    assert run(r, 2) == run(r, 1)
