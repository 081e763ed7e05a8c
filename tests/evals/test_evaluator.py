"""The Evaluator on scripted models: exact success rates, token sums and turns; attempts in
parallel under the concurrency bound; failures with messages and transcripts; cancellation."""

from __future__ import annotations

import time

import anyio
import pytest

from runtime import LLM
from runtime.evals import (
    Eval,
    EvalModel,
    Evaluator,
    PatternEval,
    PatternRun,
    evaluation,
    scripted,
    tool_calls,
)
from runtime.llm import Fault, LLMError, Reply, ScriptedModel, Usage, call, delayed

pytestmark = pytest.mark.anyio


class Notes:
    """A notebook."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def add(self, line: str) -> str:
        """Add a line."""
        self.lines.append(line)
        return f"{len(self.lines)} lines"


class AddsMilk(Eval):
    name = "adds-milk"

    def prompt(self, base: LLM) -> LLM:
        return base.with_tools(Notes()).with_prompt("Note milk.").loop(max_steps=4)

    def check(self, llm: LLM) -> None:
        calls = tool_calls(llm)
        assert [c.input for c in calls if c.name == "add"] == [{"line": "milk"}], \
            "should have added milk"


@evaluation(prompt="Say hello.")
def says_hello(llm: LLM) -> None:
    assert "hello" in (llm.last_reply or "").lower()


GOOD = [Reply(tool_calls=[call("add", {"line": "milk"})],
              usage=Usage(input_tokens=100, output_tokens=10, cache_read_tokens=40,
                          cache_write_tokens=7)),
        Reply(text="Noted.", usage=Usage(input_tokens=130, output_tokens=3,
                                         cache_read_tokens=90))]
BAD = [Reply(text="Noted (not really).", usage=Usage(input_tokens=90, output_tokens=5))]


def flaky(eval_name: str, attempt: int) -> list:
    """Attempts 2 and 4 get the wrong script: 3 of 5 pass."""
    return BAD if attempt in (2, 4) else GOOD


async def test_success_rates_tokens_and_turns_are_exact() -> None:
    report = await Evaluator().with_evals([AddsMilk()]).run(
        [scripted(flaky, label="flaky")], attempts=5)
    r = report.result("flaky", "adds-milk")
    assert (r.attempts, r.successes, r.success_rate) == (5, 3, 0.6)
    assert r.input_tokens == 3 * (100 + 130) + 2 * 90
    assert r.output_tokens == 3 * (10 + 3) + 2 * 5
    assert r.cache_read_tokens == 3 * (40 + 90)
    assert r.cache_write_tokens == 3 * 7
    assert r.turns == 3 * 2 + 2 * 1
    assert [f.attempt for f in r.failures] == [2, 4]
    assert r.failures[0].message.startswith("check: should have added milk")
    assert r.failures[0].transcript == "User: Note milk.\n\nAssistant: Noted (not really)."
    assert not report.passed and report.exit_status == 1
    assert r.seconds > 0 and report.seconds > 0


async def test_the_threshold_sets_the_exit_status() -> None:
    four_of_five = scripted(lambda _e, n: BAD if n == 3 else GOOD, label="m")
    base = Evaluator().with_evals([AddsMilk()])
    assert (await base.run([four_of_five], attempts=5)).exit_status == 0  # 0.8 >= 0.8
    assert (await base.with_threshold(0.9).run([four_of_five], attempts=5)).exit_status == 1
    assert (await base.with_threshold(0.0).run([scripted(BAD)], attempts=2)).exit_status == 0
    with pytest.raises(ValueError, match="between 0 and 1"):
        Evaluator(threshold=1.5)


async def test_attempts_run_in_parallel() -> None:
    delay, attempts = 0.4, 8
    slow = [delayed(delay, "hello")]
    started = time.perf_counter()
    report = await Evaluator().with_evals([says_hello]).run(
        [scripted(slow)], attempts=attempts, concurrency=attempts)
    elapsed = time.perf_counter() - started
    assert report.result("scripted", "says_hello").successes == attempts
    assert elapsed < attempts * delay / 2, f"{elapsed:.2f}s: the attempts ran one by one"


class _Gauge:
    """Counts the model calls in flight, to see the concurrency bound hold."""

    def __init__(self) -> None:
        self.now = self.peak = 0

    def model(self, eval_name: str) -> ScriptedModel:
        gauge = self

        class Watched(ScriptedModel):
            async def stream(self, request):  # type: ignore[override]
                gauge.now += 1
                gauge.peak = max(gauge.peak, gauge.now)
                try:
                    async for event in super().stream(request):
                        yield event
                finally:
                    gauge.now -= 1

        return Watched([delayed(0.05, "hello")])


async def test_the_concurrency_limit_bounds_attempts_across_models() -> None:
    gauge = _Gauge()
    models = [scripted(gauge.model, label=f"m{i}") for i in range(3)]
    report = await Evaluator().with_evals([says_hello]).run(models, attempts=4, concurrency=2)
    assert [r.successes for r in report.results] == [4, 4, 4]
    assert gauge.peak == 2
    gauge = _Gauge()
    await Evaluator().with_evals([says_hello]).run(
        [scripted(gauge.model, label=f"m{i}") for i in range(3)], attempts=4, concurrency=12)
    assert gauge.peak == 12  # models in parallel too, not one after another


async def test_a_model_serving_one_at_a_time_queues_its_attempts_apart_from_their_time(
        ) -> None:
    delay, attempts = 0.2, 4
    gauge = _Gauge()

    def one(eval_name: str) -> ScriptedModel:
        return gauge.model(eval_name)

    # one model that serves one attempt at a time, one with no limit of its own, in one run
    # of 8 slots: the first's attempts run one after another, each timed on its own
    lone = scripted(lambda: [delayed(delay, "hello")], label="lone", concurrency=1)
    started = time.perf_counter()
    report = await Evaluator().with_evals([says_hello]).run(
        [lone, scripted(one, label="free")], attempts=attempts, concurrency=8)
    elapsed = time.perf_counter() - started
    mine = sorted((a for a in report.attempts if a.model == "lone"),
                  key=lambda a: a.queue_seconds)
    assert [a.passed for a in mine] == [True] * attempts
    for i, a in enumerate(mine):  # each attempt's time is its own: one delay, not its place
        assert delay * 0.9 <= a.seconds < delay * 2, (i, a.seconds)
        assert a.queue_seconds >= i * delay * 0.9, (i, a.queue_seconds)
    r = report.result("lone", "says_hello")
    assert r.seconds <= elapsed and r.queue_seconds >= sum(range(attempts)) * delay * 0.9
    assert r.per_attempt("seconds") < delay * 2  # the mean does not climb with the queue
    assert gauge.peak == attempts  # the other model's attempts ran at once meanwhile
    assert all(a.queue_seconds < delay for a in report.attempts if a.model == "free")


def test_the_local_model_serves_one_request_at_a_time() -> None:
    from runtime.evals import serves_at_once

    class Local(ScriptedModel):
        @property
        def provider(self) -> str:
            return "local"

    class Pooled(ScriptedModel):
        concurrency = 3

    assert serves_at_once(Local([])) == 1
    assert serves_at_once(Pooled([])) == 3
    assert serves_at_once(ScriptedModel([])) is None


async def test_a_run_failure_is_recorded_with_its_phase_and_progress() -> None:
    limited = [Reply(tool_calls=[call("add", {"line": "x"})])] * 5
    broken = [LLMError("overloaded", fault=Fault.TERMINAL, provider="scripted")]
    report = await Evaluator().with_evals([AddsMilk()]).run(
        [scripted(limited, label="loops"), scripted(broken, label="broken")])
    loops = report.result("loops", "adds-milk").failures[0]
    assert loops.message.startswith("run: StepLimitError:") and "max_steps=4" in loops.message
    assert loops.transcript.count("Assistant called add") == 4
    assert report.result("loops", "adds-milk").turns == 4
    assert report.result("broken", "adds-milk").failures[0].message == \
        "run: LLMError: scripted (terminal): overloaded"


async def test_an_attempt_that_takes_too_long_fails_with_timeout() -> None:
    report = await Evaluator(timeout=0.2).with_evals([says_hello]).run(
        [scripted([delayed(30, "hello")])])
    assert report.results[0].failures[0].message == "run: timed out"


async def test_a_bare_assert_is_reported_by_its_source_line(tmp_path) -> None:
    # a file pytest does not rewrite, as a user's eval file is
    (tmp_path / "bare_assert_evals.py").write_text(
        "from runtime.evals import evaluation\n\n\n"
        "@evaluation(prompt='Say hello.')\n"
        "def greets(llm):\n"
        "    assert 'hello' in (llm.last_reply or '').lower()\n")
    from runtime.evals import load_evals

    report = await Evaluator().with_evals(load_evals(tmp_path / "bare_assert_evals.py")).run(
        [scripted(["goodbye"])])
    assert report.results[0].failures[0].message == (
        "check: assertion failed at bare_assert_evals.py:6: "
        "assert 'hello' in (llm.last_reply or '').lower()")


async def test_the_system_prompt_and_docs_reach_every_attempt() -> None:
    seen: list[str] = []

    def model(eval_name: str) -> ScriptedModel:
        m = ScriptedModel(["hello"])
        seen.append(m)  # type: ignore[arg-type]
        return m

    ev = (Evaluator().without_default_system_prompt().with_system_prompt("Be brief.")
          .with_docs("Tools are documented here.").with_evals([says_hello]))
    await ev.run([scripted(model)], attempts=2)
    systems = [m.requests[0].system for m in seen]  # type: ignore[attr-defined]
    assert systems == ["Be brief.\n\n# Documentation\n\nTools are documented here."] * 2


async def test_cancelling_the_run_cancels_every_attempt_and_closes_models() -> None:
    closed: list[bool] = []
    slow = EvalModel("slow", lambda _e, _a: ScriptedModel([delayed(30, "hello")]),
                     close=lambda: closed.append(True))
    started = time.perf_counter()
    with anyio.move_on_after(0.3) as scope:
        await Evaluator().with_evals([says_hello]).run([slow], attempts=6)
    assert scope.cancelled_caught
    assert time.perf_counter() - started < 5
    assert closed == [True]


async def test_bad_arguments_say_what_to_do() -> None:
    ev = Evaluator().with_evals([says_hello])
    with pytest.raises(ValueError, match="attempts must be a positive whole number"):
        await ev.run([scripted(["hello"])], attempts=0)
    with pytest.raises(ValueError, match="two models are labelled 'scripted'"):
        await ev.run([scripted(["a"]), scripted(["b"])])
    with pytest.raises(ValueError, match="no evals to run"):
        await Evaluator().run([scripted(["hello"])])
    with pytest.raises(ValueError, match="two evals are named 'says_hello'"):
        Evaluator().with_evals([says_hello, evaluation("says_hello", prompt="x")(print)])
    with pytest.raises(TypeError, match="a class: instantiate it"):
        Evaluator(evals=(AddsMilk,))  # type: ignore[arg-type]
    report = await ev.run([scripted({"other": ["hi"]}, label="t")])
    assert "have no script for eval 'says_hello'" in report.results[0].failures[0].message
    from runtime.llm import ConfigurationError

    with pytest.raises(ConfigurationError):
        await ev.run(["no-such-model-xyz"])


async def test_a_named_model_is_resolved_once_and_shared(monkeypatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-not-real-0000")
    from runtime.evals import eval_model

    m = eval_model("openai:gpt-4.1")
    assert m.label == "openai:gpt-4.1"
    assert m.build("a", 1) is m.build("b", 2)


# -- patterns as evals ------------------------------------------------------------------

from patterns.todo_agent import todo_agent  # noqa: E402


class TodoAdds(PatternEval):
    name = "todo-adds"
    pattern = todo_agent
    prompt = "Remind me to buy milk."

    def check(self, run: PatternRun) -> None:
        assert run.value("items") == [{"title": "milk", "done": False}], run.value("items")


async def test_a_pattern_eval_counts_tokens_from_the_dialog_and_turns_from_calls() -> None:
    good = [Reply(tool_calls=[call("addItem", {"title": "milk"})],
                  usage=Usage(input_tokens=200, output_tokens=12, cache_write_tokens=150)),
            Reply(text="Added milk.", usage=Usage(input_tokens=230, output_tokens=4,
                                                  cache_read_tokens=150))]
    wrong = ["Added milk (without a tool)."]
    report = await Evaluator().with_evals([TodoAdds()]).run(
        [scripted(lambda _e, n: wrong if n == 3 else good, label="m")], attempts=3)
    r = report.results[0]
    assert (r.successes, r.attempts) == (2, 3)
    assert (r.input_tokens, r.output_tokens) == (2 * 430, 2 * 16)
    assert (r.cache_read_tokens, r.cache_write_tokens) == (2 * 150, 2 * 150)
    assert r.turns == 2 * 2 + 1
    assert r.failures[0].attempt == 3 and "[]" in r.failures[0].message
    assert r.failures[0].transcript.startswith("User: Remind me to buy milk.")


async def test_a_pattern_eval_from_the_constructor_and_its_failures() -> None:
    def check(run: PatternRun) -> None:
        assert run.error is None and len(run.messages) == 2

    plain = PatternEval("plain", todo_agent, "hello", check=check)
    failing = PatternEval("model-fails", todo_agent, "hello")
    wrong_stream = PatternEval("wrong-stream", todo_agent, "hello", send="add_message")
    report = await Evaluator().with_evals([plain, failing, wrong_stream]).run([scripted({
        "plain": ["Hi."],
        "model-fails": [LLMError("rate limited", fault=Fault.TERMINAL, provider="scripted")],
        "wrong-stream": ["Hi."],
    })])
    assert report.result("scripted", "plain").successes == 1
    failed = report.result("scripted", "model-fails").failures[0]
    assert failed.message.startswith("run: RuntimeError: the dialog's turn failed:")
    assert "rate limited" in failed.message
    assert report.result("scripted", "model-fails").turns == 1
    stream = report.result("scripted", "wrong-stream").failures[0].message
    assert "has no stream 'add_message'" in stream and "send" in stream
    with pytest.raises(TypeError, match="needs a name"):
        PatternEval(pattern=todo_agent, prompt="x")
    with pytest.raises(TypeError, match="has no prompt"):
        PatternEval("p", todo_agent)


async def test_secrets_never_reach_a_report(monkeypatch) -> None:
    secret = "sk-ant-very-secret-value-123456"
    monkeypatch.setenv("ANTHROPIC_API_KEY", secret)

    @evaluation(prompt="hi")
    def leaks(llm: LLM) -> None:
        raise AssertionError(f"key was {secret}")

    report = await Evaluator().with_evals([leaks]).run([scripted([f"the key is {secret}"])])
    text = report.to_markdown() + report.to_csv()
    assert secret not in text and "[redacted]" in text
