"""``with_retry``: put the shared retry layer in front of any ``Model``.

The adapters apply their ``RetryPolicy`` themselves; this wrapper gives a model that has no
policy of its own (a ``ScriptedModel``, a third-party backend) exactly the same behaviour, so
tests of retrying callers need no HTTP at all.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from .events import StreamEvent
from .model import Model
from .retry_policy import RetryPolicy, retry_call, retry_stream
from .types import Request, Response


class RetryingModel:
    """``model`` with transient faults retried under ``policy`` (streams only before output),
    each call held to the policy's deadline (``max_elapsed``)."""

    def __init__(self, model: Model, policy: RetryPolicy) -> None:
        self.model = model
        self.policy = policy

    @property
    def name(self) -> str:
        return self.model.name

    @property
    def provider(self) -> str:
        return self.model.provider

    def __repr__(self) -> str:
        return f"RetryingModel({self.model!r}, max_attempts={self.policy.max_attempts})"

    async def generate(self, request: Request) -> Response:
        return await retry_call(lambda: self.model.generate(request), self.policy,
                                provider=self.model.provider)

    def stream(self, request: Request) -> AsyncIterator[StreamEvent]:
        return retry_stream(lambda: self.model.stream(request), self.policy,
                            provider=self.model.provider)


def with_retry(model: Model, policy: RetryPolicy | None = None) -> RetryingModel:
    """Wrap ``model`` so its calls go through the retry layer (default policy if None)."""
    return RetryingModel(model, policy or RetryPolicy())
