"""``celldialog models``: which providers are configured, what the catalog knows, and
which model a command uses when given none, and why.

It reads configuration the way the resolver does (environment, then ``.env``) and never
prints a key: only whether one is set.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

__all__ = ["command"]


def _fmt(n: int | None) -> str:
    return f"{n:,}" if n is not None else "?"


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
    from ..llm.config import PROVIDER_VARS, Settings
    from ..llm.errors import ConfigurationError
    from ..llm.safety import display_url
    from .common import choose_model

    console = Console(highlight=False)
    settings = Settings()

    # a name is never cut: its column is as wide as the longest (what a user copies into
    # --model), so are the numbers and aliases; the other columns wrap, a base URL folds,
    # and a table that cannot fit the screen so is printed wider (_print_whole)
    providers = Table(title="Providers", title_justify="left", box=box.SIMPLE_HEAD,
                      show_edge=False, pad_edge=False)
    providers.add_column("provider", no_wrap=True, min_width=max(map(len, PROVIDER_VARS)))
    providers.add_column("API key")
    providers.add_column("base URL", overflow="fold")
    for name, names in PROVIDER_VARS.items():
        key = (f"[green]set[/] ({names.api_key})" if settings.get(names.api_key)
               else f"[red]not set[/] ({names.api_key})")
        url = settings.get(names.base_url)
        providers.add_row(name, key, display_url(url) if url else f"default ({names.base_url})")
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

    try:
        choice = choose_model(None)
    except ConfigurationError as e:
        from .common import why_default
        from .errors import redact

        console.print(f"default model: [red]none[/] ({why_default(None)}): {redact(str(e))}",
                      soft_wrap=True)
        return
    console.print(f"default model: [bold]{choice.label}[/] ({choice.why})", soft_wrap=True)
