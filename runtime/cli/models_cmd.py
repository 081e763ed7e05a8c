"""``celldialog models``: which providers are configured, what the catalog knows, and
which model a command uses when given none, and why.

It reads configuration the way the resolver does (environment, then ``.env``) and never
prints a key: only whether one is set.
"""

from __future__ import annotations

import click

__all__ = ["command"]


def _fmt(n: int | None) -> str:
    return f"{n:,}" if n is not None else "?"


@click.command(name="models")
def command() -> None:
    """Show the configured providers, the model catalog, and the default model."""
    from rich.console import Console
    from rich.table import Table

    from ..llm import catalog
    from ..llm.config import PROVIDER_VARS, Settings
    from ..llm.errors import ConfigurationError
    from ..llm.safety import display_url
    from .common import choose_model

    console = Console(highlight=False)
    settings = Settings()

    providers = Table(title="Providers", title_justify="left")
    for col in ("provider", "API key", "base URL"):
        providers.add_column(col)
    for name, names in PROVIDER_VARS.items():
        key = (f"[green]set[/] ({names.api_key})" if settings.get(names.api_key)
               else f"[red]not set[/] ({names.api_key})")
        url = settings.get(names.base_url)
        providers.add_row(name, key, display_url(url) if url else f"default ({names.base_url})")
    console.print(providers)

    small = set(catalog.SMALL_MODELS.values())
    models = Table(title="Catalog", title_justify="left")
    for col, justify in (("model", "left"), ("provider", "left"), ("context", "right"),
                         ("max output", "right"), ("aliases", "left"), ("small", "left")):
        models.add_column(col, justify=justify)  # type: ignore[arg-type]
    for info in catalog.MODELS:
        models.add_row(info.name, info.provider or "?", _fmt(info.context_window),
                       _fmt(info.max_output), ", ".join(info.aliases),
                       "yes" if info.name in small else "")
    console.print(models)

    try:
        choice = choose_model(None)
    except ConfigurationError as e:
        from .common import why_default
        from .errors import redact

        console.print(f"default model: [red]none[/] ({why_default(None)}): {redact(str(e))}",
                      soft_wrap=True)
        return
    console.print(f"default model: [bold]{choice.label}[/] ({choice.why})", soft_wrap=True)
