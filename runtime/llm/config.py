"""Where settings come from: the process environment, then a ``.env`` file.

Explicit arguments beat both (that is the resolver's job); the environment beats the file so
a deployment can override a developer's ``.env`` without editing it. The ``.env`` parser is
the small common subset (``KEY=VALUE``, ``export`` prefix, quotes, comments): no dependency.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from .providers.presets import PRESETS

DEFAULT_MODEL_VAR = "CELLDIALOG_MODEL"
"""Names the model ``resolve_model`` uses when it is given none (``provider:model`` allowed)."""


@dataclass(frozen=True)
class ProviderVars:
    """The variables one provider is configured by. ``more_keys`` are read, in order, when
    ``api_key`` is unset; ``key_required`` is False for a server that usually runs without a
    key (a local one: its key variable is read and sent when set, never demanded)."""

    api_key: str
    base_url: str
    key_required: bool = True
    more_keys: tuple[str, ...] = ()


AZURE_API_VERSION_VAR = "OPENAI_API_VERSION"
"""The Azure OpenAI ``api-version`` (the name Microsoft's SDK reads)."""
AZURE_TOKEN_VAR = "AZURE_OPENAI_AD_TOKEN"
"""A Microsoft Entra ID bearer token for Azure OpenAI (the name Microsoft's SDK reads)."""
OLLAMA_HOST_VAR = "OLLAMA_HOST"
"""Ollama's own ``host[:port]`` setting, read when ``OLLAMA_BASE_URL`` is unset."""

PROVIDER_VARS: dict[str, ProviderVars] = {
    "anthropic": ProviderVars("ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL"),
    "openai": ProviderVars("OPENAI_API_KEY", "OPENAI_BASE_URL"),
    # GEMINI_API_KEY first: GOOGLE_API_KEY is Google Cloud's general name and may hold a key
    # for another API (google-genai prefers GOOGLE_API_KEY when both are set)
    "gemini": ProviderVars("GEMINI_API_KEY", "GEMINI_BASE_URL", more_keys=("GOOGLE_API_KEY",)),
    "azure": ProviderVars("AZURE_OPENAI_API_KEY", "AZURE_OPENAI_ENDPOINT"),
    **{p.name: ProviderVars(p.api_key_var, p.base_url_var, key_required=p.key_required)
       for p in PRESETS.values()},
}
"""One entry per set of variables; ``SHARED_VARS`` maps the providers that read another's."""

SHARED_VARS: dict[str, str] = {"openai-responses": "openai"}
"""Providers configured by another provider's variables (the Responses API is OpenAI's)."""


def provider_vars(provider: str) -> ProviderVars:
    """The variables ``provider`` reads (``KeyError`` for one that reads none)."""
    return PROVIDER_VARS[SHARED_VARS.get(provider, provider)]

_LINE = re.compile(r"^\s*(?:export\s+)?([A-Za-z_][A-Za-z0-9_.]*)\s*=\s*(.*?)\s*$")
_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", '"': '"', "\\": "\\"}


_SINGLE = re.compile(r"'([^']*)'")
_DOUBLE = re.compile(r'"((?:[^"\\]|\\.)*)"')


def _unquote(value: str) -> str:
    """A quoted value ends at its closing quote (a comment may follow); double quotes take
    backslash escapes. Unquoted, `` #`` starts a comment."""
    if m := _SINGLE.match(value):
        return m[1]
    if m := _DOUBLE.match(value):
        return re.sub(r"\\(.)", lambda e: _ESCAPES.get(e[1], e[0]), m[1])
    return re.split(r"\s+#", value, maxsplit=1)[0]


def parse_dotenv(text: str) -> dict[str, str]:
    """``KEY=VALUE`` pairs of a ``.env`` text; blank, comment and malformed lines are skipped."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        if line.lstrip().startswith("#"):
            continue
        m = _LINE.match(line)
        if m:
            out[m[1]] = _unquote(m[2])
    return out


def read_dotenv(path: str | os.PathLike[str]) -> dict[str, str]:
    """The pairs of the ``.env`` file at ``path``; a missing file is simply empty."""
    try:
        return parse_dotenv(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}


class Settings:
    """Layered lookup: ``env`` (default ``os.environ``), then the ``.env`` file (default
    ``./.env``), read once and only if needed. Empty values count as unset."""

    def __init__(
        self,
        env: Mapping[str, str] | None = None,
        dotenv_path: str | os.PathLike[str] | None = None,
    ) -> None:
        self._env = os.environ if env is None else env
        self._dotenv_path = Path(".env") if dotenv_path is None else Path(dotenv_path)
        self._dotenv: dict[str, str] | None = None

    def __repr__(self) -> str:  # values may be secrets: never shown
        return f"Settings(dotenv_path={str(self._dotenv_path)!r})"

    def get(self, key: str) -> str | None:
        value = self._env.get(key)
        if value:
            return value
        if self._dotenv is None:
            self._dotenv = read_dotenv(self._dotenv_path)
        return self._dotenv.get(key) or None
