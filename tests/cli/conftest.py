"""Fixtures for the CLI tests: a clean environment per test, a loopback model server."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from .fakes import OpenAIServer

REPO = Path(__file__).resolve().parents[2]
# the other providers' variables (runtime.llm.config), which a developer may well have set
PROVIDER_PREFIXES = ("AZURE_OPENAI_", "GEMINI_", "GOOGLE_API_KEY", "OLLAMA_", "VLLM_",
                     "LLAMACPP_", "LMSTUDIO_", "OPENROUTER_", "GROQ_", "TOGETHER_")


def clean_env(root: Path) -> dict[str, str]:
    """The environment a fresh user has: no keys, no model named, a home of their own under
    ``root`` (so the default store lands there), and the repository importable."""
    clean = {k: v for k, v in os.environ.items()
             if not k.startswith(("OPENAI_", "ANTHROPIC_", "CELLDIALOG_", *PROVIDER_PREFIXES))
             and not k.lower().endswith("_proxy")}  # the loopback server is reached directly
    home = root / "home"
    home.mkdir(exist_ok=True)
    clean.update(HOME=str(home), XDG_DATA_HOME=str(home / "data"), COLUMNS="200",
                 TERM="xterm", PYTHONPATH=str(REPO))
    return clean


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    return clean_env(tmp_path)


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    """Where the command runs: an empty directory, so no .env of the repository is read."""
    d = tmp_path / "work"
    d.mkdir()
    return d


@pytest.fixture
def server() -> Iterator[OpenAIServer]:
    with OpenAIServer() as srv:
        yield srv


@pytest.fixture
def model_env(env: dict[str, str], server: OpenAIServer) -> dict[str, str]:
    """``env`` pointed at the loopback server (a loopback base URL needs no key)."""
    return {**env, "OPENAI_BASE_URL": server.base_url, "CELLDIALOG_MODEL": "openai:gpt-4o-mini"}
