"""A fake Azure OpenAI resource on loopback: ``FakeOpenAI``'s Chat Completions behind Azure's
addressing, credentials and annotations.

What Azure adds to the OpenAI wire, and the fake with it:

- the route ``/openai/deployments/{deployment}/chat/completions?api-version=...``: another
  path, a deployment it does not know or an api-version it does not know is a 404 (the
  request is recorded as sent, path and query included);
- the credential: the ``api-key`` header, or ``Authorization: Bearer <Entra ID token>``; a
  missing or wrong one is a 401;
- a request argument the api-version does not know is a 400 "Unrecognized request argument
  supplied: ..." (``API_VERSIONS`` lists, per version the fake serves, the OpenAI fields it
  refuses: ``prompt_cache_key`` and ``reasoning_effort`` are not in the 2024-10-21 GA
  specification; ``stream_options`` and ``max_completion_tokens`` arrived with
  2024-09-01-preview);
- the content filter's annotations: ``prompt_filter_results`` on a completion and
  ``content_filter_results`` on each choice, and, first in a stream, Azure's prelude chunk
  (no choices, empty id, object and model, the prompt's filter results).

Everything else is ``FakeOpenAI``'s, validated against the official SDK types as it renders
it; the Azure annotations are added after that validation, and the prelude is the one chunk
no SDK type describes (``test_azure.py`` has the official ``AsyncAzureOpenAI`` client read
all of it).
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any
from urllib.parse import parse_qs, urlsplit

from .fake_openai import PATH, FakeOpenAI, _error_body, _Prepared
from .loopback import Exchange, Recorded
from .steps import Step

API_VERSIONS: dict[str, frozenset[str]] = {
    "2024-10-21": frozenset({"prompt_cache_key", "reasoning_effort"}),
    "2024-06-01": frozenset({"prompt_cache_key", "reasoning_effort", "stream_options",
                             "max_completion_tokens"}),
}
_SAFE = {"filtered": False, "severity": "safe"}
FILTER_RESULTS = {k: dict(_SAFE) for k in ("hate", "self_harm", "sexual", "violence")}
AZURE_KEYS = ("prompt_filter_results", "content_filter_results")


class FakeAzureOpenAI(FakeOpenAI):
    """``with FakeAzureOpenAI(deployment, api_key=...) as fake:`` serves one deployment at
    ``fake.endpoint``, taking ``api_key`` in the ``api-key`` header or ``token`` as a bearer
    token (each None: not accepted)."""

    def __init__(self, deployment: str, *, api_key: str | None = None,
                 token: str | None = None, **quirks: Any) -> None:
        super().__init__(**quirks)
        self.deployment = deployment
        self.api_key = api_key
        self.token = token

    @property
    def endpoint(self) -> str:
        return self.url

    def __enter__(self) -> FakeAzureOpenAI:
        super().__enter__()
        return self

    def _prepare(self, step: Step) -> _Prepared:
        prepared = super()._prepare(step)  # rendered and validated as OpenAI's
        if prepared.completion is None:
            return prepared
        completion = copy.deepcopy(prepared.completion)
        completion["prompt_filter_results"] = _prompt_filter_results()
        for choice in completion["choices"]:
            choice["content_filter_results"] = copy.deepcopy(FILTER_RESULTS)
        return dataclasses.replace(
            prepared, completion=completion,
            chunks=_annotated(prepared.chunks), chunks_no_usage=_annotated(
                prepared.chunks_no_usage))

    def _respond(self, rec: Recorded, ex: Exchange) -> None:
        parts = urlsplit(rec.path)
        versions = parse_qs(parts.query).get("api-version", [])
        route = f"/openai/deployments/{self.deployment}/chat/completions"
        if parts.path != route or len(versions) != 1 or versions[0] not in API_VERSIONS:
            self._refuse_with(ex, 404, "DeploymentNotFound", f"fake: no deployment, route or "
                              f"api-version at {parts.path} {versions}")
            return
        if not self._authorised(rec.headers):
            self._refuse_with(ex, 401, "401", "Access denied due to invalid subscription key "
                              "or wrong API endpoint.")
            return
        unknown = sorted(API_VERSIONS[versions[0]] & set(rec.body))
        if unknown:
            self._refuse_with(ex, 400, None, "Unrecognized request argument supplied: "
                              + ", ".join(unknown))
            return
        super()._respond(dataclasses.replace(rec, path=PATH), ex)

    def _authorised(self, headers: dict[str, str]) -> bool:
        key, bearer = headers.get("api-key"), headers.get("authorization")
        if key is not None and bearer is not None:
            return False  # one credential per request
        if key is not None:
            return self.api_key is not None and key == self.api_key
        return self.token is not None and bearer == f"Bearer {self.token}"

    def _refuse_with(self, ex: Exchange, status: int, code: str | None, message: str) -> None:
        self.rejected.append(message)
        ex.send_json(status, _error_body(message, "invalid_request_error", code))


def _prompt_filter_results() -> list[dict[str, Any]]:
    return [{"prompt_index": 0, "content_filter_results": copy.deepcopy(FILTER_RESULTS)}]


def _annotated(chunks: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    """Azure's stream: its prelude, then each chunk's choices with their filter results."""
    if chunks is None:
        return None
    prelude = {"choices": [], "created": 0, "id": "", "model": "", "object": "",
               "prompt_filter_results": _prompt_filter_results()}
    out = [prelude]
    for chunk in chunks:
        chunk = copy.deepcopy(chunk)
        for choice in chunk["choices"]:
            choice["content_filter_results"] = {} if choice["finish_reason"] is None else \
                copy.deepcopy(FILTER_RESULTS)
        out.append(chunk)
    return out
