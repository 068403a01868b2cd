"""The state package: its schema round-trips, its keys are defined once, it sits low."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

from tests.state.recipes import plain_recipe
from zephon_nodes import CheckpointError, Pipeline, simulate
from zephon_nodes.state import FORMAT, SCHEMA_VERSION, RankState, encode_checked
from zephon_nodes.state.codec import decode_checked
from zephon_nodes.state.schema import STATE_KEYS

PACKAGE = Path(__file__).resolve().parents[2] / "zephon_nodes"
STATE = PACKAGE / "state"


def test_round_trip_of_a_real_state() -> None:
    pipeline = Pipeline(plain_recipe())
    states: list[dict] = []
    for _ in simulate(pipeline, 2, 4, num_workers=0, save_at=4, on_save=states.append):
        pass
    state = states[0]
    typed = RankState.from_dict(state)
    assert typed.step == 4 and typed.num_lanes == 4 and sorted(typed.lanes) == [0, 1, 2, 3]
    assert typed.to_dict() == state
    assert decode_checked(encode_checked(state), "x", allow_unchecked=False) == state
    assert FORMAT == f"zephon-nodes/{SCHEMA_VERSION}" == state["format"]


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        ({"format": "zephon-nodes/0"}, "unsupported checkpoint format"),
        ({"extra": 1}, r"unexpected key\(s\) in checkpoint state: \['extra'\]"),
        ({"num_lanes": 4.0}, "num_lanes=4.0 must be an integer"),
        ({"step": -1}, r"step=-1 must be an integer in \[0, 2\*\*62\)"),
        ({"micro": True}, "micro=True must be an integer"),
        ({"lanes": {"00": [0, 0]}}, "lane '00' is out of range"),
        ({"lanes": {"0": [0, 1, 2]}}, r"lane 0: expected \[window, consumed\]"),
        ({"mixture": []}, "'mixture' must be a dict"),
    ],
)
def test_structure_is_checked_naming_the_key(edit: dict, message: str) -> None:
    state = {
        "format": FORMAT,
        "fingerprint": "f" * 64,
        "recipe": {},
        "num_lanes": 4,
        "step": 0,
        "micro": 0,
        "lanes": {"0": [0, 0]},
    }
    state.update(edit)
    with pytest.raises(CheckpointError, match=message):
        RankState.from_dict(state)


def _imports(path: Path) -> list[str]:
    """Every module a file imports, function-local imports included."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            out.append(node.module)
        elif isinstance(node, ast.Import):
            out.extend(a.name for a in node.names)
    return out


def test_the_state_package_imports_nothing_above_it() -> None:
    """state sits above recipe, io and core: no engine, operators, commands or integrations."""
    above = ("engine", "operators", "commands", "integrations", "verification", "cli", "testing")
    for path in sorted(STATE.glob("*.py")):
        for module in _imports(path):
            parts = module.split(".")
            if parts[0] == "zephon_nodes" and len(parts) > 1:
                assert parts[1] not in above, f"{path.name} imports {module}"
            # The DCP codec's format is torch tensors (the import-linter contract allows it).
            if not path.name.startswith("dcp"):
                assert parts[0] not in ("torch", "torchdata"), f"{path.name} imports {module}"


def test_state_keys_are_literals_only_in_the_schema() -> None:
    """The top-level state keys are spelled as string literals only where they are defined.

    Checked in the state package and in the loader replay; a key that is also a word of
    another schema (a lineage's ``lanes``, a log entry's ``step``, a marker's ``format``)
    is defined in that schema's module under its own name. (The multiplexer's metrics and
    ``inspect``'s output reuse the words as their own output keys, and ``digest`` has a
    ``recipe`` argument, so they are not scanned.)
    """
    users = [
        "engine/loader_state.py",
        *[f"state/{p.name}" for p in STATE.glob("*.py")],
    ]
    allowed = {"state/schema.py", "state/lineage.py", "state/mixture.py", "state/layout.py"}
    allowed.add("state/stage.py")  # the stage section: a schema of its own
    allowed.add("state/last_sample.py")  # the last_sample section defines its key
    # The DCP key layout is a schema of its own (TorchTitan's checkpoint keys use the words).
    allowed |= {f"state/{p.name}" for p in STATE.glob("dcp*.py")}
    keys = "|".join(sorted(STATE_KEYS - {"lanes"}))  # 'lanes' is also a layout key
    pattern = re.compile(rf"""(?<![\w.])["']({keys})["']""")
    for rel in users:
        if rel in allowed:
            continue
        tree = ast.parse((PACKAGE / rel).read_text())
        docstrings = {
            id(n.body[0].value)
            for n in ast.walk(tree)
            if isinstance(n, (ast.Module, ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef))
            and n.body
            and isinstance(n.body[0], ast.Expr)
            and isinstance(n.body[0].value, ast.Constant)
        }
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and id(node) not in docstrings
                and pattern.fullmatch(json.dumps(node.value))
            ):
                raise AssertionError(f"{rel}:{node.lineno}: state key {node.value!r} as a literal")
