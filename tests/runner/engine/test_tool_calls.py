"""Tool calling: Hermes-style rendering into the prompt, parsing of `<tool_call>` blocks out of
replies (like vLLM's hermes parser), and a real round trip that keeps the token prefix."""

from __future__ import annotations

import json

import httpx
import pytest

from tapdeck.proxy.upstream.toolcalls import ParsedReply, parse_tool_calls, render_tool_calls
from tapdeck.runner.engine.template import ChatTemplate
from tests.support.vllm_recordings import vllm_fixture

# SmolLM2-135M-Instruct's template, as stored in its GGUF metadata.
SMOLLM2_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
    "Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}"
)

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Get the weather for a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]


def _call(city: str, i: int) -> dict:
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": f"call_{i}",
                "type": "function",
                "function": {"name": "get_weather", "arguments": json.dumps({"city": city})},
            }
        ],
    }


def test_parse_tool_call_blocks_like_vllm_hermes():
    text = (
        'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
        '</tool_call>\n<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>'
    )
    parsed = parse_tool_calls(text)
    assert parsed.content == "Let me check.\n"
    assert [c["function"]["name"] for c in parsed.tool_calls] == ["get_weather", "get_time"]
    assert json.loads(parsed.tool_calls[0]["function"]["arguments"]) == {"city": "Paris"}
    assert parsed.tool_calls[0]["type"] == "function"
    assert parsed.tool_calls[0]["id"].startswith("chatcmpl-tool-")
    # rendering the parsed reply gives back the model's text exactly
    assert render_tool_calls(parsed.content, parsed.tool_calls) == text


def test_parse_unclosed_block_and_invalid_json():
    parsed = parse_tool_calls('<tool_call>\n{"name": "f", "arguments": {"a": 1}}')
    assert parsed.content is None and parsed.tool_calls[0]["function"]["name"] == "f"
    bad = "<tool_call>\n{not json}\n</tool_call>"
    assert parse_tool_calls(bad).tool_calls == [] and parse_tool_calls(bad).content == bad
    assert parse_tool_calls("no calls here").content == "no calls here"


def test_block_without_arguments_leaves_the_reply_plain_content_like_vllm_hermes():
    # vLLM's hermes parser reads `arguments` unconditionally: a block without it fails the reply.
    text = '<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>\n<tool_call>\n{"name": "g"}'
    assert parse_tool_calls(text) == ParsedReply(text, [])


def test_template_renders_tools_calls_and_responses_hermes_style():
    tpl = ChatTemplate(SMOLLM2_TEMPLATE)
    messages = [
        {"role": "user", "content": "Weather in Rome?"},
        _call("Rome", 1),
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
    ]
    text = tpl.render(messages, tools=TOOLS)
    assert text.startswith("<|im_start|>system\n# Tools\n")
    assert json.dumps(TOOLS[0]) in text.split("<tools>\n")[1].split("\n</tools>")[0]
    assert "SmolLM" not in text  # the tools system message replaces the default one
    assert (
        '<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": '
        '{"city": "Rome"}}\n</tool_call><|im_end|>\n' in text
    )
    assert "<|im_start|>user\n<tool_response>\nsunny\n</tool_response><|im_end|>\n" in text
    assert text.endswith("<|im_start|>assistant\n")
    with_system = tpl.render([{"role": "system", "content": "Be brief."}, *messages], tools=TOOLS)
    assert with_system.startswith("<|im_start|>system\nBe brief.\n\n# Tools\n")


def test_template_without_tools_matches_the_model_template():
    tpl = ChatTemplate(SMOLLM2_TEMPLATE)
    text = tpl.render([{"role": "user", "content": [{"type": "text", "text": "hi"}]}])
    assert text == (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by "
        "Hugging Face<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def _fewshot() -> list[dict]:
    # The 135M model does not call tools unprompted; two in-context calls make it imitate them.
    return [
        {"role": "system", "content": "You answer by calling tools."},
        {"role": "user", "content": "Weather in Rome?"},
        _call("Rome", 1),
        {"role": "user", "content": "Weather in Oslo?"},
        _call("Oslo", 2),
        {"role": "user", "content": "Weather in Paris?"},
    ]


@pytest.mark.slow
def test_tool_call_round_trip_keeps_the_token_prefix(embedded_engine):
    url = f"{embedded_engine.base_url}/chat/completions"
    req = {
        "model": "smollm2",
        "messages": _fewshot(),
        "tools": TOOLS,
        "max_tokens": 40,
        "temperature": 0,
        "return_token_ids": True,
        "logprobs": True,
    }
    body = httpx.post(url, json=req, timeout=120).json()
    choice = body["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    call = choice["message"]["tool_calls"][0]
    assert call["function"]["name"] == "get_weather"
    assert json.loads(call["function"]["arguments"]) == {"city": "Paris"}
    assert choice["message"]["content"] is None
    # Send the assistant message back as a client would, plus the tool result.
    reply = {
        "role": "assistant",
        "content": choice["message"]["content"],
        "tool_calls": choice["message"]["tool_calls"],
    }
    follow = dict(
        req,
        messages=[*_fewshot(), reply, {"role": "tool", "tool_call_id": call["id"], "content": "rain"}],
        max_tokens=4,
    )
    nxt = httpx.post(url, json=follow, timeout=120).json()
    full = body["prompt_token_ids"] + choice["token_ids"]
    assert nxt["prompt_token_ids"][: len(full)] == full


@pytest.mark.slow
def test_tool_call_streams_as_a_tool_calls_delta(embedded_engine):
    req = {
        "model": "smollm2",
        "messages": _fewshot(),
        "tools": TOOLS,
        "max_tokens": 40,
        "temperature": 0,
        "stream": True,
        "return_token_ids": True,
    }
    text = httpx.post(f"{embedded_engine.base_url}/chat/completions", json=req, timeout=120).text
    chunks = [json.loads(b[6:]) for b in text.split("\n\n") if b.startswith("data: {")]
    content = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
    assert "<tool_call>" not in content  # held back, then delivered as a tool call
    last = chunks[-1]["choices"][0]
    assert last["finish_reason"] == "tool_calls"
    assert last["delta"]["tool_calls"][0]["function"]["name"] == "get_weather"
    assert last["delta"]["tool_calls"][0]["index"] == 0
    assert text.rstrip().endswith("data: [DONE]")


@pytest.mark.parametrize("name", ["chat_tools_call", "chat_tools_no_call"])
def test_parse_agrees_with_vllm_hermes_on_recorded_replies(name):
    """Recorded vLLM 0.32 `--tool-call-parser hermes` replies: parsing the text the model sampled
    (its tokens' bytes, less the end token) gives vLLM's content and calls; ids are fresh."""
    choice = vllm_fixture(name)["response"]["choices"][0]
    entries = choice["logprobs"]["content"]
    assert entries[-1]["token"] == "<|im_end|>"
    raw = b"".join(bytes(e["bytes"]) for e in entries[:-1]).decode()
    parsed = parse_tool_calls(raw)
    theirs = choice["message"]
    assert parsed.content == theirs["content"]
    assert [(c["type"], c["function"]) for c in parsed.tool_calls] == [
        (c["type"], c["function"]) for c in theirs.get("tool_calls", [])
    ]
    assert all(c["id"].startswith("chatcmpl-tool-") for c in parsed.tool_calls)
    assert choice["finish_reason"] == ("tool_calls" if parsed.tool_calls else "stop")


def test_token_id_completion_text_parses_to_vllms_chat_call():
    """vLLM's completions route leaves a tool call as text (tokenin_tools_call_ids.json: the same
    prompt and ids as chat_tools_call.json); parsing that text gives vLLM's chat-route call."""
    text = vllm_fixture("tokenin_tools_call_ids")["response"]["choices"][0]["text"]
    chat = vllm_fixture("chat_tools_call")["response"]["choices"][0]["message"]
    parsed = parse_tool_calls(text)
    assert parsed.content == chat["content"] is None
    assert [c["function"] for c in parsed.tool_calls] == [c["function"] for c in chat["tool_calls"]]
