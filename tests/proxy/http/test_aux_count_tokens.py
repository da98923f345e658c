"""Aux routes: Anthropic count_tokens and Google countTokens (capture-cases C24, C25)."""

from __future__ import annotations

import socket

import httpx
import pytest

from tapdeck.proxy.http.token_counts import (
    aux_dialect,
    count_tokens,
    estimate_tokens,
    match_aux,
    tokenize_url,
)


def test_aux_paths_recognised_case_insensitively() -> None:
    assert match_aux("POST", "/v1/messages/count_tokens") == "anthropic_count_tokens"
    assert match_aux("post", "/v1/Messages/Count_Tokens?beta=true") == "anthropic_count_tokens"
    assert match_aux("POST", "/v1beta/models/gemini-2.5-pro:countTokens") == "google_count_tokens"
    assert match_aux("POST", "/v1/messages") is None
    assert match_aux("POST", "/v1beta/models/g:generateContent") is None
    assert match_aux("GET", "/v1/messages/count_tokens") is None
    assert aux_dialect("anthropic_count_tokens").name == "anthropic"
    assert aux_dialect("google_count_tokens").name == "google"


def test_tokenize_url_is_beside_v1() -> None:
    assert tokenize_url("http://127.0.0.1:9/v1") == "http://127.0.0.1:9/tokenize"
    assert tokenize_url("http://127.0.0.1:9/v1/") == "http://127.0.0.1:9/tokenize"
    assert tokenize_url("http://h:9") == "http://h:9/tokenize"


def test_google_estimate_reads_contents_and_system_instruction() -> None:
    text = "x" * 400
    body = {
        "contents": [{"role": "user", "parts": [{"text": text}]}],
        "systemInstruction": {"parts": [{"text": "y" * 200}]},
    }
    assert estimate_tokens("google_count_tokens", body) == 150
    nested = {"generateContentRequest": {"model": "models/g", **body}}
    assert estimate_tokens("google_count_tokens", nested) == 150


def test_google_estimate_grows_with_every_text_field() -> None:
    base = {"contents": [{"role": "user", "parts": [{"text": "hello world " * 10}]}]}
    n = estimate_tokens("google_count_tokens", base)
    assert n > 1
    with_call = {
        "contents": [
            *base["contents"],
            {
                "role": "model",
                "parts": [{"functionCall": {"name": "run", "args": {"cmd": "ls -la /some/long/path"}}}],
            },
        ]
    }
    assert estimate_tokens("google_count_tokens", with_call) > n
    with_tools = {**base, "tools": [{"functionDeclarations": [{"name": "run", "description": "d" * 80}]}]}
    assert estimate_tokens("google_count_tokens", with_tools) > n


def test_anthropic_estimate_reads_messages_system_and_tools() -> None:
    body = {
        "system": "s" * 40,
        "messages": [{"role": "user", "content": [{"type": "text", "text": "u" * 40}]}],
    }
    assert estimate_tokens("anthropic_count_tokens", body) == 20
    with_tools = {
        **body,
        "tools": [{"name": "bash", "description": "d" * 40, "input_schema": {"type": "object"}}],
    }
    assert estimate_tokens("anthropic_count_tokens", with_tools) > 20


async def test_unreachable_engine_falls_back_to_estimate() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    body = {"messages": [{"role": "user", "content": "z" * 80}]}
    reply, method = await count_tokens(
        "anthropic_count_tokens", body, engine_url=f"http://127.0.0.1:{port}/v1"
    )
    assert reply == {"input_tokens": 20} and method == "estimate"
    reply, method = await count_tokens(
        "google_count_tokens", {"contents": [{"parts": [{"text": "z" * 80}]}]}, engine_url=None
    )
    assert reply == {"totalTokens": 20} and method == "estimate"


@pytest.mark.slow
async def test_count_uses_the_engines_tokenize(embedded_engine) -> None:
    body = {
        "system": "You are terse.",
        "messages": [{"role": "user", "content": "What is the capital of France?"}],
    }
    reply, method = await count_tokens(
        "anthropic_count_tokens",
        body,
        engine_url=embedded_engine.base_url,
        served_model=embedded_engine.served_name,
    )
    assert method == "engine"
    async with httpx.AsyncClient() as client:
        direct = await client.post(
            tokenize_url(embedded_engine.base_url),
            json={
                "model": embedded_engine.served_name,
                "add_generation_prompt": True,
                "messages": [
                    {"role": "system", "content": "You are terse."},
                    {"role": "user", "content": "What is the capital of France?"},
                ],
            },
        )
    assert reply == {"input_tokens": direct.json()["count"]}
    google, method = await count_tokens(
        "google_count_tokens",
        {
            "systemInstruction": {"parts": [{"text": "You are terse."}]},
            "contents": [{"role": "user", "parts": [{"text": "What is the capital of France?"}]}],
        },
        engine_url=embedded_engine.base_url,
        served_model=embedded_engine.served_name,
    )
    assert method == "engine" and google == {"totalTokens": reply["input_tokens"]}
