"""The OpenAI-compatible servers known by name, and Azure OpenAI's addressing.

A preset is what ``resolve_model("ollama:qwen2.5")`` needs to know about a server that speaks
Chat Completions: where it listens by default, which variables configure it, whether it wants
a key, and which parts of the wire it does not honour. The wire itself is the OpenAI adapter's
(``providers/openai.py``, which turns ``tool_choice`` support into a ``Dialect``); this module
is data and small checks only, so the resolver can read it without loading httpx.

``tool_choice`` support, per server (docs/llm-port.md, "Presets"):

- ``"full"``: ``"required"``, ``"none"`` and a named function, as OpenAI takes them;
- ``"modes"``: the three words but not the named-function object (llama.cpp's server reads
  ``tool_choice`` as a string and takes the object for ``"auto"``), so a named tool is sent as
  ``"required"`` with that tool alone in ``tools``: the same constraint in words it knows;
- ``"ignored"``: no ``tool_choice`` at all (Ollama's OpenAI compatibility lists it as
  unsupported), so none is sent: ``"none"`` sends no tools, a named tool sends that tool alone,
  and ``"required"`` cannot be enforced (the reply is returned as the model gives it).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal
from urllib.parse import unquote, urlsplit

from ..errors import ConfigurationError
from ..safety import check_base_url

__all__ = [
    "AZURE_DEFAULT_API_VERSION",
    "MAX_AZURE_DEPLOYMENT_CHARS",
    "PRESETS",
    "Preset",
    "ToolChoiceSupport",
    "azure_features",
    "check_azure_api_version",
    "check_azure_deployment",
    "check_azure_endpoint",
    "ollama_host_url",
    "with_default_path",
]

ToolChoiceSupport = Literal["full", "modes", "ignored"]


@dataclass(frozen=True)
class Preset:
    """One OpenAI-compatible server family (module doc)."""

    name: str  # the provider key: "ollama" in "ollama:qwen2.5"
    label: str  # its name in messages
    base_url: str  # where it listens by default
    api_key_var: str
    base_url_var: str
    key_required: bool  # hosted: yes; a local server takes one only if configured to
    tool_choice: ToolChoiceSupport = "full"
    default_path: str = "/v1"  # added to a configured base URL that has no path
    model_fault_codes: frozenset[str] = frozenset()  # 400 codes that blame the model's output


PRESETS: dict[str, Preset] = {p.name: p for p in (
    Preset("ollama", "Ollama", "http://127.0.0.1:11434/v1", "OLLAMA_API_KEY", "OLLAMA_BASE_URL",
           key_required=False, tool_choice="ignored"),
    Preset("vllm", "vLLM", "http://127.0.0.1:8000/v1", "VLLM_API_KEY", "VLLM_BASE_URL",
           key_required=False),
    Preset("llamacpp", "llama.cpp server", "http://127.0.0.1:8080/v1", "LLAMACPP_API_KEY",
           "LLAMACPP_BASE_URL", key_required=False, tool_choice="modes"),
    Preset("lmstudio", "LM Studio", "http://127.0.0.1:1234/v1", "LMSTUDIO_API_KEY",
           "LMSTUDIO_BASE_URL", key_required=False),
    Preset("openrouter", "OpenRouter", "https://openrouter.ai/api/v1", "OPENROUTER_API_KEY",
           "OPENROUTER_BASE_URL", key_required=True, default_path="/api/v1"),
    # Groq answers 400 "tool_use_failed" when the model wrote a malformed call: the model's
    # output, not the request, so a new sample may well work (transient)
    Preset("groq", "Groq", "https://api.groq.com/openai/v1", "GROQ_API_KEY", "GROQ_BASE_URL",
           key_required=True, default_path="/openai/v1",
           model_fault_codes=frozenset({"tool_use_failed"})),
    Preset("together", "Together AI", "https://api.together.ai/v1", "TOGETHER_API_KEY",
           "TOGETHER_BASE_URL", key_required=True),
)}


def with_default_path(url: str, preset: Preset) -> str:
    """``url`` with the preset's API path added when it has none (``OLLAMA_BASE_URL`` is often
    set to ``http://localhost:11434``, the native API's root, in other tools)."""
    try:
        path = urlsplit(url).path
    except ValueError:  # check_base_url says what is wrong with it
        return url
    return url.rstrip("/") + preset.default_path if path in ("", "/") else url


_OLLAMA_PORT = 11434
_UNSPECIFIED = {"0.0.0.0": "127.0.0.1", "::": "::1", "[::]": "[::1]", "": "127.0.0.1"}


def ollama_host_url(host: str) -> str:
    """The base URL ``OLLAMA_HOST`` (``host[:port]``, optionally with a scheme) points at.

    It is the address the server binds, so one bound to every address (``0.0.0.0``, ``::``)
    is reached on loopback; the port defaults to 11434 as Ollama's does (443 for https)."""
    value = host.strip()
    scheme, sep, rest = value.partition("://")
    if not sep:
        scheme, rest = "http", value
    hostport = rest.split("/", 1)[0]
    if hostport.startswith("["):  # [::1]:11434
        name, _, tail = hostport.partition("]")
        name, port = name + "]", tail.removeprefix(":")
    elif hostport.count(":") == 1:
        name, port = hostport.split(":")
    else:
        name, port = hostport, ""
    name = _UNSPECIFIED.get(name, name)
    if ":" in name and not name.startswith("["):  # a bare IPv6 address
        name = f"[{name}]"
    return f"{scheme}://{name}:{port or (443 if scheme == 'https' else _OLLAMA_PORT)}/v1"


# -- Azure OpenAI --------------------------------------------------------------------------

AZURE_DEFAULT_API_VERSION = "2024-10-21"
"""The latest generally available ``api-version`` of Azure OpenAI's inference API (its REST
reference, "Data plane - inference"); override with ``OPENAI_API_VERSION`` / ``api_version=``."""

_API_VERSION = re.compile(r"([0-9]{4})-([0-9]{2})-([0-9]{2})(-preview)?")  # ASCII digits only
_DEPLOYMENT = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
MAX_AZURE_DEPLOYMENT_CHARS = 64
"""The longest deployment name taken. Azure's REST specification gives deployments no limit
of their own; 64 is the limit it gives the account (the resource) and most of its names."""
# The release (2024-09-01-preview) that added stream_options and max_completion_tokens;
# every version from that date on has both (2024-10-21 GA included).
_STREAM_USAGE_SINCE = (2024, 9, 1)


def check_azure_api_version(version: str) -> None:
    """Raise ``ConfigurationError`` unless ``version`` is a dated ``api-version``
    (``2024-10-21``, ``2025-04-01-preview``): it goes into the URL's query."""
    if not _API_VERSION.fullmatch(version):
        raise ConfigurationError(
            f"Azure OpenAI api-version {version[:40]!r} is not a dated version such as "
            f"{AZURE_DEFAULT_API_VERSION!r} or '2025-04-01-preview' (set OPENAI_API_VERSION "
            "or pass api_version=)"
        )


def azure_features(version: str) -> bool:
    """Whether ``version`` takes ``stream_options`` and ``max_completion_tokens`` (older ones
    answer 400 "Unrecognized request argument supplied")."""
    m = _API_VERSION.fullmatch(version)
    return m is not None and (int(m[1]), int(m[2]), int(m[3])) >= _STREAM_USAGE_SINCE


def check_azure_deployment(deployment: str) -> None:
    """Raise ``ConfigurationError`` unless ``deployment`` can stand as one URL path segment
    (letters, digits, ``.``, ``_``, ``-``; at most ``MAX_AZURE_DEPLOYMENT_CHARS``): it is put
    into the request's path."""
    if len(deployment) > MAX_AZURE_DEPLOYMENT_CHARS:
        raise ConfigurationError(
            f"Azure OpenAI deployment name {deployment[:40]!r}... is {len(deployment)} "
            f"characters long, more than the {MAX_AZURE_DEPLOYMENT_CHARS} a name may have: use "
            "the name given to the deployment in Azure, as in 'azure:my-gpt-4o'"
        )
    if not _DEPLOYMENT.fullmatch(deployment):
        raise ConfigurationError(
            f"Azure OpenAI deployment name {deployment!r} is not a deployment name: use "
            "the name given to the deployment in Azure (letters, digits, '.', '_', '-'), as "
            "in 'azure:my-gpt-4o'"
        )


def check_azure_endpoint(endpoint: str) -> None:
    """Raise ``ConfigurationError`` if ``endpoint`` cannot be a resource's root: a URL
    ``check_base_url`` refuses (userinfo, a query, a fragment, plain http to a remote host),
    or one whose path already holds the API's (an ``openai`` segment): the adapter adds
    ``/openai/deployments/...`` to it itself."""
    check_base_url(endpoint, "Azure OpenAI", "endpoint")  # so it parses, past here
    path = unquote(urlsplit(endpoint).path).lower()  # %6fpenai is openai to the server
    if "openai" in path.split("/"):
        raise ConfigurationError(
            "the Azure OpenAI endpoint is the resource's root, such as "
            "https://<resource>.openai.azure.com, not a URL with /openai... in its path "
            "(set AZURE_OPENAI_ENDPOINT or pass base_url=)"
        )
