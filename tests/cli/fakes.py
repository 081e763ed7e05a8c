"""An OpenAI-compatible server on loopback for the CLI tests, with replies that can be held.

It speaks the real Chat Completions wire format (rendered by ``tests/llm/fake_openai.py``,
whose renderings are checked against the official SDK types in the LLM tests) over the
shared ``LoopbackServer``. A ``Held`` step streams its first chunks, then holds the rest
until the test releases it or the client goes away, so a test can cancel a reply that is
really in flight and see the connection close.
"""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from runtime.llm.types import Message, Response, Role, StopReason, TextBlock, ToolUse, Usage
from tests.llm.fake_openai import PATH, render_chunks, render_completion
from tests.llm.loopback import Exchange, LoopbackServer, Recorded

MODEL = "gpt-4o-mini"


def text(reply: str) -> Response:
    """A plain text reply."""
    return Response(message=Message(role=Role.ASSISTANT, blocks=(TextBlock(text=reply),)),
                    stop_reason=StopReason.END_TURN, usage=Usage(input_tokens=10,
                                                                 output_tokens=5),
                    model=MODEL)


def tool_call(name: str, args: dict[str, Any], id: str = "call_1") -> Response:
    """A reply that calls one tool."""
    return Response(
        message=Message(role=Role.ASSISTANT, blocks=(ToolUse(id=id, name=name, input=args),)),
        stop_reason=StopReason.TOOL_USE, usage=Usage(input_tokens=10, output_tokens=5),
        model=MODEL)


@dataclass
class Held:
    """Stream ``head`` chunks of ``response`` (``pace`` seconds apart), then hold until
    ``release`` or the client leaves; ``arrived`` is set when the hold starts,
    ``client_left`` if the client hung up."""

    response: Response
    head: int = 2
    pace: float = 0.0  # seconds between the head's chunks: a model's token latency
    arrived: threading.Event = field(default_factory=threading.Event)
    release: threading.Event = field(default_factory=threading.Event)
    client_left: threading.Event = field(default_factory=threading.Event)


class OpenAIServer:
    """``with OpenAIServer() as srv:`` serves Chat Completions at ``srv.base_url``."""

    def __init__(self) -> None:
        self._steps: deque[Response | Held] = deque()
        self._lock = threading.Lock()
        self._server = LoopbackServer(self._respond)

    @property
    def base_url(self) -> str:
        return f"{self._server.url}/v1"

    @property
    def requests(self) -> list[Recorded]:
        return self._server.requests

    def script(self, *steps: Response | Held) -> None:
        with self._lock:
            self._steps.extend(steps)

    def __enter__(self) -> OpenAIServer:
        self._server.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        with self._lock:
            held = [s for s in self._steps if isinstance(s, Held)]
        for h in held:
            h.release.set()
        self._server.__exit__(*exc)

    def _respond(self, rec: Recorded, ex: Exchange) -> None:
        if rec.path != PATH:
            ex.send_json(404, {"error": {"message": f"no route {rec.path}",
                                         "type": "invalid_request_error", "param": None,
                                         "code": None}})
            return
        with self._lock:
            step = self._steps.popleft() if self._steps else None
        if step is None:
            ex.send_json(400, {"error": {"message": "fake: no scripted reply left",
                                         "type": "invalid_request_error", "param": None,
                                         "code": None}})
            return
        response = step.response if isinstance(step, Held) else step
        body = rec.body
        if body.get("stream") is not True:
            ex.send_json(200, render_completion(response))
            return
        usage = bool((body.get("stream_options") or {}).get("include_usage"))
        chunks = render_chunks(response, include_usage=usage)
        ex.start_stream()
        if isinstance(step, Held):
            for c in chunks[: step.head]:
                if step.pace:
                    time.sleep(step.pace)  # the fake model's own pace, in its own thread
                ex.send_event(json.dumps(c))
            step.arrived.set()
            if self._hold(ex, step):
                return
            chunks = chunks[step.head:]
        for c in chunks:
            ex.send_event(json.dumps(c))
        ex.send_event("[DONE]")

    @staticmethod
    def _hold(ex: Exchange, step: Held) -> bool:
        """Wait for the release or the client's leaving (True: it left)."""
        sock = ex.handler.connection
        sock.settimeout(0.05)
        try:
            while not step.release.is_set():
                try:
                    if not sock.recv(1024):
                        step.client_left.set()
                        return True
                except TimeoutError:
                    continue
        except OSError:  # reset by the client
            step.client_left.set()
            return True
        finally:
            sock.settimeout(None)
        return False
