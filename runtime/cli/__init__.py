"""The ``celldialog`` command: chat with, run and serve patterns from a terminal.

Built on click (subcommands compose as a group, each testable on its own) with rich for
what a person reads (streamed replies, tables). Each subcommand lives in its own module and
is imported only when it runs, so ``celldialog --help`` loads click and nothing of the
runtime. To add one (``eval`` will be next), write ``runtime/cli/<name>.py`` exposing a
``click.Command`` named ``command`` and add a line to ``COMMANDS``.

``main`` is the console script. It runs click in non-standalone mode so every failure comes
back here and is shown as one line with a documented exit status (``errors.py``).
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

import click

__all__ = ["COMMANDS", "cli", "main", "run"]

COMMANDS: dict[str, tuple[str, str]] = {
    "chat": ("runtime.cli.chat", "Chat in the terminal with a pattern that has a dialog."),
    "run": ("runtime.cli.run", "Run a pattern, send it events, print its result as JSON."),
    "models": ("runtime.cli.models_cmd", "Show the providers, the model catalog and the default."),
    "mcp": ("runtime.cli.mcp_serve", "Serve a pattern's handlers as MCP tools over stdio."),
    "eval": ("runtime.cli.eval_cmd", "Run evals across models and report success rates."),
    "serve": ("runtime.cli.serve", "Serve a pattern as a web page, a conversation per session."),
}
"""Subcommand name -> (module defining ``command``, one-line help shown by ``--help``)."""


class _LazyGroup(click.Group):
    """A group whose commands are imported when used, not when the group is built."""

    invoked: str | None = None

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        entry = COMMANDS.get(cmd_name)
        if entry is None:
            return None
        import importlib

        command: click.Command = importlib.import_module(entry[0]).command
        return command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        # the short help comes from COMMANDS, so listing the commands imports none of them
        with formatter.section("Commands"):
            formatter.write_dl([(name, help_) for name, (_, help_) in COMMANDS.items()])

    def resolve_command(self, ctx: click.Context,
                        args: list[str]) -> tuple[str | None, click.Command | None, list[str]]:
        if args and args[0] in COMMANDS:
            _LazyGroup.invoked = args[0]
        return super().resolve_command(ctx, args)


def _quiet_logs(verbose: bool) -> None:
    """The runtime logs what it survives (a failed turn, with its traceback) on the
    ``celldialog`` logger; the command shows those failures itself, so the log is silent
    unless ``--verbose`` asks for it."""
    for name in ("celldialog", "mcp"):
        logger = logging.getLogger(name)
        logger.propagate = False
        logger.handlers[:] = []
        if verbose:
            handler = logging.StreamHandler(sys.stderr)
            handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
            logger.addHandler(handler)
            logger.setLevel(logging.INFO)
        else:
            logger.addHandler(logging.NullHandler())


@click.group(cls=_LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("-v", "--verbose", is_flag=True, help="Log what the runtime does to stderr.")
@click.version_option(package_name="celldialog", prog_name="celldialog")
def cli(verbose: bool) -> None:
    """celldialog: reactive patterns with LLM dialogs, from the terminal.

    PATTERN (where a command takes one) is a file path (app.py, or app.py:name when the
    file defines several), a module:name, or a bundled pattern (chatbot, todo,
    todo-agent, extract). Exit statuses are listed in docs/cli.md.
    """
    _quiet_logs(verbose)


def run(argv: Sequence[str] | None = None) -> int:
    """Run the command line ``argv`` (default ``sys.argv[1:]``); return the exit status."""
    from .errors import EXIT_OK, report

    _LazyGroup.invoked = None
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        status: Any = cli.main(args=args, prog_name="celldialog", standalone_mode=False)
    except SystemExit as e:  # a command that exits on purpose keeps its status
        return e.code if isinstance(e.code, int) else EXIT_OK
    except (Exception, KeyboardInterrupt) as e:
        return report(e, _LazyGroup.invoked)
    return status if isinstance(status, int) else EXIT_OK


def main() -> NoReturn:
    """The console script ``celldialog``."""
    sys.exit(run())
