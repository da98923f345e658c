"""Named tapdeck servers for `tapdeck attach --context NAME`, kept in one TOML file in tapdeck's
config directory (`$XDG_CONFIG_HOME/tapdeck/contexts.toml`), as kubectl and k9s keep their contexts.
Free of Textual.

    [contexts.gpu-a]
    url = "https://gpu-a.lab:8300"
    admin_key_file = "~/.config/tapdeck/gpu-a.key"
    ca_file = "~/.config/tapdeck/lab-ca.pem"

    [contexts.laptop]
    url = "127.0.0.1:8300"
    data_dir = "~/.tapdeck"

    [contexts.shared]
    url = "http://10.0.0.7:8300"
    admin_key_env = "SHARED_TAPDECK_KEY"

Each context names its URL and at most one place its admin key is read from: a file holding it,
an environment variable, or the data dir of a server on this machine (its `admin.key`). The key
itself is never written in this file, which names secrets without holding them. A context naming
none takes the key as a bare URL does (--admin-key, $TAPDECK_ADMIN_KEY, --data-dir's admin.key).
"""

from __future__ import annotations

import os
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

from tapdeck.app.settings import default_settings_path
from tapdeck.proxy.config import read_admin_key, read_key_file, unsendable_admin_key, usable_data_dir
from tapdeck.schema.addresses import http_base_url

CONTEXTS_FILE = "contexts.toml"
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,31}")
"""A context's name: the server column's word, so short and without `/` (it keys the rows)."""
KEY_SOURCES = ("admin_key_file", "admin_key_env", "data_dir")
FIELDS = ("url", *KEY_SOURCES, "ca_file")


def default_contexts_path() -> Path:
    """`$XDG_CONFIG_HOME/tapdeck/contexts.toml` (`~/.config` when unset), beside the TUI's settings."""
    return default_settings_path(None).parent / CONTEXTS_FILE


@dataclass(frozen=True)
class ServerContext:
    """One named server: its base URL and where its admin key and CA are (None: not said)."""

    name: str
    url: str
    admin_key_file: Path | None = None
    admin_key_env: str | None = None
    data_dir: Path | None = None
    ca_file: Path | None = None

    def key_place(self) -> str:
        """Where this context says its key is (what a refusal of the key names); "" for nowhere."""
        if self.admin_key_file is not None:
            return f"admin_key_file {self.admin_key_file}"
        if self.admin_key_env is not None:
            return f"admin_key_env ${self.admin_key_env}"
        if self.data_dir is not None:
            return f"data_dir {self.data_dir}"
        return ""

    def admin_key(self) -> str | None:
        """The key from the one place this context names; None when it names none. ValueError
        naming the context and that place when it gives no key a client can send."""
        where = f"context {self.name!r}"
        try:
            if self.admin_key_file is not None:
                return read_key_file(self.admin_key_file)
            if self.admin_key_env is not None:
                key = os.environ.get(self.admin_key_env, "").strip()
                if not key:
                    raise ValueError(f"its admin_key_env ${self.admin_key_env} is not set")
                if unsendable := unsendable_admin_key(key, f"in ${self.admin_key_env}"):
                    raise ValueError(unsendable)
                return key
            if self.data_dir is not None:
                written = read_admin_key(usable_data_dir(self.data_dir))
                if written is None:
                    raise ValueError(f"its data_dir {self.data_dir} holds no admin.key")
                return written
        except ValueError as exc:
            raise ValueError(f"{where}: {exc}") from None
        return None


def load_contexts(path: Path) -> dict[str, ServerContext]:
    """Every context in `path`, by name. ValueError, one line naming the file (and the context
    and field), for a file that is missing or is not TOML, or a context that is not well formed."""
    try:
        raw = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise ValueError(f"no contexts file at {path}: write one naming each server's url") from None
    except OSError as exc:
        raise ValueError(f"cannot read {path}: {exc.strerror or exc}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path} is not TOML: {exc}") from None
    unknown = sorted(set(raw) - {"contexts"})
    if unknown:
        raise ValueError(f"{path}: unknown table {unknown[0]!r}; contexts are [contexts.NAME] tables")
    tables = raw.get("contexts", {})
    if not isinstance(tables, dict):
        raise ValueError(f"{path}: 'contexts' must be a table of [contexts.NAME] tables")
    return {name: _context(path, name, table) for name, table in tables.items()}


def _context(path: Path, name: str, table: object) -> ServerContext:
    where = f"{path}: context {name!r}"
    if not NAME_RE.fullmatch(name):
        raise ValueError(
            f"{where}: a name is up to 32 letters, digits, '.', '_' or '-' (it names the server's rows)"
        )
    if not isinstance(table, dict):
        raise ValueError(f"{where} must be a table ([contexts.{name}])")
    if "admin_key" in table:
        raise ValueError(
            f"{where}: write no key in this file; name where it is with admin_key_file, "
            "admin_key_env or data_dir"
        )
    if unknown := sorted(set(table) - set(FIELDS)):
        raise ValueError(f"{where}: unknown field {unknown[0]!r} (fields: {', '.join(FIELDS)})")
    if not_text := next((f for f, v in table.items() if not isinstance(v, str) or not v.strip()), None):
        raise ValueError(f"{where}: {not_text} must be a non-empty string")
    if "url" not in table:
        raise ValueError(f"{where} has no url")
    sources = [field for field in KEY_SOURCES if field in table]
    if len(sources) > 1:
        raise ValueError(f"{where} names its admin key twice ({' and '.join(sources)}); keep one")
    try:
        url = http_base_url(table["url"], "url")
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from None

    def path_of(field: str) -> Path | None:
        return Path(table[field]).expanduser() if field in table else None

    return ServerContext(
        name=name,
        url=url,
        admin_key_file=path_of("admin_key_file"),
        admin_key_env=table.get("admin_key_env"),
        data_dir=path_of("data_dir"),
        ca_file=path_of("ca_file"),
    )
