"""torchrun jobs (CPU, gloo): checkpoint at dp 2, resume at dp 1 and dp 4, same global batches.

Two kinds of job, each run uninterrupted at dp 2 (checkpoint at step 3) and then resumed:

* a tiny model trained with TorchTitan's CheckpointManager, optimizer and LR scheduler
  containers and HF tokenizer (``scripts/tt_mini.py``);
* the baseline: TorchTitan's own ``HuggingFaceTextDataLoader`` in the tiny-model job.

Expected digests come from the core's in-process ``simulate`` (an independent path).
TorchTitan's real Trainer is run the same way by the walk-through test
(``tests/examples/test_torchtitan_walkthrough.py``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from torch.distributed.checkpoint import FileSystemReader

from tests.integrations.assets import Assets
from tests.integrations.tt_helpers import content_digest, load_rows, step_digest
from zephon_nodes.engine.pipeline import Pipeline
from zephon_nodes.recipe import Recipe
from zephon_nodes.verification.simulate import simulate

REPO = Path(__file__).parents[2]
SCRIPTS = Path(__file__).parent / "scripts"
STEPS, SAVE_AT, SPL = 6, 3, 2
LOSS_RTOL = 1e-4
TIMEOUT_S = 600

pytestmark = pytest.mark.slow


def torchrun(nproc: int, script: str, args: Sequence[str], log: Path) -> int:
    """Run ``script`` under torchrun with ``nproc`` CPU processes; return the exit code."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env.update(
        OMP_NUM_THREADS="1",
        HF_HOME=str(log.parent / "hf_home"),
        HF_DATASETS_OFFLINE="1",
        HF_HUB_OFFLINE="1",
        TOKENIZERS_PARALLELISM="false",
    )
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={nproc}",
        str(SCRIPTS / script),
        *args,
    ]
    with open(log, "w") as f:
        proc = subprocess.run(
            cmd, cwd=REPO, env=env, stdout=f, stderr=subprocess.STDOUT, timeout=TIMEOUT_S
        )
    return proc.returncode


def tail(log: Path, n: int = 4000) -> str:
    return log.read_text(errors="replace")[-n:]


def run_ok(nproc: int, script: str, args: Sequence[str], out: Path) -> dict[str, Any]:
    out.mkdir(parents=True, exist_ok=True)
    log = out / "log.txt"
    rc = torchrun(nproc, script, args, log)
    assert rc == 0, f"{script} at dp {nproc} failed (rc={rc}):\n{tail(log)}"
    result: dict[str, Any] = json.loads((out / "result.json").read_text())
    result["losses"] = {int(k): v for k, v in result["losses"].items()}
    rows = [load_rows(out / f"rows_rank{r}.npz") for r in range(nproc)]
    result["digests"] = {t: step_digest([rr[t] for rr in rows], SPL) for t in sorted(rows[0])}
    result["contents"] = {t: content_digest([rr[t] for rr in rows]) for t in sorted(rows[0])}
    return result


@pytest.fixture(scope="module")
def expected(recipe_path: Path) -> dict[int, str]:
    """Digests of steps 1..STEPS from the core's in-process simulation at dp 2."""
    pipeline = Pipeline(Recipe.from_toml(recipe_path), provenance=False)  # rows: no ids
    return {r.step: r.digest for r, _ in simulate(pipeline, 2, STEPS, num_workers=1)}


def assert_same_run(base: dict[str, Any], resumed: dict[str, Any], label: str) -> None:
    steps = list(range(SAVE_AT + 1, STEPS + 1))
    assert sorted(resumed["digests"]) == steps, label
    for t in steps:
        assert resumed["digests"][t] == base["digests"][t], f"{label}: step {t} digest differs"
        a, b = base["losses"][t], resumed["losses"][t]
        assert abs(a - b) <= LOSS_RTOL * abs(a), f"{label}: step {t} loss {b} vs {a}"


def report(title: str, base: dict[str, Any], others: dict[str, dict[str, Any]]) -> None:
    """Print the side-by-side table (shown with ``pytest -s``)."""
    print(
        f"\n{title}: wall s: dp2={base['wall_s']:.1f} "
        + " ".join(f"{k}={v['wall_s']:.1f}" for k, v in others.items())
    )
    for t in sorted(base["digests"]):
        cells = [f"dp2 {base['digests'][t][:12]} {base['losses'][t]:.5f}"]
        for k, v in others.items():
            if t in v["digests"]:
                cells.append(f"{k} {v['digests'][t][:12]} {v['losses'][t]:.5f}")
        print(f"  step {t}: " + " | ".join(cells))


def lane_bytes(checkpoint: Path) -> dict[str, int]:
    """Stored bytes of each ``dataloader.*`` item of a DCP checkpoint."""
    reader = FileSystemReader(str(checkpoint))
    meta = reader.read_metadata()
    sizes: dict[str, int] = {}
    assert meta.storage_data is not None
    for index, info in meta.storage_data.items():
        if index.fqn.startswith("dataloader."):
            sizes[index.fqn] = sizes.get(index.fqn, 0) + int(info.length)
    return sizes


# ---------------------------------------------------------------- tiny model, no Trainer


def mini_args(assets: Assets, recipe: Path, ckpt: Path, out: Path, *extra: str) -> list[str]:
    return [
        "--recipe", str(recipe), "--hf-assets", str(assets.hf_assets), "--out", str(out),
        "--ckpt", str(ckpt), "--steps", str(STEPS), "--interval", str(SAVE_AT), *extra,
    ]  # fmt: skip


@pytest.fixture(scope="module")
def mini_base(assets: Assets, recipe_path: Path, tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("mini")
    out = root / "dp2"
    result = run_ok(2, "tt_mini.py", mini_args(assets, recipe_path, root / "ckpt", out), out)
    return root, result


@pytest.mark.parametrize("world", [1, 4])
def test_mini_resume_at_other_dp(
    world: int, assets: Assets, recipe_path: Path, mini_base: Any, expected: dict[int, str]
) -> None:
    """Tiny model + TorchTitan checkpointing: dp 2 -> dp 1 / dp 4, same batches and losses."""
    root, base = mini_base
    assert base["digests"] == expected
    out = root / f"resume_dp{world}"
    args = mini_args(assets, recipe_path, root / "ckpt", out, "--resume-step", str(SAVE_AT))
    resumed = run_ok(world, "tt_mini.py", args, out)
    report(f"mini dp2 -> dp{world}", base, {f"dp{world}": resumed})
    assert_same_run(base, resumed, f"mini dp{world}")


def test_mini_checkpoint_has_small_tensor_state_per_lane(mini_base: Any) -> None:
    """DCP holds one int64[3] per lane and only tensors (nothing pickled) for the loader."""
    root, _ = mini_base
    sizes = lane_bytes(root / "ckpt" / "checkpoint" / f"step-{SAVE_AT}")
    lanes = {k: v for k, v in sizes.items() if k.startswith("dataloader.lane_")}
    assert sorted(lanes) == [f"dataloader.lane_{i:05d}" for i in range(4)]
    meta = FileSystemReader(str(root / "ckpt" / "checkpoint" / f"step-{SAVE_AT}")).read_metadata()
    kinds = {
        k: type(v).__name__
        for k, v in meta.state_dict_metadata.items()
        if k.startswith("dataloader.")
    }
    assert set(kinds.values()) == {"TensorStorageMetadata"}, kinds
    print(f"\ndataloader bytes in the checkpoint: {sizes}")


# ---------------------------------------------------------------- baseline: TorchTitan's loader


@pytest.fixture(scope="module")
def titan_base(assets: Assets, tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("titan")
    data = root / "data"
    data.mkdir()
    (data / "train.jsonl").write_bytes(assets.corpus.read_bytes())
    out = root / "dp2"
    args = titan_args(assets, root, out)
    return root, run_ok(2, "tt_mini.py", args, out)


def titan_args(assets: Assets, root: Path, out: Path, *extra: str) -> list[str]:
    return [
        "--loader", "titan", "--data-dir", str(root / "data"),
        "--hf-assets", str(assets.hf_assets), "--out", str(out), "--ckpt", str(root / "ckpt"),
        "--steps", str(STEPS), "--interval", str(SAVE_AT), *extra,
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("world", "error"),
    [
        (1, "AssertionError: dp_degree is inconsistent before and after checkpoint"),
        (4, "Missing key in checkpoint state_dict: dataloader.dp_rank_"),
    ],
)
def test_default_loader_cannot_resume_at_other_dp(
    world: int, error: str, assets: Assets, titan_base: Any
) -> None:
    """TorchTitan's own loader saved at dp 2 refuses dp 1 and dp 4."""
    root, _ = titan_base
    out = root / f"resume_dp{world}"
    out.mkdir()
    rc = torchrun(
        world,
        "tt_mini.py",
        titan_args(assets, root, out, "--resume-step", str(SAVE_AT)),
        out / "log.txt",
    )
    assert rc != 0
    errors = [
        json.loads(p.read_text())["load_error"] for p in sorted(out.glob("result_rank*.json"))
    ]
    assert errors, tail(out / "log.txt")
    assert any(error in e for e in errors), errors


@pytest.mark.parametrize("world", [1, 4])
def test_default_loader_without_its_state_gives_other_batches(
    world: int, assets: Assets, titan_base: Any
) -> None:
    """Resuming with the loader state left out "works" but trains on different batches."""
    root, base = titan_base
    out = root / f"exclude_dp{world}"
    args = titan_args(assets, root, out, "--resume-step", str(SAVE_AT), "--exclude-dataloader")
    resumed = run_ok(world, "tt_mini.py", args, out)
    report(f"TorchTitan loader dp2 -> dp{world} without its state", base, {f"dp{world}": resumed})
    for t in range(SAVE_AT + 1, STEPS + 1):
        assert resumed["digests"][t] != base["digests"][t]
        assert resumed["contents"][t] != base["contents"][t], f"step {t}: same rows"


# ---------------------------------------------------------------- re-lane at load (4 -> 8 lanes)


def test_mini_relane_at_load(
    assets: Assets, recipe_path: Path, mini_base: Any, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """dp 2 with 4 lanes, checkpoint, re-lane to 8 at load on 2 and 4 ranks: same batches."""
    import shutil

    from tests.integrations.assets import write_recipe
    from zephon_nodes.engine.relane import relane_state

    root, _ = mini_base
    work = tmp_path_factory.mktemp("relane")
    eight = write_recipe(work / "recipe8.toml", assets, num_lanes=8)
    four = Pipeline(Recipe.from_toml(recipe_path), provenance=False)
    saved: list[dict[str, Any]] = []
    for _ in simulate(four, 2, SAVE_AT, num_workers=1, save_at=SAVE_AT, on_save=saved.append):
        pass
    new = relane_state(four, saved[0], 8)
    p8 = Pipeline(Recipe.from_toml(eight), provenance=False)
    want = [r.digest for r, _ in simulate(p8, 1, STEPS - SAVE_AT, num_workers=1, resume_state=new)]
    runs = {}
    for world in (2, 4):
        ckpt = work / f"ckpt{world}"
        shutil.copytree(root / "ckpt", ckpt)
        out = work / f"dp{world}"
        args = mini_args(assets, eight, ckpt, out, "--resume-step", str(SAVE_AT))
        runs[world] = run_ok(world, "tt_mini.py", [*args, "--relane-from", "4"], out)
        assert "re-laned the checkpoint of step 3 from 4 to 8 lanes" in tail(out / "log.txt", 10**6)
        rows = [load_rows(out / f"rows_rank{r}.npz") for r in range(world)]
        steps = sorted(rows[0])
        assert steps == list(range(SAVE_AT + 1, STEPS + 1))
        # 8 lanes, G = 8: one sample per lane per step.
        assert [step_digest([rr[t] for rr in rows], 1) for t in steps] == want, world
    for t in range(SAVE_AT + 1, STEPS + 1):
        a, b = runs[2]["losses"][t], runs[4]["losses"][t]
        assert abs(a - b) <= LOSS_RTOL * abs(a), f"step {t}: loss {b} at dp 4 vs {a} at dp 2"
