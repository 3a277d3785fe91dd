"""Tools: typed functions → schemas, tool calls parsed (malformed ones answered, not fatal), a raising or hanging
tool ends only its episode with a counted reason, and the calculator computes arithmetic without eval."""

import math
import time

import pytest
from chars import CharTokenizer

from tba.rollout.episodes import Limits, run_episodes
from tba.tasks.base import Prompt
from tba.tasks.tools import (
    ToolCallError,
    ToolEnv,
    calculator,
    chat_turn,
    describe_tools,
    parse_tool_calls,
    tool_metrics,
    tool_schemas,
)


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: the first
        b: the second
    """
    return a + b


def broken(x: int) -> int:
    """Always fails.

    Args:
        x: anything
    """
    raise RuntimeError("the tool is down")


def slow(x: int) -> int:
    """Never answers in time.

    Args:
        x: anything
    """
    time.sleep(30)
    return x


TOOLS = {f.__name__: f for f in (add, broken, slow)}


def test_a_typed_function_is_a_tool_schema():
    (schema,) = tool_schemas([add])
    assert schema["function"]["name"] == "add" and schema["function"]["description"] == "Add two integers."
    assert schema["function"]["parameters"]["properties"]["a"] == {"type": "integer", "description": "the first"}
    assert "add" in describe_tools([add]) and "<tool_call>" in describe_tools([add])


def test_tool_calls_are_parsed_and_every_malformed_one_says_why():
    text = 'let me add <tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>'
    assert parse_tool_calls(text, TOOLS) == [(add, {"a": 2, "b": 3})]
    assert parse_tool_calls("no call here", TOOLS) == []
    for bad, why in (("<tool_call>{name: add}</tool_call>", "not JSON"),
                     ('<tool_call>{"name": "mul", "arguments": {}}</tool_call>', "no tool named 'mul'"),
                     ('<tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call>', "missing a required"),
                     ('<tool_call>{"name": "add", "arguments": [1, 2]}</tool_call>', "JSON object"),
                     ('<tool_call>{"name": "add"', "without its closing")):
        with pytest.raises(ToolCallError, match=why):
            parse_tool_calls(bad, TOOLS)


class ToolTask:
    def __init__(self, tools):
        self.tools = tools

    def environment(self, prompt):
        return ToolEnv(self.tools, score=lambda answer: float(answer.strip() == "5"))


def scripted_policy(turns):
    """Answers turn t (the t-th call: one episode at a time here) with turns[t]."""
    calls = []

    def generate(contexts, max_new_tokens):
        text = turns[min(len(calls), len(turns) - 1)]
        calls.append(text)
        return [([ord(c) for c in text], [-1.0] * len(text)) for _ in contexts]
    return generate


def episode(turns, tools=(add, broken, slow)):
    (e,) = run_episodes(scripted_policy(turns), CharTokenizer(), ToolTask(list(tools)), [Prompt(0, "Q", "")],
                        [[ord("Q")]], num_samples=1, max_new_tokens=200,
                        limits=Limits(max_turns=4, max_tokens=1000, timeout_s=0.5))
    return e


def test_a_tool_result_is_the_next_turn_and_a_plain_answer_ends_the_episode():
    e = episode(['<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>', "5"])
    text = CharTokenizer().decode(e.tokens)
    assert e.end == "done" and e.reward == 1.0 and e.env.calls == 1 and "\n5\n" in text
    assert [t for t, m in zip(text, e.mask, strict=True) if not m] == list("\n5\n")  # only the result is the env's


def test_a_malformed_call_is_an_observation_and_a_broken_or_hung_tool_ends_the_episode():
    e = episode(['<tool_call>{"name": "mul", "arguments": {}}</tool_call>', "5"])
    assert e.end == "done" and e.reward == 1.0 and e.env.malformed == 1
    assert "no tool named" in CharTokenizer().decode(e.tokens)
    e = episode(['<tool_call>{"name": "broken", "arguments": {"x": 1}}</tool_call>'])
    assert e.end == "error" and "the tool is down" in e.error and e.reward is None
    t0 = time.perf_counter()
    e = episode(['<tool_call>{"name": "slow", "arguments": {"x": 1}}</tool_call>'])
    assert e.end == "timeout" and time.perf_counter() - t0 < 5


def test_tool_metrics_split_reward_by_whether_the_tool_was_called():
    with_call = episode(['<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>', "5"])
    without = episode(["4"])
    m = tool_metrics([with_call, without])
    assert m["tool/called_share"] == 0.5 and m["tool/score_with_call"] == 1.0 and m["tool/score_without_call"] == 0.0
    assert math.isnan(tool_metrics([with_call])["tool/score_without_call"])


def test_the_calculator_computes_arithmetic_and_nothing_else():
    assert calculator("37 * (48 + 5)") == "1961" and calculator("7 / 2") == "3.5" and calculator("-2 ** 3") == "-8"
    for bad in ("__import__('os').system('true')", "x + 1", "2 ** 10 ** 10", "10 ** 20", "1 / 0", "[1, 2]"):
        assert calculator(bad).startswith("error:"), bad


def test_chat_turn_renders_the_templates_text_after_an_end_of_turn():
    class Chat:
        chat_template, eos_token = "x", "<end>"

        def apply_chat_template(self, msgs, tokenize=False, add_generation_prompt=False):
            text = "".join(f"<{m['role']}>{m['content']}<end>\n" for m in msgs)
            return text + ("<assistant>" if add_generation_prompt else "")

    assert chat_turn(Chat(), "tool", "42") == "\n<tool>42<end>\n<assistant>"
