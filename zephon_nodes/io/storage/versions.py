"""The versions of the optional backend libraries, checked at a backend's first use.

A backend library older than its extra pins fails in ways that name nothing of the cause
(``s3fs`` 0.4.2, which ``pip install s3fs`` resolves to beside some botocore pins, ends every
S3 read in ``AttributeError: 'S3FileSystem' object has no attribute 'loop'``). So before a
scheme's filesystem is first made, each package of its extra is compared with the version
the extra pins in ``pyproject.toml`` (:data:`PINS`; a test holds the two equal): an older
one is refused, naming the package, the version found, the one needed and the ``pip
install`` that fixes it. A newer one is accepted (the pins are what CI tested; a newer
release usually reads the same). A package that is not installed is left to the import,
whose error names the extra.
"""

from __future__ import annotations

import re
from importlib import metadata

from zephon_nodes.core.errors import DataError

__all__ = ["PINS", "check_backend", "older"]

PINS: dict[str, dict[str, str]] = {
    "s3": {"fsspec": "2026.2.0", "s3fs": "2026.2.0"},
    "gcs": {"fsspec": "2026.2.0", "gcsfs": "2026.2.0"},
    "azure": {"fsspec": "2026.2.0", "adlfs": "2024.12"},
    "hf": {"fsspec": "2026.2.0", "huggingface_hub": "0.30"},
    "http": {"fsspec": "2026.2.0", "aiohttp": "3.9"},
}
"""Per extra, the lowest version of each of its packages (``==`` and ``>=`` pins alike)."""

_CHECKED: set[str] = set()


def _release(version: str) -> tuple[int, ...]:
    """The numeric release of a version string (``"2026.2.0rc1"`` -> ``(2026, 2, 0)``)."""
    match = re.match(r"\d+(?:\.\d+)*", version.strip())
    return tuple(int(p) for p in match.group(0).split(".")) if match else ()


def older(found: str, needed: str) -> bool:
    """True if release ``found`` is below ``needed`` (missing parts count as 0)."""
    a, b = _release(found), _release(needed)
    width = max(len(a), len(b))
    return a + (0,) * (width - len(a)) < b + (0,) * (width - len(b))


def check_backend(extra: str, where: str) -> None:
    """Refuse an installed package of ``extra`` older than the extra pins (once per process).

    Args:
        extra: The extra's name (``"s3"``, ``"gcs"``, ``"azure"``, ``"hf"``, ``"http"``).
        where: What is being read (a redacted URI), named in the message.

    Raises:
        DataError: Naming the package, the version found, the one needed and the fix.
    """
    if extra in _CHECKED:
        return
    for package, needed in PINS.get(extra, {}).items():
        try:
            found = metadata.version(package)
        except metadata.PackageNotFoundError:
            continue  # the import names the extra
        if older(found, needed):
            raise DataError(
                f"{where}: {package} {found} is installed, the {extra} backend needs "
                f"{package}>={needed} (what zephon-nodes[{extra}] pins): "
                f"pip install 'zephon-nodes[{extra}]'"
            )
    _CHECKED.add(extra)
