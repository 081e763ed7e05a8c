"""The errors of the conversation object, under the project's one tree (``runtime.errors``).

    CelldialogError
    └── ConversationError          the conversation object used wrongly, or its work failed
        ├── NotEvaluatedError      a result read from a value whose queued steps have not run
        ├── StepLimitError         loop(max_steps=n) reached n before the model ended its turn
        ├── PortableIdError        a portable id that cannot be made or read
        └── AgentStateError        an agent operation its state does not allow

Model failures are the port's own ``LLMError``, raised as they are.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..errors import CelldialogError

if TYPE_CHECKING:
    from .llm import LLM

__all__ = [
    "AgentStateError",
    "ConversationError",
    "NotEvaluatedError",
    "PortableIdError",
    "StepLimitError",
]


class ConversationError(CelldialogError, RuntimeError):
    """The conversation object used wrongly, or its work failed; the message names the fix."""


class NotEvaluatedError(ConversationError):
    """A result field was read from a value with queued ``step``/``loop`` work: await it."""


class StepLimitError(ConversationError):
    """``loop(max_steps=n)`` made n model calls and the model still called tools.

    ``progress`` is the conversation as far as it got (a valid history: the last step's tool
    results are in it), so a caller can look at it or go on with ``progress.loop()``."""

    def __init__(self, message: str, *, max_steps: int, progress: LLM) -> None:
        super().__init__(message)
        self.max_steps = max_steps
        self.progress = progress

    def __reduce__(self) -> Any:  # picklable without the conversation
        return (ConversationError, (str(self),))


class PortableIdError(ConversationError, ValueError):
    """A portable id that cannot be made (state that cannot be saved) or read back."""


class AgentStateError(ConversationError):
    """An agent operation its current state refuses (say, ``resume`` of a running agent)."""
