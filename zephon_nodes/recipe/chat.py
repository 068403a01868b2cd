"""The recipe's ``[chat]`` table: conversations rendered with a chat template, SFT labels."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from zephon_nodes.core.errors import RecipeError
from zephon_nodes.recipe.bounds import unknown_keys

__all__ = ["DEFAULT_ROLES", "TRAIN_ON", "ChatSpec"]

TRAIN_ON = ("assistant", "last", "all")
DEFAULT_ROLES = ("system", "user", "assistant", "tool")


@dataclass(frozen=True)
class ChatSpec:
    """How conversation records become token ids and labels (the ``[chat]`` recipe table).

    Each record's ``messages_field`` holds a list of ``{"role", "content"}`` messages. The
    list is rendered with the tokenizer's chat template (Jinja, rendered as Hugging Face's
    ``apply_chat_template`` does), the text is tokenized whole, and only the tokens of the
    trained turns get labels (-100 elsewhere).

    Args:
        messages_field: Record field holding the messages.
        template: A ``tokenizer_config.json`` (its ``chat_template``, and ``bos_token`` /
            ``eos_token``) or a Jinja template file, relative to the recipe. ``None``: the
            ``tokenizer_config.json`` next to an ``hf`` tokenizer file.
        train_on: ``"assistant"`` (every assistant turn), ``"last"`` (the last assistant
            turn only) or ``"all"`` (every token).
        roles: The roles a message may have; another role is a bad record.
        bos_token: Text of the bos token given to the template (``None``: from the
            ``tokenizer_config.json``, else the tokenizer's bos piece).
        eos_token: Text of the eos token given to the template (as ``bos_token``).
    """

    messages_field: str = "messages"
    template: Path | None = None
    train_on: str = "assistant"
    roles: tuple[str, ...] = DEFAULT_ROLES
    bos_token: str | None = None
    eos_token: str | None = None

    def __post_init__(self) -> None:
        if self.train_on not in TRAIN_ON:
            raise RecipeError(f"chat.train_on={self.train_on!r} must be one of {TRAIN_ON}")
        if not self.messages_field:
            raise RecipeError("chat.messages_field must be a non-empty string")
        if not self.roles or not all(isinstance(r, str) and r for r in self.roles):
            raise RecipeError(f"chat.roles={self.roles!r} must be a list of non-empty strings")
        if self.train_on != "all" and "assistant" not in self.roles:
            raise RecipeError(
                f"chat.roles={list(self.roles)} lacks 'assistant', so train_on="
                f"{self.train_on!r} would train on nothing"
            )

    @classmethod
    def from_table(cls, table: Mapping[str, Any], base: Path, where: str) -> ChatSpec:
        """Build from the parsed ``[chat]`` TOML table (paths relative to ``base``)."""
        known = {"messages_field", "template", "train_on", "roles", "bos_token", "eos_token"}
        unknown = sorted(set(table) - known)
        if unknown:
            raise RecipeError(unknown_keys(where, unknown, ()))
        for key in ("messages_field", "template", "train_on", "bos_token", "eos_token"):
            if key in table and not isinstance(table[key], str):
                raise RecipeError(f"{where}.{key}={table[key]!r} must be a string")
        roles = table.get("roles", list(DEFAULT_ROLES))
        if not isinstance(roles, list):
            raise RecipeError(f"{where}.roles={roles!r} must be a list of strings")
        template = table.get("template")
        return cls(
            messages_field=table.get("messages_field", "messages"),
            template=base / template if template is not None else None,
            train_on=table.get("train_on", "assistant"),
            roles=tuple(roles),
            bos_token=table.get("bos_token"),
            eos_token=table.get("eos_token"),
        )

    def template_path(self, tokenizer_path: Path | None) -> Path:
        """Return the template file: ``template``, else ``tokenizer_config.json`` beside it.

        Raises:
            RecipeError: If neither is given or the file does not exist.
        """
        if self.template is not None:
            path = Path(self.template)
        elif tokenizer_path is not None:
            path = Path(tokenizer_path).parent / "tokenizer_config.json"
        else:
            raise RecipeError(
                "chat.template is required with this tokenizer kind (a tokenizer_config.json "
                "or a Jinja template file)"
            )
        if not path.is_file():
            raise RecipeError(f"chat template file not found: {path} (set chat.template)")
        return path

    def canonical(self, tokenizer_path: Path | None) -> dict[str, Any]:
        """Data-defining fields, with the template file's SHA-256 (not its path)."""
        digest = hashlib.sha256(self.template_path(tokenizer_path).read_bytes()).hexdigest()
        return {
            "messages_field": self.messages_field,
            "template_sha256": digest,
            "train_on": self.train_on,
            "roles": list(self.roles),
            "bos_token": self.bos_token,
            "eos_token": self.eos_token,
        }
