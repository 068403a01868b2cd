"""docs/quickstart-object-store.md runs as typed: every shell line of the page, in order, in
one bash in an empty folder, against the suite's moto server (tests/io/conftest.py).

Three lines are the user's side of the machine and are replaced, each checked verbatim: the
``pip install`` (the test venv has it), starting moto (the ``s3_server`` fixture is that very
command on a free port: the page's port 5000 is swapped for it) and ``kill %1``.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.docs.test_docs import DOCS, blocks
from tests.docs.test_walkthroughs import _user_env
from tests.io.conftest import S3Server, s3_server  # noqa: F401  (the session's moto server)

PAGE = DOCS / "quickstart-object-store.md"
PIP = "pip install torch==2.13.0 'zephon-nodes[s3]' 'moto[server]'"
MOTO = "python -m moto.server -H 127.0.0.1 -p 5000 > moto.log 2>&1 &"
KILL = "kill %1"


def typed_lines() -> list[str]:
    """The page's commands as typed: ``$ `` lines, with the heredoc lines that follow them."""
    out: list[str] = []
    for block in blocks(PAGE, "console"):
        for line in block.splitlines():
            if line.startswith("$ "):
                out.append(line[2:])
            else:
                assert out, f"{PAGE.name}: a console block starts without `$ `: {line!r}"
                out[-1] += "\n" + line
    return out


def test_quickstart_runs_as_typed(tmp_path: Path, s3_server: S3Server) -> None:  # noqa: F811
    lines = typed_lines()
    assert lines[:2] == [PIP, MOTO] and lines[-1] == KILL
    script = "\n".join(lines[2:-1]).replace("127.0.0.1:5000", f"127.0.0.1:{s3_server.port}")
    env = {k: v for k, v in _user_env().items() if not k.startswith("AWS_")}
    done = subprocess.run(
        ["bash", "-e", "-c", script],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    out = done.stdout.splitlines()
    assert out[0] == str([f"web/part-{i}.jsonl" for i in range(4)])  # the upload
    steps = [ln for ln in out if ln.startswith('{"step"')]
    assert [ln.split(",")[0] for ln in steps] == [f'{{"step": {i}' for i in range(1, 5)]
    assert out[-1] == "identical"  # s3 at dp 2 == the local copy at dp 1
    assert (tmp_path / "recipe.toml").read_text().count(f'path = "{tmp_path}/tok.model"') == 1
