"""The trainer's in-memory policy served by the embedded engine's own wire code.

`PolicyModel` gives a transformers causal LM (the very `nn.Module` a trainer is updating) the
interface `EngineCore` drives for llama.cpp (`prefill`, `step`, `tokenize`, `detokenize`, token
tables), so the vLLM-wire server, sampler, stop rules and tool-call rendering are the embedded
engine's, unchanged: the engine always samples from the trainer's *current* weights, with the
processed logprobs a trainer recomputes. `PolicyEngine` serves it on loopback.

Runs in the training environment (torch, transformers); nothing else in tapdeck imports it.
Numerics: fp32 forward with a KV cache; the cache is dropped whenever the weights change
(`weights_changed()`), so a reply is never continued from keys and values of older weights.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

DEFAULT_N_CTX = 8192


def byte_decoder() -> dict[str, int]:
    """Byte-level BPE's printable-character alphabet mapped back to bytes.

    Printable Latin-1 bytes stand for themselves; the other 68 bytes are shifted to code points
    256 and up, in byte order.
    """
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    table = {chr(b): b for b in printable}
    shift = 0
    for b in range(256):
        if b not in printable:
            table[chr(256 + shift)] = b
            shift += 1
    return table


def token_pieces(tokenizer: Any, n_vocab: int) -> tuple[list[bytes], np.ndarray]:
    """Every token's bytes and whether it is a control token (skipped in message text)."""
    decode = byte_decoder()
    special_ids = set(tokenizer.all_special_ids)
    added = getattr(tokenizer, "added_tokens_decoder", {}) or {}
    special_ids |= {i for i, tok in added.items() if getattr(tok, "special", False)}
    pieces: list[bytes] = []
    special = np.zeros(n_vocab, dtype=bool)
    for token, text in enumerate(tokenizer.convert_ids_to_tokens(list(range(n_vocab)))):
        text = text or ""
        if token in special_ids or token in added:
            pieces.append(text.encode("utf-8"))
            special[token] = token in special_ids
        elif all(ch in decode for ch in text):
            pieces.append(bytes(decode[ch] for ch in text))
        else:  # not a byte-level token (another tokenizer family): its text is its bytes
            pieces.append(text.encode("utf-8"))
    return pieces, special


def load_policy(gguf: Path, *, dtype: str = "float32") -> tuple[Any, Any]:
    """(model, tokenizer) from a GGUF file, dequantised by transformers (no download)."""
    from transformers import AutoTokenizer

    gguf = Path(gguf)
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    return load_model(gguf, dtype=dtype), tokenizer


def load_model(gguf: Path, *, dtype: str = "float32") -> Any:
    """The causal LM of a GGUF file, dequantised by transformers to plain `dtype` tensors (no
    download, no tokenizer)."""
    import torch
    from transformers import AutoModelForCausalLM

    gguf = Path(gguf)
    model = AutoModelForCausalLM.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, dtype=getattr(torch, dtype)
    )
    # The GGUF "quantizer" only dequantised at load: the parameters are plain float tensors. Left
    # attached, it makes transformers' Trainer refuse to train them ("purely quantized model").
    model.hf_quantizer = None
    model.is_quantized = False
    model.quantization_method = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    return model


class PolicyModel:
    """A transformers causal LM behind the `LlamaModel` interface the engine core drives.

    Not thread-safe: `EngineCore` holds its lock around every call. The trainer must not step the
    optimizer while a reply is generated (GRPOTrainer calls `rollout_func` between steps).
    """

    def __init__(self, model: Any, tokenizer: Any, *, path: Path, n_ctx: int = DEFAULT_N_CTX) -> None:
        self.module = model
        self.tokenizer = tokenizer
        self.path = Path(path)
        self.n_ctx = min(n_ctx, int(getattr(model.config, "max_position_embeddings", n_ctx)))
        self.n_vocab = int(model.config.vocab_size)
        self.eos_id = int(tokenizer.eos_token_id)
        self.bos_id = tokenizer.bos_token_id
        self.bos_text: str = tokenizer.bos_token or ""
        self.chat_template: str | None = tokenizer.chat_template
        self.pieces, self.special = token_pieces(tokenizer, self.n_vocab)
        self.token_texts = [p.decode("utf-8", errors="replace") for p in self.pieces]
        self._ids: list[int] = []
        self._cache: Any = None

    # -- text -----------------------------------------------------------------------------------
    def tokenize(self, text: str) -> list[int]:
        """Encode text; special-token markup (`<|im_start|>`) becomes its single id; no BOS added."""
        if not text:
            return []
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def token_strs(self, ids: Sequence[int]) -> list[str]:
        """The tokenizer's own text of each id, as vLLM's `/tokenize` reports it."""
        return list(self.tokenizer.convert_ids_to_tokens(list(ids)))

    def detokenize(self, ids: Sequence[int], *, skip_special: bool = True) -> bytes:
        """The bytes of `ids`; control tokens are dropped when `skip_special`."""
        return b"".join(self.pieces[i] for i in ids if not (skip_special and self.special[i]))

    # -- forward --------------------------------------------------------------------------------
    @property
    def cached_tokens(self) -> int:
        """How many tokens the KV cache holds."""
        return len(self._ids)

    def weights_changed(self) -> None:
        """Forget the KV cache: it was computed with the weights before an optimizer step."""
        self._ids, self._cache = [], None

    def _forward(self, new: Sequence[int]) -> np.ndarray:
        import torch

        with torch.no_grad():
            out = self.module(
                input_ids=torch.tensor([list(new)], dtype=torch.long),
                past_key_values=self._cache,
                use_cache=True,
            )
        if out.past_key_values is None:  # e.g. gradient checkpointing turns the cache off in training
            raise RuntimeError("the policy model returned no KV cache; turn gradient checkpointing off")
        self._cache = out.past_key_values
        self._ids.extend(int(t) for t in new)
        return out.logits[0, -1].to(torch.float64).numpy()

    def prefill(self, ids: Sequence[int]) -> np.ndarray:
        """Evaluate a prompt (reusing the cached common prefix) and return the next-token logits."""
        if not ids:
            raise ValueError("cannot evaluate an empty prompt")
        ids = [int(t) for t in ids]
        keep = 0
        # At least one token is evaluated: it gives the logits.
        for a, b in zip(self._ids, ids[:-1], strict=False):
            if a != b:
                break
            keep += 1
        if self._cache is None or keep == 0:
            self._ids, self._cache = [], None
        elif keep < len(self._ids):
            self._cache.crop(keep - len(self._ids))  # negative: drop that many from the end
            del self._ids[keep:]
        return self._forward(ids[keep:])

    def step(self, token: int) -> np.ndarray:
        """Append one token and return the next-token logits."""
        return self._forward([token])

    def settle(self, interrupted: Callable[[], bool] | None = None) -> None:
        """Nothing to settle: torch's batched and one-token paths agree to float rounding."""

    def close(self) -> None:
        """Drop the cache (the weights belong to the trainer)."""
        self.weights_changed()


class PolicyEngine:
    """The policy served on loopback in vLLM's wire format (`base_url` ends in `/v1`)."""

    def __init__(
        self, model: PolicyModel, *, served_name: str = "policy", host: str = "127.0.0.1", port: int = 0
    ) -> None:
        self.model = model
        self.served_name = served_name
        self.host = host
        self.port = port
        self.core: Any = None
        self._server: Any = None

    @property
    def base_url(self) -> str:
        """`http://host:port/v1`."""
        if self._server is None:
            raise RuntimeError("policy engine not started")
        return f"{self._server.url}/v1"

    def start(self) -> PolicyEngine:
        """Serve the model on a thread."""
        from tapdeck.proxy.http.uvicorn_thread import ThreadedServer
        from tapdeck.runner.engine.core import EngineCore
        from tapdeck.runner.engine.server import create_engine_app

        self.core = EngineCore(self.model)  # type: ignore[arg-type]
        app = create_engine_app(self.core, served_name=self.served_name, return_tokens_as_token_ids=True)
        self._server = ThreadedServer(app, self.host, self.port, name="tapdeck-policy-engine")
        self._server.start()
        return self

    def weights_changed(self) -> None:
        """Call after every optimizer step: later replies are sampled from the new weights."""
        if self.core is None:
            self.model.weights_changed()
            return
        with self.core.holding():  # a reply in progress finishes on the weights it started with
            self.model.weights_changed()

    def score(
        self, prompt_ids: Sequence[int], completion_ids: Sequence[int], *, temperature: float = 1.0
    ) -> list[float]:
        """The engine's processed logprob of each completion token given the prompt (teacher forced
        through the same prefill/step path and log-softmax that sampling uses)."""
        from tapdeck.runner.engine.sampling import Sampler, SamplingParams

        sampler = Sampler(SamplingParams(temperature=temperature), np.asarray(prompt_ids), self.model.n_vocab)
        out = []
        with self.core.holding() if self.core is not None else contextlib.nullcontext():
            logits = self.model.prefill(list(prompt_ids))
            for i, token in enumerate(completion_ids):
                out.append(float(sampler.process(logits)[int(token)]))
                if i + 1 < len(completion_ids):
                    logits = self.model.step(int(token))
        return out

    def stop(self) -> None:
        """Stop serving."""
        if self._server is not None:
            self._server.stop()
            self._server = None

    def __enter__(self) -> PolicyEngine:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
