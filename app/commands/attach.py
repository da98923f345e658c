"""`tapdeck attach URL`: the TUI on a tapdeck server running elsewhere (another process, or
another machine through a tunnel).

The admin key is looked for as `rollout --server` looks for it: --admin-key, then
$TAPDECK_ADMIN_KEY, then `<data-dir>/admin.key` (what a `serve` on this machine wrote).
"""

from __future__ import annotations

import asyncio
import ssl
from pathlib import Path
from typing import Annotated

import typer

from tapdeck.app.client import ApiError, TapdeckClient, admin_key_refusal, command_admin_key
from tapdeck.app.commands.options import CaFileOption, admin_key_option, data_dir_option
from tapdeck.app.exit_codes import EXIT_COULD_NOT_RUN, EXIT_USAGE, CommandError


def register(app: typer.Typer) -> None:
    """Add the `attach` command."""

    @app.command("attach")
    def attach(
        url: str = typer.Argument(..., help="Base URL of a tapdeck server, e.g. http://127.0.0.1:8300"),
        admin_key: Annotated[
            str | None, admin_key_option("The server's admin key (default: <data-dir>/admin.key).")
        ] = None,
        data_dir: Annotated[
            Path | None,
            data_dir_option(
                "Data directory whose admin.key holds the key of a server on this machine (default "
                "$TAPDECK_DATA_DIR or ~/.tapdeck)."
            ),
        ] = None,
        ca_file: CaFileOption = None,
    ) -> None:
        """Open the TUI on a remote tapdeck server (over SSH: tunnel its port and attach to it)."""
        from tapdeck.app.commands.tui import run_app
        from tapdeck.app.settings import default_settings_path
        from tapdeck.proxy.config import default_data_dir
        from tapdeck.schema.addresses import http_base_url
        from tapdeck.schema.tls import server_trust

        data = (data_dir or default_data_dir()).expanduser()
        try:
            base = http_base_url(url, "server URL")
            key = command_admin_key(admin_key, data)
            trust = server_trust(ca_file)
        except ValueError as exc:
            raise CommandError(EXIT_USAGE, f"tapdeck attach: {exc}") from None
        if key is None:
            raise CommandError(EXIT_COULD_NOT_RUN, f"tapdeck attach: {admin_key_refusal(data, found=False)}")
        problem = asyncio.run(_check(base, key, key_dir=None if admin_key else data, verify=trust))
        if problem:
            raise CommandError(EXIT_COULD_NOT_RUN, f"tapdeck attach: {problem}")
        run_app(base, key, server_label=base, settings_path=default_settings_path(None), verify=trust)


async def _check(
    base: str, admin_key: str, *, key_dir: Path | None, verify: ssl.SSLContext | bool = True
) -> str | None:
    """What stops the TUI from working against `base` (None: nothing). The key is checked before
    the TUI takes the terminal: a refused key is one line, not a dead screen, naming where the key
    came from (`key_dir`: the data dir it was read from; None: --admin-key or $TAPDECK_ADMIN_KEY)."""
    client = TapdeckClient(base, admin_key, timeout=15.0, verify=verify)
    try:
        try:
            await client.health()
        except ApiError as exc:
            if exc.kind == "untrusted":
                return exc.message
            return (
                f"no tapdeck server answers at {base} ({exc.message}); start one with "
                "`tapdeck serve` or check the URL / SSH tunnel"
            )
        try:
            await client.sessions()
        except ApiError as exc:
            if exc.kind != "auth":
                return f"the server at {base} answered /health but not /admin/sessions ({exc.message})"
            if key_dir is not None:
                return admin_key_refusal(key_dir, found=True)
            return (
                f"the server at {base} rejected the admin key from --admin-key or $TAPDECK_ADMIN_KEY "
                "(401); pass the key from the server's <data-dir>/admin.key with --admin-key"
            )
        return None
    finally:
        await client.aclose()
