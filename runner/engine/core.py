"""The engine's runtime: one model, one lock, generation on worker threads, cancellation.

llama.cpp is not thread-safe and holds one KV cache, so every call runs under one lock, on a
worker thread (the event loop stays free for health checks and other clients). A call whose client
has left is cancelled between tokens.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncGenerator, Callable, Iterator
from dataclasses import dataclass
from typing import Any

from tapdeck.runner.engine.generation import Choice, Generation, StopRules, TokenStep
from tapdeck.runner.engine.model import LlamaModel, PromptScores
from tapdeck.runner.engine.sampling import Sampler, SamplingParams
from tapdeck.runner.engine.template import ChatTemplate, turn_end_ids


@dataclass
class StreamEvent:
    """What a streaming worker reports: a token of choice `index`, or that choice's end."""

    index: int
    step: TokenStep | None = None
    choice: Choice | None = None


class EngineCore:
    """Serialises generation over one model."""

    def __init__(self, model: LlamaModel) -> None:
        self.model = model
        self.template = (
            ChatTemplate(
                model.chat_template,
                bos_token=model.bos_text,
                eos_token=model.pieces[model.eos_id].decode("utf-8", errors="replace"),
            )
            if model.chat_template
            else None
        )
        self.end_ids = frozenset({model.eos_id, *turn_end_ids(self.template, model)})
        """Tokens that end a reply: EOS, and the template's end of an assistant turn where that
        is another token (Gemma's header EOS is `<eos>`, its turns end with `<end_of_turn>`)."""
        self.lock = threading.Lock()
        self._wanting = 0  # threads waiting in `holding()`: a settle in progress gives way to them
        self._wanting_guard = threading.Lock()

    @contextlib.contextmanager
    def holding(self) -> Iterator[None]:
        """Hold the model, as `lock` does, except that a settle in progress stops at its next
        batch for this caller instead of finishing first (`LlamaModel.settle`)."""
        with self._wanting_guard:
            self._wanting += 1
        try:
            self.lock.acquire()
        finally:
            with self._wanting_guard:
                self._wanting -= 1
        try:
            yield
        finally:
            self.lock.release()

    def wanted(self) -> bool:
        """Whether a caller is waiting in `holding()`."""
        return self._wanting > 0

    def chat_prompt(
        self,
        messages: list[dict[str, Any]],
        *,
        tools: list[dict[str, Any]] | None,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        **extra: Any,
    ) -> list[int]:
        """Render messages with the model's template and tokenise the result.

        `continue_final_message` (vLLM's option) leaves the last message open: the text is cut
        right after that message's content, so the model continues it.
        """
        if self.template is None:
            raise ValueError(f"{self.model.path.name} has no chat template; use /v1/completions")
        text = self.template.render(
            messages, tools=tools, add_generation_prompt=add_generation_prompt, **extra
        )
        if continue_final_message and messages:
            final = messages[-1].get("content")
            if not isinstance(final, str) or not final or final not in text:
                raise ValueError("continue_final_message needs a last message with text content")
            text = text[: text.rindex(final) + len(final)]
        return self.model.tokenize(text)

    def _generations(
        self,
        prompt_ids: list[int],
        params: SamplingParams,
        rules: StopRules,
        n: int,
        top_logprobs: int | None,
        cancelled: Callable[[], bool],
    ) -> list[Generation]:
        sampler = Sampler(params, prompt_ids, self.model.n_vocab)
        return [
            Generation(
                self.model,
                prompt_ids,
                sampler,
                rules,
                top_logprobs=top_logprobs,
                cancelled=cancelled,
                end_ids=self.end_ids,
            )
            for _ in range(n)
        ]

    def _run_all(
        self,
        gens: list[Generation],
        cancel: threading.Event,
        emit: Callable[[StreamEvent], None] | None,
        done: Callable[[list[Choice] | BaseException], None],
    ) -> None:
        """Generate every choice under the lock, hand the result over, then settle the cache.

        Settling (re-batching the reply into the KV cache, see `LlamaModel.settle`) happens after
        the caller has its answer, typically while the agent runs the tool the reply asked for, and
        gives way to the next caller waiting for the model.
        """
        with self.holding():
            try:
                for index, gen in enumerate(gens):
                    gen.sampler.reset_output()
                    if cancel.is_set():
                        gen.choice.finish_reason = "abort"
                    for step in [] if cancel.is_set() else gen.steps():
                        if emit is not None:
                            emit(StreamEvent(index, step=step))
                    if emit is not None:
                        emit(StreamEvent(index, choice=gen.choice))
            except BaseException as exc:  # noqa: BLE001 - handed to the waiting request, which re-raises it
                done(exc)
                return
            done([g.choice for g in gens])
            self.model.settle(self.wanted)

    async def generate(
        self,
        prompt_ids: list[int],
        params: SamplingParams,
        rules: StopRules,
        *,
        n: int = 1,
        top_logprobs: int | None = None,
        disconnected: Callable[[], Any] | None = None,
    ) -> list[Choice]:
        """Generate `n` choices off the event loop; stop early when `disconnected()` turns true."""
        loop = asyncio.get_running_loop()
        result: asyncio.Future[list[Choice]] = loop.create_future()
        cancel = threading.Event()
        gens = self._generations(prompt_ids, params, rules, n, top_logprobs, cancel.is_set)

        def done(value: list[Choice] | BaseException) -> None:
            def deliver() -> None:
                if result.done():
                    return
                if isinstance(value, BaseException):
                    result.set_exception(value)
                else:
                    result.set_result(value)

            # The caller's loop may be gone (its server stopped mid-generation): nobody to tell.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(deliver)

        worker = threading.Thread(
            target=self._run_all, args=(gens, cancel, None, done), name="tapdeck-engine-gen", daemon=True
        )
        worker.start()
        watcher = asyncio.create_task(self._watch(disconnected, cancel)) if disconnected else None
        try:
            return await result
        finally:
            cancel.set()  # no-op once finished; stops the worker if this request was cancelled
            if watcher is not None:
                watcher.cancel()

    async def score(self, prompt_ids: list[int], top: int = 0) -> PromptScores:
        """Every prompt token's logprob (`LlamaModel.score`), off the event loop, holding the model."""

        def run() -> PromptScores:
            with self.holding():
                return self.model.score(prompt_ids, top)

        return await asyncio.to_thread(run)

    @staticmethod
    async def _watch(disconnected: Callable[[], Any], cancel: threading.Event) -> None:
        while not cancel.is_set():
            if await disconnected():
                cancel.set()
                return
            await asyncio.sleep(0.25)

    async def stream(
        self,
        prompt_ids: list[int],
        params: SamplingParams,
        rules: StopRules,
        *,
        n: int = 1,
        top_logprobs: int | None = None,
    ) -> AsyncGenerator[StreamEvent, None]:
        """Generate `n` choices off the event loop, yielding tokens as they come.

        Closing the iterator (the client left) cancels the generation at the next token.
        """
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[StreamEvent | BaseException | None] = asyncio.Queue()
        cancel = threading.Event()
        gens = self._generations(prompt_ids, params, rules, n, top_logprobs, cancel.is_set)

        def emit(ev: StreamEvent | BaseException | None) -> None:
            loop.call_soon_threadsafe(queue.put_nowait, ev)

        def done(value: list[Choice] | BaseException) -> None:
            emit(value if isinstance(value, BaseException) else None)

        threading.Thread(
            target=self._run_all, args=(gens, cancel, emit, done), name="tapdeck-engine-stream", daemon=True
        ).start()
        try:
            while True:
                item = await queue.get()
                if item is None:
                    break
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            cancel.set()  # the worker notices between tokens
