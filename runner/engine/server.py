"""The embedded engine's HTTP app: vLLM's OpenAI-compatible wire format over `EngineCore`.

Routes: `GET /health`, `GET /v1/models`, `POST /v1/chat/completions` (streaming or not),
`POST /v1/completions` (text or token-id prompt, with vLLM's `prompt_logprobs`), `POST /tokenize`.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any, TypeVar

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ValidationError

from tapdeck.proxy.upstream.toolcalls import START as TOOL_START
from tapdeck.runner.engine import wire
from tapdeck.runner.engine.core import EngineCore, StreamEvent
from tapdeck.runner.engine.errors import (
    EngineHTTPError,
    bad_param,
    context_exceeded,
    invalid_json,
    model_not_found,
    validation_error,
)
from tapdeck.runner.engine.generation import Choice
from tapdeck.runner.engine.protocol import (
    PARSER,
    ChatCompletionRequest,
    CompletionRequest,
    TokenizeRequest,
)
from tapdeck.runner.engine.template import TemplateError

_Req = TypeVar("_Req", bound=BaseModel)
SSE_TYPE = "text/event-stream; charset=utf-8"


# A TypeVar, not PEP 695's syntax: the training environment's Python 3.11 runs this server too.
async def _parse(request: Request, model_cls: type[_Req]) -> _Req:  # noqa: UP047
    raw = await request.body()
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise invalid_json(exc.pos, exc.msg) from None
    except UnicodeDecodeError:
        raise invalid_json(0, "body is not UTF-8") from None
    try:
        return model_cls.model_validate(data)
    except ValidationError as exc:
        errors = [dict(e, loc=("body", *e["loc"])) for e in exc.errors(include_url=False)]
        raise validation_error(errors) from None


def _sse(obj: Any) -> bytes:
    return b"data: " + json.dumps(obj, ensure_ascii=False).encode() + b"\n\n"


def _safe_content(text: str) -> str:
    """Text that can be streamed as content while a tool call might still be forming."""
    cut = text.find(TOOL_START)
    if cut >= 0:
        return text[:cut]
    for k in range(min(len(TOOL_START) - 1, len(text)), 0, -1):
        if TOOL_START.startswith(text[-k:]):
            return text[:-k]
    return text


def create_engine_app(
    core: EngineCore,
    *,
    served_name: str = "smollm2",
    max_model_len: int | None = None,
    return_tokens_as_token_ids: bool = False,
    root: str | None = None,
) -> FastAPI:
    """The FastAPI app serving `core` under `served_name` in vLLM's wire format."""
    model = core.model
    max_len = max_model_len or model.n_ctx
    namer = wire.TokenNamer(model.token_texts, as_ids=return_tokens_as_token_ids)
    app = FastAPI(title="tapdeck embedded engine", docs_url=None, redoc_url=None, openapi_url=None)

    @app.exception_handler(EngineHTTPError)
    async def _engine_error(_: Request, exc: EngineHTTPError) -> JSONResponse:
        return JSONResponse(exc.body(), status_code=exc.status)

    @app.exception_handler(Exception)
    async def _internal(_: Request, exc: Exception) -> JSONResponse:
        err = EngineHTTPError(500, f"{type(exc).__name__}: {exc}", type="InternalServerError")
        return JSONResponse(err.body(), status_code=500)

    def check_model(name: str | None) -> None:
        if name is not None and name != served_name:
            raise model_not_found(name, [served_name])

    def check_prompt(prompt_ids: list[int]) -> None:
        if len(prompt_ids) > max_len:
            # vLLM stops counting one past the limit, hence "at least max_model_len + 1"
            raise context_exceeded(max_len, max_len + 1)

    def chat_ids(req: ChatCompletionRequest | TokenizeRequest) -> list[int]:
        extra = dict(getattr(req, "chat_template_kwargs", None) or {})
        try:
            return core.chat_prompt(
                req.messages or [],
                tools=req.tools,
                add_generation_prompt=req.add_generation_prompt,
                continue_final_message=getattr(req, "continue_final_message", False),
                **extra,
            )
        except (TemplateError, ValueError) as exc:
            raise bad_param(str(exc), "messages") from None

    @app.get("/health")
    async def health() -> Response:
        return Response(status_code=200)

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        now = int(time.time())
        return {
            "object": "list",
            "data": [
                {
                    "id": served_name,
                    "object": "model",
                    "created": now,
                    "owned_by": "vllm",
                    "root": root or str(model.path),
                    "parent": None,
                    "max_model_len": max_len,
                    "permission": [
                        {
                            "id": f"modelperm-{secrets.token_hex(8)}",
                            "object": "model_permission",
                            "created": now,
                            "allow_create_engine": False,
                            "allow_sampling": True,
                            "allow_logprobs": True,
                            "allow_search_indices": False,
                            "allow_view": True,
                            "allow_fine_tuning": False,
                            "organization": "*",
                            "group": None,
                            "is_blocking": False,
                        }
                    ],
                }
            ],
        }

    @app.post("/tokenize")
    async def tokenize(request: Request) -> dict[str, Any]:
        req = await _parse(request, TokenizeRequest)
        check_model(req.model)
        if req.messages is not None:
            ids = chat_ids(req)
        elif req.prompt is not None:
            ids = model.tokenize(req.prompt)
        else:
            raise bad_param("either `prompt` or `messages` is required.", "prompt")
        strs = model.token_strs(ids) if req.return_token_strs else None
        return {"count": len(ids), "max_model_len": max_len, "tokens": ids, "token_strs": strs}

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        req = await _parse(request, ChatCompletionRequest)
        check_model(req.model)
        req.check(max_len)
        prompt_ids = chat_ids(req)
        check_prompt(prompt_ids)
        max_tokens = req.requested_max_tokens or (max_len - len(prompt_ids))
        params, rules = req.sampling(), req.stop_rules(max_tokens)
        top = req.n_top_logprobs if req.logprobs else None
        return_ids = bool(req.return_token_ids)
        if req.stream:
            include_usage = bool((req.stream_options or {}).get("include_usage"))
            events = core.stream(prompt_ids, params, rules, n=req.n, top_logprobs=top)
            return StreamingResponse(
                _chat_stream(events, req, prompt_ids, return_ids, include_usage), media_type=SSE_TYPE
            )
        choices = await core.generate(
            prompt_ids, params, rules, n=req.n, top_logprobs=top, disconnected=request.is_disconnected
        )
        body_choices = [_chat_choice(i, c, req, return_ids) for i, c in enumerate(choices)]
        body = wire.chat_completion(
            wire.new_id("chatcmpl"),
            int(time.time()),
            served_name,
            body_choices,
            prompt_ids,
            sum(len(c.token_ids) for c in choices),
            return_ids=return_ids,
        )
        return JSONResponse(body)

    def _chat_choice(index: int, c: Choice, req: ChatCompletionRequest, return_ids: bool) -> dict[str, Any]:
        content: str | None = c.text
        calls = None
        finish = c.finish_reason
        if req.parse_tools:
            parsed = PARSER.parse(c.text)
            content, calls = parsed.content, parsed.tool_calls or None
            if calls:
                finish = "tool_calls"
        return wire.chat_choice(
            index,
            c,
            namer,
            logprobs=bool(req.logprobs),
            top_k=req.n_top_logprobs,
            return_ids=return_ids,
            content=content,
            tool_calls=calls,
            finish_reason=finish,
        )

    async def _chat_stream(
        events: AsyncGenerator[StreamEvent, None],
        req: ChatCompletionRequest,
        prompt_ids: list[int],
        return_ids: bool,
        include_usage: bool,
    ) -> AsyncIterator[bytes]:
        writer = wire.ChunkWriter(
            served_name, namer, logprobs=bool(req.logprobs), top_k=req.n_top_logprobs, return_ids=return_ids
        )
        completion_tokens = 0
        texts: dict[int, str] = {}
        sent: dict[int, int] = {}
        held: dict[int, Any] = {}  # each choice's last token waits for the choice's outcome
        try:
            async for ev in events:
                i = ev.index
                if i not in texts:
                    texts[i], sent[i] = "", 0
                    yield _sse(writer.role(i, prompt_ids))
                if ev.step is not None:
                    completion_tokens += 1
                    texts[i] += ev.step.delta
                    if ev.step.last:
                        held[i] = ev.step
                        continue
                    safe = _safe_content(texts[i]) if req.parse_tools else texts[i]
                    content, sent[i] = safe[sent[i] :], max(sent[i], len(safe))
                    yield _sse(writer.token(i, ev.step, delta={"content": content}))
                    continue
                step = held.pop(i, None)
                if step is None:  # no token at all (cancelled, or no room in the context)
                    continue
                choice = ev.choice
                assert choice is not None, "an event without a token ends its choice"
                finish = choice.finish_reason
                delta: dict[str, Any] = {"content": texts[i][sent[i] :]}
                if req.parse_tools:
                    parsed = PARSER.parse(choice.text)
                    if parsed.tool_calls:
                        finish = "tool_calls"
                        delta = {
                            "content": (parsed.content or "")[sent[i] :],
                            "tool_calls": [dict(c, index=k) for k, c in enumerate(parsed.tool_calls)],
                        }
                yield _sse(
                    writer.token(
                        i, step, delta=delta, finish_reason=finish, stop_reason=choice.stop_reason, final=True
                    )
                )
            if include_usage:
                yield _sse(writer.usage(len(prompt_ids), completion_tokens))
            yield b"data: [DONE]\n\n"
        finally:
            await events.aclose()

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        req = await _parse(request, CompletionRequest)
        check_model(req.model)
        req.check(max_len)
        if req.stream:
            raise bad_param(
                "streaming legacy completions are not supported by the embedded "
                "engine; use /v1/chat/completions or stream=false.",
                "stream",
            )
        prompt = req.single_prompt()
        if isinstance(prompt, str):
            prompt_ids = model.tokenize(prompt)
        else:
            bad = [t for t in prompt if not 0 <= t < model.n_vocab]
            if bad:
                raise bad_param(f"token id {bad[0]} is out of vocabulary (size {model.n_vocab}).", "prompt")
            prompt_ids = list(prompt)
        if not prompt_ids:
            raise bad_param("prompt must not be empty.", "prompt")
        check_prompt(prompt_ids)
        rules = req.stop_rules(req.max_tokens or (max_len - len(prompt_ids)))
        scored = None
        if req.prompt_logprobs is not None:
            scores = await core.score(prompt_ids, req.prompt_logprobs)
            scored = wire.prompt_logprobs(prompt_ids, scores, namer)
        choices = await core.generate(
            prompt_ids,
            req.sampling(),
            rules,
            n=req.n,
            top_logprobs=req.logprobs,
            disconnected=request.is_disconnected,
        )
        return_ids = bool(req.return_token_ids)
        body_choices = [
            {
                "index": i,
                "text": c.text,
                "logprobs": wire.legacy_logprobs(c, namer, req.logprobs)
                if req.logprobs is not None
                else None,
                "finish_reason": c.finish_reason,
                "stop_reason": c.stop_reason,
                "token_ids": list(c.token_ids) if return_ids else None,
                "prompt_logprobs": scored,
                "prompt_token_ids": list(prompt_ids) if return_ids else None,
                "routed_experts": None,
            }
            for i, c in enumerate(choices)
        ]
        return JSONResponse(
            wire.completion(
                wire.new_id("cmpl"),
                int(time.time()),
                served_name,
                body_choices,
                len(prompt_ids),
                sum(len(c.token_ids) for c in choices),
            )
        )

    return app
