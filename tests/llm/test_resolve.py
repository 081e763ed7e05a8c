"""Model name resolution, configuration layering (.env < environment < arguments), catalog.

Azure's resolution is tested in ``test_azure.py`` and the presets' in ``test_presets.py``;
Gemini and the Responses API are resolved here by settings only (their adapters are theirs).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from runtime.llm import ConfigurationError, catalog
from runtime.llm.config import Settings, parse_dotenv, read_dotenv
from runtime.llm.resolve import model_settings, parse_model_name, resolve_model

SECRET = "sk-resolve-SECRET-9f8e7d"


@pytest.mark.parametrize(
    ("name", "provider", "want"),
    [
        ("claude-sonnet-4-5", None, ("anthropic", "claude-sonnet-4-5")),
        ("claude-3-haiku-20240307", None, ("anthropic", "claude-3-haiku-20240307")),
        ("gpt-4.1-mini", None, ("openai", "gpt-4.1-mini")),
        ("chatgpt-4o-latest", None, ("openai", "chatgpt-4o-latest")),
        ("o1", None, ("openai", "o1")),
        ("o3-mini", None, ("openai", "o3-mini")),
        ("o4-mini", None, ("openai", "o4-mini")),
        ("  gpt-5  ", None, ("openai", "gpt-5")),
        ("anthropic:claude-opus-4-5", None, ("anthropic", "claude-opus-4-5")),
        ("openai:llama3.1:8b", None, ("openai", "llama3.1:8b")),
        ("OpenAI:qwen2.5", None, ("openai", "qwen2.5")),
        ("llama3.1:8b", "openai", ("openai", "llama3.1:8b")),  # explicit provider wins
        ("claude-sonnet-4-5", "openai", ("openai", "claude-sonnet-4-5")),  # e.g. a gateway
        ("openai:gpt-5", "openai", ("openai", "gpt-5")),
        ("sonnet", None, ("anthropic", "claude-sonnet-4-5")),
        ("Haiku", None, ("anthropic", "claude-haiku-4-5")),
        ("opus", None, ("anthropic", "claude-opus-4-5")),
        ("gpt", None, ("openai", "gpt-5")),
        ("mini", None, ("openai", "gpt-5-mini")),
        ("mini", "openai", ("openai", "gpt-5-mini")),
        ("mini", "anthropic", ("anthropic", "mini")),  # alias of another provider: verbatim
        ("gemini-2.5-flash", None, ("gemini", "gemini-2.5-flash")),
        ("gemini-3-pro-preview", None, ("gemini", "gemini-3-pro-preview")),
        ("gemini:gemini-2.5-pro", None, ("gemini", "gemini-2.5-pro")),
        ("flash", None, ("gemini", "gemini-2.5-flash")),
        ("flash-lite", "gemini", ("gemini", "gemini-2.5-flash-lite")),
        ("openai-responses:gpt-5", None, ("openai-responses", "gpt-5")),
        ("openai-responses:mini", None, ("openai-responses", "gpt-5-mini")),  # OpenAI's aliases
        ("o3", "openai-responses", ("openai-responses", "o3")),
        ("azure:gpt-4o-prod", None, ("azure", "gpt-4o-prod")),
        ("mini", "azure", ("azure", "mini")),  # a deployment is named by its owner
        ("ollama:qwen2.5:7b", None, ("ollama", "qwen2.5:7b")),
        ("openrouter:anthropic/claude-sonnet-4.5", None,
         ("openrouter", "anthropic/claude-sonnet-4.5")),
        ("GROQ:llama-3.3-70b-versatile", None, ("groq", "llama-3.3-70b-versatile")),
    ],
)
def test_parse_model_name(name: str, provider: str | None, want: tuple[str, str]) -> None:
    assert parse_model_name(name, provider) == want


@pytest.mark.parametrize("name", ["llama3", "mistral-large", "ollama", "omni", "gemini", "azure"])
def test_unknown_name_lists_the_options(name: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        parse_model_name(name)
    msg = str(info.value)
    assert repr(name) in msg
    for option in ("claude-", "gpt-", "o3", "gemini-", "provider:model", "anthropic", "openai",
                   "openai-responses", "gemini", "azure", "ollama", "vllm", "llamacpp",
                   "lmstudio", "openrouter", "groq", "together", "sonnet", "mini", "flash"):
        assert option in msg


@pytest.mark.parametrize(
    ("name", "provider", "fragment"),
    [
        ("", None, "empty model name"),
        ("anthropic:", None, "no model after"),
        ("gpt-5", "google", "unknown provider 'google'"),
        ("anthropic:claude-x", "openai", "names provider 'anthropic'"),
        ("scripted:anything", None, "ScriptedModel"),
        ("anything", "scripted", "ScriptedModel"),
    ],
)
def test_bad_names_and_providers(name: str, provider: str | None, fragment: str) -> None:
    with pytest.raises(ConfigurationError, match=fragment):
        parse_model_name(name, provider)


# -- configuration layering -------------------------------------------------------------


def dotenv(tmp_path: Path, text: str) -> Path:
    path = tmp_path / ".env"
    path.write_text(text)
    return path


def test_dotenv_parsing() -> None:
    text = """
# a comment
export A=1
B = "two words"   # trailing comment
C='single # not a comment'
D=plain # comment
E="esc\\n\\"q\\" \\\\"
F=
G=a#b
not a pair
  H  =  spaced
"""
    assert parse_dotenv(text) == {
        "A": "1", "B": "two words", "C": "single # not a comment", "D": "plain",
        "E": 'esc\n"q" \\', "F": "", "G": "a#b", "H": "spaced",
    }


def test_missing_dotenv_is_empty(tmp_path: Path) -> None:
    assert read_dotenv(tmp_path / "absent.env") == {}


def test_environment_beats_dotenv_and_empty_is_unset(tmp_path: Path) -> None:
    path = dotenv(tmp_path, "X=file\nY=file\nZ=file\n")
    s = Settings({"X": "env", "Y": ""}, path)
    assert (s.get("X"), s.get("Y"), s.get("Z"), s.get("W")) == ("env", "file", "file", None)


def test_default_dotenv_is_the_working_directory(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    dotenv(tmp_path, "CELLDIALOG_MODEL=haiku\nANTHROPIC_API_KEY=from-cwd\n")
    monkeypatch.chdir(tmp_path)
    s = model_settings(env={})
    assert (s.provider, s.model, s.api_key) == ("anthropic", "claude-haiku-4-5", "from-cwd")


def test_key_and_base_url_precedence(tmp_path: Path) -> None:
    path = dotenv(tmp_path, "OPENAI_API_KEY=dotenv-key\nOPENAI_BASE_URL=https://file.example/v1\n")
    env = {"OPENAI_API_KEY": "env-key"}
    s = model_settings("gpt-5", env=env, dotenv_path=path)
    assert (s.api_key, s.base_url) == ("env-key", "https://file.example/v1")
    s = model_settings("gpt-5", env={}, dotenv_path=path)
    assert (s.api_key, s.base_url) == ("dotenv-key", "https://file.example/v1")
    s = model_settings("gpt-5", api_key="arg-key", base_url="https://arg.example/v1", env=env,
                       dotenv_path=path)
    assert (s.api_key, s.base_url) == ("arg-key", "https://arg.example/v1")


def test_keys_are_per_provider(tmp_path: Path) -> None:
    env = {"ANTHROPIC_API_KEY": "a-key", "OPENAI_API_KEY": "o-key",
           "ANTHROPIC_BASE_URL": "https://a.example"}
    a = model_settings("sonnet", env=env, dotenv_path=tmp_path / "none")
    o = model_settings("gpt-5", env=env, dotenv_path=tmp_path / "none")
    assert (a.api_key, a.base_url) == ("a-key", "https://a.example")
    assert (o.api_key, o.base_url) == ("o-key", None)


def test_default_model_variable(tmp_path: Path) -> None:
    env = {"CELLDIALOG_MODEL": "openai:gpt-4.1", "OPENAI_API_KEY": "k"}
    for name in (None, "", "   "):
        s = model_settings(name, env=env, dotenv_path=tmp_path / "none")
        assert (s.provider, s.model) == ("openai", "gpt-4.1")
    s = model_settings("sonnet", env={**env, "ANTHROPIC_API_KEY": "k"},
                       dotenv_path=tmp_path / "none")
    assert s.model == "claude-sonnet-4-5"  # a given name beats the default
    with pytest.raises(ConfigurationError, match="CELLDIALOG_MODEL is not set"):
        model_settings(None, env={}, dotenv_path=tmp_path / "none")


def test_missing_key_is_an_error_except_for_a_local_server(tmp_path: Path) -> None:
    none = tmp_path / "none"
    with pytest.raises(ConfigurationError, match="OPENAI_API_KEY"):
        model_settings("gpt-5", env={}, dotenv_path=none)
    with pytest.raises(ConfigurationError, match="ANTHROPIC_API_KEY"):
        model_settings("claude-haiku-4-5", env={}, dotenv_path=none)
    local = model_settings("openai:qwen2.5", env={"OPENAI_BASE_URL": "http://127.0.0.1:8080/v1"},
                           dotenv_path=none)
    assert (local.api_key, local.base_url) == (None, "http://127.0.0.1:8080/v1")
    # the same rule as the adapter's: loopback over https (a local TLS proxy) needs no key either
    tls = model_settings("openai:qwen2.5", base_url="https://localhost:8443/v1", env={},
                         dotenv_path=none)
    assert tls.api_key is None


@pytest.mark.parametrize("url", ["http://models.example.com/v1", "ftp://127.0.0.1/",
                                 "http://10.0.0.5:8000", f"http://u:{SECRET}@example.com/?k=1"])
def test_unsafe_base_url_refused_without_leaking_the_key(tmp_path: Path, url: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        model_settings("gpt-5", api_key=SECRET, base_url=url, dotenv_path=tmp_path / "none")
    assert url.partition("u:")[0] in str(info.value) and "https" in str(info.value)
    assert SECRET not in str(info.value) and SECRET not in repr(info.value)


def test_key_never_in_settings_repr(tmp_path: Path) -> None:
    s = model_settings("gpt-5", api_key=SECRET, env={}, dotenv_path=tmp_path / "none")
    assert s.api_key == SECRET
    assert SECRET not in repr(s) and SECRET not in str(s)
    settings = Settings({"OPENAI_API_KEY": SECRET}, tmp_path / "none")
    assert settings.get("OPENAI_API_KEY") == SECRET and SECRET not in repr(settings)


def test_errors_never_carry_a_key_from_the_environment(tmp_path: Path) -> None:
    env = {"OPENAI_API_KEY": SECRET, "ANTHROPIC_API_KEY": SECRET}
    for name, provider in [("nonsense", None), ("gpt-5", "bogus"), ("", None)]:
        with pytest.raises(ConfigurationError) as info:
            model_settings(name, provider, env=env, dotenv_path=tmp_path / "none")
        assert SECRET not in str(info.value)


def test_gemini_keys_gemini_first_then_google(tmp_path: Path) -> None:
    """``GEMINI_API_KEY`` first: ``GOOGLE_API_KEY`` is Google Cloud's general name and may
    hold another API's key (google-genai itself prefers it when both are set)."""
    none = tmp_path / "none"
    both = model_settings("gemini-2.5-pro", env={"GEMINI_API_KEY": "gem-key",
                                                 "GOOGLE_API_KEY": "goog-key"},
                          dotenv_path=none)
    assert (both.provider, both.model, both.api_key) == ("gemini", "gemini-2.5-pro", "gem-key")
    google = model_settings("gemini:gemini-2.5-flash", env={"GOOGLE_API_KEY": "goog-key"},
                            dotenv_path=none)
    assert google.api_key == "goog-key" and "goog-key" not in repr(google)
    path = dotenv(tmp_path, "GOOGLE_API_KEY=from-file\nGEMINI_BASE_URL=https://gw.example\n")
    filed = model_settings("flash", env={}, dotenv_path=path)
    assert (filed.api_key, filed.base_url) == ("from-file", "https://gw.example")
    with pytest.raises(ConfigurationError, match="set GEMINI_API_KEY or GOOGLE_API_KEY"):
        model_settings("gemini-2.5-pro", env={"OPENAI_API_KEY": SECRET}, dotenv_path=none)
    with pytest.raises(ConfigurationError, match="GEMINI_API_KEY"):  # loopback or not
        model_settings("gemini-2.5-pro", base_url="http://127.0.0.1:9/", env={},
                       dotenv_path=none)


def test_the_responses_api_reads_openais_variables(tmp_path: Path) -> None:
    none = tmp_path / "none"
    env = {"OPENAI_API_KEY": "o-key", "OPENAI_BASE_URL": "https://proxy.example/v1"}
    s = model_settings("openai-responses:gpt-5", env=env, dotenv_path=none)
    assert (s.provider, s.model, s.api_key, s.base_url) == (
        "openai-responses", "gpt-5", "o-key", "https://proxy.example/v1")
    with pytest.raises(ConfigurationError, match="set OPENAI_API_KEY"):
        model_settings("openai-responses:gpt-5", env={}, dotenv_path=none)
    local = model_settings("openai-responses:gpt-oss", base_url="http://127.0.0.1:8080/v1",
                           env={}, dotenv_path=none)
    assert local.api_key is None  # a local Responses server, like a local OpenAI one


def test_every_provider_resolves_with_its_key(tmp_path: Path) -> None:
    """Each provider a name can select has its variables, its label and a setting."""
    from runtime.llm.config import provider_vars
    from runtime.llm.resolve import PROVIDERS

    for provider in PROVIDERS:
        names = provider_vars(provider)
        env = {names.api_key: SECRET, "AZURE_OPENAI_ENDPOINT": "https://r.openai.azure.com"}
        s = model_settings("some-model", provider, env=env, dotenv_path=tmp_path / "none")
        assert (s.provider, s.model, s.api_key) == (provider, "some-model", SECRET)
        assert SECRET not in repr(s)


# -- building the adapter ---------------------------------------------------------------


def test_resolve_model_builds_the_adapter(tmp_path: Path) -> None:
    from runtime.llm.providers.anthropic import AnthropicModel
    from runtime.llm.providers.openai import OpenAIModel

    env = {"ANTHROPIC_API_KEY": SECRET, "OPENAI_API_KEY": SECRET}
    a = resolve_model("sonnet", env=env, dotenv_path=tmp_path / "none")
    o = resolve_model("openai:gpt-4.1", env=env, dotenv_path=tmp_path / "none", max_tokens=99)
    assert isinstance(a, AnthropicModel) and isinstance(o, OpenAIModel)
    assert (a.provider, a.name) == ("anthropic", "claude-sonnet-4-5")
    assert (o.provider, o.name) == ("openai", "gpt-4.1")
    assert SECRET not in repr(a) and SECRET not in repr(o)


# -- catalog ----------------------------------------------------------------------------


def test_catalog_lookup() -> None:
    sonnet = catalog.lookup("claude-sonnet-4-5")
    assert (sonnet.provider, sonnet.context_window, sonnet.max_output) == (
        "anthropic", 200_000, 64_000)
    assert catalog.lookup("sonnet") == sonnet
    snap = catalog.lookup("gpt-4o-2024-08-06")
    assert (snap.name, snap.provider, snap.context_window) == ("gpt-4o-2024-08-06", "openai",
                                                              128_000)
    assert catalog.lookup("claude-haiku-4-5-20251001").max_output == 64_000


def test_unknown_models_have_no_context_window() -> None:
    info = catalog.lookup("my-local-llama")
    assert (info.name, info.provider, info.context_window, info.max_output) == (
        "my-local-llama", None, None, None)
    assert catalog.lookup("gpt-99-2030-01-01").context_window is None


def test_small_siblings_are_in_the_catalog() -> None:
    assert catalog.small_model("gemini") == "gemini-2.5-flash-lite"
    assert catalog.small_model("openai-responses") == catalog.small_model("openai")
    for provider in ("anthropic", "openai", "gemini"):
        small = catalog.lookup(catalog.small_model(provider))
        assert small.provider == provider and small.context_window
    with pytest.raises(KeyError):
        catalog.small_model("scripted")


def test_gemini_models_and_prices() -> None:
    pro = catalog.lookup("gemini-2.5-pro")
    assert (pro.provider, pro.context_window, pro.max_output) == ("gemini", 1_048_576, 65_536)
    assert pro.price == catalog.Price(1.25, 10, None)  # cached input: not sourced, so unknown
    assert catalog.lookup("flash").name == "gemini-2.5-flash"
    sonnet = catalog.lookup("claude-sonnet-4-5-20250929")  # a snapshot keeps the price
    assert sonnet.price == catalog.Price(3, 15, 0.3)
    assert catalog.lookup("my-local-model").price is None


def test_every_known_price_is_sane() -> None:
    """Cached input is cheaper than fresh input, output dearer than input, all positive."""
    priced = [m for m in catalog.MODELS if m.price is not None]
    assert {m.provider for m in priced} == {"anthropic", "openai", "gemini"}
    for m in priced:
        p = m.price
        assert p is not None and 0 < p.input < p.output, m.name
        assert p.cached_input is None or 0 < p.cached_input < p.input, m.name


def test_aliases_are_unique_and_resolve_to_catalog_models() -> None:
    aliases = catalog.aliases()
    assert {"sonnet", "haiku", "opus", "gpt", "mini"} <= set(aliases)
    names = [m.name for m in catalog.MODELS]
    assert len(names) == len(set(names)) and set(aliases.values()) <= set(names)
    assert not set(aliases) & set(names)


def test_a_local_server_gets_no_key_from_the_process_environment(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    model = resolve_model("openai:qwen2.5", env={"OPENAI_BASE_URL": "http://127.0.0.1:8080/v1"},
                          dotenv_path=tmp_path / "none")
    assert model.name == "qwen2.5"
    assert SECRET not in repr(vars(model))


def test_anthropic_always_needs_a_key(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="ANTHROPIC_API_KEY"):
        model_settings("sonnet", env={"ANTHROPIC_BASE_URL": "http://127.0.0.1:9/"},
                       dotenv_path=tmp_path / "none")


def test_configuration_is_read_in_one_place(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """``resolve_model`` reads the environment and ``.env`` and hands the adapters explicit
    values; the adapters read nothing themselves. So a process environment the resolver is
    told to ignore (``env={}``) reaches no adapter."""
    for var in ("ANTHROPIC_API_KEY", "OPENAI_API_KEY"):
        monkeypatch.setenv(var, SECRET)
    monkeypatch.setenv("ANTHROPIC_BASE_URL", "https://from-process.example")
    monkeypatch.setenv("OPENAI_BASE_URL", "https://from-process.example/v1")
    path = dotenv(tmp_path, "ANTHROPIC_API_KEY=sk-ant-file\nOPENAI_API_KEY=sk-file\n"
                            "ANTHROPIC_BASE_URL=https://from-file.example\n")
    a = resolve_model("sonnet", env={}, dotenv_path=path)
    o = resolve_model("gpt-5", env={}, dotenv_path=path)
    assert a.base_url == "https://from-file.example"  # type: ignore[attr-defined]
    assert o._key == "sk-file" and a._key == "sk-ant-file"  # type: ignore[attr-defined]
    assert "api.openai.com" in repr(o)  # not the process's OPENAI_BASE_URL
    with pytest.raises(ConfigurationError, match="API key"):
        resolve_model("sonnet", env={}, dotenv_path=tmp_path / "none")


@pytest.mark.parametrize(("key", "url", "fragment"), [
    (f"{SECRET}\n", None, "a newline at its end"),
    ("sk-\u201cquoted", None, "non-ASCII"),
    (SECRET, "http://localhost:99999/v1", "port"),
    (SECRET, "http://localhost:8080/v1\t", "a tab"),
    (SECRET, "http://[invalid", "cannot be parsed"),
])
def test_unusable_keys_and_urls_are_configuration_errors(tmp_path: Path, key: str,
                                                         url: str | None, fragment: str) -> None:
    with pytest.raises(ConfigurationError, match=fragment) as info:
        model_settings("gpt-5", env={"OPENAI_API_KEY": key, "OPENAI_BASE_URL": url or ""},
                       dotenv_path=tmp_path / "none")
    assert SECRET not in str(info.value)
