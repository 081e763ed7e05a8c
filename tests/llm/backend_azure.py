"""The Azure OpenAI adapter against ``FakeAzureOpenAI``, as a contract-suite ``Backend``.

The wire is Chat Completions, so everything but the model and the request's re-encoding is
``OpenAIBackend``'s: the bytes are read by position the same way.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from typing import Any

from runtime.llm import Request, Response, RetryPolicy, StreamEvent
from runtime.llm.providers.openai import AzureOpenAIModel

from .backend_openai import OpenAIBackend
from .fake_azure import FakeAzureOpenAI

API_KEY = "azure-test-key-7f3a9c1e5b2d4f60"
DEPLOYMENT = "gpt-4o-test"


class _RecordingModel(AzureOpenAIModel):
    """The adapter, noting each port request it is asked."""

    def __init__(self, asked: list[Request], **kw: Any) -> None:
        super().__init__(DEPLOYMENT, **kw)
        self._asked = asked

    async def generate(self, request: Request) -> Response:
        self._asked.append(request)
        return await super().generate(request)

    def stream(self, request: Request) -> AsyncIterator[StreamEvent]:
        self._asked.append(request)
        return super().stream(request)


class AzureBackend(OpenAIBackend):
    name = "azure"

    def model(self, *, retry: RetryPolicy | None = None) -> AzureOpenAIModel:
        return _RecordingModel(self._asked, api_key=API_KEY, base_url=self.fake.endpoint,
                               retry=retry)

    def _request(self, index: int) -> Request:
        raw = self.fake.requests[index].raw
        encoder = AzureOpenAIModel(DEPLOYMENT, api_key=API_KEY, base_url=self.fake.endpoint)
        for request in self._asked:
            for stream in (False, True):
                if encoder.encode(request, stream=stream) == raw:
                    return request
        raise LookupError(f"request {index} was not sent by this backend's models")

    @property
    def base_url(self) -> str:
        return self.fake.endpoint


@contextmanager
def make_backend() -> Iterator[AzureBackend]:
    with FakeAzureOpenAI(DEPLOYMENT, api_key=API_KEY) as fake:
        yield AzureBackend(fake)  # type: ignore[arg-type]
