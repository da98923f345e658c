"""The model: a GGUF loaded with llama.cpp, evaluated token by token with KV-cache prefix reuse.

Only the forward pass comes from llama.cpp; sampling is done in numpy (`sampling.py`) from the raw
logits, so the logprobs we report are exactly those of the distribution we sampled from.

The KV cache is kept between calls: an agent's call k+1 usually starts with call k's whole prompt
and reply, so only the new suffix is evaluated (measured ~2x faster per call on 2 cores). Reuse is
arranged so that the numbers never depend on the cache's history (see `prefill`).
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NamedTuple, NotRequired, TypedDict

import numpy as np

from tapdeck.runner.engine.sampling import log_softmax

_CONTROL_ATTR = 8  # LLAMA_TOKEN_ATTR_CONTROL: <|im_start|>, <|im_end|>, ... (skipped in message text)
_CHUNK = 512  # tokens per prefill batch (llama.cpp's n_batch)

DEFAULT_N_CTX = 32768
"""The embedded engine's context. SmolLM2 was trained at 8,192 tokens, but real agents' first
prompts are 7.7k-16.6k: YaRN stretches RoPE 4x (quality and speed measured in bench/engine.py)."""

MIN_N_CTX = 256
"""The smallest context served: llama.cpp allocates its KV cache in blocks of 256 tokens, so a
smaller one would be served as 256 all the same, and a chat prompt (template markup included)
leaves almost nothing to sample below it."""

MAX_STRETCH = 4
"""How many times its trained context a model is served at most: the YaRN stretch the default
context uses and bench/engine.py measured. Past it quality is unmeasured, and a context far past it
fails only once llama.cpp allocates the KV cache (SmolLM2's for 10^8 tokens: terabytes)."""


class ContextLengthError(ValueError):
    """A context length the engine does not serve (below `MIN_N_CTX`, or past `MAX_STRETCH` times
    the model's trained context); the message gives the range it does serve."""


class ModelFileError(ValueError):
    """A model file llama.cpp cannot read as a GGUF model, or whose header does not give the
    context length it was trained with; found before any weight is loaded."""


def _check_context_length(n_ctx: int, trained: int, model_name: str) -> None:
    """ContextLengthError unless `MIN_N_CTX <= n_ctx <= MAX_STRETCH * trained`: refused, never
    rounded, so the context served is the one asked for."""
    most = MAX_STRETCH * trained
    if n_ctx < MIN_N_CTX:
        raise ContextLengthError(
            f"{n_ctx} is below {MIN_N_CTX}, the smallest context served; give {MIN_N_CTX} to {most}"
        )
    if n_ctx > most:
        raise ContextLengthError(
            f"{n_ctx} is past {most}, {MAX_STRETCH}x the {trained} tokens "
            f"{model_name} was trained with (the furthest its RoPE is "
            f"stretched); give {MIN_N_CTX} to {most}"
        )


def trained_context(path: Path) -> int:
    """The context length a GGUF model was trained with (its metadata, weights not loaded)."""
    import llama_cpp
    from llama_cpp._utils import suppress_stdout_stderr

    params = llama_cpp.llama_model_default_params()
    params.vocab_only = True
    with suppress_stdout_stderr(disable=False):  # llama.cpp logs the whole header otherwise
        model = llama_cpp.llama_model_load_from_file(str(path).encode(), params)
    if not model:
        raise ModelFileError(f"llama.cpp could not read {path} as a GGUF model")
    try:
        arch = _meta(llama_cpp, model, "general.architecture")
        value = _meta(llama_cpp, model, f"{arch}.context_length")
        if not value:
            raise ModelFileError(f"{path} does not say its trained context length")
        return int(value)
    finally:
        llama_cpp.llama_model_free(model)


def _meta(llama_cpp, model, key: str) -> str | None:
    buf = ctypes.create_string_buffer(256)
    n = llama_cpp.llama_model_meta_val_str(model, key.encode(), buf, len(buf))
    return buf.value.decode() if n >= 0 else None


def default_threads() -> int:
    """All cores but one, for prefill and decode alike.

    llama.cpp's threads meet at a barrier after every layer: when another process (the agent, the
    proxy, the TUI, a second engine) takes a core, a waiting thread stalls the step. Measured on 2
    busy cores: decode 58 ms/token with 1 thread against 1,076 ms with 2, prefill 34 tok/s against
    18.
    """
    return max(1, (os.cpu_count() or 1) - 1)


class ContextParams(TypedDict):
    """The keyword arguments of llama.cpp's `Llama` that `context_params` sets."""

    n_ctx: int
    rope_scaling_type: NotRequired[int]
    rope_freq_scale: NotRequired[float]
    yarn_orig_ctx: NotRequired[int]


def context_params(path: Path, n_ctx: int) -> ContextParams:
    """llama.cpp context options for `n_ctx`: beyond the trained context, YaRN RoPE scaling by
    trained/n_ctx (llama.cpp applies YaRN's attention temperature itself). ContextLengthError for
    one the engine does not serve, raised before any weight is loaded."""
    import llama_cpp

    trained = trained_context(path)
    _check_context_length(n_ctx, trained, path.name)
    if n_ctx <= trained:
        return {"n_ctx": n_ctx}
    return {
        "n_ctx": n_ctx,
        "rope_scaling_type": llama_cpp.LLAMA_ROPE_SCALING_TYPE_YARN,
        "rope_freq_scale": trained / n_ctx,
        "yarn_orig_ctx": trained,
    }


class PromptScores(NamedTuple):
    """Each prompt token's logprob given the tokens before it (position 0 has none): vLLM's
    `prompt_logprobs`, from the raw logits (no temperature), as a trainer computes them."""

    logprobs: np.ndarray
    """float64, one per token of the prompt but the first."""
    ranks: np.ndarray
    """int64: 1 for the most likely token, as vLLM's `rank`."""
    tops: list[list[tuple[int, float]]]
    """Per position, the `top` most likely tokens and their logprobs (empty when `top` is 0)."""


class LlamaModel:
    """A GGUF model: vocabulary tables, tokenizer, and a forward pass that reuses the KV cache.

    Not thread-safe: callers serialise access (the server holds one lock around every call).
    """

    def __init__(self, path: Path, *, n_ctx: int = DEFAULT_N_CTX, n_threads: int | None = None) -> None:
        import llama_cpp  # heavy; only the engine needs it
        from llama_cpp._utils import suppress_stdout_stderr

        self._lc = llama_cpp
        self.path = Path(path)
        if not self.path.is_file():
            raise FileNotFoundError(f"model file not found: {self.path}")
        threads = n_threads or default_threads()
        # quiet: llama.cpp warns on stderr about every context past the trained one
        with suppress_stdout_stderr(disable=False):
            self._llm = llama_cpp.Llama(
                model_path=str(self.path),
                n_batch=_CHUNK,
                n_threads=threads,
                n_threads_batch=threads,
                logits_all=False,
                verbose=False,
                **context_params(self.path, n_ctx),
            )
        meta = self._llm.metadata
        # llama.cpp rounds its KV cache up to a block of 256 tokens; the context served (and
        # reported as max_model_len) stays the one asked for.
        self.n_ctx: int = n_ctx
        self.n_vocab: int = self._llm.n_vocab()
        self.eos_id: int = int(meta.get("tokenizer.ggml.eos_token_id", self._llm.token_eos()))
        self.bos_id: int | None = (
            int(meta["tokenizer.ggml.bos_token_id"]) if "tokenizer.ggml.bos_token_id" in meta else None
        )
        self.chat_template: str | None = meta.get("tokenizer.chat_template")
        self.pieces: list[bytes] = [self._piece(i) for i in range(self.n_vocab)]
        vocab = self._llm._model.vocab
        # Text of the BOS token for chat templates that write `{{ bos_token }}` themselves (Gemma's):
        # without it such a model reads its prompt with no BOS and degrades badly.
        self.bos_text: str = (
            self.pieces[self.bos_id].decode("utf-8", errors="replace") if self.bos_id is not None else ""
        )
        self.special = np.array(
            [bool(llama_cpp.llama_vocab_get_attr(vocab, i) & _CONTROL_ATTR) for i in range(self.n_vocab)],
            dtype=bool,
        )
        # Token texts as vLLM reports them in logprobs (a partial UTF-8 piece decodes to U+FFFD).
        self.token_texts: list[str] = [p.decode("utf-8", errors="replace") for p in self.pieces]
        self._batched = 0  # leading cache positions that were computed inside a batch
        self.evaluated = 0
        """Tokens run through the model since load (prefill, decode and settle): what prefix
        reuse saves shows here."""
        self.prefilled = 0
        """Tokens the last `prefill` evaluated; the rest of its prompt came from the cache."""

    def _piece(self, token: int) -> bytes:
        buf = ctypes.create_string_buffer(64)
        n = self._lc.llama_token_to_piece(self._llm._model.vocab, token, buf, len(buf), 0, True)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = self._lc.llama_token_to_piece(self._llm._model.vocab, token, buf, len(buf), 0, True)
        return buf.raw[:n]

    def tokenize(self, text: str) -> list[int]:
        """Encode text; special-token markup (`<|im_start|>`) becomes its single id; no BOS added."""
        if not text:
            return []
        return self._llm.tokenize(text.encode("utf-8"), add_bos=False, special=True)

    def token_strs(self, ids: Sequence[int]) -> list[str]:
        """The vocabulary's own text of each id (byte-level form, `Ġcapital`), as vLLM's
        `/tokenize` reports it with `return_token_strs`."""
        vocab = self._llm._model.vocab
        return [self._lc.llama_vocab_get_text(vocab, i).decode("utf-8", errors="replace") for i in ids]

    def detokenize(self, ids: Sequence[int], *, skip_special: bool = True) -> bytes:
        """The bytes of `ids`; control tokens are dropped when `skip_special` (vLLM's default)."""
        if skip_special:
            return b"".join(self.pieces[i] for i in ids if not self.special[i])
        return b"".join(self.pieces[i] for i in ids)

    @property
    def cached_tokens(self) -> int:
        """How many tokens currently sit in the KV cache."""
        return self._llm.n_tokens

    def _eval(self, ids: list[int]) -> None:
        self._llm.eval(ids)
        self.evaluated += len(ids)

    def _eval_batched(self, ids: Sequence[int], interrupted: Callable[[], bool] | None = None) -> int:
        """Evaluate `ids` in batches; stop between batches once `interrupted()` is true.
        Returns how many were evaluated."""
        # Chunks of at least two tokens: llama.cpp's one-token path gives different numbers.
        pos = 0
        while pos < len(ids):
            if interrupted is not None and interrupted():
                break
            size = min(_CHUNK, len(ids) - pos)
            if len(ids) - pos - size == 1:
                size -= 1
            self._eval(list(ids[pos : pos + size]))
            pos += size
        return pos

    def prefill(self, ids: Sequence[int]) -> np.ndarray:
        """Evaluate a prompt and return the next-token logits (float64).

        Numerics do not depend on what was cached before: llama.cpp computes a position
        differently alone than inside a batch (logprobs move by ~1e-3), so the cache is reused
        only over positions computed in a batch (`settle()` re-batches a finished reply), the
        prompt body is evaluated in batches of >= 2 tokens, and the last prompt token always alone,
        exactly as each generated token is.
        """
        if not ids:
            raise ValueError("cannot evaluate an empty prompt")
        llm = self._llm
        last = len(ids) - 1
        n = min(self._batched, last)
        prefix = n
        if n:
            diff = np.nonzero(llm.input_ids[:n] != np.asarray(ids[:n]))[0]
            prefix = int(diff[0]) if diff.size else n
        if last - prefix == 1 and prefix > 0:
            prefix -= 1  # keep the body a batch
        llm.n_tokens = prefix
        self._batched = min(self._batched, prefix)
        self.prefilled = len(ids) - prefix
        if last - prefix >= 2:
            self._eval_batched(ids[prefix:last])
            self._batched = last
        elif last - prefix == 1:
            self._eval([ids[prefix]])
        self._eval([ids[last]])
        return self._last_logits()

    def step(self, token: int) -> np.ndarray:
        """Append one token to the evaluated sequence and return the next-token logits."""
        self._eval([token])
        return self._last_logits()

    def settle(self, interrupted: Callable[[], bool] | None = None) -> None:
        """Re-evaluate, as one batch, the cached positions that were computed one at a time (the
        last prompt token and the reply), so the next call can reuse them with batch numerics.

        Run after a reply has gone out: it costs what the next call's prefill would otherwise pay.
        It stops between batches once `interrupted()` is true (another call wants the model, or the
        engine is closing): the cache then ends where the re-evaluation got to. Nothing is lost by
        that, since a follow-up of this reply re-evaluates the rest in its own prefill, and any
        other call would overwrite it; a long reply's settle (minutes for 8k tokens on two cores)
        no longer holds up the next call or a shutdown.
        """
        llm = self._llm
        end = llm.n_tokens
        start = self._batched if end - self._batched >= 2 else max(0, end - 2)
        if end - start < 2:
            return
        tail = llm.input_ids[start:end].tolist()
        llm.n_tokens = self._batched = start
        self._batched = start + self._eval_batched(tail, interrupted)

    def score(self, ids: Sequence[int], top: int = 0) -> PromptScores:
        """The logprob of every token of `ids` given the ones before it, in one forward pass.

        Batches of up to 512 tokens with the logits of every position kept (the engine otherwise
        keeps only the last): batch numerics, as vLLM's prompt logprobs and a trainer's forward
        pass have them. The cache then holds `ids`, computed in batches, for a follow-up prefill.
        """
        if not ids:
            raise ValueError("cannot score an empty prompt")
        llm = self._llm
        n = len(ids)
        llm.n_tokens = 0
        llm._ctx.kv_cache_seq_rm(-1, 0, -1)
        self._batched = 0
        logprobs = np.zeros(n - 1, dtype=np.float64)
        ranks = np.zeros(n - 1, dtype=np.int64)
        tops: list[list[tuple[int, float]]] = []
        pos = 0
        while pos < n:
            size = min(_CHUNK, n - pos)
            if n - pos - size == 1:
                size -= 1  # no one-token batch: its numerics differ
            chunk = list(ids[pos : pos + size])
            llm._batch.set_batch(batch=chunk, n_past=pos, logits_all=True)
            llm._ctx.decode(llm._batch)
            llm.input_ids[pos : pos + size] = chunk
            llm.n_tokens = pos + size
            self.evaluated += size
            for i in range(min(size, n - 1 - pos)):
                ptr = self._lc.llama_get_logits_ith(llm._ctx.ctx, i)
                row = log_softmax(np.ctypeslib.as_array(ptr, shape=(self.n_vocab,)).astype(np.float64))
                token = ids[pos + i + 1]
                logprobs[pos + i] = row[token]
                ranks[pos + i] = 1 + int(np.count_nonzero(row > row[token]))
                if top:
                    best = np.argpartition(-row, top)[:top]
                    best = best[np.argsort(-row[best], kind="stable")]
                    tops.append([(int(t), float(row[t])) for t in best])
                else:
                    tops.append([])
            pos += size
        self._batched = n if n > 1 else 0
        return PromptScores(logprobs, ranks, tops)

    def _last_logits(self) -> np.ndarray:
        ptr = self._lc.llama_get_logits_ith(self._llm._ctx.ctx, -1)
        return np.ctypeslib.as_array(ptr, shape=(self.n_vocab,)).astype(np.float64)

    def close(self) -> None:
        """Free the llama.cpp context and weights."""
        self._llm.close()
