"""What both HTTP adapters share (``providers/_http.py``), held to the same behaviour against
bare loopback servers speaking each provider's wire format: what an error may carry (never
the key, never a runaway body, no exception chain), how a refusal is classified, how a
server's wait hint is read, and what the constructor refuses. How long a call may take and
how much of a reply it may hold: ``test_limits.py``.
"""

from __future__ import annotations

import json
import math
import re
import socket
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from runtime.llm import (
    ConfigurationError,
    Fault,
    LLMError,
    Message,
    OpaqueBlock,
    Request,
    Response,
    RetryPolicy,
    Role,
    StopReason,
    TextBlock,
    ToolUse,
    Usage,
    assemble,
    model_settings,
)
from runtime.llm.errors import MAX_MESSAGE_CHARS, quota_exhausted
from runtime.llm.providers._http import ERROR_BODY_LIMIT, HTTPModel, is_json_object, loads
from runtime.llm.providers.anthropic import AnthropicModel
from runtime.llm.providers.openai import OpenAIModel

from .fake_anthropic import check_error, check_event, check_message, message_body, stream_events
from .fake_openai import (
    render_chunks,
    render_completion,
    validate_chunk,
    validate_completion,
    validate_error,
)
from .harness import Sleeps, policy
from .loopback import Exchange, LoopbackServer, Recorded

pytestmark = pytest.mark.anyio

PROVIDERS = ["anthropic", "openai"]
MODES = ["generate", "stream"]
# Random-looking, so no 8-character piece of it occurs in any text by accident.
KEY = "sk-Q7vLp2Zr9TfX4mWc8NbK3hJd6GyS1aE5uR0"
ENDPOINT = {"anthropic": "/v1/messages", "openai": "/v1/chat/completions"}


def adapter(provider: str, root: str, *, key: str = KEY, **kw: Any) -> HTTPModel:
    """An adapter pointed at a server whose root URL is ``root``."""
    kw.setdefault("retry", RetryPolicy(max_attempts=1))
    if provider == "anthropic":
        return AnthropicModel("claude-sonnet-4-5", api_key=key, base_url=root, **kw)
    return OpenAIModel("gpt-4.1", api_key=key, base_url=f"{root}/v1", **kw)


def ask() -> Request:
    return Request(messages=(Message.text(Role.USER, "Hi"),), max_tokens=64)


async def run(model: HTTPModel, mode: str) -> Response:
    return await (model.generate(ask()) if mode == "generate" else assemble(model.stream(ask())))


REPLY = Response(message=Message(role=Role.ASSISTANT, blocks=(TextBlock(text="ok"),)),
                 stop_reason=StopReason.END_TURN, usage=Usage(input_tokens=3, output_tokens=1))


def success_body(provider: str) -> dict[str, Any]:
    if provider == "anthropic":
        return message_body(REPLY, model="claude-sonnet-4-5")
    return render_completion(REPLY)


def error_body(provider: str, message: str, kind: str | None = None,
               code: str | None = None) -> dict[str, Any]:
    """The provider's error body (checked against its SDK's types)."""
    if provider == "anthropic":
        body = {"type": "error", "error": {"type": kind or "api_error", "message": message}}
        check_error(body)
        return body
    body = {"error": {"message": message, "type": kind or "server_error", "param": None,
                      "code": code}}
    validate_error(body)
    return body


def stream_error(provider: str, ex: Exchange, message: str, kind: str | None = None,
                 code: str | None = None) -> None:
    """A 200 stream whose first event is an error, in the provider's form."""
    ex.start_stream()
    if provider == "anthropic":
        data = error_body(provider, message, kind)
        check_event("error", data)
        ex.send_event(json.dumps(data), "error")
    else:
        ex.send_event(json.dumps(error_body(provider, message, kind, code)))


@pytest.fixture
def serve() -> Iterator[Callable[[Callable[[Recorded, Exchange], None]], LoopbackServer]]:
    servers: list[LoopbackServer] = []

    def start(respond: Callable[[Recorded, Exchange], None]) -> LoopbackServer:
        srv = LoopbackServer(respond).__enter__()
        servers.append(srv)
        return srv

    yield start
    for srv in servers:
        srv.__exit__(None, None, None)


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pieces_of(secret: str, size: int = 8) -> list[str]:
    return [secret[i:i + size] for i in range(len(secret) - size + 1)]


def leaks(text: str, secret: str = KEY) -> list[str]:
    """The pieces of ``secret`` (8 characters or more) that occur in ``text``."""
    return [p for p in pieces_of(secret) if p in text]


# -- 13. what an error may carry -------------------------------------------------------------

# Where the key sits in a server's echo: at the start; ending at character 300 (the old cut,
# made before scrubbing, left all of it but its last character); across the message cap; and
# across the read limit, where only the start of the key is received at all.
OFFSETS = [0, 300 - len(KEY) + 1, MAX_MESSAGE_CHARS - len(KEY) // 2, MAX_MESSAGE_CHARS - 5,
           ERROR_BODY_LIMIT - 5 - len('{"error":{"message":"')]


@pytest.mark.parametrize("offset", OFFSETS)
@pytest.mark.parametrize("form", ["json", "html"])
@pytest.mark.parametrize("provider", PROVIDERS)
async def test_a_key_echoed_anywhere_in_an_error_body_never_leaks(
        serve: Any, provider: str, form: str, offset: int) -> None:
    echo = "x" * offset + KEY + " was rejected " + "y" * 200

    def respond(rec: Recorded, ex: Exchange) -> None:
        if form == "json":
            ex.send_json(401, error_body(provider, echo, "authentication_error"))
        else:
            ex.send_bytes(401, f"<html><body>{echo}</body></html>".encode(), "text/html")

    srv = serve(respond)
    with pytest.raises(LLMError) as info:
        await adapter(provider, srv.url).generate(ask())
    err = info.value
    assert err.status == 401 and err.fault is Fault.TERMINAL
    assert len(err.message) <= MAX_MESSAGE_CHARS
    assert leaks(f"{err} {err!r} {err.message} {err.args}") == []


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_a_huge_error_body_is_read_only_in_part_and_makes_a_short_message(
        serve: Any, provider: str) -> None:
    """A 50 MB error body: the adapter reads at most ``ERROR_BODY_LIMIT`` bytes of it (the
    server never gets to send the rest) and its message is capped."""
    size = 50 * 1024 * 1024
    finished = threading.Event()
    head = {  # the provider's error body up to its message's text, which is 50 MB of "x"
        "anthropic": b'{"type":"error","error":{"type":"api_error","message":"',
        "openai": b'{"error":{"type":"server_error","param":null,"code":null,"message":"',
    }[provider]
    tail = b'"}}'

    def respond(rec: Recorded, ex: Exchange) -> None:
        h = ex.handler
        h.send_response(500)
        h.send_header("content-type", "application/json")
        h.send_header("content-length", str(len(head) + size + len(tail)))
        h.end_headers()
        h.wfile.write(head)
        chunk = b"x" * 65536
        for _ in range(size // len(chunk)):
            h.wfile.write(chunk)
        h.wfile.write(tail)
        h.wfile.flush()
        finished.set()

    srv = serve(respond)
    with pytest.raises(LLMError) as info:
        await adapter(provider, srv.url).generate(ask())
    assert info.value.status == 500 and info.value.fault is Fault.TRANSIENT
    assert len(info.value.message) <= MAX_MESSAGE_CHARS
    assert len(str(info.value)) < MAX_MESSAGE_CHARS + 100
    assert not finished.is_set(), "the whole 50 MB body was read"


def chain(error: BaseException) -> list[BaseException]:
    """Every exception reachable from ``error`` through ``__cause__`` and ``__context__``."""
    seen: list[BaseException] = []
    todo = [error]
    while todo:
        e = todo.pop()
        if any(e is s for s in seen):
            continue
        seen.append(e)
        todo += [x for x in (e.__cause__, e.__context__) if x is not None]
    return seen


RAW = "RAW-BODY-MARKER-5d1c"


def _echo_401(provider: str) -> Callable[[Recorded, Exchange], None]:
    return lambda rec, ex: ex.send_json(401, error_body(
        provider, f"bad key {KEY} {RAW}", "authentication_error"))


def _in_stream_error(provider: str) -> Callable[[Recorded, Exchange], None]:
    return lambda rec, ex: stream_error(provider, ex, f"key {KEY} {RAW}", "invalid_request_error")


def _not_json(provider: str) -> Callable[[Recorded, Exchange], None]:
    return lambda rec, ex: ex.send_bytes(200, f"<html>{KEY} {RAW}</html>".encode(), "text/html")


def _bad_event(provider: str) -> Callable[[Recorded, Exchange], None]:
    def respond(rec: Recorded, ex: Exchange) -> None:
        ex.start_stream()
        ex.send_event(f"{{not json {KEY} {RAW}", "content_block_delta")

    return respond


SCENARIOS = {
    "401 echoing the key": (_echo_401, "generate"),
    "error event in the stream": (_in_stream_error, "stream"),
    "200 body that is not JSON": (_not_json, "generate"),
    "stream event that is not JSON": (_bad_event, "stream"),
    "connection refused": (None, "generate"),
}


@pytest.mark.parametrize("scenario", SCENARIOS)
@pytest.mark.parametrize("provider", PROVIDERS)
async def test_no_key_or_raw_body_is_reachable_through_the_exception_chain(
        serve: Any, provider: str, scenario: str) -> None:
    """The exceptions underneath an adapter's error hold the request (with its key), the raw
    body (a JSONDecodeError's ``doc``) or the error event: none is chained to it."""
    make, mode = SCENARIOS[scenario]
    root = f"http://127.0.0.1:{closed_port()}" if make is None else serve(make(provider)).url
    with pytest.raises(LLMError) as info:
        await run(adapter(provider, root), mode)
    err = info.value
    assert (err.__cause__, err.__context__) == (None, None)
    for e in chain(err):  # the server's own message may be in ``err``, never the raw body
        text = f"{e!s} {e!r} {e.args!r} {vars(e)!r}"
        assert leaks(text) == [] and (e is err or RAW not in text)


# A key as long as OpenAI's project keys: a decoder quoting the start of a tool name (40
# characters of it) quotes a piece of it, never the whole.
LONG_KEY = "sk-proj-" + "Hq4Tz8Wm2Lx6Rv0Nc3Yb7Kd1Sf5Jg9Pa" * 3


def replying(provider: str, mode: str, response: Response) -> Callable[[Recorded, Exchange], None]:
    """A server answering with ``response`` in ``provider``'s wire format, each body checked
    against its SDK's types first."""
    def respond(rec: Recorded, ex: Exchange) -> None:
        if mode == "generate":
            if provider == "anthropic":
                body = message_body(response, model="claude-sonnet-4-5")
                check_message(body)
            else:
                body = render_completion(response)
                validate_completion(body)
            ex.send_json(200, body)
            return
        ex.start_stream()
        if provider == "anthropic":
            for name, data in stream_events(response, model="claude-sonnet-4-5"):
                check_event(name, data)
                ex.send_event(json.dumps(data), name)
            return
        for chunk in render_chunks(response, include_usage=True):
            validate_chunk(chunk)
            ex.send_event(json.dumps(chunk))
        ex.send_event("[DONE]")

    return respond


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("provider", PROVIDERS)
async def test_a_key_starting_an_overlong_tool_name_never_leaks(
        serve: Any, provider: str, mode: str, caplog: pytest.LogCaptureFixture) -> None:
    """A server echoing the key as a tool name past the cap: the error quotes the name's
    first 40 characters, a piece of the key, which is redacted like the whole key."""
    caplog.set_level("INFO", logger="celldialog.llm.retry")
    call = ToolUse(id="call_1", name=LONG_KEY + "y" * 300, input={"x": 1})
    srv = serve(replying(provider, mode, Response(
        message=Message(role=Role.ASSISTANT, blocks=(call,)), stop_reason=StopReason.TOOL_USE,
        usage=Usage(input_tokens=3, output_tokens=1))))
    with pytest.raises(LLMError, match="tool name cap") as info:
        await run(adapter(provider, srv.url, key=LONG_KEY), mode)
    err = info.value
    assert "[redacted]" in err.message
    logged = [r.getMessage() for r in caplog.records if r.name == "celldialog.llm.retry"]
    assert logged and "[redacted]" in logged[-1]
    for text in (str(err), repr(err), repr(err.args), *logged):
        assert leaks(text, LONG_KEY) == []


async def test_a_key_the_server_names_a_tool_with_leaks_into_no_error_or_retry_log(
        serve: Any, caplog: pytest.LogCaptureFixture) -> None:
    """A tool named with the key, its arguments not an object: the decoder's (transient)
    error quotes the name; every attempt's error is redacted before the retry layer logs it
    (a WARNING, as another attempt follows) and before it reaches the caller."""
    caplog.set_level("INFO", logger="celldialog.llm.retry")
    body = render_completion(REPLY)
    body["choices"][0]["finish_reason"] = "tool_calls"
    body["choices"][0]["message"]["tool_calls"] = [{
        "id": "call_1", "type": "function", "function": {"name": KEY, "arguments": "[1]"}}]
    validate_completion(body)
    srv = serve(lambda rec, ex: ex.send_json(200, body))
    sleeps = Sleeps()
    with pytest.raises(LLMError, match="arguments are not a JSON object") as info:
        await adapter("openai", srv.url, retry=policy(sleeps, attempts=2)).generate(ask())
    err = info.value
    assert (err.fault, err.attempts, len(srv.requests)) == (Fault.TRANSIENT, 2, 2)
    assert "'[redacted]'" in err.message
    records = [r for r in caplog.records if r.name == "celldialog.llm.retry"]
    assert [r.levelname for r in records] == ["WARNING", "INFO"]
    assert "'[redacted]'" in records[0].getMessage()
    for text in (str(err), repr(err), repr(err.args), caplog.text):
        assert leaks(text) == []


# -- what a reply's JSON may hold --------------------------------------------------------------

NON_FINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


@pytest.mark.parametrize("constant", NON_FINITE)
def test_nan_and_infinity_are_not_json(constant: str) -> None:
    """Python's reader takes them; JSON has none, so no reply may bring one in (kept in an
    opaque block, it would be sent back as a request that is not JSON)."""
    for text in (constant, f'{{"a":[1,{{"b":{constant}}}]}}'):
        for raw in (text, text.encode()):
            with pytest.raises(ValueError, match=f"{re.escape(constant)} is not JSON"):
                loads(raw)
    assert not is_json_object(f'{{"type":"thinking","n":{constant}}}')
    assert loads(f'{{"b":"{constant}","n":-1e308}}') == {"b": constant, "n": -1e308}
    assert is_json_object('{"n":1e308}')


THINKING = '{"type":"thinking","thinking":"Rain data wanted.","signature":"c2lnbmVk"}'


@pytest.mark.parametrize("constant", NON_FINITE)
@pytest.mark.parametrize("mode", MODES)
async def test_a_thinking_block_holding_nan_is_a_malformed_reply(
        serve: Any, mode: str, constant: str) -> None:
    """Anthropic's thinking block is kept whole, as an opaque block sent back verbatim: one
    holding ``NaN`` is refused as it arrives (terminal, like any reply that is not JSON)."""
    response = Response(message=Message(role=Role.ASSISTANT, blocks=(
        OpaqueBlock(provider="anthropic", raw=THINKING), TextBlock(text="ok"))),
        stop_reason=StopReason.END_TURN, usage=Usage(input_tokens=3, output_tokens=1))

    def respond(rec: Recorded, ex: Exchange) -> None:
        if mode == "generate":
            body = message_body(response, model="claude-sonnet-4-5")
            check_message(body)
            body["content"][0]["n"] = NON_FINITE[constant]  # json.dumps writes the constant
            ex.send_json(200, body)
            return
        ex.start_stream()
        for name, data in stream_events(response, model="claude-sonnet-4-5"):
            check_event(name, data)
            if name == "content_block_start" and data["index"] == 0:
                data["content_block"]["n"] = NON_FINITE[constant]
            ex.send_event(json.dumps(data), name)

    srv = serve(respond)
    with pytest.raises(LLMError, match="malformed") as info:
        await run(adapter("anthropic", srv.url), mode)
    assert info.value.fault is Fault.TERMINAL and len(srv.requests) == 1


async def test_tool_call_arguments_holding_nan_are_malformed_like_any_non_object(
        serve: Any) -> None:
    """OpenAI's arguments are the model's text: ``{"x": NaN}`` is not a JSON object, the
    same (transient) fault as any other arguments that are not one."""
    body = render_completion(REPLY)
    body["choices"][0]["finish_reason"] = "tool_calls"
    body["choices"][0]["message"]["tool_calls"] = [{
        "id": "call_1", "type": "function", "function": {"name": "f", "arguments": '{"x": NaN}'}}]
    validate_completion(body)
    srv = serve(lambda rec, ex: ex.send_json(200, body))
    with pytest.raises(LLMError, match="'f' arguments are not a JSON object") as info:
        await adapter("openai", srv.url).generate(ask())
    assert info.value.fault is Fault.TRANSIENT


# -- 14. classification, wait hints, logging, time -------------------------------------------

RATE, QUOTA = Fault.TRANSIENT, Fault.TERMINAL
MESSAGES = [
    ("tokens per minute quota exceeded", RATE),
    ("Rate limit reached for gpt-4.1 on requests per min. Visit "
     "https://platform.openai.com/account/billing to add a payment method.", RATE),
    ("Number of request tokens has exceeded your per-minute rate limit", RATE),
    ("Too many requests", RATE),
    ("You exceeded your current quota, please check your plan and billing details.", QUOTA),
    ("insufficient_quota", QUOTA),
    ("Your credit balance is too low to access the Anthropic API.", QUOTA),
    ("Billing hard limit has been reached", QUOTA),
    ("billing: the payment method was declined", QUOTA),
    ("quota exceeded", QUOTA),
]


@pytest.mark.parametrize(("message", "fault"), MESSAGES)
def test_one_classifier_reads_quota_and_rate_limit_messages(message: str, fault: Fault) -> None:
    assert quota_exhausted(message) is (fault is QUOTA)


@pytest.mark.parametrize("code", ["insufficient_quota", "billing_error",
                                  "billing_hard_limit_reached"])
def test_a_quota_code_is_terminal_whatever_the_message(code: str) -> None:
    assert quota_exhausted("Rate limit: tokens per minute", "requests", code)
    assert not quota_exhausted("Rate limit: tokens per minute", "rate_limit_exceeded", None)


@pytest.mark.parametrize(("message", "fault"), MESSAGES)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("provider", PROVIDERS)
async def test_the_same_text_classifies_the_same_in_both_adapters(
        serve: Any, provider: str, mode: str, message: str, fault: Fault) -> None:
    """A 429 (or an error event mid-stream) with a neutral type / code: only its text says
    whether it is a rate limit or an empty wallet, and both adapters read it alike."""
    kind = "rate_limit_error" if provider == "anthropic" else "requests"

    def respond(rec: Recorded, ex: Exchange) -> None:
        if mode == "generate":
            ex.send_json(429, error_body(provider, message, kind))
        else:
            stream_error(provider, ex, message, kind)

    srv = serve(respond)
    with pytest.raises(LLMError) as info:
        await run(adapter(provider, srv.url), mode)
    assert info.value.fault is fault


# header -> value -> the wait it must give: None for the policy's own backoff (the hint is
# ignored), else the hint, clamped to [0, max_delay].
HINTS: dict[str, dict[str, float | None]] = {
    "retry-after": {
        "nan": None, "inf": None, "-inf": None, "1e400": None, "soon": None, "1_000": None,
        "": None, "-5": 0.0, "2": 2.0, "99999999999": 20.0,
        "Fri, 31 Dec 9999 23:59:59 GMT": 20.0, "Wed, 21 Oct 2015 07:28:00 GMT": 0.0,
    },
    "retry-after-ms": {
        "nan": None, "inf": None, "1e400": None, "soon": None, "-5": 0.0, "1500": 1.5,
        "99999999999999": 20.0, "Fri, 31 Dec 9999 23:59:59 GMT": None,
    },
}


@pytest.mark.parametrize(("header", "value"),
                         [(h, v) for h, values in HINTS.items() for v in values])
@pytest.mark.parametrize("provider", PROVIDERS)
async def test_a_wait_hint_of_any_shape_never_escapes_as_a_raw_error(
        serve: Any, provider: str, header: str, value: str) -> None:
    replies = iter([429, 200])

    def respond(rec: Recorded, ex: Exchange) -> None:
        if next(replies) == 429:
            kind = "rate_limit_error" if provider == "anthropic" else "requests"
            ex.send_json(429, error_body(provider, "slow down", kind), {header: value})
        else:
            ex.send_json(200, success_body(provider))

    srv = serve(respond)
    sleeps = Sleeps()
    retry = RetryPolicy(max_attempts=2, base_delay=0.5, jitter=0.0, sleep=sleeps,
                        clock=lambda: 0.0)
    got = await adapter(provider, srv.url, retry=retry).generate(ask())
    assert got.message.text_content() == "ok"
    want = HINTS[header][value]
    assert sleeps.waits == [0.5 if want is None else want]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("provider", PROVIDERS)
async def test_each_retry_is_logged_and_the_error_counts_the_attempts(
        serve: Any, provider: str, mode: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("INFO", logger="celldialog.llm.retry")
    srv = serve(lambda rec, ex: ex.send_json(503, error_body(provider, "overloaded")))
    sleeps = Sleeps()
    with pytest.raises(LLMError) as info:
        await run(adapter(provider, srv.url, retry=policy(sleeps, attempts=3)), mode)
    assert len(srv.requests) == 3
    assert info.value.attempts == 3 and "after 3 attempts" in str(info.value)
    records = [r for r in caplog.records if r.name == "celldialog.llm.retry"]
    assert [(r.levelname, r.attempt, r.max_attempts, r.provider, r.status)  # type: ignore[attr-defined]
            for r in records] == [
        ("WARNING", 1, 3, provider, 503), ("WARNING", 2, 3, provider, 503),
        ("INFO", 3, 3, provider, 503)]
    assert [r.delay for r in records] == [*sleeps.waits, None]  # type: ignore[attr-defined]
    assert "attempt 1 of 3" in records[0].getMessage()
    assert f"retrying in {sleeps.waits[0]:.2f} s" in records[0].getMessage()
    assert "giving up" in records[2].getMessage()
    assert not [r for r in caplog.records if KEY in r.getMessage()]


# -- 15. what the constructor refuses, and what a 404 says -----------------------------------

BAD_URLS = {
    "http://localhost:99999": "port",
    "http://local\thost:8080": "a tab at position 12",
    "http://localhost:8080/v1\n": "a newline at position 24",
    "http://localhost:8080 /v1": "a space",
    "http://[invalid": "cannot be parsed",
    "https://[::1:443": "cannot be parsed",
}


@pytest.mark.parametrize("url", BAD_URLS)
@pytest.mark.parametrize("provider", PROVIDERS)
def test_a_base_url_httpx_cannot_use_fails_at_construction(provider: str, url: str) -> None:
    with pytest.raises(ConfigurationError, match=BAD_URLS[url]) as info:
        adapter(provider, url)
    assert "base URL" in str(info.value) and KEY not in str(info.value)
    with pytest.raises(ConfigurationError, match=BAD_URLS[url]):
        model_settings(f"{provider}:m", api_key=KEY, base_url=url, env={},
                       dotenv_path="/nonexistent/.env")


BAD_KEYS = {
    f"{KEY}\n": "a newline at its end",
    f" {KEY}": "a space at position 0",
    f"{KEY[:10]}\t{KEY[10:]}": "a tab at position 10",
    f"{KEY[:6]}\u201c{KEY[6:]}": "a non-ASCII character",
    f"{KEY[:6]}\u00e9{KEY[6:]}": "a non-ASCII character",
    f"{KEY[:6]}\x00{KEY[6:]}": "a control character",
}


@pytest.mark.parametrize("key", BAD_KEYS)
@pytest.mark.parametrize("provider", PROVIDERS)
def test_a_key_that_cannot_go_in_a_header_fails_at_construction(provider: str, key: str) -> None:
    cls = AnthropicModel if provider == "anthropic" else OpenAIModel
    with pytest.raises(ConfigurationError, match=BAD_KEYS[key]) as info:
        cls("m", api_key=key, base_url="https://gw.example/v1")
    assert "API key" in str(info.value)
    assert leaks(f"{info.value} {info.value!r}") == []
    with pytest.raises(ConfigurationError, match=BAD_KEYS[key]) as info:
        model_settings(f"{provider}:m", api_key=key, env={}, dotenv_path="/nonexistent/.env")
    assert leaks(str(info.value)) == []


@pytest.mark.parametrize("timeout", [0, -1, math.nan, math.inf])
@pytest.mark.parametrize("provider", PROVIDERS)
def test_a_timeout_must_be_a_positive_number(provider: str, timeout: float) -> None:
    with pytest.raises(ConfigurationError, match="timeout"):
        adapter(provider, "https://gw.example", timeout=timeout)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("provider", PROVIDERS)
async def test_a_404_names_the_url_it_asked_for(serve: Any, provider: str, mode: str) -> None:
    srv = serve(lambda rec, ex: ex.send_json(404, error_body(
        provider, "Not found", "not_found_error" if provider == "anthropic"
        else "invalid_request_error")))
    with pytest.raises(LLMError) as info:
        await run(adapter(provider, f"{srv.url}/proxy"), mode)
    err = info.value
    assert (err.status, err.fault) == (404, Fault.TERMINAL)
    assert err.message.startswith("Not found")
    assert f"{srv.url}/proxy{ENDPOINT[provider]}" in err.message


# What a base URL must not hold (what the message names), each behind a valid https URL:
# never the part itself, which may be a password or a token.
EXTRAS = {
    "https://user:hunter2pw@gw.example/v1": "a user name or password .*Basic auth",
    "https://hunter2pw@gw.example/v1": "a user name or password",
    "https://gw.example/v1?key=hunter2pw": r"a query \('\?\.\.\.'\)",
    "https://gw.example/v1?": "a query",
    "http://127.0.0.1:8080/v1#hunter2pw": "a fragment",
    "https://u:hunter2pw@gw.example/v1?k=1#f": "password .*; and a query .*; and a fragment",
}


@pytest.mark.parametrize("url", EXTRAS)
@pytest.mark.parametrize("provider", PROVIDERS)
def test_a_base_url_with_userinfo_a_query_or_a_fragment_is_refused(provider: str,
                                                                   url: str) -> None:
    """userinfo makes httpx send Basic auth in place of the key; the adapter's path would
    land inside a query, or after a fragment (never sent). The message says which part and
    to remove it, never what it held."""
    for build in (lambda: adapter(provider, url), lambda: model_settings(
            f"{provider}:m", api_key=KEY, base_url=url, env={},
            dotenv_path="/nonexistent/.env")):
        with pytest.raises(ConfigurationError, match=EXTRAS[url]) as info:
            build()
        text = f"{info.value} {info.value!r}"
        assert "base URL" in text and "remove it" in text
        assert "hunter2pw" not in text and leaks(text) == []


@pytest.mark.parametrize("url", ["http://127.0.0.1:8080/v1", "http://localhost:11434/v1/",
                                 "http://[::1]:8000", "https://gw.example/api/v1",
                                 "https://gw.example:8443/openai/v1"])
@pytest.mark.parametrize("provider", PROVIDERS)
def test_the_base_urls_in_use_are_still_taken(provider: str, url: str) -> None:
    assert isinstance(adapter(provider, url), HTTPModel)
    assert model_settings(f"{provider}:m", api_key=KEY, base_url=url, env={},
                          dotenv_path="/nonexistent/.env").base_url == url
