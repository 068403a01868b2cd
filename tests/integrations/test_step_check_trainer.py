"""TorchTitan's real Trainer (CPU): an optimizer step of half the recipe's global batch is
refused at the first optimizer step, naming both settings, before any checkpoint is written.

TorchTitan's own llama3 debug-model job, switched to the walk-through's recipe (G=8,
seq_len 64) by ``--override.imports``, on 1 rank with 2 samples per micro-batch and an
optimizer step of 4 samples (0.3.0: ``--training.global-batch-size 4``; main:
``--training.num-tokens-per-train-step 256``) and a checkpoint after every step. Runs with
the installed TorchTitan (main: ``titan_main/test_seams_main.py`` collects it again).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton", reason="torchtitan.trainer imports triton")

from zephon_nodes.integrations.torchtitan import API

pytestmark = pytest.mark.slow

REPO = Path(__file__).parents[2]
OVERRIDE = "zephon_nodes.integrations.torchtitan.override.use_recipe"


def test_half_a_global_batch_per_step_is_refused_by_the_real_trainer(tmp_path: Path) -> None:
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1")
    work = tmp_path / "w"
    make = [sys.executable, str(REPO / "examples/torchtitan/make_assets.py"), str(work)]
    subprocess.run(make, cwd=REPO, env=env, check=True, capture_output=True, timeout=600)
    if API == "main":
        sizes = [
            "--training.max-context-length", "64",
            "--training.num-tokens-per-microbatch-per-dp-rank", "128",
            "--training.num-tokens-per-train-step", "256",
        ]  # fmt: skip
        said = (
            "training.num_tokens_per_train_step=256 tokens, which is not a multiple of the "
            "recipe's global_batch_size=8"
        )
        fix = "set --training.num-tokens-per-train-step 512"
    else:
        sizes = [
            "--training.seq-len", "64",
            "--training.local-batch-size", "2",
            "--training.global-batch-size", "4",
        ]  # fmt: skip
        said = (
            "training.global_batch_size=4 samples, which is not a multiple of the recipe's "
            "global_batch_size=8"
        )
        fix = "set --training.global-batch-size 8"
    settings = json.dumps({"recipe": str(work / "recipe.toml")})
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=1",
        "-m", "zephon_nodes.integrations.torchtitan.train",
        "--module", "llama3", "--config", "llama3_debugmodel",
        "--override.imports", f"{OVERRIDE}={settings}",
        "--hf-assets-path", str(work / "hf_assets"), *sizes,
        "--training.steps", "2", "--checkpoint.enable", "--checkpoint.interval", "1",
        "--dump-folder", str(work / "runs"), "--debug.seed", "0",
    ]  # fmt: skip
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out[-4000:]
    assert "the trainer's optimizer step took 2 micro-batch(es) of 2 samples" in out, out[-4000:]
    assert said in out and fix in out, out[-4000:]
    assert not list((work / "runs").glob("checkpoint/step-*")), "a checkpoint was written"
