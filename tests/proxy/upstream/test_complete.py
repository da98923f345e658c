"""capture-cases B19/B20/B21/B22 and E31/E32: reading recorded vLLM replies and classifying failures."""

from __future__ import annotations

import asyncio
import json
import socket

import httpx
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tapdeck.proxy.capture.tokens import PromptIdsMemo, loads_with_prompt_ids
from tapdeck.proxy.upstream import transport as upstream_http
from tapdeck.proxy.upstream.client import (
    EngineClient,
    EngineError,
    parse_capture,
)
from tapdeck.proxy.upstream.reply_check import check_reply
from tapdeck.proxy.upstream.tiers import EngineSpec, Tier
from tapdeck.schema.findings import Level
from tests.support.fake_vllm import FakeVllm

URL = "http://vllm.test:8111/v1"
SPEC = EngineSpec(url=URL)


def test_ids_and_logprobs_read_from_recorded_reply(vllm):
    reply = vllm("chat_basic")["response"]
    cap = parse_capture(reply)
    assert cap.prompt_ids.dtype == np.int32 and cap.prompt_ids.tolist() == reply["prompt_token_ids"]
    assert cap.sampled_ids.tolist() == [504, 3575, 282, 4649, 314, 7042, 30, 2]
    assert cap.logprobs.dtype == np.float64
    assert cap.logprobs.tolist() == [e["logprob"] for e in reply["choices"][0]["logprobs"]["content"]]
    assert (
        cap.token_texts[-1] == "<|im_end|>"
        and "".join(cap.token_texts[:-1]) == "The capital of France is Paris."
    )
    assert cap.findings == []


def test_per_choice_prompt_ids_used_only_when_top_level_empty(vllm):
    # completions_ids.json is a real reply with per-choice prompt_token_ids (the SGLang placement).
    per_choice = vllm("completions_ids")["response"]
    assert "prompt_token_ids" not in per_choice or not per_choice.get("prompt_token_ids")
    assert parse_capture(per_choice).prompt_ids.tolist() == [504, 3575, 282, 4649, 314]

    chat = vllm("chat_basic")["response"]
    chat["choices"][0]["prompt_token_ids"] = [9, 9, 9]
    assert parse_capture(chat).prompt_ids.tolist() == chat["prompt_token_ids"]
    chat["prompt_token_ids"] = []
    assert parse_capture(chat).prompt_ids.tolist() == [9, 9, 9]


def test_top_alternatives_read_with_ordering_quirk(vllm):
    cap = parse_capture(vllm("chat_top2")["response"])
    assert cap.top_logprobs[0] == [("The", pytest.approx(-0.5493447)), ("Le", pytest.approx(-2.5493448))]
    assert all(len(alts) == 2 for alts in cap.top_logprobs)


def test_token_id_strings_checked_against_token_ids(vllm):
    reply = vllm("chat_token_id_strings")["response"]
    cap = parse_capture(reply)
    assert cap.findings == []
    assert cap.logprobs is not None and cap.logprobs.size == cap.sampled_ids.size
    # The sampled entry's bytes are the real token; shown as text, not "token_id:504".
    assert cap.token_texts[0] == "The"
    # Alternatives' bytes hold the "token_id:N" string (vLLM quirk): a sampled id's text is reused,
    # an unseen id stays in its token_id form.
    assert cap.top_logprobs[0][0][0] == "The"
    assert cap.top_logprobs[0][1][0] == "token_id:7026"


def test_token_id_mismatch_drops_logprobs_keeps_ids(vllm):
    reply = vllm("chat_token_id_strings")["response"]
    reply["choices"][0]["logprobs"]["content"][3]["token"] = "token_id:999"
    cap = parse_capture(reply)
    assert cap.logprobs is None
    assert cap.sampled_ids.tolist() == reply["choices"][0]["token_ids"]
    assert cap.prompt_ids is not None
    [finding] = cap.findings
    assert finding.level is Level.FATAL and finding.code == "token_id_mismatch" and "3" in finding.detail
    assert str(finding).startswith("[FATAL] ")


def test_null_logprob_makes_turn_untrainable_not_a_crash(vllm):
    reply = vllm("chat_basic")["response"]
    reply["choices"][0]["logprobs"]["content"][2]["logprob"] = None
    cap = parse_capture(reply)
    assert cap.logprobs is None and cap.sampled_ids.size == 8
    assert [f.code for f in cap.findings] == ["logprob_missing"]
    assert cap.findings[0].level is Level.FATAL


def test_reply_without_capture_fields_has_nothing_to_train_on(vllm):
    # errors.json's 200 case: a request without capture fields comes back with null logprobs/ids.
    reply = next(c for c in vllm("errors")["cases"] if c["case"] == "max_tokens_plus_prompt_over_context")[
        "body"
    ]
    cap = parse_capture(reply)
    assert cap.logprobs is None and cap.sampled_ids is None and cap.token_texts is None


async def test_complete_returns_recorded_reply_with_zero_filled_usage_once_checked(
    inprocess_vllm, basic_chat
):
    client = EngineClient(SPEC, http=inprocess_vllm.client())
    body, _ = client.prepare(basic_chat, Tier.TOKENS, "smollm2", training=False)
    reply = check_reply(await client.complete(body), URL).reply
    assert reply["prompt_token_ids"][:3].tolist() == [1, 9690, 198]
    assert reply["usage"]["prompt_tokens_details"] == {"cached_tokens": 0, "audio_tokens": 0}
    assert reply["usage"]["completion_tokens_details"]["reasoning_tokens"] == 0
    assert reply["usage"]["prompt_tokens"] == 37


async def test_upstream_400_passed_through_with_engine_message(make_inprocess_vllm, vllm_error, basic_chat):
    status, body = vllm_error("top_logprobs_too_large")
    up = make_inprocess_vllm(answer=lambda _b: (status, body))
    with pytest.raises(EngineError) as err:
        await EngineClient(SPEC, http=up.client()).complete(basic_chat)
    assert (err.value.kind, err.value.status) == ("upstream_4xx", 400)
    assert err.value.message == body["error"]["message"]


@pytest.mark.parametrize("status", [413, 422])
async def test_upstream_413_422_keep_their_status(make_inprocess_vllm, basic_chat, status):
    up = make_inprocess_vllm(
        answer=lambda _b: (
            status,
            {"error": {"message": "too big", "type": "x", "param": None, "code": status}},
        )
    )
    with pytest.raises(EngineError) as err:
        await EngineClient(SPEC, http=up.client()).complete(basic_chat)
    assert (err.value.kind, err.value.status, err.value.message) == ("upstream_4xx", status, "too big")


async def test_context_length_400_classified(make_inprocess_vllm, vllm_error, basic_chat):
    status, body = vllm_error("prompt_over_context")
    up = make_inprocess_vllm(answer=lambda _b: (status, body))
    with pytest.raises(EngineError) as err:
        await EngineClient(SPEC, http=up.client()).complete(basic_chat)
    assert (err.value.kind, err.value.status) == ("context_length", 400)


async def test_unknown_model_404_becomes_classified_502(inprocess_vllm, basic_chat):
    with pytest.raises(EngineError) as err:
        await EngineClient(SPEC, http=inprocess_vllm.client()).complete(
            {**basic_chat, "model": "no-such-model"}
        )
    assert (err.value.kind, err.value.status) == ("upstream_4xx", 502)
    assert "does not exist" in err.value.message and URL in err.value.message


async def test_upstream_500_becomes_502(make_inprocess_vllm, basic_chat):
    up = make_inprocess_vllm(answer=lambda _b: (500, {"error": {"message": "EngineCore died"}}))
    with pytest.raises(EngineError) as err:
        await EngineClient(SPEC, http=up.client()).complete(basic_chat)
    assert (err.value.kind, err.value.status) == ("upstream_5xx", 502)
    assert "EngineCore died" in err.value.message


async def test_200_without_choices_is_bad_reply(make_inprocess_vllm, vllm, basic_chat):
    reply = vllm("chat_basic")["response"]
    del reply["choices"]
    up = make_inprocess_vllm(answer=lambda _b: (200, reply))
    with pytest.raises(EngineError) as err:
        await EngineClient(SPEC, http=up.client()).complete(basic_chat)
    assert (err.value.kind, err.value.status) == ("bad_reply", 502)


async def test_html_error_page_named_with_engine_url(make_inprocess_vllm, basic_chat):
    page = "<html><body><h1>502 Bad Gateway</h1>tunnel closed</body></html>"
    for status in (200, 502):
        up = make_inprocess_vllm(answer=lambda _b, s=status: (s, page))
        with pytest.raises(EngineError) as err:
            await EngineClient(SPEC, http=up.client()).complete(basic_chat)
        assert err.value.status == 502 and URL in err.value.message
        assert err.value.kind == ("bad_reply" if status == 200 else "upstream_5xx")


async def test_connection_refused_is_unreachable_naming_url_and_cause_after_retrying(basic_chat):
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}/v1"
    client = EngineClient(EngineSpec(url=url))
    try:
        with pytest.raises(EngineError) as err:
            await client.complete(basic_chat)
    finally:
        await client.aclose()
    assert (err.value.kind, err.value.status) == ("unreachable", 502)
    assert url in err.value.message and "ConnectionRefusedError" in err.value.message
    assert f"{upstream_http.CONNECT_ATTEMPTS} attempts" in err.value.message


async def test_timeout_is_classified_not_a_hang(basic_chat):
    def handler(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("read timed out", request=request)

    client = EngineClient(SPEC, http=httpx.AsyncClient(transport=httpx.MockTransport(handler)))
    with pytest.raises(EngineError) as err:
        await client.complete(basic_chat)
    assert (err.value.kind, err.value.status) == ("timeout", 502) and URL in err.value.message


async def test_real_slow_socket_times_out(basic_chat):
    # A loopback server that accepts and never answers: the client's read timeout must fire.
    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(65536)
        await asyncio.sleep(30)

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    client = EngineClient(EngineSpec(url=f"http://127.0.0.1:{port}/v1"), timeout=0.2)
    try:
        with pytest.raises(EngineError) as err:
            await client.complete(basic_chat)
        assert err.value.kind == "timeout"
    finally:
        await client.aclose()
        server.close()


async def test_api_key_sent_as_bearer(make_inprocess_vllm, basic_chat):
    up = make_inprocess_vllm()
    client = EngineClient(EngineSpec(url=URL, api_key="sk-engine"), http=up.client())
    await client.complete(basic_chat)
    assert up.sent[-1].headers["authorization"] == "Bearer sk-engine"
    assert "sk-engine" not in repr(client.spec)


async def test_concurrent_calls_all_in_flight_at_once_each_gets_its_reply(vllm, basic_chat):
    """Many sessions on one engine: calls are all in flight at once (no pool caps them), every
    caller gets the engine's reply, and a later call reuses a kept-alive connection."""
    reply = vllm("chat_basic")["response"]
    calls = 17
    engine = FakeVllm(answer=lambda _body: (200, reply), hold=lambda _body: True)
    with engine:
        client = EngineClient(EngineSpec(url=engine.base_url))
        try:
            replies = asyncio.gather(*(client.complete(basic_chat) for _ in range(calls)))
            deadline = asyncio.get_running_loop().time() + 30
            while engine.held < calls:  # the engine answers none until all have arrived
                assert asyncio.get_running_loop().time() < deadline, f"only {engine.held} in flight"
                await asyncio.sleep(0.05)
            engine.hold = None
            replies = await asyncio.wait_for(replies, 30)
            assert client._lean.connections_opened == calls
            await client.complete(basic_chat)  # a later call reuses a connection
            assert client._lean.connections_opened == calls
        finally:
            await client.aclose()
    assert len(engine.requests) == calls + 1
    assert all(parse_capture(r).prompt_ids.tolist() == reply["prompt_token_ids"] for r in replies)
    with pytest.raises(RuntimeError, match="closed"):
        await client.complete(basic_chat)


async def test_keepalive_connection_closed_by_the_engine_is_retried_once_on_a_fresh_one(vllm, basic_chat):
    """The engine closes an idle keep-alive connection just as the next call reuses it (uvicorn's
    5 s keep-alive, seen in bench/proxy.py): the caller must get the reply, not a 502. The engine
    is a script on a raw socket, not the fake vLLM: no HTTP server drops a request unanswered."""
    payload = json.dumps(vllm("chat_basic")["response"]).encode()
    connections = 0

    async def engine(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        head = await reader.readuntil(b"\r\n\r\n")
        length = int(
            next(
                line.split(b":")[1]
                for line in head.split(b"\r\n")
                if line.lower().startswith(b"content-length")
            )
        )
        await reader.readexactly(length)
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\n\r\n%s" % (len(payload), payload)
        )
        await writer.drain()
        # Keep the connection "alive" for the client, then drop the next request unanswered.
        try:
            await reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError:
            pass
        writer.close()

    server = await asyncio.start_server(engine, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    client = EngineClient(EngineSpec(url=f"http://127.0.0.1:{port}/v1"))
    try:
        first = await client.complete(basic_chat)
        second = await asyncio.wait_for(client.complete(basic_chat), 30)
    finally:
        await client.aclose()
        server.close()
    assert first["id"] == second["id"] == vllm("chat_basic")["response"]["id"]
    assert connections == 2  # the first call and its dropped reuse, then the retry's fresh one


def test_prompt_ids_decoded_straight_to_an_array_and_the_rest_as_plain_json(vllm):
    raw = json.dumps(vllm("chat_basic")["response"]).encode()
    plain, fast = json.loads(raw), loads_with_prompt_ids(raw)
    assert isinstance(fast["prompt_token_ids"], np.ndarray)
    assert fast["prompt_token_ids"].tolist() == plain.pop("prompt_token_ids")
    fast.pop("prompt_token_ids")
    assert fast == plain


@pytest.mark.parametrize(
    "body",
    [
        {"choices": [{"prompt_token_ids": [4, 5]}], "prompt_token_ids": [1, 2]},  # nested key first
        {"prompt_token_ids": [1.5, 2]},
        {"prompt_token_ids": [1, "2"]},
        {"x": '"prompt_token_ids":[1,2]'},
    ],
)
def test_prompt_ids_anything_unexpected_decodes_as_plain_json(body):
    assert loads_with_prompt_ids(json.dumps(body, separators=(",", ":")).encode()) == body


def _compact(body: dict) -> bytes:
    return json.dumps(body, separators=(",", ":")).encode()


def test_prompt_ids_past_the_sessions_last_prompt_are_the_only_ones_parsed(vllm):
    """A multi-turn recording: each turn's list starts with the last one's text, so the memo's ids
    are taken as they are (marked here to show it) and only the new tail is parsed."""
    memo = PromptIdsMemo()
    first = vllm("chat_multiturn_1")["response"]
    second = vllm("chat_multiturn_2")["response"]
    assert (
        loads_with_prompt_ids(_compact(first), memo)["prompt_token_ids"].tolist() == first["prompt_token_ids"]
    )
    known = len(first["prompt_token_ids"])
    assert second["prompt_token_ids"][:known] == first["prompt_token_ids"]
    memo.keep(memo.text, np.full(known, -1, dtype=np.int32))
    got = loads_with_prompt_ids(_compact(second), memo)["prompt_token_ids"]
    assert got[:known].tolist() == [-1] * known
    assert got[known:].tolist() == second["prompt_token_ids"][known:]
    assert memo.ids is got and not got.flags.writeable


def test_extending_replies_share_one_growing_buffer_and_arrays_handed_out_keep_their_ids():
    """Nothing of the prompt's size is copied per call: the memo's text is a view of the reply,
    and each reply's new ids are written after the last ones, where no earlier array reaches."""
    memo = PromptIdsMemo()
    ids: list[int] = []
    handed: list[tuple[np.ndarray, list[int]]] = []
    for step in range(6):
        ids = ids + list(range(100 * step, 100 * step + 300))
        body = _compact({"prompt_token_ids": ids, "choices": []})
        got = loads_with_prompt_ids(body, memo)["prompt_token_ids"]
        assert memo.ids is got and memo.text.obj is body
        handed.append((got, list(ids)))
    # From the first extension on: one buffer until it is full (600, 900, 1,200 ids), then one
    # twice the size, so the known ids are copied a logarithmic number of times, not each call.
    assert handed[1][0].base is handed[2][0].base is handed[3][0].base
    assert handed[4][0].base is handed[5][0].base is not handed[3][0].base
    other = loads_with_prompt_ids(_compact({"prompt_token_ids": [7, 7]}), memo)["prompt_token_ids"]
    again = loads_with_prompt_ids(_compact({"prompt_token_ids": [7, 7, 8]}), memo)["prompt_token_ids"]
    assert other.tolist() == [7, 7] and again.tolist() == [7, 7, 8]
    assert again.base is not handed[-1][0].base
    for got, want in handed:
        assert got.tolist() == want


@pytest.mark.parametrize(
    ("last", "now"),
    [
        ([1, 2], [1, 23, 4]),  # the last list's text ends inside an id of this one
        ([1, 2], [1, 2]),  # the same list again
        ([5, 6], [1, 2, 3]),  # another conversation
        ([1, 2, 3], [1, 2]),  # shorter
        ([1, 2], [1, 2, 3, 4]),
    ],
)
def test_prompt_ids_with_a_memo_match_plain_json(last, now):
    memo = PromptIdsMemo()
    loads_with_prompt_ids(_compact({"prompt_token_ids": last}), memo)
    body = {"id": "x", "prompt_token_ids": now, "choices": []}
    got = loads_with_prompt_ids(_compact(body), memo)
    assert got["prompt_token_ids"].tolist() == now and memo.ids.tolist() == now


def test_prompt_ids_arrive_as_int32_and_an_id_past_int32_decodes_as_plain_json():
    """The array is already in the stored form (no range pass or copy later); an id int32 cannot
    hold stays a plain list, which `parse_capture` reports as a bad prompt."""
    memo = PromptIdsMemo()
    got = loads_with_prompt_ids(_compact({"prompt_token_ids": [1, 2147483647]}), memo)
    assert got["prompt_token_ids"].dtype == np.int32
    body = {"prompt_token_ids": [1, 2147483647, 2147483648]}
    assert loads_with_prompt_ids(_compact(body), memo) == body
    capture = EngineClient.parse_capture({**body, "choices": [{"token_ids": [3]}]})
    assert capture.prompt_ids is None and [f.code for f in capture.findings] == ["bad_prompt_ids"]


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.integers(0, 300_000), max_size=30),
    st.lists(st.integers(0, 300_000), max_size=30),
    st.booleans(),
    st.sampled_from([",", ", "]),
)
def test_prompt_ids_parsed_after_any_earlier_list_equal_plain_json(last, extra, extends, comma):
    now = last + extra if extends else extra
    memo = PromptIdsMemo()
    for ids in (last, now):
        raw = ("{" + f'"prompt_token_ids":[{comma.join(map(str, ids))}],"usage":{{}}' + "}").encode()
        got = loads_with_prompt_ids(raw, memo)
        assert got["prompt_token_ids"].tolist() == ids and got["usage"] == {}
        assert memo.ids.tolist() == ids
