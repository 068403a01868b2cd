"""A hostile table, rounds two and three (issue 35): hostile arguments, odd files, edited states.

Each case is run and sorted into one outcome: ``ok`` (refused with one line and a non-zero
status, or resumed to the same batches), ``silent`` (other batches, no error), ``traceback``
(an exception other than the library's reached the caller, or stderr holds a traceback),
``format`` (not one line, or a zero status for a refusal), ``leak`` (a thread or a
shared-memory file left behind) or ``hang`` (no answer within 120 s). The signal cases
(process runner, SIGINT/SIGTERM, stdout full or closed) are in ``test_cli_faults.py``.

The table is printed (``pytest -s``); every outcome but ``ok`` fails the test, except the
cases listed in :data:`KNOWN`, which are named gaps (docs/checkpoint.md; none now).
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import os
import threading
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.fault.common import INLINE, memory_pipeline
from tests.fault.test_cli_faults import write_corpus
from zephon_nodes import CheckpointError, ZephonError, simulate
from zephon_nodes.cli import main
from zephon_nodes.state.codec import decode_checked, encode_checked

LONG_STEPS = 140  # 2 samples per lane per step: 280 > the 256 replayed at a restore
KNOWN: set[str] = set()
"""Resealed edits not refused yet (docs/checkpoint.md, "What the seal protects against"):
none; past 256 samples per lane each lane's ``last_sample`` check refuses them."""


def _shm() -> set[str]:
    try:
        return {n for n in os.listdir("/dev/shm") if n.startswith("zephon-")}
    except FileNotFoundError:
        return set()


def run_cli(argv: list[str]) -> str:
    """Run ``zephon ARGV`` in-process in a thread; return the outcome."""
    threads, shm = threading.active_count(), _shm()
    err = io.StringIO()
    result: dict[str, Any] = {}

    def target() -> None:
        try:
            with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
                result["rc"] = main(argv)
        except SystemExit as e:
            result["rc"] = e.code
        except BaseException as e:
            result["exc"] = e

    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(120)
    if t.is_alive():
        return "hang"
    text = err.getvalue()
    if "exc" in result or "Traceback" in text:
        return "traceback"
    if not result.get("rc") or len(text.strip().splitlines()) != 1:
        return "format"
    for _ in range(50):
        if threading.active_count() <= threads:
            break
        threading.Event().wait(0.1)
    if threading.active_count() > threads or _shm() - shm:
        return "leak"
    return "ok"


def _files(root: Path) -> dict[str, Path]:
    recipe = write_corpus(root)
    fifo = root / "fifo.toml"
    os.mkfifo(fifo)
    binary = root / "binary.toml"
    binary.write_bytes(bytes(range(256)) * 10)
    empty = root / "empty.toml"
    empty.write_text("")
    big_key = root / "big_key.toml"
    big_key.write_text(recipe.read_text().replace("seed = 3", f"seed = 3\n{'k' * 100_000} = 1"))
    deep = root / "deep" / "zephon_state.json"
    deep.parent.mkdir()
    deep.write_text("[" * 100_000 + "]" * 100_000)
    listing = root / "list" / "zephon_state.json"
    listing.parent.mkdir()
    listing.write_text("[1, 2]")
    state_fifo = root / "fifostate" / "zephon_state.json"
    state_fifo.parent.mkdir()
    os.mkfifo(state_fifo)
    return {
        "recipe": recipe,
        "fifo": fifo,
        "binary": binary,
        "empty": empty,
        "big_key": big_key,
        "deep": deep.parent,
        "list": listing.parent,
        "state_fifo": state_fifo.parent,
        "dir": root / "deep",
    }


def cli_cases(f: dict[str, Path]) -> dict[str, list[str]]:
    r = str(f["recipe"])
    return {
        "--steps -1": ["digest", r, "--steps", "-1"],
        "--steps 10**30": ["digest", r, "--steps", str(10**30)],
        "--dp-world-size 0": ["digest", r, "--steps", "1", "--dp-world-size", "0"],
        "--num-workers 10**9": ["digest", r, "--steps", "1", "--num-workers", str(10**9)],
        "--local-batch-size 3": ["digest", r, "--steps", "1", "--local-batch-size", "3"],
        "--save-at beyond the run": [
            "digest",
            r,
            "--steps",
            "1",
            "--save-at",
            "5",
            "--checkpoint-dir",
            str(f["recipe"].parent / "ck"),
        ],
        "missing recipe": ["digest", r + ".missing", "--steps", "1"],
        "directory as recipe": ["explain", str(f["dir"])],
        "FIFO as recipe": ["explain", str(f["fifo"])],
        "/dev/zero as recipe": ["explain", "/dev/zero"],
        "binary recipe": ["explain", str(f["binary"])],
        "empty recipe": ["explain", str(f["empty"])],
        "100 KB unknown key": ["explain", str(f["big_key"])],
        "inspect: no state here": ["inspect", str(f["recipe"].parent)],
        "inspect: a JSON list": ["inspect", str(f["list"])],
        "inspect: 100,000 nested brackets": ["inspect", str(f["deep"])],
        "inspect: a FIFO as state": ["inspect", str(f["state_fifo"])],
        "resume from a FIFO": ["digest", r, "--steps", "1", "--resume-from", str(f["state_fifo"])],
        "--mixture-updates /dev/zero": [
            "digest",
            r,
            "--steps",
            "1",
            "--mixture-updates",
            "/dev/zero",
        ],
        "--operator-workers garbage": ["digest", r, "--steps", "1", "--operator-workers", "x=y:z"],
        "--cache-limit -5G": ["digest", r, "--steps", "1", "--cache-limit", "-5G"],
        "--token-cache-limit 1e400": ["digest", r, "--steps", "1", "--token-cache-limit", "1e400"],
        "lanes --dp-sizes 0": ["lanes", "--dp-sizes", "0"],
        "unknown command": ["frobnicate"],
    }


def _resume(pipeline: Any, state: Any, steps: int) -> list[tuple[int, str]]:
    """``(step, digest)`` of the next ``steps`` steps: a relabelled step is a change too."""
    run = simulate(pipeline, 1, steps, pool=INLINE, resume_state=state)
    return [(r.step, r.digest) for r, _ in run]


def _resealed(state: dict[str, Any], edit: Callable[[dict[str, Any]], None]) -> Any:
    raw = copy.deepcopy(state)
    edit(raw)
    return decode_checked(encode_checked(raw), "edited", allow_unchecked=False)


def _swap(raw: dict[str, Any]) -> None:
    raw["lanes"]["0"], raw["lanes"]["1"] = raw["lanes"]["1"], raw["lanes"]["0"]


def _every_lane(raw: dict[str, Any]) -> None:
    for pos in raw["lanes"].values():
        pos[1] += 1


def _lane0(raw: dict[str, Any]) -> None:
    raw["lanes"]["0"][1] += 1


def _lane0_down(raw: dict[str, Any]) -> None:
    raw["lanes"]["0"][1] -= 1


def _step(raw: dict[str, Any]) -> None:
    raw["step"] += 1


def _step_down(raw: dict[str, Any]) -> None:
    raw["step"] -= 1


def _set(*path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def edit(raw: dict[str, Any]) -> None:
        node = raw
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value(node[path[-1]]) if callable(value) else value

    return edit


def _drop(*path: str) -> Callable[[dict[str, Any]], None]:
    def edit(raw: dict[str, Any]) -> None:
        node = raw
        for key in path[:-1]:
            node = node[key]
        del node[path[-1]]

    return edit


def _checks_swapped(raw: dict[str, Any]) -> None:
    checks = raw["last_sample"]
    checks["0"], checks["1"] = checks["1"], checks["0"]


def _lane_renamed(raw: dict[str, Any]) -> None:
    raw["lanes"]["00"] = raw["lanes"].pop("0")


EDITS: dict[str, Callable[[dict[str, Any]], None]] = {
    "step +1": _step,
    "step -1": _step_down,
    "lane 0 consumed +1": _lane0,
    "lane 0 consumed -1": _lane0_down,
    "lanes 0 and 1 swapped": _swap,
    "every lane consumed +1": _every_lane,
    # Round three (session 11): each refused, none resumed with other batches.
    "lane 3 removed": _drop("lanes", "3"),
    "lane 4 added": _set("lanes", "4", value=[0, 0]),
    "lane 0 window +1": _set("lanes", "0", value=lambda pos: [pos[0] + 1, pos[1]]),
    "lane 0 consumed 10**30": _set("lanes", "0", value=lambda pos: [pos[0], 10**30]),
    "lane 0 position as floats": _set("lanes", "0", value=lambda pos: [float(p) for p in pos]),
    "lane key '0' as '00'": _lane_renamed,
    "pass 1": _set("pass", value=1),
    "micro 1": _set("micro", value=1),
    "num_lanes 8": _set("num_lanes", value=8),
    "step true": _set("step", value=True),
    "last_sample checks of lanes 0 and 1 swapped": _checks_swapped,
    "last_sample of lane 0, one bit": _set("last_sample", "0", value=lambda c: c ^ 1),
    "a mixture log added": _set("mixture", value=[[3, {"d": 1.0}]]),
    "an unknown key": _set("zz_extra", value=1),
    "fingerprint zeroed": _set("fingerprint", value="0" * 64),
    "format zephon-nodes/9": _set("format", value="zephon-nodes/9"),
}


def state_outcome(pipeline: Any, state: dict[str, Any], edit: Callable[..., None]) -> str:
    """Resume from ``state`` edited and resealed: refused (ok), other batches (silent)."""
    expected = _resume(pipeline, state, 3)
    try:
        got = _resume(pipeline, _resealed(state, edit), 3)
    except ZephonError:
        return "ok"
    except Exception:
        return "traceback"
    return "ok" if got == expected else "silent"


def saved_at(pipeline: Any, step: int) -> dict[str, Any]:
    saved: list[dict[str, Any]] = []
    for _ in simulate(pipeline, 1, step, pool=INLINE, save_at=step, on_save=saved.append):
        pass
    return saved[0]


def test_hostile_table(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ZEPHON_CACHE_DIR", str(tmp_path / "cache"))
    files = _files(tmp_path)
    table: dict[str, str] = {}
    for name, argv in cli_cases(files).items():
        table[f"cli: {name}"] = run_cli(argv)
    pipeline = memory_pipeline(n_docs=3000)
    short, long = saved_at(pipeline, 10), saved_at(pipeline, LONG_STEPS)
    for name, edit in EDITS.items():
        table[f"plain state at step 10: {name}"] = state_outcome(pipeline, short, edit)
        table[f"plain state past 256 samples: {name}"] = state_outcome(pipeline, long, edit)
    with pytest.raises(CheckpointError):  # control: an edit without a reseal is damage
        decode_checked(json.dumps({**short, "step": 11}).encode(), "x", allow_unchecked=False)
    counts = Counter(table.values())
    print(f"\nhostile table, round two: {len(table)} cases, {dict(counts)}")
    for name, outcome in table.items():
        print(f"  {outcome:>9}  {name}{'  (known gap)' if name in KNOWN else ''}")
    unexpected = {n: o for n, o in table.items() if o != "ok" and n not in KNOWN}
    assert not unexpected
    assert counts["silent"] == 0
