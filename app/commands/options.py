"""The options several commands take, each declared once: its flag, type and environment variable.

Where a command words an option's help for what it does with it (`attach`'s --data-dir is where a
key is read, `info`'s --engine is one to check), it passes its own help to the option's factory;
the others use the alias with the shared help.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from tapdeck.app.client import CA_FILE_HELP
from tapdeck.proxy.config import DEFAULT_ENGINE_WAIT_S
from tapdeck.schema.tls import CA_FILE_ENV

DATA_DIR_HELP = "Data directory (default $TAPDECK_DATA_DIR or ~/.tapdeck)."
ENGINE_API_KEY_HELP = "API key for that engine (never logged)."
ADMIN_KEY_HELP = "Admin key of --server (default: <data-dir>/admin.key)."


def data_dir_option(help: str = DATA_DIR_HELP) -> Any:
    """`--data-dir`: the folder of a server's capture store, runs and admin key."""
    return typer.Option("--data-dir", help=help)


def engine_option(help: str) -> Any:
    """`--engine`: an engine's address; each command says what it does with it."""
    return typer.Option("--engine", help=help)


def engine_api_key_option(help: str = ENGINE_API_KEY_HELP) -> Any:
    """`--engine-api-key` (or $TAPDECK_ENGINE_API_KEY): the key an engine wants, if any."""
    return typer.Option("--engine-api-key", envvar="TAPDECK_ENGINE_API_KEY", help=help)


def admin_key_option(help: str = ADMIN_KEY_HELP) -> Any:
    """`--admin-key` (or $TAPDECK_ADMIN_KEY): a tapdeck server's admin key."""
    return typer.Option("--admin-key", envvar="TAPDECK_ADMIN_KEY", help=help)


def server_option(help: str) -> Any:
    """`--server`: a tapdeck server to work on instead of one started in this process."""
    return typer.Option("--server", help=help)


def ca_file_option(help: str = CA_FILE_HELP) -> Any:
    """`--ca-file` (or $TAPDECK_CA_FILE): what an https:// tapdeck server's certificate is checked
    against."""
    return typer.Option("--ca-file", envvar=CA_FILE_ENV, help=help)


def tls_cert_option(help: str) -> Any:
    """`--tls-cert`: the certificate a server started here serves HTTPS with; each command says
    which server that is."""
    return typer.Option("--tls-cert", help=help)


DataDirOption = Annotated[Path | None, data_dir_option()]
EngineModelOption = Annotated[str | None, typer.Option("--engine-model", help="Model name on that engine.")]
EngineApiKeyOption = Annotated[str | None, engine_api_key_option()]
AdminKeyOption = Annotated[str | None, admin_key_option()]
PublicUrlOption = Annotated[
    str | None,
    typer.Option(
        "--public-url",
        help="Address sandboxes use to reach the proxy (http://HOST:PORT, e.g. an SSH "
        "reverse tunnel); sessions advertise it. Default: the bound address.",
    ),
]
EngineWaitOption = Annotated[
    float,
    typer.Option(
        "--engine-wait",
        min=0,
        help="Seconds to wait for an --engine that does not answer yet (vLLM loading its "
        "model), saying so every 10 s; sessions and runs on it get a 503 meanwhile. Default "
        f"{DEFAULT_ENGINE_WAIT_S:.0f}: a 70B model loading from a network disk and capturing "
        "its CUDA graphs takes over ten minutes. 0: it must answer at once.",
    ),
]
CaFileOption = Annotated[Path | None, ca_file_option()]
ServerCaFileOption = Annotated[Path | None, ca_file_option(f"With --server: {CA_FILE_HELP}")]
"""`--ca-file` of a command that reaches a server only with --server."""
TlsKeyOption = Annotated[Path | None, typer.Option("--tls-key", help="The private key of --tls-cert (PEM).")]
