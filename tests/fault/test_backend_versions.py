"""An optional backend library older than its extra pins is named, with the fix (issue 35,
item 6): a fake old ``s3fs`` (a dist-info directory first on ``sys.path``), no downgrade."""

from __future__ import annotations

import re
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

from zephon_nodes import DataError
from zephon_nodes.cli import main
from zephon_nodes.io.storage import storage, versions

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def fresh(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No backend checked yet, no filesystem made yet in this process."""
    monkeypatch.setattr(versions, "_CHECKED", set())
    storage._forget_filesystems()
    yield
    storage._forget_filesystems()


def fake_distribution(root: Path, name: str, version: str) -> Path:
    """A dist-info directory that makes ``importlib.metadata.version(name)`` say ``version``."""
    info = root / f"{name}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    return root


def test_pins_are_the_extras_of_pyproject() -> None:
    """PINS holds, per storage extra, the lowest version pyproject.toml allows for each package."""
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    expected = {}
    for extra in {e for _, _, e in storage.BACKENDS.values()}:
        pins = {}
        for requirement in extras[extra]:
            m = re.fullmatch(r"([A-Za-z0-9_.-]+)\s*(==|>=)\s*([0-9.]+)", requirement.strip())
            assert m, requirement
            pins[m.group(1)] = m.group(3)
        expected[extra] = pins
    assert expected == versions.PINS


def test_an_old_s3fs_is_named_with_the_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fresh: None
) -> None:
    monkeypatch.syspath_prepend(str(fake_distribution(tmp_path / "site", "s3fs", "0.4.2")))
    with pytest.raises(DataError) as e:
        storage.filesystem("s3://bucket/data/x.jsonl")
    message = str(e.value)
    for part in ("s3fs 0.4.2", "s3fs>=2026.2.0", "pip install 'zephon-nodes[s3]'", "s3://bucket"):
        assert part in message, message


def test_the_cli_says_it_in_one_line(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    fresh: None,
) -> None:
    monkeypatch.syspath_prepend(str(fake_distribution(tmp_path / "site", "fsspec", "2023.1.0")))
    recipe = tmp_path / "r.toml"
    recipe.write_text(
        'seed = 1\nnum_lanes = 2\nglobal_batch_size = 2\nseq_len = 8\n[tokenizer]\nkind = "bytes"\n'
        '[[datasets]]\nname = "d"\npaths = ["s3://bucket/*.jsonl"]\n'
    )
    assert main(["explain", str(recipe)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    assert "fsspec 2023.1.0" in err and "fsspec>=2026.2.0" in err, err
    assert "pip install 'zephon-nodes[s3]'" in err and "Traceback" not in err


@pytest.mark.parametrize(
    ("found", "needed", "old"),
    [
        ("0.4.2", "2026.2.0", True),
        ("2026.2.0", "2026.2.0", False),
        ("2026.2", "2026.2.0", False),
        ("2026.1.9", "2026.2.0", True),
        ("2026.10.0", "2026.2.0", False),
        ("3.9.0rc1", "3.9", False),
        ("1.33.0", "0.30", False),
    ],
)
def test_older(found: str, needed: str, old: bool) -> None:
    assert versions.older(found, needed) is old


def test_installed_versions_pass(fresh: None) -> None:
    """Control: the installed test extras are accepted (the check refuses nothing they pin)."""
    for extra in versions.PINS:
        versions.check_backend(extra, "x")
