"""Multi-turn SFT through the main adapter (examples/torchtitan/sft_main.py): dp 1/2/4."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip(
    "torchtitan.components.data.loader",
    reason="needs TorchTitan main (the .venv-titan-main of `make test-titan-main`)",
)

pytestmark = pytest.mark.titan_main

EXAMPLE = Path(__file__).parents[3] / "examples" / "torchtitan" / "sft_main.py"


def _example() -> object:
    spec = importlib.util.spec_from_file_location("sft_main", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_multi_turn_sft_is_elastic_and_supervises_assistant_turns(tmp_path: Path) -> None:
    sft: Any = _example()
    recipe = sft.make(tmp_path / "w")
    steps = {world: sft.steps_at(recipe, world) for world in (1, 2, 4)}
    tokens = {w: [[t for inp, _ in s for t in inp] for s in st] for w, st in steps.items()}
    assert tokens[1] == tokens[2] == tokens[4]
    for world, st in steps.items():
        texts = [t for s in st for t in sft.supervised_texts(recipe, s)]
        assert texts, world
        assert set(texts) <= set(sft.ASSISTANT), set(texts) - set(sft.ASSISTANT)
        # Several assistant turns per conversation are supervised, not only the last.
        assert len(texts) > sft.STEPS * sft.G
    # The user turns are in the inputs but never in the labels.
    inputs = [t for s in steps[1] for inp, _ in s for t in inp]
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(recipe.parent / "hf_assets" / "tokenizer.json"))
    assert any(u in tok.decode(inputs) for u in sft.USER)
