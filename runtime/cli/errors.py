"""What a failed command prints and the status it exits with.

Every failure the command can foresee ends the same way: one line on stderr, naming what
was wrong and how to fix it, and a status saying which kind of failure it was, so a script
can tell a typo from a dead server. Nothing the user did wrong ever shows a traceback; a bug
of ours shows one only with ``CELLDIALOG_DEBUG=1``. Lines are scrubbed of the API keys the
environment and ``.env`` hold before they are printed.

======  ==========================================================================
status  meaning
======  ==========================================================================
0       success (also: leaving ``chat`` with Ctrl-C at the prompt or Ctrl-D)
1       the pattern failed: a handler refused an event, a run did not settle in time
2       bad arguments: an unknown option, bad JSON, an unknown stream, a bad store URL
3       the pattern cannot be used: not found, does not import, has no dialog
4       model configuration: an unknown model, a missing API key, an unusable base URL
5       the model is unreachable or refused the call
6       the store failed: locked, unreadable, conflicting writers
70      a bug in celldialog (run again with ``CELLDIALOG_DEBUG=1`` for the traceback)
130     interrupted (Ctrl-C outside a chat's own handling)
======  ==========================================================================

A model that cannot be used ends ``chat`` and ``run`` with 4 or 5 whenever they find out:
``chat`` before its first line, ``run`` when a dialog's turn failed on it (``common.
DeferredModel.failure``), printing that line instead of the result.
"""

from __future__ import annotations

import os
import sys
from typing import Any

__all__ = [
    "EXIT_CONFIG",
    "EXIT_FAILURE",
    "EXIT_INTERNAL",
    "EXIT_INTERRUPTED",
    "EXIT_MODEL",
    "EXIT_OK",
    "EXIT_PATTERN",
    "EXIT_STORE",
    "EXIT_USAGE",
    "CliError",
    "PatternNotUsable",
    "UsageProblem",
    "exit_status",
    "redact",
    "report",
]

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_PATTERN = 3
EXIT_CONFIG = 4
EXIT_MODEL = 5
EXIT_STORE = 6
EXIT_INTERNAL = 70
EXIT_INTERRUPTED = 130


class CliError(Exception):
    """A failure the command reports as one line and ``exit_code``."""

    exit_code = EXIT_FAILURE

    def __init__(self, message: str, exit_code: int | None = None) -> None:
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code


class UsageProblem(CliError):
    """An argument the command cannot use (bad JSON, an unknown stream, a bad store URL)."""

    exit_code = EXIT_USAGE


class PatternNotUsable(CliError):
    """PATTERN names nothing we can load, or something that cannot do what was asked."""

    exit_code = EXIT_PATTERN


def exit_status(error: BaseException) -> int:
    """The status an error ends the command with (see the table above)."""
    import click

    from ..errors import CelldialogError, StorageError, StoreConfigError

    if isinstance(error, CliError):
        return error.exit_code
    if isinstance(error, click.exceptions.UsageError):
        return EXIT_USAGE
    if isinstance(error, click.ClickException):
        return error.exit_code
    if isinstance(error, KeyboardInterrupt | click.exceptions.Abort):
        return EXIT_INTERRUPTED
    if isinstance(error, CelldialogError):
        # imported here: the port's errors module is cheap, but only errors need it
        from ..llm.errors import ConfigurationError, LLMError

        if isinstance(error, ConfigurationError):
            return EXIT_CONFIG
        if isinstance(error, LLMError):
            return EXIT_MODEL
        if isinstance(error, StoreConfigError):
            return EXIT_USAGE
        if isinstance(error, StorageError):
            return EXIT_STORE
        return EXIT_FAILURE
    return EXIT_INTERNAL


def message_of(error: BaseException, command: str | None) -> str:
    """The one line an error is shown as."""
    import click

    where = f"celldialog {command}" if command else "celldialog"
    if isinstance(error, click.exceptions.UsageError):
        hint = f" (see '{where} --help')"
        return f"{where}: {error.format_message()}{hint}"
    if isinstance(error, click.ClickException):
        return f"{where}: {error.format_message()}"
    if isinstance(error, KeyboardInterrupt | click.exceptions.Abort):
        return f"{where}: interrupted"
    if isinstance(error, CliError):
        return f"{where}: {error}"
    from ..errors import CelldialogError

    if isinstance(error, CelldialogError):
        # the resolver speaks to Python callers; on the command line the flag is the way
        return f"{where}: {error}".replace(" or pass api_key=", "")
    return (f"{where}: internal error {type(error).__name__}: {error} (a bug in celldialog: "
            "run again with CELLDIALOG_DEBUG=1 for the traceback, and report it)")


def redact(text: str) -> str:
    """``text`` with every known secret replaced by ``[redacted]`` (see
    ``runtime.llm.safety.redact_secrets``)."""
    from ..llm.safety import redact_secrets  # on use: `--help` loads nothing of the port

    return redact_secrets(text)


def one_line(text: str) -> str:
    """Messages from below may span lines (a schema error's details): the report is one."""
    return " ".join(part.strip() for part in text.splitlines() if part.strip())


def report(error: BaseException, command: str | None) -> int:
    """Print ``error`` as its one line on stderr; return its exit status."""
    status = exit_status(error)
    line = one_line(redact(message_of(error, command)))
    if status == EXIT_INTERNAL and os.environ.get("CELLDIALOG_DEBUG"):
        import traceback

        sys.stderr.write(redact("".join(traceback.format_exception(error))))
    sys.stderr.write(line + "\n")
    sys.stderr.flush()
    return status


def describe(value: Any, limit: int = 60) -> str:
    """A short repr of a user's value for an error line."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
