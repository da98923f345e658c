"""Request bodies the engine accepts (OpenAI + vLLM extensions) and their checks, in vLLM's order.

Unknown fields are accepted and ignored, as vLLM does.
"""

from __future__ import annotations

import dataclasses
from typing import Any, cast

from pydantic import BaseModel, ConfigDict

from tapdeck.proxy.upstream.toolcalls import EMBEDDED_TOOL_PARSER, TOOL_PARSERS, parses_tools
from tapdeck.runner.engine.errors import bad_param
from tapdeck.runner.engine.generation import StopRules
from tapdeck.runner.engine.sampling import SamplingParams

MAX_TOP_LOGPROBS = 20
PARSER = TOOL_PARSERS[EMBEDDED_TOOL_PARSER]
"""The chat route's tool-call parser (vLLM's `--tool-call-parser`); token-in capture applies the
same one to replies it samples on the completions route."""


class _Sampled(BaseModel):
    """Fields shared by chat and legacy completions."""

    model_config = ConfigDict(extra="allow")

    model: str | None = None
    max_tokens: int | None = None
    n: int = 1
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    stream: bool | None = False
    stream_options: dict[str, Any] | None = None
    return_token_ids: bool | None = None

    def sampling(self) -> SamplingParams:
        """The sampling parameters, defaults filled in."""
        return SamplingParams(
            temperature=1.0 if self.temperature is None else self.temperature,
            top_p=1.0 if self.top_p is None else self.top_p,
            top_k=0 if self.top_k is None or self.top_k < 0 else self.top_k,
            min_p=self.min_p or 0.0,
            presence_penalty=self.presence_penalty or 0.0,
            frequency_penalty=self.frequency_penalty or 0.0,
            repetition_penalty=1.0 if self.repetition_penalty is None else self.repetition_penalty,
            seed=self.seed,
        )

    def stop_rules(self, max_tokens: int) -> StopRules:
        """When generation ends."""
        stop = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        return StopRules(
            max_tokens=max_tokens,
            stop=tuple(s for s in stop if s),
            stop_token_ids=tuple(self.stop_token_ids or ()),
            ignore_eos=self.ignore_eos,
            include_stop_str_in_output=self.include_stop_str_in_output,
            skip_special_tokens=self.skip_special_tokens,
        )

    def check_common(self, requested_max: int | None, max_model_len: int, param: str) -> None:
        """Checks that do not need the prompt."""
        if self.stream_options is not None and not self.stream:
            raise bad_param("Stream options can only be defined when `stream=True`.", "stream_options")
        if self.n < 1:
            raise bad_param(f"n must be at least 1, got {self.n}.", "n", self.n, with_value=True)
        if self.temperature is not None and self.temperature < 0:
            raise bad_param(
                f"temperature must be non-negative, got {self.temperature}.",
                "temperature",
                self.temperature,
                with_value=True,
            )
        if self.top_p is not None and not 0.0 < self.top_p <= 1.0:
            raise bad_param(
                f"top_p must be in (0, 1], got {self.top_p}.", "top_p", self.top_p, with_value=True
            )
        if self.min_p is not None and not 0.0 <= self.min_p <= 1.0:
            raise bad_param(
                f"min_p must be in [0, 1], got {self.min_p}.", "min_p", self.min_p, with_value=True
            )
        if requested_max is not None:
            if requested_max < 1:
                raise bad_param(
                    f"{param} must be at least 1, got {requested_max}.", param, requested_max, with_value=True
                )
            if requested_max > max_model_len:
                raise bad_param(
                    f"{param}={requested_max} cannot be greater than "
                    f"max_model_len={max_model_len}. Please request fewer output "
                    "tokens.",
                    param,
                    requested_max,
                    with_value=True,
                )


class ChatCompletionRequest(_Sampled):
    """`POST /v1/chat/completions`."""

    messages: list[dict[str, Any]]
    max_completion_tokens: int | None = None
    logprobs: bool | None = False
    top_logprobs: int | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template_kwargs: dict[str, Any] | None = None

    @property
    def requested_max_tokens(self) -> int | None:
        """`max_completion_tokens` wins over the older `max_tokens`, as in the OpenAI API."""
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    @property
    def n_top_logprobs(self) -> int:
        """How many alternatives per token to report (0 when logprobs are off)."""
        return (self.top_logprobs or 0) if self.logprobs else 0

    @property
    def parse_tools(self) -> bool:
        """Whether to look for tool calls in the reply."""
        return parses_tools({"tools": self.tools, "tool_choice": self.tool_choice})

    def stop_rules(self, max_tokens: int) -> StopRules:
        """As for any request, except that a reply parsed for tool calls keeps special tokens in
        its text, as vLLM's tool parsers ask (`adjust_request`)."""
        rules = super().stop_rules(max_tokens)
        if self.parse_tools and PARSER.keeps_special_tokens:
            rules = dataclasses.replace(rules, skip_special_tokens=False)
        return rules

    def check(self, max_model_len: int) -> None:
        """vLLM's request checks that do not need the prompt."""
        if self.tools is not None and len(self.tools) == 0:
            raise bad_param(
                "`tools` must not be an empty array. Either provide at least one tool "
                "or omit the field entirely.",
                "tools",
            )
        if self.top_logprobs is not None:
            if self.top_logprobs < 0 and self.top_logprobs != -1:
                raise bad_param("`top_logprobs` must be a positive value.", "top_logprobs")
            if not self.logprobs:
                raise bad_param("when using `top_logprobs`, `logprobs` must be set to true.", "top_logprobs")
            if self.top_logprobs > MAX_TOP_LOGPROBS:
                raise bad_param(
                    f"Requested sample logprobs of {self.top_logprobs}, which is "
                    f"greater than max allowed: {MAX_TOP_LOGPROBS}",
                    "logprobs",
                    self.top_logprobs,
                    with_value=True,
                )
        if self.add_generation_prompt and self.continue_final_message:
            raise bad_param(
                "Cannot set both `continue_final_message` and `add_generation_prompt` to True.",
                "continue_final_message",
            )
        param = "max_completion_tokens" if self.max_completion_tokens is not None else "max_tokens"
        self.check_common(self.requested_max_tokens, max_model_len, param)


class CompletionRequest(_Sampled):
    """`POST /v1/completions` (legacy): one prompt, as text or as token ids."""

    prompt: str | list[int] | list[str] | list[list[int]]
    max_tokens: int | None = 16
    logprobs: int | None = None
    echo: bool = False
    prompt_logprobs: int | None = None
    """vLLM's: each prompt token's logprob given the tokens before it, plus this many top ones."""

    def check(self, max_model_len: int) -> None:
        """vLLM's checks that do not need the prompt."""
        if self.logprobs is not None and self.logprobs > MAX_TOP_LOGPROBS:
            raise bad_param(
                f"Requested sample logprobs of {self.logprobs}, which is greater than "
                f"max allowed: {MAX_TOP_LOGPROBS}",
                "logprobs",
                self.logprobs,
                with_value=True,
            )
        if self.prompt_logprobs is not None and not 0 <= self.prompt_logprobs <= MAX_TOP_LOGPROBS:
            raise bad_param(
                f"Requested prompt logprobs of {self.prompt_logprobs}; give 0 to {MAX_TOP_LOGPROBS}",
                "prompt_logprobs",
                self.prompt_logprobs,
                with_value=True,
            )
        if self.echo:
            raise bad_param("`echo` is not supported by the embedded engine.", "echo")
        self.check_common(self.max_tokens, max_model_len, "max_tokens")

    def single_prompt(self) -> str | list[int]:
        """The one prompt of this request (a batch of several is refused)."""
        p = self.prompt
        if isinstance(p, list) and p and isinstance(p[0], (list, str)):
            if len(p) != 1:
                raise bad_param(
                    f"the embedded engine serves one prompt per request; send {len(p)} requests instead.",
                    "prompt",
                )
            p = p[0]
        if isinstance(p, list) and not p:
            raise bad_param("prompt must not be empty.", "prompt")
        # A list left here is token ids: pydantic validated it as one of the prompt's list types,
        # and its first item is no list or string (mypy cannot narrow a list by its items).
        return cast("str | list[int]", p)


class TokenizeRequest(BaseModel):
    """`POST /tokenize`: either a text prompt or chat messages (vLLM's two forms)."""

    model_config = ConfigDict(extra="allow")

    model: str | None = None
    prompt: str | None = None
    messages: list[dict[str, Any]] | None = None
    tools: list[dict[str, Any]] | None = None
    add_generation_prompt: bool = True
    add_special_tokens: bool = True
    return_token_strs: bool = False
