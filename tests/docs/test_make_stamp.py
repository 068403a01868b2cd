"""`make demo` / `make test` run pip only when pyproject.toml or the extras changed (issue 26.3).

The Makefile's install targets run in a scratch copy with ``PIP`` replaced by ``echo``, so the
test sees which pip commands would run without installing anything.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def make(cwd: Path, target: str) -> str:
    out = subprocess.run(
        # SYSTEM_PACKAGES= : no apt-get here (test_missing_system_package_is_one_line checks it).
        [
            *("make", "-s", target, "VENV=v", "PIP=echo PIP", f"PYTHON={sys.executable}"),
            "SYSTEM_PACKAGES=",
        ],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return out.stdout


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make (CI runs the Makefile)")
def test_second_install_skips_pip(tmp_path: Path) -> None:
    """Installed once, a second run is a no-op; a test install covers the demo's; an edited
    pyproject.toml installs again."""
    for name in (
        "Makefile",
        "pyproject.toml",
        ".ci/node/package.json",
        ".ci/node/package-lock.json",
    ):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / name, tmp_path / name)
    # Azurite's npm install is up to date (its own stamp; npm is not what this test checks).
    (tmp_path / ".ci/node/node_modules").mkdir()
    (tmp_path / ".ci/node/node_modules/.installed").touch()
    (tmp_path / "v" / "bin").mkdir(parents=True)
    (tmp_path / "v" / "bin" / "python").symlink_to(sys.executable)
    first = make(tmp_path, "install")
    assert "PIP install -q -e ." in first
    stamp = (tmp_path / "v" / ".installed-base").read_text()
    assert stamp.startswith("torch==2.13.0 extras=[] pyproject=")
    second = make(tmp_path, "install")
    assert "PIP install" not in second and "up to date" in second
    (tmp_path / "v" / ".installed-base").unlink()
    assert "PIP install -q -e .[test," in make(tmp_path, "install-test")
    assert "PIP install" not in make(tmp_path, "install")  # the test extras hold the demo's
    assert "PIP install" not in make(tmp_path, "install-test")
    with open(tmp_path / "pyproject.toml", "a") as f:
        f.write("\n# changed\n")
    assert "PIP install -q -e .\n" in make(tmp_path, "install")
    assert "PIP install -q -e .[test," in make(tmp_path, "install-test")


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make (CI runs the Makefile)")
def test_missing_system_package_is_one_line(tmp_path: Path) -> None:
    """A system package the tests need that apt-get cannot install (or without root) stops
    `make test` before any test with one line naming the package and how to install it
    (issue 36.3: not 17 test errors)."""
    shutil.copy(REPO / "Makefile", tmp_path / "Makefile")
    base = ["make", "-s", "system-packages", "SYSTEM_PACKAGES=sh:sh zephonnocmd:zephon-no-pkg"]
    present = subprocess.run(
        [*base[:3], "SYSTEM_PACKAGES=sh:sh"], cwd=tmp_path, capture_output=True, text=True
    )
    assert present.returncode == 0 and present.stdout == present.stderr == ""
    for apt_get in ("false", "zephon-no-apt-get"):  # apt-get fails; no apt-get at all
        out = subprocess.run(
            [*base, f"APT_GET={apt_get}", f"APT_LOG={tmp_path / 'apt.log'}"],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.returncode != 0
        errors = [line for line in out.stderr.splitlines() if line.startswith("error:")]
        assert len(errors) == 1, out.stderr
        assert "zephon-no-pkg" in errors[0] and "apt-get install -y zephon-no-pkg" in errors[0]
        assert "sh " not in errors[0].split("install -y")[1]  # only the missing one is named


def test_missing_server_refuses_its_tests_in_one_line() -> None:
    """Without nginx, the tests that need it are refused with one line naming the package and
    the session fails; the others still run (issue 36.3: not one error per test)."""
    out = subprocess.run(
        [
            *(sys.executable, "-m", "pytest", "-q", "-p", "tests.docs.missing_nginx_plugin"),
            *("-p", "no:cacheprovider", "--collect-only", "tests/io/test_http_range.py"),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 1, out.stdout + out.stderr
    errors = [line for line in out.stdout.splitlines() if line.startswith("ERROR:")]
    assert errors == [
        "ERROR: 2 storage tests refused: nginx is not installed (the HTTP server of the storage "
        "tests): `sudo apt-get install nginx`, or `make test`, which installs it"
    ]
    assert "4/6 tests collected (2 deselected)" in out.stdout
