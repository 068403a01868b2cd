"""Named user code a recipe may refer to: filters, maps and tokenizers.

A recipe file never imports or runs code. Python code registers functions and tokenizers
under a name (and a version string, part of the recipe fingerprint), and the recipe names
them::

    import zephon_nodes

    def long_enough(text: str, min_words: int = 50) -> bool:
        return len(text.split()) >= min_words

    zephon_nodes.register_filter("long_enough", long_enough, version="1")

Registrations are per process. The process runner pickles the operator, which holds the
function itself: a module-level function pickles by reference (its module is imported in the
worker), a lambda does not pickle.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from zephon_nodes.core.errors import RecipeError

__all__ = [
    "Registered",
    "lookup",
    "register_filter",
    "register_map",
    "register_tokenizer",
    "registered_names",
]

KINDS = ("filter", "map", "tokenizer")


@dataclass(frozen=True)
class Registered:
    """A registered object.

    Attributes:
        kind: ``"filter"``, ``"map"`` or ``"tokenizer"``.
        name: Name the recipe uses.
        obj: The function (filters, maps), or a tokenizer object or zero-argument factory.
        version: Free-form version string, part of the recipe fingerprint: change it when
            the code changes its output.
    """

    kind: str
    name: str
    obj: Any
    version: str


_REGISTRY: dict[tuple[str, str], Registered] = {}
_LOCK = threading.Lock()


def _register(kind: str, name: str, obj: Any, version: str) -> None:
    if not isinstance(name, str) or not name:
        raise RecipeError(f"a registered {kind} needs a non-empty name, got {name!r}")
    if not isinstance(version, str):
        raise RecipeError(f"{kind} {name!r}: version={version!r} must be a string")
    with _LOCK:
        _REGISTRY[(kind, name)] = Registered(kind, name, obj, version)


def register_filter(name: str, fn: Callable[..., bool], version: str = "") -> None:
    """Register ``fn(text, **params) -> bool`` (keep the document when True) as a filter.

    Args:
        name: Name used by ``[[operators]] filter = "name"`` in recipes.
        fn: The predicate; must be deterministic and free of side effects.
        version: Change it when ``fn`` changes which documents it keeps.
    """
    _register("filter", name, fn, version)


def register_map(name: str, fn: Callable[..., str], version: str = "") -> None:
    """Register ``fn(text, **params) -> str`` as a map over document texts.

    Args:
        name: Name used by ``[[operators]] map = "name"`` in recipes.
        fn: The transformation; must be deterministic and free of side effects.
        version: Change it when ``fn`` changes its output.
    """
    _register("map", name, fn, version)


def register_tokenizer(name: str, tokenizer: Any, version: str = "") -> None:
    """Register a tokenizer object (or a zero-argument factory returning one).

    The object implements :class:`~zephon_nodes.operators.tokenize.Tokenizer`: attributes
    ``bos_id``, ``eos_id``, ``pad_id`` (-1 if none), ``vocab_size`` and a method
    ``encode_batch(texts) -> list[list[int]]`` (ids without bos/eos). Recipes name it with
    ``[tokenizer] kind = "custom", name = "..."``.

    Args:
        name: The name.
        tokenizer: The tokenizer, or a callable taking no argument that builds it.
        version: Change it when the tokenizer's output changes (part of the fingerprint).
    """
    _register("tokenizer", name, tokenizer, version)


def lookup(kind: str, name: str) -> Registered:
    """Return the registration of ``name``.

    Raises:
        RecipeError: If nothing is registered under that name.
    """
    got = _REGISTRY.get((kind, name))
    if got is None:
        known = registered_names(kind)
        raise RecipeError(
            f"no {kind} registered under the name {name!r} (registered: {known}); call "
            f"zephon_nodes.register_{kind}({name!r}, ...) before loading the recipe"
        )
    return got


def registered_names(kind: str) -> list[str]:
    """Return the names registered for ``kind``, sorted."""
    return sorted(n for k, n in _REGISTRY if k == kind)


def _min_chars(text: str, n: int = 1) -> bool:
    return len(text) >= n


def _max_chars(text: str, n: int) -> bool:
    return len(text) <= n


def _strip(text: str) -> str:
    return text.strip()


register_filter("min_chars", _min_chars, version="builtin-1")
register_filter("max_chars", _max_chars, version="builtin-1")
register_map("strip", _strip, version="builtin-1")
