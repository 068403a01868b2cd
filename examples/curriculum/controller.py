"""A worked dynamic-mixture controller: per-domain loss -> exponentiated-gradient weights.

Three domains that are not equally hard to learn (``repeat``: periodic strings, ``words``:
words of a small vocabulary, ``noise``: random letters) are mixed by a zephon-nodes recipe
and read through TorchTitan's ``BaseDataLoader`` (:class:`ZephonDataLoader`), one loader
per data-parallel rank. A small byte-level language model trains on the global batch; after
every step each rank computes its per-domain loss sums from ``dataset_ids`` and they are
all-reduced (summed over ranks); every ``every`` steps the controller raises the weight of
domains whose loss is high relative to the others (exponentiated gradient, DoReMi-style:
``w_d <- w_d * exp(eta * (loss_d - mean))``, normalized, mixed with ``smoothing`` of the
uniform mixture) and every rank calls ``set_mixture``.

The run is checkpointed mid-way (loader state through DCP-style tensors, the model and the
optimizer with ``torch.save``) and resumed at other dp sizes: the global batches, the
decision logs and the losses after the resume are those of the uninterrupted run. The
controller keeps no state of its own: its weights are the last decision in the loader's
log, so they resume with the data.

This is the mini loop (dp ranks simulated in one process, gradients of the global batch
computed once, which is what an all-reduce of the ranks' gradient sums gives). Usage::

    python -m examples.curriculum.controller --out /tmp/curriculum [--steps 60] [--plot P]
"""

from __future__ import annotations

import argparse
import json
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from zephon_nodes.integrations.torchtitan import ZephonDataLoader
from zephon_nodes.verification.digest import global_batch_digest

DOMAINS = ("repeat", "words", "noise")
SEQ_LEN, GLOBAL_BATCH, NUM_LANES = 64, 16, 4
VOCAB = 259  # the byte tokenizer: ids 0-2 special, then bytes + 3
IGNORE_INDEX = -100


def write_corpus(root: Path, docs: int = 600) -> None:
    """Write one JSONL file per domain under ``root``."""
    rng = random.Random(0)
    vocab = ["".join(rng.choice("etaoinshr") for _ in range(rng.randint(2, 6))) for _ in range(40)]
    for name in DOMAINS:
        with open(root / f"{name}.jsonl", "w", encoding="utf-8") as f:
            for _ in range(docs):
                if name == "repeat":
                    unit = "".join(rng.choice("abcdefgh") for _ in range(rng.randint(2, 4)))
                    text = unit * rng.randint(10, 40)
                elif name == "words":
                    text = " ".join(rng.choice(vocab) for _ in range(rng.randint(10, 60)))
                else:
                    text = "".join(
                        rng.choice("klmnopqrstuvwxyz") for _ in range(rng.randint(40, 200))
                    )
                f.write(json.dumps({"text": text}) + "\n")


def write_recipe(root: Path) -> Path:
    """Write the recipe: the three domains, equal weights, endless."""
    datasets = "\n".join(
        f'[[datasets]]\nname = "{n}"\npaths = ["{n}.jsonl"]\nweight = 1.0\n'
        'on_exhausted = "repeat"\n'
        for n in DOMAINS
    )
    path = root / "recipe.toml"
    path.write_text(
        f"seed = 11\nnum_lanes = {NUM_LANES}\nglobal_batch_size = {GLOBAL_BATCH}\n"
        f'seq_len = {SEQ_LEN}\nflush_every = 2\n\n[tokenizer]\nkind = "bytes"\n\n{datasets}\n'
        '[work]\nchunk_size = 2\nepochs = "inf"\n\n[shuffle]\nbuffer_size = 4\n',
        encoding="utf-8",
    )
    return path


class TinyLM(nn.Module):
    """Token + position embeddings, a causal convolution, an MLP and a vocabulary head."""

    def __init__(self, dim: int = 64) -> None:
        super().__init__()
        self.tok = nn.Embedding(VOCAB, dim)
        self.pos = nn.Embedding(SEQ_LEN, dim)
        self.conv = nn.Conv1d(dim, dim, kernel_size=4, padding=3)
        self.mlp = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))
        self.head = nn.Linear(dim, VOCAB)

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        h = self.tok(tokens) + self.pos(positions)
        h = h + self.conv(h.transpose(1, 2))[..., : tokens.shape[1]].transpose(1, 2)
        return self.head(h + self.mlp(h))


@dataclass
class ExpGradController:
    """Exponentiated-gradient weights over domains from their mean losses.

    Attributes:
        names: The recipe's dataset names.
        eta: Step size of the update.
        smoothing: Share of the uniform mixture mixed into every decision (keeps every
            domain sampled, so its loss stays measurable).
        weights: The weights in force.
    """

    names: Sequence[str]
    eta: float = 1.0
    smoothing: float = 0.1
    weights: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.weights:
            self.weights = {n: 1 / len(self.names) for n in self.names}

    def update(self, losses: Sequence[float]) -> dict[str, float]:
        """Return the next weights given each domain's mean loss since the last update."""
        mean = sum(losses) / len(losses)
        raw = {
            n: self.weights[n] * math.exp(self.eta * (loss - mean))
            for n, loss in zip(self.names, losses, strict=True)
        }
        total = sum(raw.values())
        k = len(self.names)
        self.weights = {
            n: (1 - self.smoothing) * v / total + self.smoothing / k for n, v in raw.items()
        }
        return dict(self.weights)


def domain_sums(loss: torch.Tensor, ids: torch.Tensor, k: int) -> torch.Tensor:
    """Per-domain ``[loss sum, token count]`` (shape ``[2, k]``) from per-token losses."""
    out = torch.zeros(2, k, dtype=torch.float64)
    valid = ids >= 0
    out[0].index_add_(0, ids[valid], loss.detach().double()[valid])
    out[1].index_add_(0, ids[valid], torch.ones_like(loss, dtype=torch.float64)[valid])
    return out


def build_loaders(recipe: Path, dp: int, prefetch: int = 2) -> list[ZephonDataLoader]:
    """One TorchTitan loader per simulated rank (one micro-batch per rank per step)."""
    config = ZephonDataLoader.Config(recipe=str(recipe), num_workers=0, prefetch=prefetch)
    return [
        config.build(
            dp_world_size=dp,
            dp_rank=r,
            tokenizer=None,
            seq_len=SEQ_LEN,
            local_batch_size=GLOBAL_BATCH // dp,
            snapshot_every_n_steps=None,
        )
        for r in range(dp)
    ]


def train(
    recipe: Path,
    dp: int,
    steps: int,
    *,
    every: int = 5,
    eta: float = 1.0,
    save_at: int | None = None,
    ckpt: Path | None = None,
    resume: Path | None = None,
) -> dict[str, Any]:
    """Train with the controller; return per-step losses, digests, weights and the log.

    Args:
        recipe: The recipe TOML.
        dp: Simulated data-parallel ranks.
        steps: Last step to run.
        every: Steps between decisions.
        eta: Controller step size.
        save_at: Save a checkpoint into ``ckpt`` after this step.
        ckpt: Checkpoint directory.
        resume: Resume from this checkpoint directory.
    """
    torch.manual_seed(0)
    model = TinyLM()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    loaders = build_loaders(recipe, dp)
    names = [d.name for d in loaders[0].pipeline.recipe.datasets]
    start = 0
    if resume is not None:
        stored = torch.load(resume / "loader.pt", weights_only=True)
        for loader in loaders:  # what DCP does: ask for the keys, fill them in place
            wanted = loader.state_dict()
            for key, value in wanted.items():
                value.copy_(stored[key])
            loader.load_state_dict(wanted)
        trained = torch.load(resume / "model.pt", weights_only=True)
        model.load_state_dict(trained["model"])
        opt.load_state_dict(trained["opt"])
        start = int(stored["step"])
    log = loaders[0].mixture_log
    controller = ExpGradController(names, eta=eta, weights=dict(log[-1][1]) if log else {})
    iters = [iter(x) for x in loaders]
    window = torch.zeros(2, len(names), dtype=torch.float64)
    out: dict[str, Any] = {"losses": {}, "digests": {}, "domain_loss": {}, "weights": {}}
    for step in range(start + 1, steps + 1):
        batches = [next(it) for it in iters]  # rank order = lane order
        ids = torch.cat([torch.cat(x.pop_dataset_ids()) for x in loaders])
        tokens = torch.cat([b[0]["input"] for b in batches])
        positions = torch.cat([b[0]["positions"] for b in batches])
        labels = torch.cat([b[1] for b in batches])
        logits = model(tokens, positions)
        per_token = F.cross_entropy(
            logits.flatten(0, 1), labels.flatten(), ignore_index=IGNORE_INDEX, reduction="none"
        )
        valid = labels.flatten() != IGNORE_INDEX
        loss = per_token[valid].mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        # Each rank's sums over its rows, then the all-reduce (a sum over ranks).
        rows_per_rank = GLOBAL_BATCH // dp
        sums = sum(
            domain_sums(
                per_token.view(GLOBAL_BATCH, SEQ_LEN)[r * rows_per_rank : (r + 1) * rows_per_rank],
                ids[r * rows_per_rank : (r + 1) * rows_per_rank],
                len(names),
            )
            for r in range(dp)
        )
        window += sums
        out["losses"][step] = float(loss.detach())
        rows = [
            {"input": tokens[j].numpy(), "labels": labels[j].numpy(), "dataset_ids": ids[j].numpy()}
            for j in range(GLOBAL_BATCH)
        ]
        spl = GLOBAL_BATCH // NUM_LANES
        out["digests"][step] = global_batch_digest((j // spl, r) for j, r in enumerate(rows))
        out["domain_loss"][step] = [  # NaN: no token of the domain in this step
            s / c if c > 0 else math.nan for s, c in zip(*sums.tolist(), strict=True)
        ]
        out["weights"][step] = [controller.weights[n] for n in names]
        if step % every == 0:
            means = (window[0] / window[1].clamp(min=1)).tolist()
            weights = controller.update(means)
            for loader in loaders:  # every rank makes the same decision
                loader.set_mixture(weights)
            window.zero_()
        if save_at is not None and step == save_at and ckpt is not None:
            ckpt.mkdir(parents=True, exist_ok=True)
            stored = {}
            for loader in loaders:  # DCP keeps one value per key: lanes are unique
                stored.update({k: v.clone() for k, v in loader.state_dict().items()})
            torch.save(stored, ckpt / "loader.pt")
            torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, ckpt / "model.pt")
    out["log"] = [[s, w] for s, w in loaders[0].mixture_log]
    for loader in loaders:
        loader.close()
    return out


def plot(result: dict[str, Any], names: Sequence[str], path: Path) -> None:
    """Plot weights and per-domain losses over steps."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = sorted(result["weights"])
    fig, (a, b) = plt.subplots(2, 1, figsize=(7, 6), sharex=True)
    for k, n in enumerate(names):
        a.plot(steps, [result["weights"][s][k] for s in steps], label=n)
        b.plot(steps, [result["domain_loss"][s][k] for s in steps], label=n)
    a.set_ylabel("weight in force (token share)")
    b.set_ylabel("per-domain loss (all-reduced)")
    b.set_xlabel("step")
    a.legend()
    a.set_title("exponentiated-gradient controller (dp 2, resumed at dp 1 and 4 mid-run)")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def run(out: Path, steps: int = 60, every: int = 5, save_at: int = 30) -> dict[str, Any]:
    """dp 2 uninterrupted with a checkpoint, then resumes at dp 1 and dp 4; compare."""
    out.mkdir(parents=True, exist_ok=True)
    write_corpus(out)
    recipe = write_recipe(out)
    base = train(recipe, 2, steps, every=every, save_at=save_at, ckpt=out / "ckpt")
    summary: dict[str, Any] = {
        "steps": steps,
        "every": every,
        "save_at": save_at,
        "log": base["log"],
    }
    for dp in (1, 4):
        resumed = train(recipe, dp, steps, every=every, resume=out / "ckpt")
        after = range(save_at + 1, steps + 1)
        summary[f"dp{dp}"] = {
            "same_batches": all(resumed["digests"][s] == base["digests"][s] for s in after),
            "same_log": resumed["log"] == base["log"],
            "max_loss_diff": max(abs(resumed["losses"][s] - base["losses"][s]) for s in after),
        }
    summary["result"] = base
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--every", type=int, default=5)
    parser.add_argument("--save-at", type=int, default=30)
    parser.add_argument("--plot", type=Path, default=None)
    args = parser.parse_args()
    summary = run(args.out, args.steps, args.every, args.save_at)
    if args.plot:
        plot(summary["result"], DOMAINS, args.plot)
    brief = {k: v for k, v in summary.items() if k != "result"}
    print(json.dumps(brief, indent=1))


if __name__ == "__main__":
    main()
