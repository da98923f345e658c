"""Wire fidelity as the real client SDKs see it: what a reply says (usage; logprobs when asked, as
the provider gives them) and what a malformed request gets back (a 400 naming the field, in the
caller's envelope, with nothing sent upstream).

Every call goes through the capture server in front of the scripted engine, which answers with
recorded vLLM 0.32 bodies (tests/support/capture_server.py).
"""

from __future__ import annotations

import copy
from typing import Any

import anthropic
import httpx
import openai
import pytest
from google.genai import errors as genai_errors
from google.genai import types

from tests.support.agent_recordings import google_client
from tests.support.capture_server import CaptureServer
from tests.support.fake_vllm import FakeVllm
from tests.support.findings import rendered
from tests.support.vllm_recordings import vllm_fixture, vllm_reply_to

STREAMING = pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])


def _anthropic(info: dict[str, Any]) -> anthropic.Anthropic:
    return anthropic.Anthropic(
        api_key=info["api_key"], base_url=info["base_urls"]["anthropic"], max_retries=0
    )


def _openai(info: dict[str, Any]) -> openai.OpenAI:
    return openai.OpenAI(api_key=info["api_key"], base_url=info["base_urls"]["openai"], max_retries=0)


# ---- usage ---------------------------------------------------------------------------------------


@STREAMING
def test_anthropic_input_tokens_exclude_the_prompt_tokens_read_from_cache(
    upstream: FakeVllm, capture: CaptureServer, stream: bool
) -> None:
    # vLLM with --enable-prompt-tokens-details fills `prompt_tokens_details.cached_tokens` (the
    # recorded body has null there): 32 of chat_basic's 37 prompt tokens came from the prefix cache.
    reply = copy.deepcopy(vllm_fixture("chat_basic")["response"])
    reply["usage"]["prompt_tokens_details"] = {"cached_tokens": 32}
    upstream.answer = lambda body: (200, vllm_reply_to(body, reply))
    client = _anthropic(capture.open_session())
    kwargs: dict[str, Any] = dict(
        model="claude-x", max_tokens=24, messages=[{"role": "user", "content": "q"}]
    )
    if stream:
        with client.messages.stream(**kwargs) as events:
            start = next(e for e in events if e.type == "message_start").message.usage
            message = events.get_final_message()
        assert (start.input_tokens, start.cache_read_input_tokens) == (5, 32)
    else:
        message = client.messages.create(**kwargs)
    # Anthropic counts a prompt as input + cache reads + cache writes: 37, not 69.
    usage = message.usage
    assert (usage.input_tokens, usage.cache_read_input_tokens, usage.cache_creation_input_tokens) == (
        5,
        32,
        0,
    )
    assert usage.output_tokens == 8


# ---- malformed requests: a 400 naming the field, nothing sent upstream ---------------------------


def test_anthropic_stop_sequences_as_a_string_are_refused_not_split_into_characters(
    upstream: FakeVllm, capture: CaptureServer
) -> None:
    client = _anthropic(capture.open_session())
    with pytest.raises(anthropic.BadRequestError) as err:
        client.messages.create(
            model="claude-x",
            max_tokens=8,
            messages=[{"role": "user", "content": "q"}],
            stop_sequences="\n\nHuman:",
        )  # type: ignore[arg-type]
    assert err.value.body["error"]["message"] == "stop_sequences must be a list of strings"
    assert upstream.requests == []


GOOGLE_MALFORMED = [
    ({"contents": [{"role": "user", "parts": "hi"}]}, "contents[0].parts must be a list of objects"),
    ({"contents": [{"role": "user", "parts": ["hi"]}]}, "contents[0].parts[0] must be an object"),
    (
        {"contents": [{"parts": [{"text": "hi"}]}], "generationConfig": "greedy"},
        "generationConfig must be an object",
    ),
    (
        {"contents": [{"parts": [{"text": "hi"}]}], "generationConfig": {"stopSequences": "END"}},
        "generationConfig.stopSequences must be a list of strings",
    ),
    (
        {"contents": [{"parts": [{"text": "hi"}]}], "systemInstruction": {"parts": "Be brief."}},
        "systemInstruction.parts must be a list of objects",
    ),
    ({"contents": [{"parts": [{"text": "hi"}]}], "tools": ["run"]}, "tools[0] must be an object"),
    (
        {
            "contents": [{"parts": [{"text": "hi"}]}],
            "tools": [{"functionDeclarations": [{"name": "run"}]}],
            "toolConfig": "AUTO",
        },
        "toolConfig must be an object",
    ),
]


@pytest.mark.parametrize(
    "body, message", GOOGLE_MALFORMED, ids=[m.split(" ")[0] for _, m in GOOGLE_MALFORMED]
)
def test_google_wrong_shaped_field_is_a_400_naming_it(
    upstream: FakeVllm, capture: CaptureServer, body: dict[str, Any], message: str
) -> None:
    info = capture.open_session()
    reply = httpx.post(
        f"{info['base_urls']['google']}/v1beta/models/gemini-x:generateContent",
        headers={"x-goog-api-key": info["api_key"]},
        json=body,
        timeout=30,
    )
    assert reply.status_code == 400
    assert reply.json() == {"error": {"code": 400, "message": message, "status": "INVALID_ARGUMENT"}}
    assert upstream.requests == []


RESPONSES_MALFORMED = [
    ({"input": []}, "input is empty and there are no instructions: send at least one input item"),
    (
        {"input": [{"role": "user", "content": [7]}]},
        "input[0].content[0] must be a string or a content part object",
    ),
    ({"input": "hi", "tools": ["execute"]}, "tools[0] must be an object"),
]


@pytest.mark.parametrize("body, message", RESPONSES_MALFORMED, ids=["empty-input", "content-part", "tool"])
def test_responses_malformed_request_is_a_400_naming_the_field(
    upstream: FakeVllm, capture: CaptureServer, body: dict[str, Any], message: str
) -> None:
    client = _openai(capture.open_session())
    with pytest.raises(openai.BadRequestError) as err:
        client.responses.create(model="gpt-x", max_output_tokens=8, **body)
    assert err.value.body["message"] == message
    assert err.value.param == message.split(" ")[0]
    assert upstream.requests == []


# ---- logprobs ------------------------------------------------------------------------------------


def test_responses_logprobs_come_back_when_included(upstream: FakeVllm, capture: CaptureServer) -> None:
    recorded = vllm_fixture("chat_top2")["response"]  # two alternatives per token
    upstream.answer = lambda body: (200, vllm_reply_to(body, recorded))
    client = _openai(capture.open_session())
    kwargs: dict[str, Any] = dict(
        model="gpt-x",
        input="q",
        max_output_tokens=24,
        top_logprobs=1,
        include=["message.output_text.logprobs"],
    )
    expected = [
        (e["token"], e["logprob"], e["top_logprobs"][0]["token"])
        for e in recorded["choices"][0]["logprobs"]["content"]
    ]

    def seen(logprobs: Any) -> list[tuple[str, float, str]]:
        assert all(len(lp.top_logprobs) == 1 for lp in logprobs)  # as many as asked, not captured
        return [(lp.token, lp.logprob, lp.top_logprobs[0].token) for lp in logprobs]

    response = client.responses.create(**kwargs)
    assert seen(response.output[0].content[0].logprobs) == expected
    assert response.top_logprobs == 1
    events = list(client.responses.create(stream=True, **kwargs))
    assert seen(next(e for e in events if e.type == "response.output_text.delta").logprobs) == expected
    assert seen(events[-1].response.output[0].content[0].logprobs) == expected
    assert [(r["logprobs"], r["top_logprobs"]) for r in upstream.requests] == [(True, 1), (True, 1)]
    # Not included: no logprobs, as OpenAI answers.
    plain = client.responses.create(model="gpt-x", input="q", max_output_tokens=24, top_logprobs=1)
    assert plain.output[0].content[0].logprobs == []


def test_responses_item_reference_refusal_points_to_what_works(
    upstream: FakeVllm, capture: CaptureServer
) -> None:
    # The session does keep stored responses (previous_response_id works): the refusal must not
    # tell the caller otherwise.
    client = _openai(capture.open_session())
    with pytest.raises(openai.BadRequestError) as err:
        client.responses.create(model="gpt-x", input=[{"type": "item_reference", "id": "msg_1"}])
    assert err.value.body["message"] == (
        "input[0]: item_reference is not supported; send the item "
        "itself, or continue a stored response with previous_response_id"
    )
    assert err.value.param == "input[0]" and upstream.requests == []


@STREAMING
def test_google_logprobs_come_back_when_asked(
    upstream: FakeVllm, capture: CaptureServer, stream: bool
) -> None:
    recorded = vllm_fixture("chat_top2")["response"]  # two alternatives per token
    upstream.answer = lambda body: (200, vllm_reply_to(body, recorded))
    client = google_client(capture.open_session())
    config = types.GenerateContentConfig(max_output_tokens=24, response_logprobs=True, logprobs=1)
    if stream:
        chunks = list(client.models.generate_content_stream(model="gemini-x", contents="q", config=config))
        candidate = chunks[-1].candidates[0]
    else:
        candidate = client.models.generate_content(model="gemini-x", contents="q", config=config).candidates[
            0
        ]
    choice = recorded["choices"][0]
    result, entries = candidate.logprobs_result, choice["logprobs"]["content"]
    assert [(c.token, c.token_id, c.log_probability) for c in result.chosen_candidates] == [
        (e["token"], i, e["logprob"]) for e, i in zip(entries, choice["token_ids"], strict=True)
    ]
    assert [[(a.token, a.log_probability) for a in top.candidates] for top in result.top_candidates] == [
        [(e["top_logprobs"][0]["token"], e["top_logprobs"][0]["logprob"])] for e in entries
    ]
    assert candidate.avg_logprobs == pytest.approx(result.log_probability_sum / len(choice["token_ids"]))
    assert (upstream.requests[-1]["logprobs"], upstream.requests[-1]["top_logprobs"]) == (True, 1)
    # Not asked: none, as Google answers.
    plain = client.models.generate_content(
        model="gemini-x", contents="q", config=types.GenerateContentConfig(max_output_tokens=24)
    ).candidates[0]
    assert plain.logprobs_result is None and plain.avg_logprobs is None


# ---- server-held state the proxy cannot see ----------------------------------------------------

SERVER_STATE = [
    ({"conversation": "conv_68a1"}, "conversation"),
    ({"conversation": {"id": "conv_68a1"}}, "conversation"),
    ({"prompt": {"id": "pmpt_1", "version": "2"}}, "prompt"),
]


@pytest.mark.parametrize(
    "extra, param", SERVER_STATE, ids=["conversation-id", "conversation-object", "prompt"]
)
def test_responses_conversation_or_stored_prompt_is_refused_not_answered_without_its_content(
    upstream: FakeVllm, capture: CaptureServer, extra: dict[str, Any], param: str
) -> None:
    # The client sends only its new input and relies on OpenAI to add the rest: answered anyway,
    # the model would reply without that content and nothing would say so.
    client = _openai(capture.open_session())
    upstream.requests.clear()  # the engine's probe, when this test opens the module's first session
    with pytest.raises(openai.BadRequestError) as err:
        client.responses.create(model="gpt-x", input="and now?", max_output_tokens=8, **extra)
    assert err.value.param == param
    assert err.value.body["message"].startswith(f"{param} is not supported by tapdeck: ")
    assert "instead" not in err.value.body["message"] and "input" in err.value.body["message"]
    assert upstream.requests == []


def test_google_cached_content_is_refused_not_answered_without_it(
    upstream: FakeVllm, capture: CaptureServer
) -> None:
    client = google_client(capture.open_session())
    upstream.requests.clear()  # the engine's probe, when this test opens the module's first session
    with pytest.raises(genai_errors.ClientError) as err:
        client.models.generate_content(
            model="gemini-x",
            contents="and now?",
            config=types.GenerateContentConfig(max_output_tokens=8, cached_content="cachedContents/a1b2"),
        )
    assert err.value.code == 400 and err.value.status == "INVALID_ARGUMENT"
    assert err.value.message == (
        "cachedContent is not supported by tapdeck: cached content lives at "
        "Google; send its contents and systemInstruction in the request"
    )
    assert upstream.requests == []


# ---- tool-call arguments that are not a JSON object ---------------------------------------------

CUT_ARGUMENTS = '{"command": "ls -'  # a call cut short, as a parser passing raw text through gives it


def _anthropic_round_trip(info: dict[str, Any], tools: list[dict[str, Any]]) -> tuple[Any, Any]:
    client = _anthropic(info)
    anthropic_tools = [{"name": t["name"], "input_schema": t["parameters"]} for t in tools]
    first = [{"role": "user", "content": "list the files"}]
    message = client.messages.create(model="claude-x", max_tokens=8, messages=first, tools=anthropic_tools)
    block = message.content[-1]
    client.messages.create(
        model="claude-x",
        max_tokens=8,
        tools=anthropic_tools,
        messages=[
            *first,
            {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in message.content]},
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": block.id, "content": "error"}],
            },
        ],
    )
    return block.name, block.input


def _google_round_trip(info: dict[str, Any], tools: list[dict[str, Any]]) -> tuple[Any, Any]:
    client = google_client(info)
    config = types.GenerateContentConfig(
        max_output_tokens=8,
        tools=[
            types.Tool(
                function_declarations=[
                    types.FunctionDeclaration(name=t["name"], parameters_json_schema=t["parameters"])
                    for t in tools
                ]
            )
        ],
        automatic_function_calling=types.AutomaticFunctionCallingConfig(disable=True),
    )
    first = [types.Content(role="user", parts=[types.Part(text="list the files")])]
    content = (
        client.models.generate_content(model="gemini-x", contents=first, config=config).candidates[0].content
    )
    call = content.parts[-1].function_call
    client.models.generate_content(
        model="gemini-x",
        config=config,
        contents=[
            *first,
            content,
            types.Content(
                role="user",
                parts=[
                    types.Part(
                        function_response=types.FunctionResponse(
                            id=call.id, name=call.name, response={"output": "error"}
                        )
                    )
                ],
            ),
        ],
    )
    return call.name, call.args


@pytest.mark.parametrize(
    "round_trip", [_anthropic_round_trip, _google_round_trip], ids=["anthropic", "google"]
)
def test_tool_arguments_that_are_not_a_json_object_are_a_finding_and_resent_as_sampled(
    upstream: FakeVllm, capture: CaptureServer, tool_reply: Any, round_trip: Any
) -> None:
    # Anthropic `input` and Google `args` must be objects, so the agent is handed {} for them: the
    # turn says so, and the {} it resends renders as what the model sampled (the chain holds).
    tools = [
        {"name": "bash", "parameters": {"type": "object", "properties": {"command": {"type": "string"}}}}
    ]
    info = capture.open_session()
    upstream.answer = lambda body: (200, vllm_reply_to(body, tool_reply([("bash", CUT_ARGUMENTS)])))
    assert round_trip(info, tools) == ("bash", {})
    resent = upstream.requests[-1]["messages"][-2]
    assert resent["tool_calls"][0]["function"]["arguments"] == CUT_ARGUMENTS
    findings = [f for f in rendered(capture.turn(info["id"], 0)["findings"]) if "tool_arguments" in f]
    assert findings == [
        f"[WARN] tool_arguments_not_object: tool call 0 (bash): the sampled arguments are "
        f"not a JSON object, so the agent was handed {{}} for {CUT_ARGUMENTS!r}; resent, "
        "the call renders as sampled"
    ]


# ---- the proxy's own stop replies ---------------------------------------------------------------


def test_chat_stop_reply_of_a_spent_budget_has_only_the_fields_vllm_sends(
    upstream: FakeVllm, capture: CaptureServer
) -> None:
    info = capture.open_session(call_budget=1)

    def call() -> httpx.Response:
        return httpx.post(
            f"{info['base_urls']['openai']}/chat/completions",
            timeout=30,
            headers={"Authorization": f"Bearer {info['api_key']}"},
            json={"model": "gpt-x", "max_tokens": 8, "messages": [{"role": "user", "content": "q"}]},
        )

    assert call().status_code == 200
    reply = call()
    assert reply.status_code == 200
    body = reply.json()
    assert "budget" in body["choices"][0]["message"]["content"]
    assert set(body) <= set(vllm_fixture("chat_basic")["response"]), set(body)


# ---- a reply cut at a stop string ---------------------------------------------------------------


def test_a_reply_cut_at_a_stop_string_names_the_stop_string_as_the_prefix_break(
    upstream: FakeVllm, capture: CaptureServer
) -> None:
    # vLLM cuts the text before the stop string but keeps the tokens it sampled for it, so the
    # next prompt, rendered from the text the agent resends, leaves them out: a break whose cause
    # is the stop string, not a re-tokenisation. chat_basic cut at "Paris", as vLLM answers it.
    recorded = vllm_fixture("chat_basic")["response"]
    prompt, sampled = recorded["prompt_token_ids"], recorded["choices"][0]["token_ids"][:6]  # ... " Paris"
    first = copy.deepcopy(recorded)
    choice = first["choices"][0]
    choice["message"]["content"], choice["token_ids"], choice["stop_reason"] = (
        "The capital of France is",
        sampled,
        "Paris",
    )
    choice["logprobs"]["content"] = choice["logprobs"]["content"][:6]
    second = copy.deepcopy(recorded)
    second["prompt_token_ids"] = [*prompt, *sampled[:5], 2, 198, 1, 4093, 198, 2, 198, 1, 520, 9531, 198]
    info = capture.open_session(rollout_type="eval")
    replies = iter([first, second])
    upstream.answer = lambda body: (200, vllm_reply_to(body, next(replies)))
    client = _openai(info)
    messages: list[Any] = [{"role": "user", "content": "What is the capital of France?"}]
    reply = client.chat.completions.create(model="gpt-x", max_tokens=8, messages=messages, stop=["Paris"])
    messages += [reply.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "go on"}]
    client.chat.completions.create(model="gpt-x", max_tokens=8, messages=messages)
    turn = capture.turn(info["id"], 1)
    assert (turn["parent"], turn["link_kind"]) == (0, "retokenized")
    offset = len(prompt) + 5
    assert [f for f in rendered(capture.summary(info["id"])["findings"]) if "retokenized" in f] == [
        f"[WARN] retokenized: prompt continues turn 0's reply as text but the ids diverge at offset {offset} "
        "(reply token 5): turn 0 stopped on the stop string 'Paris', whose sampled tokens its reply's "
        "text leaves out"
    ]


# ---- tool choices the engine can only loosen ----------------------------------------------------

THREE_TOOLS = ["bash", "read", "write"]


def _loosened(capture: CaptureServer, session_id: str) -> list[str]:
    return [f for f in rendered(capture.turn(session_id, 0)["findings"]) if "tool_choice_loosened" in f]


@pytest.mark.parametrize(
    "allowed, sent",
    [
        (["bash", "read"], "required"),
        (["bash"], {"type": "function", "function": {"name": "bash"}}),
        (THREE_TOOLS, "required"),
    ],
    ids=["subset", "one", "all"],
)
def test_google_allowed_function_names_the_engine_cannot_force_are_a_finding(
    upstream: FakeVllm, capture: CaptureServer, allowed: list[str], sent: Any
) -> None:
    # vLLM forces one named tool or any tool: a subset of two goes out as "any", and the turn says so.
    # An eval session: a training one refuses a forced choice outright.
    info = capture.open_session(rollout_type="eval")
    client = google_client(info)
    config = types.GenerateContentConfig(
        max_output_tokens=8,
        automatic_function_calling=types.AutomaticFunctionCallingConfig(disable=True),
        tools=[types.Tool(function_declarations=[types.FunctionDeclaration(name=n) for n in THREE_TOOLS])],
        tool_config=types.ToolConfig(
            function_calling_config=types.FunctionCallingConfig(mode="ANY", allowed_function_names=allowed)
        ),
    )
    client.models.generate_content(model="gemini-x", contents="q", config=config)
    assert upstream.requests[-1]["tool_choice"] == sent
    assert _loosened(capture, info["id"]) == (
        [
            "[WARN] tool_choice_loosened: toolConfig.functionCallingConfig.allowedFunctionNames limits calls "
            "to bash, read; the engine can force one named tool or any tool, not a subset, so this call "
            "could call any of its 3 tools"
        ]
        if allowed == ["bash", "read"]
        else []
    )


@pytest.mark.parametrize("mode, sent", [("required", "required"), ("auto", None)])
def test_responses_allowed_tools_subset_is_sent_as_the_nearest_choice_with_a_finding(
    upstream: FakeVllm, capture: CaptureServer, mode: str, sent: Any
) -> None:
    info = capture.open_session(rollout_type="eval")
    _openai(info).responses.create(
        model="gpt-x",
        input="q",
        max_output_tokens=8,
        tools=[
            {"type": "function", "name": n, "parameters": {"type": "object", "properties": {}}}
            for n in THREE_TOOLS
        ],
        tool_choice={
            "type": "allowed_tools",
            "mode": mode,
            "tools": [{"type": "function", "name": "bash"}, {"type": "function", "name": "read"}],
        },
    )
    assert upstream.requests[-1].get("tool_choice") == sent
    assert _loosened(capture, info["id"]) == [
        "[WARN] tool_choice_loosened: tool_choice.tools limits calls to bash, read; the engine can force "
        "one named tool or any tool, not a subset, so this call could call any of its 3 tools"
    ]


def test_a_training_sessions_refusal_of_a_forced_tool_names_the_field_the_google_client_sent(
    upstream: FakeVllm, capture: CaptureServer
) -> None:
    client = google_client(capture.open_session())
    probes = len(upstream.requests)  # the session's tier probe
    config = types.GenerateContentConfig(
        max_output_tokens=8,
        automatic_function_calling=types.AutomaticFunctionCallingConfig(disable=True),
        tools=[types.Tool(function_declarations=[types.FunctionDeclaration(name=n) for n in THREE_TOOLS])],
        tool_config=types.ToolConfig(function_calling_config=types.FunctionCallingConfig(mode="ANY")),
    )
    with pytest.raises(genai_errors.ClientError) as err:
        client.models.generate_content(model="gemini-x", contents="q", config=config)
    assert err.value.code == 400 and len(upstream.requests) == probes
    assert err.value.message == (
        "`toolConfig.functionCallingConfig.mode` is not allowed in a training "
        "session: a forced tool choice constrains decoding"
    )
