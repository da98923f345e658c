"""Auth, budgets and upstream failures, against real loopback servers (recorded vLLM bodies)."""

from __future__ import annotations

import time

import anthropic
import httpx
import openai
import pytest

from tapdeck.proxy.http import token_counts as aux

CHAT = {"model": "x", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}


def _open(admin: httpx.Client, **spec) -> dict:
    resp = admin.post("/admin/sessions", json=spec)
    assert resp.status_code == 200, resp.text
    return resp.json()


def _sse_data(text: str) -> list[str]:
    return [line[6:] for line in text.splitlines() if line.startswith("data: ")]


def test_health_leaks_nothing(upstream, make_server):
    server = make_server(upstream.base_url)
    body = httpx.get(f"{server.url}/health").json()
    assert set(body) == {"status", "instance", "engine_wait"}
    assert body["status"] == "ok" and body["instance"] == server.instance
    assert body["engine_wait"] is None  # its engine answered (one awaited: tests/app/test_engine_wait.py)


@pytest.mark.parametrize("auth", [None, "Bearer wrong-key", "Basic abc", "Bearer"])
def test_admin_routes_need_the_admin_key(upstream, make_server, auth):
    server = make_server(upstream.base_url)
    headers = {"Authorization": auth} if auth else {}
    for method, path in [
        ("GET", "/admin/sessions"),
        ("POST", "/admin/sessions"),
        ("GET", "/admin/events"),
        ("GET", "/admin/sessions/s-0000000000000000"),
        ("DELETE", "/admin/sessions/x"),
    ]:
        resp = httpx.request(method, f"{server.url}{path}", headers=headers, json={})
        assert resp.status_code == 401, (method, path)


def test_every_admin_refusal_has_detail_kind_and_retryable(upstream, make_server, admin_for):
    server = make_server(upstream.base_url)
    admin = admin_for(server)
    unauthorised = httpx.get(f"{server.url}/admin/runs")
    assert unauthorised.headers["www-authenticate"] == "Bearer"
    refusals = [
        (unauthorised, 401, "authentication_error", "admin key required"),
        (admin.get("/admin/runs/nope"), 404, "not_found_error", "no run nope"),
        (admin.get("/admin/train/nope"), 404, "not_found_error", "no training run nope"),
        (
            admin.post("/admin/runs", json={"tasks": ["no-such-task"]}),
            400,
            "invalid_request_error",
            "no-such-task",
        ),
        (
            admin.post("/admin/sessions", content=b"notjson", headers={"content-type": "application/json"}),
            422,
            "invalid_request_error",
            "",
        ),
    ]
    for resp, status, kind, words in refusals:
        body = resp.json()
        assert resp.status_code == status, body
        assert (body["kind"], body["retryable"]) == (kind, False), body
        assert words in str(body["detail"]), body


def test_unknown_session_key_is_401_in_openai_shape(upstream, make_server):
    server = make_server(upstream.base_url)
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="tdk-" + "A" * 43, max_retries=0)
    with pytest.raises(openai.AuthenticationError) as err:
        client.chat.completions.create(**CHAT)
    assert err.value.status_code == 401
    assert err.value.body["type"] == "authentication_error"
    assert not upstream.requests


def test_models_lists_only_the_sessions_model(upstream, make_server, admin_for):
    server = make_server(upstream.base_url)
    info = _open(admin_for(server))
    body = httpx.get(f"{server.url}/v1/models", headers={"Authorization": f"Bearer {info['api_key']}"}).json()
    assert [m["id"] for m in body["data"]] == ["smollm2"]
    for headers, params in [({"x-goog-api-key": info["api_key"]}, {}), ({}, {"key": info["api_key"]})]:
        body = httpx.get(f"{server.url}/v1/models", headers=headers, params=params).json()
        assert [m["name"] for m in body["models"]] == ["models/smollm2"]  # Google's shape
    assert httpx.get(f"{server.url}/v1/models").status_code == 401


def test_openai_sdk_retrieves_the_sessions_model_and_gets_a_404_naming_it_for_another(
    upstream, make_server, admin_for
):
    """`client.models.retrieve(id)` (some agents call it at start-up) was a 405."""
    server = make_server(upstream.base_url)
    info = _open(admin_for(server))
    client = openai.OpenAI(base_url=info["base_urls"]["openai"], api_key=info["api_key"], max_retries=0)
    assert client.models.retrieve("smollm2") == client.models.list().data[0]
    for other in ["gpt-4o", "Qwen/Qwen3-8B"]:  # an id may hold a slash
        with pytest.raises(openai.NotFoundError) as err:
            client.models.retrieve(other)
        assert err.value.body["type"] == "not_found_error"
        assert err.value.body["message"] == (
            f"model {other!r} is not served here: this session's model is 'smollm2'"
        )


def test_anthropic_sdk_lists_and_retrieves_the_sessions_model_in_its_own_shape(
    upstream, make_server, admin_for
):
    """The listing was OpenAI's (no `type`, `display_name` or `created_at`) and a retrieve a 405."""
    server = make_server(upstream.base_url)
    info = _open(admin_for(server))
    client = anthropic.Anthropic(
        base_url=info["base_urls"]["anthropic"], api_key=info["api_key"], max_retries=0
    )
    listed = list(client.models.list())
    assert [(m.id, m.type, m.display_name) for m in listed] == [("smollm2", "model", "smollm2")]
    assert int(listed[0].created_at.timestamp()) == int(info["created_at"])
    assert client.models.retrieve("smollm2") == listed[0]
    with pytest.raises(anthropic.NotFoundError) as err:
        client.models.retrieve("claude-sonnet-4-5")
    assert (err.value.type, err.value.body["type"]) == ("not_found_error", "error")
    assert "this session's model is 'smollm2'" in err.value.api_message


@pytest.mark.parametrize("api_version", ["v1", "v1beta"])  # google-genai's default; gemini-cli's
def test_google_genai_sdk_gets_and_lists_the_sessions_model(upstream, make_server, admin_for, api_version):
    """`client.models.get` was a 405 in the chat envelope (read as status None), and the listing,
    in OpenAI's shape, read as no models."""
    from google import genai
    from google.genai import errors as genai_errors
    from google.genai import types

    server = make_server(upstream.base_url)
    info = _open(admin_for(server))
    client = genai.Client(
        api_key=info["api_key"],
        http_options=types.HttpOptions(base_url=info["base_urls"]["google"], api_version=api_version),
    )
    model = client.models.get(model="smollm2")
    assert (model.name, model.display_name) == ("models/smollm2", "smollm2")
    assert "generateContent" in model.supported_actions
    assert [m.name for m in client.models.list()] == ["models/smollm2"]
    with pytest.raises(genai_errors.ClientError) as err:
        client.models.get(model="gemini-2.5-pro")
    assert (err.value.code, err.value.status) == (404, "NOT_FOUND")
    assert "this session's model is 'smollm2'" in err.value.message


def test_an_unknown_get_path_is_a_404_naming_what_answers_get(upstream, make_server, admin_for):
    """Every GET the routes did not know was a 405 "Method Not Allowed" (the POST model route
    matches any path), as if the path were right and the method wrong."""
    server = make_server(upstream.base_url)
    admin = admin_for(server)
    for path in ["/nosuch", "/v1/nosuch", "/v1/chat/completions"]:
        resp = httpx.get(f"{server.url}{path}")
        assert resp.status_code == 404, (path, resp.text)
        assert resp.json()["error"]["message"].startswith(
            f"nothing answers GET {path}: GET serves /health, /v1/models"
        ), path
    unknown = admin.get("/admin/nosuch")
    assert unknown.status_code == 404 and unknown.json()["kind"] == "not_found_error"
    post_only = admin.get("/admin/runs/r/cancel")  # a route that takes POST stays a 405
    assert post_only.status_code == 405 and post_only.headers["allow"] == "POST"


def test_the_models_routes_are_matched_case_insensitively_as_model_calls_are(
    upstream, make_server, admin_for
):
    server = make_server(upstream.base_url)
    info = _open(admin_for(server))
    auth = {"Authorization": f"Bearer {info['api_key']}"}
    assert (
        httpx.get(f"{server.url}/V1/MODELS", headers=auth).json()
        == httpx.get(f"{server.url}/v1/models", headers=auth).json()
    )
    one = httpx.get(f"{server.url}/V1/Models/smollm2", headers=auth)
    assert one.status_code == 200 and one.json()["id"] == "smollm2"
    assert httpx.get(f"{server.url}/V1/MODELS/SmolLM2", headers=auth).status_code == 404  # ids keep case


def test_a_model_listing_with_a_bad_key_answers_in_the_sdks_own_error_shape(upstream, make_server):
    server = make_server(upstream.base_url)
    client = anthropic.Anthropic(base_url=server.url, api_key="tdk-" + "A" * 43, max_retries=0)
    with pytest.raises(anthropic.AuthenticationError) as err:
        client.models.list()
    assert err.value.body["type"] == "error"  # Anthropic's envelope
    assert err.value.body["error"]["type"] == "authentication_error"
    google = httpx.get(f"{server.url}/v1/models", headers={"x-goog-api-key": "nope"}).json()
    assert google["error"]["status"] == "UNAUTHENTICATED"
    plain = httpx.get(f"{server.url}/v1/models", headers={"Authorization": "Bearer nope"}).json()
    assert plain["error"]["type"] == "authentication_error" and "status" not in plain["error"]


def test_training_on_a_text_tier_engine_is_refused_at_session_creation(upstream, make_server, admin_for):
    upstream.fault = "no_logprobs"
    server = make_server(upstream.base_url)
    admin = admin_for(server)
    resp = admin.post("/admin/sessions", json={"rollout_type": "train"})
    assert resp.status_code == 400
    assert "tokens tier" in resp.json()["detail"]
    assert _open(admin)["rollout_type"] == "eval"


def test_budget_reached_gives_a_non_empty_stop_and_no_node(upstream, make_server, admin_for):
    server = make_server(upstream.base_url)
    admin = admin_for(server)
    info = _open(admin, call_budget=1)
    client = openai.OpenAI(base_url=info["base_urls"]["openai"], api_key=info["api_key"], max_retries=0)
    first = client.chat.completions.create(**CHAT)
    assert first.choices[0].message.content == "The capital of France is Paris."
    calls = len(upstream.requests)
    second = client.chat.completions.create(**CHAT)
    assert second.choices[0].finish_reason == "stop"
    assert "budget" in second.choices[0].message.content
    stream = client.chat.completions.create(**CHAT, stream=True)
    streamed = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert "budget" in streamed
    assert len(upstream.requests) == calls
    assert admin.get(f"/admin/sessions/{info['id']}").json()["turns"] == 1


def test_engine_gone_after_the_session_opened_is_a_502_naming_the_url(upstream, make_server, admin_for):
    url = upstream.base_url
    server = make_server(url)
    info = _open(admin_for(server))
    assert info["tier"] == "tokens"
    upstream.stop()
    resp = httpx.post(
        f"{server.url}/v1/chat/completions", json=CHAT, headers={"Authorization": f"Bearer {info['api_key']}"}
    )
    assert resp.status_code == 502
    err = resp.json()["error"]
    assert err["type"] == "unreachable"
    assert url in err["message"]


def test_an_engine_found_down_is_probed_again_by_the_next_session(upstream, make_server, admin_for):
    # vLLM restarted at the same URL, now with the capture flags: the proxy must not keep the tier
    # it probed before the restart.
    upstream.fault = "no_logprobs"
    server = make_server(upstream.base_url)
    admin = admin_for(server)
    info = _open(admin)
    assert info["tier"] == "text"
    assert _open(admin)["tier"] == "text"  # cached, as long as nothing says the engine changed
    upstream.stop()
    resp = httpx.post(
        f"{server.url}/v1/chat/completions", json=CHAT, headers={"Authorization": f"Bearer {info['api_key']}"}
    )
    assert resp.status_code == 502
    upstream.fault = None
    upstream.serve_again()
    assert _open(admin)["tier"] == "tokens"


def test_an_engine_found_down_has_its_tokenize_asked_again(upstream, make_server, admin_for):
    # This engine has no /tokenize, so counts are estimated; restarted, it may serve one.
    server = make_server(upstream.base_url)
    info = _open(admin_for(server))
    count = httpx.post(
        f"{server.url}/v1/messages/count_tokens",
        headers={"x-api-key": info["api_key"]},
        json={"model": "x", "messages": [{"role": "user", "content": "Hi"}]},
    )
    assert count.status_code == 200, count.text
    tokenize = aux.tokenize_url(upstream.base_url)
    assert tokenize in aux._no_tokenize
    upstream.stop()
    resp = httpx.post(
        f"{server.url}/v1/chat/completions", json=CHAT, headers={"Authorization": f"Bearer {info['api_key']}"}
    )
    assert resp.status_code == 502
    assert tokenize not in aux._no_tokenize


def test_html_body_is_a_classified_bad_reply(upstream, make_server, admin_for):
    server = make_server(upstream.base_url)
    info = _open(admin_for(server))
    upstream.fault = "html"  # e.g. a gateway's error page in front of an engine that was answering
    client = openai.OpenAI(base_url=info["base_urls"]["openai"], api_key=info["api_key"], max_retries=0)
    with pytest.raises(openai.APIStatusError) as err:
        client.chat.completions.create(**CHAT)
    assert err.value.status_code == 502
    assert "not a JSON object" in err.value.message


def test_upstream_5xx_before_the_stream_starts_keeps_its_status(upstream, make_server, admin_for):
    # The stream is held until the engine answers (or a keepalive is due): a failed call is a 502
    # the SDK retries on, not HTTP 200 plus an error event (issue 17).
    server = make_server(upstream.base_url)
    info = _open(admin_for(server))
    upstream.fault = "http500"
    resp = httpx.post(
        f"{server.url}/v1/chat/completions",
        json={**CHAT, "stream": True},
        headers={"Authorization": f"Bearer {info['api_key']}"},
    )
    assert resp.status_code == 502
    assert "engine core died" in resp.json()["error"]["message"]
    client = openai.OpenAI(base_url=info["base_urls"]["openai"], api_key=info["api_key"], max_retries=0)
    with pytest.raises(openai.InternalServerError):
        list(client.chat.completions.create(**CHAT, stream=True))


def test_upstream_timeout_is_classified_and_cancels_nothing_else(upstream, tmp_path, admin_for):
    from tapdeck.app.host import LocalServer
    from tapdeck.proxy.config import ServerConfig

    server = LocalServer(ServerConfig(port=0, data_dir=tmp_path, engine_url=upstream.base_url)).start()
    try:
        server.service.engine_timeout = 0.3
        info = _open(admin_for(server))
        upstream.delay = 5.0
        resp = httpx.post(
            f"{server.url}/v1/chat/completions",
            json=CHAT,
            timeout=30,
            headers={"Authorization": f"Bearer {info['api_key']}"},
        )
        assert resp.status_code == 502
        assert resp.json()["error"]["type"] == "timeout"
        assert upstream.base_url in resp.json()["error"]["message"]
    finally:
        server.stop()


@pytest.mark.medium
def test_context_length_400_becomes_a_normal_stop_with_a_warning(upstream, make_server, admin_for):
    server = make_server(upstream.base_url)
    admin = admin_for(server)
    info = _open(admin)
    upstream.fault = "context_full"
    client = openai.OpenAI(base_url=info["base_urls"]["openai"], api_key=info["api_key"], max_retries=0)
    reply = client.chat.completions.create(**CHAT)
    assert reply.choices[0].finish_reason == "stop"
    assert reply.choices[0].message.content
    stream = client.chat.completions.create(**CHAT, stream=True)
    chunks = [c for c in stream if c.choices]
    assert chunks[-1].choices[0].finish_reason == "stop"
    summary = admin.get(f"/admin/sessions/{info['id']}").json()
    assert summary["turns"] == 0 and summary["warn"] >= 2
    assert any(f["code"] == "context_full" for f in summary["findings"])


def test_upstream_400_passes_through_with_its_status(upstream, make_server, admin_for):
    server = make_server(upstream.base_url)
    info = _open(admin_for(server))
    client = openai.OpenAI(base_url=info["base_urls"]["openai"], api_key=info["api_key"], max_retries=0)
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(**CHAT, n=2)
    assert not upstream.requests or all(r.get("n") in (None, 1) for r in upstream.requests)


def test_streaming_client_gets_keepalives_and_hang_up_cancels_the_call(upstream, make_server, admin_for):
    server = make_server(upstream.base_url)
    info = _open(admin_for(server))
    server.service.keepalive_s = 0.05
    upstream.delay = 0.4
    resp = httpx.post(
        f"{server.url}/v1/chat/completions",
        json={**CHAT, "stream": True},
        timeout=30,
        headers={"Authorization": f"Bearer {info['api_key']}"},
    )
    assert ": keepalive" in resp.text and _sse_data(resp.text)[-1] == "[DONE]"

    upstream.delay = 30.0
    before = upstream.cancelled
    with (
        httpx.Client(timeout=30) as client,
        client.stream(
            "POST",
            f"{server.url}/v1/chat/completions",
            json={**CHAT, "stream": True},
            headers={"Authorization": f"Bearer {info['api_key']}"},
        ) as stream,
    ):
        assert next(stream.iter_lines()) == ": keepalive"
    # The client hung up: the proxy's engine request is aborted, so the upstream sees a cancel.
    deadline = time.monotonic() + 30  # a bound for a loaded machine, not a speed check
    while upstream.cancelled == before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert upstream.cancelled > before


def test_admin_events_stream_session_and_turn_events(upstream, make_server, admin_for):
    import threading

    server = make_server(upstream.base_url)
    admin = admin_for(server)
    seen: list[str] = []
    ready = threading.Event()

    def listen() -> None:
        with (
            httpx.Client(timeout=30) as c,
            c.stream(
                "GET", f"{server.url}/admin/events", headers={"Authorization": f"Bearer {server.admin_key}"}
            ) as s,
        ):
            for line in s.iter_lines():
                if line.startswith(": connected"):
                    ready.set()
                if line.startswith("data: "):
                    import json

                    event = json.loads(line[6:])
                    seen.append(event["type"])
                    if event["type"] == "session_closed":
                        return

    thread = threading.Thread(target=listen, daemon=True)
    thread.start()
    assert ready.wait(60)
    info = _open(admin)
    httpx.post(
        f"{server.url}/v1/chat/completions", json=CHAT, headers={"Authorization": f"Bearer {info['api_key']}"}
    )
    server.service.events.publish({"type": "run_started", "run_id": "r1"})
    admin.delete(f"/admin/sessions/{info['id']}")
    thread.join(60)
    # The call's start updates the session's summary (its call in flight), then its turn lands.
    assert seen == ["session_opened", "session_updated", "turn_captured", "run_started", "session_closed"]
