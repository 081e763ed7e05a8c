"""``celldialog models``: which providers are configured, what the catalog knows (limits and
prices), and which model a command uses when given none, and why.

It reads configuration the way the resolver does (environment, then ``.env``; the same
``configured_base_url``) and never prints a key or a token: only whether one is set, and by
which variable. Every configured value it shows (a URL, an api-version, a model name, an
error quoting one) is escaped (``_shown``): text such as ``[/]`` is not Rich markup here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

    from ..llm.config import Settings

__all__ = ["command"]


def _shown(text: str) -> str:
    """Configured text as Rich shows it literally, never as markup."""
    from rich.markup import escape

    return escape(text)


def _fmt(n: int | None) -> str:
    return f"{n:,}" if n is not None else "?"


def _dollars(x: float | None) -> str:
    return "?" if x is None else f"{x:g}"


def _key_status(provider: str, settings: Settings) -> str:
    """Whether ``provider``'s credential is set, and by which variable (never its value)."""
    from ..llm.config import AZURE_TOKEN_VAR, provider_vars

    names = provider_vars(provider)
    candidates = (names.api_key, *names.more_keys)
    if provider == "azure":  # an Entra ID token does as well (and wins, as in the SDK)
        candidates = (AZURE_TOKEN_VAR, names.api_key)
    found = next((var for var in candidates if settings.get(var)), None)
    if found:
        return f"[green]set[/] ({found})"
    if not names.key_required:
        return f"[dim]not needed[/] ({names.api_key})"
    return f"[red]not set[/] ({' or '.join(candidates)})"


def _base_url(provider: str, settings: Settings) -> str:
    """Where ``provider``'s requests go: the configured URL and its variable, or the
    default."""
    from ..llm.config import AZURE_API_VERSION_VAR, provider_vars
    from ..llm.providers.presets import AZURE_DEFAULT_API_VERSION, PRESETS
    from ..llm.resolve import configured_base_url
    from ..llm.safety import display_url

    names = provider_vars(provider)
    url, var = configured_base_url(provider, settings)
    if provider == "azure":
        version = settings.get(AZURE_API_VERSION_VAR) or AZURE_DEFAULT_API_VERSION
        where = _shown(display_url(url)) if url else f"[red]not set[/] ({names.base_url})"
        return f"{where}, api-version {_shown(version)}"
    if url:
        return f"{_shown(display_url(url))} ({var})"
    if provider in PRESETS:
        return f"{PRESETS[provider].base_url} (default; {names.base_url})"
    return f"default ({names.base_url})"


def _print_whole(console: Console, table: Table) -> None:
    """``table`` at the console's width, or wider when its columns that never wrap (the
    names) need more: a line the terminal wraps is better than a name cut short."""
    from rich.measure import Measurement

    unbounded = console.options.update(width=10_000)  # measured as if the screen were wide
    needed = Measurement.get(console, unbounded, table).minimum
    if needed <= console.width:
        console.print(table)
        return
    width = console.width
    console.width = needed  # print() never goes past the console's width: widen it
    try:
        console.print(table)
    finally:
        console.width = width


@click.command(name="models")
def command() -> None:
    """Show the configured providers, the model catalog, and the default model."""
    from rich import box
    from rich.console import Console
    from rich.table import Table

    from ..llm import catalog
    from ..llm.config import Settings
    from ..llm.errors import ConfigurationError
    from ..llm.resolve import PROVIDERS
    from .common import choose_model

    console = Console(highlight=False)
    settings = Settings()

    # a name is never cut: its column is as wide as the longest (what a user copies into
    # --model), so are the numbers and aliases; the other columns wrap, a base URL folds,
    # and a table that cannot fit the screen so is printed wider (_print_whole)
    providers = Table(title="Providers", title_justify="left", box=box.SIMPLE_HEAD,
                      show_edge=False, pad_edge=False)
    providers.add_column("provider", no_wrap=True, min_width=max(map(len, PROVIDERS)))
    providers.add_column("API key")
    providers.add_column("base URL", overflow="fold")
    for name in PROVIDERS:
        providers.add_row(name, _key_status(name, settings), _base_url(name, settings))
    _print_whole(console, providers)

    small = set(catalog.SMALL_MODELS.values())
    models = Table(title="Catalog", title_justify="left", box=box.SIMPLE_HEAD,
                   show_edge=False, pad_edge=False)
    models.add_column("model", no_wrap=True,
                      min_width=max((len(m.name) for m in catalog.MODELS), default=5))
    models.add_column("provider", no_wrap=True)
    for col in ("context", "max output"):
        models.add_column(col, justify="right", no_wrap=True)
    models.add_column("aliases", min_width=max(  # an alias is a name too: wrapped, not cut
        (len(a) + 1 for m in catalog.MODELS for a in m.aliases), default=7))
    models.add_column("small", no_wrap=True)
    for info in catalog.MODELS:
        models.add_row(info.name, info.provider or "?", _fmt(info.context_window),
                       _fmt(info.max_output), ", ".join(info.aliases),
                       "yes" if info.name in small else "")
    _print_whole(console, models)

    prices = Table(title="Prices (US$ per million tokens; ? unknown)", title_justify="left",
                   box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
    prices.add_column("model", no_wrap=True,
                      min_width=max((len(m.name) for m in catalog.MODELS), default=5))
    for col in ("input", "output", "cached input"):
        prices.add_column(col, justify="right", no_wrap=True)
    for info in catalog.MODELS:
        price = info.price
        prices.add_row(info.name, *(("?",) * 3 if price is None else (
            _dollars(price.input), _dollars(price.output), _dollars(price.cached_input))))
    _print_whole(console, prices)

    try:
        choice = choose_model(None)
    except ConfigurationError as e:
        from .common import why_default
        from .errors import redact

        console.print(f"default model: [red]none[/] ({_shown(why_default(None))}): "
                      f"{_shown(redact(str(e)))}", soft_wrap=True)
        return
    console.print(f"default model: [bold]{_shown(choice.label)}[/] ({_shown(choice.why)})",
                  soft_wrap=True)
