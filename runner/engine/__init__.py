"""The embedded engine: a small real model served in vLLM's wire format.

Modules: `model` (GGUF via llama.cpp, KV-cache reuse), `sampling` (numpy sampler, processed
logprobs), `template` (chat template + Hermes tool rendering; the `<tool_call>` format and its
parser live in `tapdeck.proxy.upstream.toolcalls`, shared with token-in capture), `generation` (decode
loop, stop rules), `core` (lock, worker threads, cancellation), `protocol` (request bodies and
checks), `errors` (vLLM error bodies), `wire` (response bodies), `server` (the FastAPI app),
`embedded` (`EmbeddedEngine`, `default_model_path`).
"""
