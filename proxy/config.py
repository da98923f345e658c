"""Server configuration: where it listens, where it keeps data, which engine it defaults to.

Also the admin-key rules: a key given explicitly (flag, `$TAPDECK_ADMIN_KEY` or a key file) is used
as is; otherwise one is generated per start and written to `<data_dir>/admin.key` (mode 0600) so a
local client can read it. A bind address other than loopback is refused unless the operator chose a
key explicitly, and one that strong (MIN_PUBLIC_KEY_CHARS). The data directory is the owner's alone
(0700, the capture database 0600): it holds every captured conversation.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import secrets
import ssl
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, field_validator

from tapdeck.proxy.store.atomic_write import atomic_write
from tapdeck.proxy.store.no_follow import open_no_follow, refuse_link
from tapdeck.schema.addresses import check_public_url

DATA_DIR_ENV = "TAPDECK_DATA_DIR"
ADMIN_KEY_FILE = "admin.key"
CAPTURE_DB = "capture.db"
DEFAULT_MAX_BODY_BYTES = 32 * 1024 * 1024
"""A long agent conversation resent whole on every call (a 12-17k-token first prompt with tools
grows past 100k tokens, tool outputs included) is a few MB of JSON; images inline as base64 add
more. 32 MiB leaves room for both and still bounds what one request can make the server buffer."""
DEFAULT_MAX_REPLY_BYTES = 32 * 1024 * 1024
"""An engine's whole reply to one call. The largest a real one gets: 8,192 sampled tokens (the
proxy's `max_tokens` cap) with 20 top logprobs each (~1.3 kB of JSON a token, ~11 MB) plus the
prompt's token ids (~7 bytes a token, ~1 MB at 128k tokens). 32 MiB leaves room and still bounds
what one call makes the server buffer (a never-ending reply reached 60 MB unbounded)."""
DEFAULT_MAX_HEADER_BYTES = 64 * 1024
"""A request's head (request line and headers). Agent SDKs send under 2 kB, and common servers take
less than this by default (nginx 8 kB a line, Node 16 kB in all), so 64 kB refuses no real client."""
DEFAULT_MAX_HEADERS = 100
"""Header lines in one request (the OpenAI SDK sends about 15; Apache refuses more than 100)."""
DEFAULT_HEADER_TIMEOUT_S = 30.0
"""From a request's first byte to the end of its headers (and the longest a new connection may
send nothing). A client on any network sends a head of a few kB in well under a second; this only
cuts off clients that trickle or idle."""
DEFAULT_BODY_TIMEOUT_S = 30.0
"""The longest a request body may pause between two reads. Counted as a gap, not a total, so a
32 MiB body on a slow link still arrives; time the server itself is not reading is not counted."""
DEFAULT_KEEP_ALIVE_S = 75.0
"""Seconds an idle client connection is kept open. Longer than clients keep theirs (httpx, and so
the openai and anthropic SDKs, drop an idle connection after 5 s): with uvicorn's own 5 s, a client
reusing a connection just as the server closed it got `Connection reset by peer` (1-25 calls in
1,300 at 64 concurrent sessions in bench/proxy.py), a dropped call for no reason of its own."""
DEFAULT_ENGINE_UPDATE_WAIT_S = 300.0
"""How long a call the engine refuses with a 503 (it is updating its weights or reconfiguring) is
resent before the agent gets the 503. A weight sync broadcast from a trainer takes seconds to a
minute; a from-disk reload of a mid-sized model a few minutes. Five minutes covers both and still
leaves the reply inside the 600 s default timeout of the openai and anthropic SDKs."""
DEFAULT_ENGINE_WAIT_S = 1200.0
"""How long a server waits for an engine URL that does not answer yet (`--engine-wait`). vLLM
answers only once its model is loaded: a 70B model (~140 GB of bf16 weights) takes minutes from a
local NVMe disk and over ten from a network filesystem, then compiling it and capturing its CUDA
graphs takes one to a few more. Twenty minutes covers that; weights still to be downloaded are
not covered (download them first)."""
MIN_PUBLIC_KEY_CHARS = 24
"""An admin key guarding a non-loopback bind: at least this many characters from at least
MIN_PUBLIC_KEY_CLASSES character classes (a generated key has 53)."""
MIN_PUBLIC_KEY_CLASSES = 2
GIVEN_ADMIN_KEY = "from --admin-key or $TAPDECK_ADMIN_KEY"
"""Where an admin key given to a command came from (what refusals of it name)."""


def default_data_dir() -> Path:
    """`$TAPDECK_DATA_DIR` when set, else `~/.tapdeck`."""
    env = os.environ.get(DATA_DIR_ENV)
    return Path(env).expanduser() if env else Path.home() / ".tapdeck"


class ConnectionLimits(BaseModel):
    """What a client connection may send and how long it may take, enforced by the server's HTTP
    protocol (`proxy/http/bounded_protocol.py`) before any key is checked: a head over its limits
    gets a 431, a head or body that stalls a 408 (or a close when nothing was sent)."""

    model_config = ConfigDict(frozen=True)

    max_header_bytes: int = Field(default=DEFAULT_MAX_HEADER_BYTES, gt=0)
    max_headers: int = Field(default=DEFAULT_MAX_HEADERS, gt=0)
    header_timeout_s: float = Field(default=DEFAULT_HEADER_TIMEOUT_S, gt=0)
    body_timeout_s: float = Field(default=DEFAULT_BODY_TIMEOUT_S, gt=0)
    keep_alive_s: float = Field(default=DEFAULT_KEEP_ALIVE_S, gt=0)


class TlsFiles(BaseModel):
    """The certificate (PEM, its chain after it) and private key the server answers HTTPS with."""

    model_config = ConfigDict(frozen=True)

    cert: Path
    key: Path


class ServerConfig(BaseModel):
    """Everything `LocalServer` needs to start (also what `tapdeck serve` parses its flags into)."""

    host: str = "127.0.0.1"
    port: int = 8300
    admin_key: str | None = None
    """None → a fresh key is generated at start and written to `<data_dir>/admin.key`."""
    data_dir: Path = Field(default_factory=default_data_dir, validate_default=True)
    """Validated when it comes from `$TAPDECK_DATA_DIR` too: a file there is refused as a
    `--data-dir` file is."""
    engine_url: str | None = None
    """None → the embedded engine is started and used as the default engine."""
    engine_model: str | None = None
    engine_api_key: str | None = None
    engine_tool_parser: str | None = None
    """The tool-call parser the default engine's chat route applies (`EngineSpec.tool_call_parser`);
    the embedded engine's own when it is the default."""
    engine_reasoning_parser: str | None = None
    """The default engine's reasoning parser, if it runs one (`EngineSpec.reasoning_parser`)."""
    engine_wait_s: float = Field(default=DEFAULT_ENGINE_WAIT_S, ge=0)
    """How long the server waits for `engine_url` to answer (0: it must answer at start)."""
    max_body_bytes: int = Field(default=DEFAULT_MAX_BODY_BYTES, gt=0)
    """Largest request body accepted (413 in the caller's dialect beyond it)."""
    max_reply_bytes: int = Field(default=DEFAULT_MAX_REPLY_BYTES, gt=0)
    """Largest engine reply read for one call (a 502 in the caller's dialect beyond it)."""
    engine_update_wait_s: float = Field(default=DEFAULT_ENGINE_UPDATE_WAIT_S, ge=0)
    """Seconds a call the engine refuses with a 503 is resent for (proxy/upstream/update_wait.py)."""
    connection: ConnectionLimits = Field(default_factory=ConnectionLimits)
    tls: TlsFiles | None = None
    """Serve HTTPS with these; None → plain HTTP (what loopback and an SSH tunnel need)."""
    public_url: str | None = None
    """The address sandboxes use to reach this server (`http://host:port`), advertised in every
    session's base URLs; None → this server's own bound address (loopback by default)."""

    @field_validator("data_dir")
    @classmethod
    def _data_dir(cls, value: Path) -> Path:
        return usable_data_dir(value)

    @field_validator("public_url")
    @classmethod
    def _public_url(cls, value: str | None) -> str | None:
        return check_public_url(value) if value else None

    @property
    def capture_db(self) -> Path:
        """The SQLite capture store."""
        return self.data_dir / CAPTURE_DB

    @property
    def admin_key_path(self) -> Path:
        """Where the admin key is written for local clients."""
        return self.data_dir / ADMIN_KEY_FILE


class ConfigError(ValueError):
    """A configuration the server refuses to start with."""


def is_loopback(host: str) -> bool:
    """True for `localhost` and loopback addresses (127.0.0.0/8, ::1)."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_bind(config: ServerConfig) -> None:
    """Refuse an admin key no client can send, a certificate and key that cannot serve, and a
    non-loopback bind without an explicitly chosen admin key of public strength."""
    if config.admin_key and (unsendable := unsendable_admin_key(config.admin_key, GIVEN_ADMIN_KEY)):
        raise ConfigError(unsendable)
    if config.tls is not None:
        check_tls(config.tls)
    if is_loopback(config.host):
        return
    if not config.admin_key:
        raise ConfigError(
            f"refusing to listen on {config.host}: binding beyond loopback exposes the admin API, so "
            "an admin key must be given explicitly (--admin-key-file PATH or $TAPDECK_ADMIN_KEY); "
            "or bind 127.0.0.1 and use an SSH tunnel"
        )
    weak = admin_key_weakness(config.admin_key)
    if weak:
        raise ConfigError(
            f"refusing to listen on {config.host} with a weak admin key: {weak} "
            "(`python -c 'import secrets; print(secrets.token_urlsafe(32))'` makes one)"
        )


def check_tls(tls: TlsFiles) -> None:
    """Load the pair as the server will, so a missing file, one that is not PEM or a key that is
    not the certificate's is refused by name before anything starts (uvicorn would only fail in
    its own thread)."""
    try:
        ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(tls.cert, tls.key)
    except ssl.SSLError as exc:  # not PEM, or a key that is not the certificate's
        why = f"{exc.reason or exc} (is each file PEM, and the key the certificate's?)"
    except OSError as exc:
        why = exc.strerror or str(exc)
    else:
        return
    raise ConfigError(f"cannot serve HTTPS with --tls-cert {tls.cert} and --tls-key {tls.key}: {why}")


def cleartext_warning(config: ServerConfig) -> str | None:
    """The one line a bind beyond loopback without TLS starts with (None for loopback or TLS): what
    anyone on the network path can read."""
    if config.tls is not None or is_loopback(config.host):
        return None
    return (
        f"warning: {config.host} is beyond loopback and this server has no TLS: session keys, the "
        "admin key and every prompt and reply (the agent's code and files) cross the network in "
        "the clear; give --tls-cert and --tls-key, or bind 127.0.0.1 and reach it over an SSH tunnel"
    )


def admin_key_weakness(key: str) -> str | None:
    """Why `key` is too weak to guard a public bind, or None when it is strong enough."""
    if len(key) < MIN_PUBLIC_KEY_CHARS:
        return f"it has {len(key)} characters; at least {MIN_PUBLIC_KEY_CHARS} are needed"
    classes = sum(
        any(test(c) for c in key)
        for test in (str.islower, str.isupper, str.isdigit, lambda c: not c.isalnum())
    )
    if classes < MIN_PUBLIC_KEY_CLASSES or len(set(key)) < MIN_PUBLIC_KEY_CHARS // 2:
        return "it repeats too few distinct characters; use a random one"
    return None


def unsendable_admin_key(key: str, where: str) -> str | None:
    """Why `key` (from `where`, e.g. "in PATH") can never be sent, or None when it can.

    Clients send it in an HTTP header (`Bearer KEY`), which carries ASCII only, and the server
    strips the token it reads; so printable ASCII without spaces, as a generated key is."""
    if all("!" <= c <= "~" for c in key):
        return None
    return f"the admin key {where} must be printable ASCII without spaces (an HTTP header carries it)"


def read_key_file(path: Path) -> str:
    """The admin key in `path` (first line, stripped); ValueError naming the file when it is
    unreadable or empty, or its key cannot be sent."""
    try:
        # Bytes that are not UTF-8 become U+FFFD, which the ASCII rule below refuses by the file's name.
        key = path.expanduser().read_text(errors="replace").strip()
    except OSError as exc:
        raise ValueError(f"cannot read the admin key file {path}: {exc.strerror or exc}") from None
    if not key:
        raise ValueError(f"the admin key file {path} is empty")
    key = key.splitlines()[0].strip()
    if unsendable := unsendable_admin_key(key, f"in {path}"):
        raise ValueError(unsendable)
    return key


def secure_data_dir(config: ServerConfig) -> None:
    """Create the data directory owner-only (0700) and the capture database 0600, tightening
    existing ones: they hold every captured conversation. LinkRefused when the database or one of
    its side files is a symbolic link (the data dir itself may be one)."""
    config.data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(config.data_dir, 0o700)
    os.close(open_no_follow(config.capture_db, os.O_WRONLY | os.O_CREAT, 0o600))
    for suffix in ("", "-wal", "-shm"):
        refuse_link(f"{config.capture_db}{suffix}")  # os.chmod would change the file it names
        with contextlib.suppress(FileNotFoundError):
            os.chmod(f"{config.capture_db}{suffix}", 0o600)


def new_admin_key() -> str:
    """A fresh unguessable admin key."""
    return "tdk-admin-" + secrets.token_urlsafe(32)


def write_admin_key(path: Path, key: str) -> None:
    """Replace the key file whole, readable by its owner only (created 0600; never readable by
    others, even briefly)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_write(path, mode=0o600) as f:
        f.write((key + "\n").encode())


def usable_data_dir(path: Path) -> Path:
    """`path` with `~` expanded; ValueError when it names something that is not a directory (a
    directory that does not exist yet is made when the server starts)."""
    path = path.expanduser()
    if path.exists() and not path.is_dir():
        raise ValueError(f"{path} is not a directory")
    return path


def read_admin_key(data_dir: Path) -> str | None:
    """The admin key a local server wrote into `data_dir`, if any; ValueError (`read_key_file`'s,
    naming the file) when the file is there but gives no key a client can send."""
    path = data_dir / ADMIN_KEY_FILE
    return read_key_file(path) if path.exists() else None
