"""`tapdeck attach URL --admin-key KEY`: the TUI on a tapdeck server running elsewhere."""

from __future__ import annotations

import sys

import typer


def register(app: typer.Typer) -> None:
    """Add the `attach` command."""

    @app.command("attach")
    def attach(
        url: str = typer.Argument(..., help="Base URL of a tapdeck server, e.g. http://127.0.0.1:8300"),
        admin_key: str | None = typer.Option(None, "--admin-key", envvar="TAPDECK_ADMIN_KEY",
                                             help="The server's admin key (its <data-dir>/admin.key)."),
    ) -> None:
        """Open the TUI on a remote tapdeck server (over SSH: tunnel its port and attach to it)."""
        import httpx

        from tapdeck.app.commands.tui import run_app
        from tapdeck.app.settings import default_settings_path

        base = url.rstrip("/")
        if not base.startswith(("http://", "https://")):
            base = f"http://{base}"
        try:
            health = httpx.get(f"{base}/health", timeout=5.0)
            health.raise_for_status()
            if health.json().get("status") != "ok":
                raise ValueError(f"unexpected /health reply {health.text[:100]!r}")
        except (httpx.HTTPError, ValueError) as exc:
            print(f"tapdeck attach: no tapdeck server answers at {base} ({exc}); start one with "
                  "`tapdeck serve` or check the URL / SSH tunnel", file=sys.stderr)
            raise typer.Exit(1) from None
        # Check the key before the TUI takes the terminal: a refused key is one line, not a dead screen.
        headers = {"Authorization": f"Bearer {admin_key}"} if admin_key else {}
        try:
            status = httpx.get(f"{base}/admin/sessions", headers=headers, timeout=15.0).status_code
        except httpx.HTTPError as exc:
            print(f"tapdeck attach: the server at {base} answered /health but not /admin/sessions ({exc})",
                  file=sys.stderr)
            raise typer.Exit(1) from None
        if status == 401:
            problem = ("no --admin-key given (or $TAPDECK_ADMIN_KEY)" if not admin_key
                       else f"the server at {base} rejected the admin key (401)")
            print(f"tapdeck attach: {problem}; pass the key from the server's <data-dir>/admin.key "
                  "with --admin-key", file=sys.stderr)
            raise typer.Exit(1) from None
        run_app(base, admin_key, server_label=base, settings_path=default_settings_path(None))
