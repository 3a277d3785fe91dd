"""Tools: plain typed Python functions the policy calls by writing a tool call; their results are its next turn.

As in TRL and verifiers, a tool is a function with type hints and a Google-style docstring; its JSON schema
comes from `transformers.utils.get_json_schema`, so a chat template that takes `tools=` renders it, and
`describe_tools` writes it into a prompt for one that does not. A call is written as the Hermes/Qwen chat
templates write it:

    <tool_call>{"name": "calculator", "arguments": {"expression": "37 * 48"}}</tool_call>

`ToolEnv` is an environment (tba.rollout.episodes) made of tools: a policy turn with tool calls gets their results
back, each as a `tool` message rendered by the tokenizer's chat template (`chat_turn`); a turn without a call is
the final answer, scored by `score(answer)`, and ends the episode. A call that is not well formed (bad JSON, an
unknown tool, arguments the function does not take) is answered with an error message the policy can learn
from; a tool that raises ends the episode as an environment error, one that hangs as a timeout
(search.env_timeout_s) — both counted, neither stops the run.

`calculator` is a built-in tool: arithmetic through Python's `ast` on a whitelist of nodes (numbers, + − × ÷,
//, %, **, parentheses), never `eval`, with bounds on the size of what it computes.
"""

from __future__ import annotations

import ast
import inspect
import json
import operator
import re
from collections.abc import Callable

from transformers.utils import get_json_schema

CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)


class ToolCallError(ValueError):
    """A tool call the policy wrote that cannot be run: its text is the observation the policy gets back."""


def chat_turn(tokenizer, role: str, content: str) -> str:
    """The text a chat template puts after an assistant turn for a `role` message (user, tool, …) with
    `content`, up to the next assistant turn's start — what an environment returns so that a chat model sees
    its usual format. Rendered as the difference of two renderings (template text before the assistant's
    reply is not repeated). A tokenizer without a chat template gets `\\n{content}\\n`."""
    return chat_messages(tokenizer, [{"role": role, "content": content}])


def chat_messages(tokenizer, messages: list[dict]) -> str:
    """`chat_turn` of several messages at once (each tool call's result, as TRL appends them): what the template
    puts after an assistant turn for `messages`, up to the next assistant turn's start."""
    if not getattr(tokenizer, "chat_template", None):
        return "".join(f"\n{m['content']}\n" for m in messages)
    base = [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]
    before = tokenizer.apply_chat_template(base, tokenize=False)
    after = tokenizer.apply_chat_template([*base, *messages], tokenize=False, add_generation_prompt=True)
    # the policy's turn ended with EOS (the template's end-of-turn token): what follows EOS is the environment's
    marker = "y" + (tokenizer.eos_token or "")
    cut = before.rfind(marker)
    prefix = before[:cut + len(marker)] if cut >= 0 else before
    if not after.startswith(prefix):
        raise ValueError("the chat template renders a conversation differently once a turn is added; "
                         "write the environment's turn text yourself")
    return after[len(prefix):]


def tool_schemas(tools: list[Callable]) -> list[dict]:
    """The OpenAI-style JSON schema of each tool (name, description, typed parameters from the docstring)."""
    return [get_json_schema(t) for t in tools]


def describe_tools(tools: list[Callable]) -> str:
    """A prompt paragraph for templates without tool support: the schemas, and how to call."""
    lines = ["You can call these tools:"] + [json.dumps(s["function"]) for s in tool_schemas(tools)]
    lines.append('To call one, write <tool_call>{"name": ..., "arguments": {...}}</tool_call>; its result comes '
                 "back as the next message. Answer without a tool call when you are done.")
    return "\n".join(lines)


def call_text(name: str, **arguments) -> str:
    """A tool call as the policy writes one (what `parse_tool_calls` reads): for demonstrations and tests."""
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def parse_tool_calls(text: str, tools: dict[str, Callable]) -> list[tuple[Callable, dict]]:
    """The (function, arguments) of every tool call in `text`; raises ToolCallError saying what is wrong."""
    calls = []
    for body in CALL.findall(text):
        try:
            call = json.loads(body)
        except json.JSONDecodeError as e:
            raise ToolCallError(f"error: the tool call is not JSON ({e.msg} at character {e.pos})") from None
        if not isinstance(call, dict) or not isinstance(call.get("name"), str):
            raise ToolCallError('error: a tool call is {"name": ..., "arguments": {...}}')
        fn = tools.get(call["name"])
        if fn is None:
            raise ToolCallError(f"error: no tool named {call['name']!r}; tools: {', '.join(tools)}")
        args = call.get("arguments", {})
        if not isinstance(args, dict):
            raise ToolCallError("error: arguments must be a JSON object")
        try:
            inspect.signature(fn).bind(**args)
        except TypeError as e:
            raise ToolCallError(f"error: {call['name']}: {e}") from None
        calls.append((fn, args))
    if not calls and "<tool_call>" in text:
        raise ToolCallError("error: a <tool_call> without its closing </tool_call>")
    return calls


class ToolEnv:
    """An episode of tool use (see the module docstring). `score(answer)` rewards the final answer."""

    def __init__(self, tools: list[Callable], score: Callable[[str], float], tokenizer=None, role: str = "tool"):
        self.tools = {t.__name__: t for t in tools}
        self.score, self.tokenizer, self.role = score, tokenizer, role
        self.calls = 0
        self.malformed = 0
        self.answer: str | None = None

    def _turn(self, content: str) -> str:
        return chat_turn(self.tokenizer, self.role, content) if self.tokenizer is not None else f"\n{content}\n"

    def step(self, action: str) -> str | None:
        try:
            calls = parse_tool_calls(action, self.tools)
        except ToolCallError as e:
            self.malformed += 1
            return self._turn(str(e))
        if not calls:
            self.answer = action
            return None
        self.calls += len(calls)
        return self._turn("\n".join(str(fn(**args)) for fn, args in calls))  # a tool that raises ends the episode

    def get_reward(self) -> float:
        return float(self.score(self.answer)) if self.answer is not None else 0.0


def tool_metrics(episodes) -> dict[str, float]:
    """Evaluation metrics of ToolEnv episodes: the share that called a tool, the mean reward of those that did
    and of those that did not (NaN where there are none), the share with a malformed call."""
    envs = [(e.env, e.reward or 0.0) for e in episodes if isinstance(e.env, ToolEnv)]
    called = [r for env, r in envs if env.calls]
    alone = [r for env, r in envs if not env.calls]
    n = max(len(envs), 1)
    return {"tool/called_share": len(called) / n,
            "tool/score_with_call": sum(called) / len(called) if called else float("nan"),
            "tool/score_without_call": sum(alone) / len(alone) if alone else float("nan"),
            "tool/malformed_share": sum(env.malformed > 0 for env, _ in envs) / n}


_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
        ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}
_LIMIT = 10 ** 12


def _value(node: ast.AST) -> float:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        v = _value(node.operand)
        return -v if isinstance(node.op, ast.USub) else v
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        a, b = _value(node.left), _value(node.right)
        if isinstance(node.op, ast.Pow) and (abs(b) > 64 or abs(a) > 10 ** 6):
            raise ValueError("exponent too large")
        v = _OPS[type(node.op)](a, b)
        if abs(v) > _LIMIT:
            raise ValueError("result too large")
        return v
    raise ValueError(f"not arithmetic: {ast.unparse(node)!r}")


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression.

    Args:
        expression: numbers with + - * / // % ** and parentheses, e.g. "37 * (48 + 5)"
    """
    try:
        tree = ast.parse(expression.strip(), mode="eval")
        v = _value(tree.body)
    except (SyntaxError, ValueError, ZeroDivisionError, RecursionError) as e:
        return f"error: {e}"
    return str(int(v)) if float(v).is_integer() else f"{v:.6g}"
