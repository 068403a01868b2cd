"""Chat templates: the Jinja template of a ``tokenizer_config.json``, rendered as Hugging Face does.

The environment matches ``transformers``' ``apply_chat_template``: an immutable sandbox with
``trim_blocks`` and ``lstrip_blocks``, the ``loopcontrols`` extension, a ``tojson`` filter that
keeps non-ASCII text, ``raise_exception``, ``dict`` and ``namespace``, the special token texts
(``bos_token``, ``eos_token``, ...) and ``add_generation_prompt``. ``strftime_now`` is left
out on purpose: a template that would read the clock falls back to its fixed date, so the
rendered text never depends on when it ran.

Which characters are trained is found in one of two ways:

- a template with ``{% generation %} ... {% endgeneration %}`` blocks marks them itself
  (the spans ``return_assistant_tokens_mask=True`` uses);
- otherwise the assistant turn ``k`` spans from the end of the conversation's first ``k``
  messages rendered with ``add_generation_prompt=True`` (so the role header is not trained)
  to the end of its first ``k + 1`` messages rendered. This needs a *prefix-stable* template
  (each of these renderings is a prefix of the next); one that is not is refused for that
  conversation with a message saying to add generation blocks.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from zephon_nodes.core.errors import RecipeError

__all__ = ["ChatTemplate", "TemplateFailure"]

_GENERATION = re.compile(r"\{%-?\s*generation\s*-?%\}")
_SPECIAL_KEYS = (
    "bos_token",
    "eos_token",
    "unk_token",
    "pad_token",
    "sep_token",
    "cls_token",
    "mask_token",
)
_LOCAL = threading.local()


class TemplateFailure(Exception):
    """The template failed on one conversation (``raise_exception``, an error, not stable)."""


def _token_text(value: Any) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping) and isinstance(value.get("content"), str):
        return str(value["content"])  # an AddedToken as tokenizer_config.json stores it
    return None


@dataclass(frozen=True)
class ChatTemplate:
    """A chat template and the special token texts it is rendered with; picklable.

    Attributes:
        source: The Jinja template text.
        path: The file it came from (messages).
        tokens: ``(name, text)`` of the special tokens passed to the template.
    """

    source: str
    path: str
    tokens: tuple[tuple[str, str], ...] = ()

    @classmethod
    def load(
        cls, path: str | Path, *, bos_token: str | None = None, eos_token: str | None = None
    ) -> ChatTemplate:
        """Read a ``tokenizer_config.json`` (its ``chat_template``) or a Jinja template file.

        A config's ``chat_template`` may be a list of ``{"name", "template"}``: the one named
        ``"default"`` is used. ``bos_token`` / ``eos_token`` override the config's.

        Raises:
            RecipeError: If the file cannot be read, holds no template, or does not compile.
        """
        p = Path(path)
        try:
            text = p.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise RecipeError(f"cannot read chat template {p}: {e}") from None
        tokens: dict[str, str] = {}
        source = text
        if p.suffix == ".json":
            try:
                config = json.loads(text)
            except ValueError as e:
                raise RecipeError(f"{p}: not valid JSON: {e}") from None
            raw = config.get("chat_template") if isinstance(config, dict) else None
            if isinstance(raw, list):
                named = {t.get("name"): t.get("template") for t in raw if isinstance(t, dict)}
                raw = named.get("default")
            if not isinstance(raw, str):
                raise RecipeError(
                    f"{p}: no `chat_template` string (a list needs an entry named 'default'); "
                    f"give a Jinja file in chat.template"
                )
            source = raw
            for key in _SPECIAL_KEYS:
                value = _token_text(config.get(key))
                if value is not None:
                    tokens[key] = value
        if bos_token is not None:
            tokens["bos_token"] = bos_token
        if eos_token is not None:
            tokens["eos_token"] = eos_token
        out = cls(source, str(p), tuple(sorted(tokens.items())))
        try:
            out._compiled()
        except Exception as e:
            raise RecipeError(f"{p}: the chat template does not compile: {e}") from None
        return out

    def with_tokens(self, **defaults: str) -> ChatTemplate:
        """Return a copy with ``defaults`` for the special token texts it lacks."""
        tokens = dict(defaults)
        tokens.update(self.tokens)
        return ChatTemplate(self.source, self.path, tuple(sorted(tokens.items())))

    @property
    def has_generation_blocks(self) -> bool:
        """Whether the template marks trained text with ``{% generation %}`` blocks."""
        return bool(_GENERATION.search(self.source))

    def _compiled(self) -> Any:
        cache: dict[str, Any] | None = getattr(_LOCAL, "templates", None)
        if cache is None:
            cache = _LOCAL.templates = {}
        compiled = cache.get(self.source)
        if compiled is None:
            compiled = cache[self.source] = _environment().from_string(self.source)
        return compiled

    def render(self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool) -> str:
        """Render messages to text.

        Raises:
            TemplateFailure: If the template raises (``raise_exception`` or any error).
        """
        try:
            return str(
                self._compiled().render(
                    messages=list(messages),
                    tools=None,
                    documents=None,
                    add_generation_prompt=add_generation_prompt,
                    **dict(self.tokens),
                )
            )
        except Exception as e:
            raise TemplateFailure(f"{type(e).__name__}: {e}") from None

    def render_trained(
        self, messages: Sequence[Mapping[str, Any]], train_on: str
    ) -> tuple[str, list[tuple[int, int]]]:
        """Render a conversation; return its text and the character spans to train on.

        ``train_on`` is ``"assistant"``, ``"last"`` (the last assistant span only) or
        ``"all"`` (the whole text).

        Raises:
            TemplateFailure: If the template fails or is not prefix-stable (no generation
                blocks) on this conversation.
        """
        if train_on == "all":
            text = self.render(messages, False)
            return text, [(0, len(text))]
        if self.has_generation_blocks:
            text, spans = self._render_tracked(messages)
        else:
            text = self.render(messages, False)
            spans = []
            for k, message in enumerate(messages):
                if message.get("role") != "assistant":
                    continue
                before = self.render(messages[:k], True)
                upto = self.render(messages[: k + 1], False)
                if not (upto.startswith(before) and text.startswith(upto)):
                    raise TemplateFailure(
                        f"the template is not prefix-stable at message {k} (rendering the "
                        f"first messages is not a prefix of rendering more of them), so the "
                        f"assistant text cannot be located; wrap it in "
                        f"{{% generation %}}...{{% endgeneration %}} in the template"
                    )
                spans.append((len(before), len(upto)))
        spans = [(a, b) for a, b in spans if b > a]
        if train_on == "last":
            spans = spans[-1:]
        return text, spans

    def _render_tracked(
        self, messages: Sequence[Mapping[str, Any]]
    ) -> tuple[str, list[tuple[int, int]]]:
        compiled = self._compiled()
        blocks: list[str] = []
        spans: list[tuple[int, int]] = []
        try:
            with compiled.environment.track_generation(blocks, spans):
                for block in compiled.generate(
                    messages=list(messages),
                    tools=None,
                    documents=None,
                    add_generation_prompt=False,
                    **dict(self.tokens),
                ):
                    blocks.append(block)
        except Exception as e:
            raise TemplateFailure(f"{type(e).__name__}: {e}") from None
        return "".join(blocks), spans


def _environment() -> Any:
    """A sandboxed Jinja environment configured as ``transformers`` configures its own."""
    try:
        import jinja2
        import jinja2.ext
        from jinja2.sandbox import ImmutableSandboxedEnvironment
    except ImportError:
        raise RecipeError("[chat] recipes need jinja2: pip install 'zephon-nodes[chat]'") from None

    class GenerationTracker(jinja2.ext.Extension):
        """``{% generation %}...{% endgeneration %}``: records the character span rendered."""

        tags = {"generation"}  # noqa: RUF012 - jinja2's Extension API

        def __init__(self, environment: Any) -> None:
            super().__init__(environment)
            environment.extend(track_generation=self.track)
            self._blocks: list[str] | None = None
            self._spans: list[tuple[int, int]] | None = None

        def parse(self, parser: Any) -> Any:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            call = self.call_method("_support")
            return jinja2.nodes.CallBlock(call, [], [], body).set_lineno(lineno)

        def _support(self, caller: Any) -> str:
            rendered = str(caller())
            if self._blocks is not None and self._spans is not None:
                start = sum(len(b) for b in self._blocks)
                self._spans.append((start, start + len(rendered)))
            return rendered

        @contextmanager
        def track(self, blocks: list[str], spans: list[tuple[int, int]]) -> Any:
            self._blocks, self._spans = blocks, spans
            try:
                yield
            finally:
                self._blocks = self._spans = None

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    def tojson(
        x: Any,
        ensure_ascii: bool = False,
        indent: int | None = None,
        separators: Any = None,
        sort_keys: bool = False,
    ) -> str:
        return json.dumps(
            x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
        )

    class Namespace(jinja2.utils.Namespace):
        """A namespace that refuses underscore names (no way into Python internals)."""

        def __setitem__(self, name: str, value: Any) -> None:
            if isinstance(name, str) and name.startswith("_"):
                raise jinja2.exceptions.SecurityError(f"namespace attribute {name!r} refused")
            super().__setitem__(name, value)

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[GenerationTracker, jinja2.ext.loopcontrols],
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["dict"] = dict
    env.globals["namespace"] = Namespace
    return env
