"""Chat's text side: rendering, Hermes tool calls, the incremental text a stream sends."""

import json

import pytest

from tba.serve.chat import TextStream, parse_tool_calls, render, tool_format
from tba.serve.protocol import APIError


def test_tool_calls_are_read_in_the_hermes_format():
    text = 'Let me call a tool.<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>'
    content, calls = parse_tool_calls(text)
    assert content == "Let me call a tool."
    assert [c["function"]["name"] for c in calls] == ["add"] and calls[0]["type"] == "function"
    assert json.loads(calls[0]["function"]["arguments"]) == {"a": 1, "b": 2}
    assert parse_tool_calls("<tool_call>{not json</tool_call>") == ("<tool_call>{not json</tool_call>", [])
    assert parse_tool_calls("plain") == ("plain", [])


def test_the_template_decides_the_tool_format(chat_tokenizer, tiny_tokenizer):
    assert tool_format(chat_tokenizer) == "hermes" and tool_format(tiny_tokenizer) is None


def test_rendering_is_the_template_with_openai_messages_read(chat_tokenizer):
    messages = [{"role": "user", "content": [{"type": "text", "text": "What is "}, {"type": "text", "text": "1+2?"}]},
                {"role": "assistant", "content": None,
                 "tool_calls": [{"id": "c", "type": "function",
                                 "function": {"name": "add", "arguments": '{"a": 1, "b": 2}'}}]},
                {"role": "tool", "content": "3"}]
    ids = render(chat_tokenizer, messages)
    text = chat_tokenizer.decode(ids)
    assert "What is 1+2?" in text and '"arguments": {"a": 1, "b": 2}' in text and text.endswith("<|assistant|>")
    with pytest.raises(APIError, match="messages.0.content.0"):
        render(chat_tokenizer, [{"role": "user", "content": [{"type": "image_url"}]}])


def test_no_template_is_a_400(tiny_tokenizer):
    with pytest.raises(APIError, match="no chat template") as e:
        render(tiny_tokenizer, [{"role": "user", "content": "hi"}])
    assert e.value.status == 400 and e.value.param == "messages"


def test_streamed_pieces_add_up_to_the_content_and_hold_back_a_tool_call(chat_tokenizer):
    text = 'Let me call a tool.<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>'
    ids = chat_tokenizer.encode(text, add_special_tokens=False)
    stream, pieces = TextStream(chat_tokenizer, tools=True), []
    for t in ids:
        pieces.append(stream.push([t]))
        assert "<" not in "".join(pieces)  # never a piece of the tool call's tag
    rest, calls = stream.finish()
    assert "".join(pieces) + rest == "Let me call a tool." and calls[0]["function"]["name"] == "add"
    plain = TextStream(chat_tokenizer, tools=False)
    assert "".join(plain.push([t]) for t in ids) + plain.finish()[0] == chat_tokenizer.decode(ids)
