"""The embedded engine serves exactly the context it is given, within its stated range: llama.cpp's
rounding of the KV cache to blocks of 256 tokens never shows, and a context outside the range is
refused from the model's metadata before its weights load."""

from __future__ import annotations

import httpx
import pytest

pytestmark = pytest.mark.slow


def test_a_context_between_llama_cpps_blocks_is_served_as_asked_not_rounded_up() -> None:
    pytest.importorskip("llama_cpp", reason="the embedded engine needs llama-cpp-python")
    from tapdeck.runner.engine.embedded import EmbeddedEngine

    with EmbeddedEngine(n_ctx=300) as eng:  # llama.cpp allocates 512
        [listed] = httpx.get(f"{eng.base_url}/models", timeout=30).json()["data"]
        assert eng.core.model.n_ctx == listed["max_model_len"] == 300
        reply = httpx.post(
            f"{eng.base_url}/completions",
            timeout=120,
            json={"model": "smollm2", "prompt": [100] * 301, "max_tokens": 1},
        )
    assert reply.status_code == 400
    assert "maximum context length is 300 tokens" in reply.json()["error"]["message"]


@pytest.mark.parametrize("n_ctx", [1, 255, 32769])
def test_a_context_outside_the_range_is_refused_before_the_weights_load(
    n_ctx: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    llama_cpp = pytest.importorskip("llama_cpp", reason="the embedded engine needs llama-cpp-python")
    from tapdeck.runner.engine.model import ContextLengthError, LlamaModel
    from tapdeck.runner.engine.model_file import default_model_path

    def load(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("the weights were loaded for a context the engine does not serve")

    monkeypatch.setattr(llama_cpp, "Llama", load)
    with pytest.raises(ContextLengthError, match=r"give 256 to 32768$"):
        LlamaModel(default_model_path(), n_ctx=n_ctx)
