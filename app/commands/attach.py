"""`tapdeck attach URL…`: the TUI on tapdeck servers running elsewhere (other processes, or other
machines through tunnels); several at once in one table with a server column.

A server is a URL, or a context named in the contexts file (`--context NAME`,
app/server_contexts.py). A URL's admin key is looked for as `rollout --server` looks for it:
--admin-key, then $TAPDECK_ADMIN_KEY, then `<data-dir>/admin.key` (what a `serve` on this machine
wrote); the same key for every URL given, so servers with keys of their own are named as contexts.
"""

from __future__ import annotations

import asyncio
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import typer

from tapdeck.app.client import ApiError, TapdeckClient, admin_key_refusal, command_admin_key
from tapdeck.app.commands.options import CaFileOption, admin_key_option, data_dir_option
from tapdeck.app.exit_codes import EXIT_COULD_NOT_RUN, EXIT_USAGE, CommandError


@dataclass(frozen=True)
class Target:
    """One server to attach to. `key_dir`: the data dir its key was read from (what a refusal
    names); `key_from`: where else it came from ("" for --admin-key or $TAPDECK_ADMIN_KEY)."""

    name: str
    base: str
    key: str
    verify: ssl.SSLContext | bool
    key_dir: Path | None = None
    key_from: str = ""


def register(app: typer.Typer) -> None:
    """Add the `attach` command."""

    @app.command("attach")
    def attach(
        urls: Annotated[
            list[str] | None,
            typer.Argument(
                help="Base URL of each tapdeck server, e.g. http://127.0.0.1:8300 (HOST:PORT will do).",
                show_default=False,
            ),
        ] = None,
        context: Annotated[
            list[str] | None,
            typer.Option(
                "--context",
                help="A server named in $XDG_CONFIG_HOME/tapdeck/contexts.toml (its url, admin key "
                "and CA); give it once per server.",
                show_default=False,
            ),
        ] = None,
        admin_key: Annotated[
            str | None,
            admin_key_option(
                "The admin key of each URL, and of each context that names none (default: "
                "<data-dir>/admin.key)."
            ),
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
        """Open the TUI on remote tapdeck servers (over SSH: tunnel a port and attach to it)."""
        from tapdeck.app.commands.tui import run_app
        from tapdeck.app.server_links import ServerLink
        from tapdeck.app.settings import default_settings_path

        targets = _targets(urls or [], context or [], admin_key, data_dir, ca_file)
        problem = asyncio.run(_check_all(targets))
        if problem:
            raise CommandError(EXIT_COULD_NOT_RUN, f"tapdeck attach: {problem}")
        first, *others = targets
        run_app(
            first.base,
            first.key,
            server_label=first.base,
            server_name=first.name,
            others=[
                ServerLink(t.name, t.base, TapdeckClient(t.base, t.key, verify=t.verify)) for t in others
            ],
            settings_path=default_settings_path(None),
            verify=first.verify,
        )


def _targets(
    urls: list[str], names: list[str], admin_key: str | None, data_dir: Path | None, ca_file: Path | None
) -> list[Target]:
    """The servers given, URLs first, then contexts; CommandError (one line, naming what to fix)
    for bad usage or a key that cannot be found."""
    from tapdeck.app.server_contexts import default_contexts_path, load_contexts
    from tapdeck.app.server_links import host_port
    from tapdeck.proxy.config import default_data_dir
    from tapdeck.schema.addresses import http_base_url
    from tapdeck.schema.tls import server_trust

    if not urls and not names:
        raise CommandError(EXIT_USAGE, "tapdeck attach: give a server's URL, or --context NAME")
    data = (data_dir or default_data_dir()).expanduser()
    shared: str | None = None

    def shared_key() -> str:
        """--admin-key / $TAPDECK_ADMIN_KEY / <data-dir>/admin.key, read once, when first needed."""
        nonlocal shared
        if shared is None:
            found = command_admin_key(admin_key, data)
            if found is None:
                raise CommandError(
                    EXIT_COULD_NOT_RUN, f"tapdeck attach: {admin_key_refusal(data, found=False)}"
                )
            shared = found
        return shared

    shared_dir = None if admin_key else data
    targets: list[Target] = []
    try:
        for url in urls:
            base = http_base_url(url, "server URL")
            targets.append(Target(host_port(base), base, shared_key(), server_trust(ca_file), shared_dir))
        if names:
            path = default_contexts_path()
            contexts = load_contexts(path)
            for name in names:
                ctx = contexts.get(name)
                if ctx is None:
                    known = ", ".join(sorted(contexts)) or "none"
                    raise ValueError(f"--context {name}: no such context in {path} (it names: {known})")
                own = ctx.admin_key()
                targets.append(
                    Target(
                        ctx.name,
                        ctx.url,
                        own or shared_key(),
                        server_trust(ctx.ca_file or ca_file),
                        None if own else shared_dir,
                        f"context {ctx.name!r} ({ctx.key_place()})" if own else "",
                    )
                )
    except ValueError as exc:
        raise CommandError(EXIT_USAGE, f"tapdeck attach: {exc}") from None
    _refuse_twice(targets)
    return targets


def _refuse_twice(targets: list[Target]) -> None:
    """A server given twice, or two that would share a name in the server column: bad usage."""
    for i, target in enumerate(targets):
        for other in targets[:i]:
            if other.base == target.base:
                raise CommandError(EXIT_USAGE, f"tapdeck attach: {target.base} is given twice")
            if other.name == target.name:
                raise CommandError(
                    EXIT_USAGE,
                    f"tapdeck attach: {other.base} and {target.base} would both be named "
                    f"{target.name!r}; name them as contexts (--context)",
                )


async def _check_all(targets: list[Target]) -> str | None:
    """What stops the TUI from working (None: nothing). One server: `_check`'s line. Several:
    a server that refuses the key or answers as no tapdeck server does is named with its line;
    one that does not answer yet is shown as unreachable in the TUI, unless none answers."""
    problems = await asyncio.gather(*(_check(t) for t in targets))
    if len(targets) == 1:
        return problems[0][0]
    for target, (problem, unreachable) in zip(targets, problems, strict=True):
        if problem and not unreachable:
            return f"{target.name}: {problem}"
    if all(problem for problem, _ in problems):
        return (
            f"no tapdeck server answers at {', '.join(t.base for t in targets)}; start them with "
            "`tapdeck serve` or check the URLs / SSH tunnels"
        )
    return None


async def _check(target: Target) -> tuple[str | None, bool]:
    """What stops the TUI from working against `target` (None: nothing), and whether that is only
    that it does not answer. The key is checked before the TUI takes the terminal: a refused key
    is one line, not a dead screen, naming where the key came from."""
    base = target.base
    client = TapdeckClient(base, target.key, timeout=15.0, verify=target.verify)
    try:
        try:
            await client.health()
        except ApiError as exc:
            if exc.kind == "untrusted":
                return exc.message, False
            return (
                f"no tapdeck server answers at {base} ({exc.message}); start one with "
                "`tapdeck serve` or check the URL / SSH tunnel"
            ), True
        try:
            await client.sessions()
        except ApiError as exc:
            if exc.kind != "auth":
                return f"the server at {base} answered /health but not /admin/sessions ({exc.message})", False
            if target.key_from:
                return f"the server at {base} rejected the admin key of {target.key_from} (401)", False
            if target.key_dir is not None:
                return admin_key_refusal(target.key_dir, found=True), False
            return (
                f"the server at {base} rejected the admin key from --admin-key or $TAPDECK_ADMIN_KEY "
                "(401); pass the key from the server's <data-dir>/admin.key with --admin-key"
            ), False
        return None, False
    finally:
        await client.aclose()
