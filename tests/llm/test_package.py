"""The package surface: every public name is importable from ``runtime.llm``, and importing
it stays cheap (the adapters, and httpx with them, load on first use)."""

from __future__ import annotations

import subprocess
import sys

import runtime.llm as llm
from runtime.llm.providers.anthropic import AnthropicModel
from runtime.llm.providers.openai import OpenAIModel


def test_every_exported_name_resolves() -> None:
    assert [n for n in llm.__all__ if not hasattr(llm, n)] == []
    assert len(set(llm.__all__)) == len(llm.__all__)
    assert set(llm.__all__) <= set(dir(llm))


def test_the_adapters_are_the_providers_classes() -> None:
    from runtime.llm import AnthropicModel as A
    from runtime.llm import OpenAIModel as O

    assert (A, O) == (AnthropicModel, OpenAIModel)
    assert llm.OpenAIModel is OpenAIModel


def test_an_unknown_name_is_an_attribute_error() -> None:
    try:
        llm.NoSuchModel  # noqa: B018
    except AttributeError as e:
        assert "NoSuchModel" in str(e)
    else:
        raise AssertionError("no AttributeError")


def test_importing_the_port_does_not_load_the_adapters() -> None:
    code = (
        "import sys, runtime.llm\n"
        "loaded = [m for m in ('httpx', 'runtime.llm.providers.anthropic',"
        " 'runtime.llm.providers.openai') if m in sys.modules]\n"
        "assert not loaded, loaded\n"
        "from runtime.llm import OpenAIModel\n"
        "assert 'httpx' in sys.modules and 'runtime.llm.providers.anthropic' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_importing_the_port_does_not_load_the_cell_graph_or_storage() -> None:
    """The port is a leaf: the cell graph, schema validation and the store stay unloaded
    (anyio may load: the port uses it)."""
    code = (
        "import sys, runtime.llm\n"
        "heavy = ('runtime.cells', 'runtime.storage', 'jsonschema', 'sqlite3', '_sqlite3')\n"
        "loaded = sorted(m for m in sys.modules\n"
        "                if any(m == h or m.startswith(h + '.') for h in heavy))\n"
        "assert not loaded, loaded\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
