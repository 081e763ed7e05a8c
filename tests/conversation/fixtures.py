"""Importable things the conversation tests bind and restore in another process: a notebook
dataclass (its state survives ``portable_id``) and scripted models named by import path."""

from __future__ import annotations

from dataclasses import dataclass

from runtime.llm import Reply, ScriptedModel, call


@dataclass(frozen=True)
class Notebook:
    """A notebook the model can write in."""

    lines: tuple[str, ...] = ()

    def add(self, line: str) -> Notebook:
        """Append a line; the new notebook replaces this one as the state."""
        return Notebook((*self.lines, line))

    def count(self) -> int:
        """How many lines there are."""
        return len(self.lines)


def continuation_model() -> ScriptedModel:
    """What the restoring process's model answers: one note, then a count of them."""
    return ScriptedModel([Reply(tool_calls=[call("add", {"line": "eggs"})]),
                          Reply(tool_calls=[call("count")]), "You have 2 notes."])
