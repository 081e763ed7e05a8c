"""``celldialog run PATTERN``: instantiate, send events, settle, print the result as JSON.

Everything is checked before the runtime starts (the JSON of ``--args`` and of each
``--send``, the pattern, the store URL), and each stream name before the first event is
sent, so a typo never leaves half the events applied to a persistent store.

A dialog's model is resolved when a turn first needs it (a pattern without a dialog needs
no key); if a turn failed on it, the run ends with that failure's status, as ``chat`` does
before it starts: 4 for the model's configuration, 5 for a server unreachable or refusing.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import click

from .common import parse_json, pattern_args, scope_options, store_option, store_url
from .errors import CliError, UsageProblem

__all__ = ["command"]


def _split_send(text: str) -> tuple[str, Any]:
    name, sep, payload = text.partition("=")
    if not sep or not name.strip():
        raise UsageProblem(
            f"--send takes STREAM=JSON, as in --send 'add={{\"title\": \"milk\"}}'; got {text!r}")
    return name.strip(), parse_json(payload, f"--send {name.strip()}=")


@click.command(name="run")
@click.argument("pattern")
@click.option("--args", "args_json", default=None, metavar="JSON",
              help="The pattern's arguments, a JSON object.")
@click.option("--send", "sends", multiple=True, metavar="STREAM=JSON",
              help="Send an event to a stream of the result (repeatable, in order).")
@store_option("memory")
@scope_options
@click.option("--model", default=None, metavar="NAME",
              help="The model the pattern's dialogs use (default: as `celldialog models`).")
@click.option("--timeout", type=click.FloatRange(min=0, min_open=True), default=None,
              metavar="SECONDS", help="Give up if the run has not settled by then.")
def command(pattern: str, args_json: str | None, sends: tuple[str, ...], store: str | None,
            space: str, user: str | None, session: str | None, model: str | None,
            timeout: float | None) -> None:
    """Run PATTERN, send each --send event in order, wait until it settles (dialog turns
    included) and print its result (its cells' values) as JSON."""
    args = pattern_args(args_json)
    events = [_split_send(s) for s in sends]
    url = store_url(store, "memory")

    from .loading import load_pattern

    target = load_pattern(pattern)

    import anyio

    state = anyio.run(_run, target, args, events, url, space, user, session, model, timeout)
    sys.stdout.write(json.dumps(state, indent=2, ensure_ascii=False) + "\n")


async def _run(pattern: Any, args: dict[str, Any] | None, events: list[tuple[str, Any]],
               url: str, space: str, user: str | None, session: str | None,
               model_name: str | None, timeout: float | None) -> Any:
    import anyio

    from .. import Runtime
    from .common import DeferredModel, result_state, start

    model = DeferredModel(model_name)
    try:
        async with Runtime(store=url, model=model) as rt:
            inst = start(rt, pattern, args, space, user, session)
            for name, _ in events:
                if name not in inst.streams:
                    known = ", ".join(sorted(inst.streams)) or "none"
                    raise UsageProblem(
                        f"pattern {pattern.name} has no stream {name!r}; its streams: {known}")
            for name, event in events:
                try:
                    await inst.send(name, event)
                except Exception as e:
                    from ..errors import CelldialogError

                    if not isinstance(e, CelldialogError):
                        raise
                    raise CliError(f"--send {name}: {e}") from None
            with anyio.move_on_after(timeout if timeout is not None else float("inf")) as scope:
                await rt.settled()
            if scope.cancelled_caught:
                raise CliError(
                    f"{pattern.name} did not settle within {timeout:g} s (a dialog turn still "
                    "running?): raise --timeout")
            if model.failure is not None:  # a dialog's turn failed on the model: 4 or 5
                raise model.failure
            if rt.errors:
                where, error = rt.errors[0]
                more = f" (and {len(rt.errors) - 1} more)" if len(rt.errors) > 1 else ""
                raise CliError(f"{where} failed: {error}{more}")
            return result_state(inst)
    finally:
        await model.aclose()
