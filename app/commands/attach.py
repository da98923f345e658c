"""`tapdeck attach URL --admin-key KEY`: the TUI on a tapdeck server running elsewhere."""

from __future__ import annotations

import asyncio
import sys

import typer

from tapdeck.app.client import ApiError, TapdeckClient, given_admin_key


def register(app: typer.Typer) -> None:
    """Add the `attach` command."""

    @app.command("attach")
    def attach(
        url: str = typer.Argument(..., help="Base URL of a tapdeck server, e.g. http://127.0.0.1:8300"),
        admin_key: str | None = typer.Option(None, "--admin-key", envvar="TAPDECK_ADMIN_KEY",
                                             help="The server's admin key (its <data-dir>/admin.key)."),
    ) -> None:
        """Open the TUI on a remote tapdeck server (over SSH: tunnel its port and attach to it)."""
        from tapdeck.app.commands.tui import run_app
        from tapdeck.app.settings import default_settings_path

        from tapdeck.schema.addresses import http_base_url

        try:
            base = http_base_url(url, "server URL")
            given_admin_key(admin_key)
        except ValueError as exc:
            print(f"tapdeck attach: {exc}", file=sys.stderr)
            raise typer.Exit(2) from None
        problem = asyncio.run(_check(base, admin_key))
        if problem:
            print(f"tapdeck attach: {problem}", file=sys.stderr)
            raise typer.Exit(1)
        run_app(base, admin_key, server_label=base, settings_path=default_settings_path(None))


async def _check(base: str, admin_key: str | None) -> str | None:
    """What stops the TUI from working against `base` (None: nothing). The key is checked before
    the TUI takes the terminal: a refused key is one line, not a dead screen."""
    client = TapdeckClient(base, admin_key, timeout=15.0)
    try:
        try:
            await client.health()
        except ApiError as exc:
            return (f"no tapdeck server answers at {base} ({exc.message}); start one with "
                    "`tapdeck serve` or check the URL / SSH tunnel")
        try:
            await client.sessions()
        except ApiError as exc:
            if exc.kind != "auth":
                return f"the server at {base} answered /health but not /admin/sessions ({exc.message})"
            refused = ("no admin key given (looked at --admin-key and $TAPDECK_ADMIN_KEY)" if not admin_key
                       else f"the server at {base} rejected the admin key from --admin-key or "
                            "$TAPDECK_ADMIN_KEY (401)")
            return f"{refused}; pass the key from the server's <data-dir>/admin.key with --admin-key"
        return None
    finally:
        await client.aclose()
