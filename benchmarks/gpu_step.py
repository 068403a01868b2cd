"""Step time of TorchTitan's debug model on one GPU, fed by each loader (issue 33.5).

For a machine with a GPU; nothing depends on it (``benchmarks/step_time.py`` is the CPU
emulation). TorchTitan 0.3.0's ``llama3`` ``debugmodel`` (flex attention, document masks
from the batch's positions) trains with AdamW in bf16 autocast; each step takes one
micro-batch of ``--batch-size`` x ``--seq-len`` tokens from the loader and the clock runs
from the ``next()`` to ``torch.cuda.synchronize()`` after the optimizer step. The loaders are
those of ``step_time.py`` (``--peers``; ``alone`` reuses one batch: no loader at all), each
run in a fresh process. Token ids are taken modulo the model's vocabulary (the benchmark
corpus' tokenizer is larger than the debug model's): the values do not change the step time.

Usage (on the GPU machine, from the repository root)::

    python -m benchmarks.gpu_step --steps 200 --json gpu_step.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from benchmarks.step_time import PEERS, REPO, TITAN_MAIN_PYTHON, StepConfig

__all__ = ["main", "parse_args"]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=200, help="timed steps per loader")
    p.add_argument("--warmup-steps", type=int, default=20, help="untimed steps first")
    p.add_argument("--batch-size", type=int, default=8, help="rows per micro-batch")
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--workers", type=int, default=2, help="each loader's workers")
    p.add_argument("--peers", default="alone," + ",".join(PEERS), help="comma-separated")
    p.add_argument("--device", default="cuda")
    p.add_argument("--compile", action="store_true", help="torch.compile the model")
    p.add_argument("--titan-main-python", default=TITAN_MAIN_PYTHON)
    p.add_argument("--root", default=None, help="corpus cache directory")
    p.add_argument("--json", default=None, help="write the results as JSON here")
    return p.parse_args(argv)


def _tokens_of(peer: str, batch: Any) -> tuple[Any, Any, Any]:
    """(input, labels, positions or None) of a loader's batch."""
    if isinstance(batch, tuple):  # TorchTitan: (inputs dict, labels)
        inputs, labels = batch
        return inputs["input"], labels, inputs.get("positions")
    return batch["input"], batch["labels"], batch.get("positions")


def run_peer(peer: str, cfg: StepConfig, args: argparse.Namespace) -> dict[str, Any]:
    """Train ``args.steps`` steps of the debug model fed by ``peer``; per-step seconds."""
    import torch
    import torchtitan.models.llama3 as llama3

    from benchmarks.step_time import LOADERS

    device = torch.device(args.device)
    model = llama3.llama3_configs["debugmodel"](attn_backend="flex").build().to(device)
    vocab = int(model.config.vocab_size) if hasattr(model, "config") else 2048
    if args.compile:
        model = torch.compile(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device.type == "cuda")
    if peer == "alone":
        fixed = {
            "input": torch.randint(0, vocab, (cfg.batch_size, cfg.seq_len)),
            "labels": torch.randint(0, vocab, (cfg.batch_size, cfg.seq_len)),
        }
        batches: Any = iter(lambda: fixed, None)
    else:
        batches, _ = LOADERS[peer](cfg)

    def step() -> None:
        inp, lab, pos = _tokens_of(peer, next(batches))
        inp = (inp % vocab).reshape(cfg.batch_size, -1).to(device, non_blocking=True)
        lab = lab.reshape(cfg.batch_size, -1).to(device, non_blocking=True)
        lab = torch.where(lab < 0, lab, lab % vocab)
        if pos is None:
            pos = torch.arange(inp.shape[1]).expand(cfg.batch_size, -1)
        pos = pos.reshape(cfg.batch_size, -1).to(device, non_blocking=True)
        masks = model.get_attention_masks(pos) if hasattr(model, "get_attention_masks") else None
        with torch.autocast(device.type, dtype=torch.bfloat16):
            logits = model(inp, positions=pos, attention_masks=masks)
            loss = torch.nn.functional.cross_entropy(
                logits.flatten(0, 1).float(), lab.flatten(), ignore_index=-100
            )
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize()

    for _ in range(args.warmup_steps):
        step()
    times = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    return {"peer": peer, "step_s": times}


def main(argv: list[str] | None = None) -> int:
    """Run every loader in its own process; print the step-time table."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--worker"]:
        peer, cfg_json = argv[1], argv[2]
        out = run_peer(peer, StepConfig(**json.loads(cfg_json)), parse_args(argv[3:]))
        print("RESULT " + json.dumps(out), flush=True)
        os._exit(0)
    args = parse_args(argv)
    from benchmarks.corpus import build_corpus
    from benchmarks.run import corpus_args

    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    cargs = corpus_args(False, args.root)
    corpus = build_corpus(Path(cargs.pop("root")), log=False, **cargs)
    cfg = StepConfig(
        corpus_root=str(corpus.root), jsonl=str(corpus.jsonl), shard_glob=corpus.shard_glob,
        model=str(corpus.model), seq_len=args.seq_len, batch_size=args.batch_size,
        workers=args.workers,
    )  # fmt: skip
    results: dict[str, Any] = {}
    for peer in [p for p in args.peers.split(",") if p]:
        python = args.titan_main_python if peer == "titan_main" else sys.executable
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
        cmd = [python, "-m", "benchmarks.gpu_step", "--worker", peer, json.dumps(asdict(cfg))]
        proc = subprocess.run(cmd + argv, capture_output=True, text=True, env=env, cwd=REPO)
        got = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
        if not got:
            results[peer] = {"error": (proc.stderr.strip().splitlines() or ["?"])[-1]}
            continue
        times = json.loads(got[0][7:])["step_s"]
        results[peer] = {
            "median_ms": statistics.median(times) * 1e3,
            "p95_ms": sorted(times)[int(0.95 * (len(times) - 1))] * 1e3,
        }
    base = results.get("alone", {}).get("median_ms")
    print("| loader | step ms median | p95 | inflation vs alone |\n|---|---|---|---|")
    for peer, r in results.items():
        if "error" in r:
            print(f"| {peer} | error: {r['error'][:120]} | | |")
            continue
        infl = f"{100 * (r['median_ms'] / base - 1):+.1f}%" if base else "n/a"
        print(f"| {peer} | {r['median_ms']:.1f} | {r['p95_ms']:.1f} | {infl} |")
    if args.json:
        Path(args.json).write_text(json.dumps({"config": asdict(cfg), "results": results}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
