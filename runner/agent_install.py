"""Pinned installs of the coding-agent CLIs tapdeck runs (codex, claude-code, gemini-cli, opencode,
qwen-code, mini-swe-agent), from their registries into tapdeck-managed folders.

Each agent gets its own folder, `<agents dir>/<name>-<version>/`: an npm `--prefix` for the Node
CLIs, a Python >= 3.12 venv for mini-swe-agent. A finished install writes `install.json` (package,
version, size, seconds taken) last, so only a folder with a record counts as installed. Installing is
idempotent and serialised per agent with a file lock (concurrent rollouts may all ask for it on first use).

The installs run with a scratch HOME and TMPDIR: postinstall scripts (opencode's makes
`~/.cache/opencode/bin`) and the CLIs' first runs would otherwise write into the operator's home.
After an install nothing is fetched again: the agents run offline from here.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel

from tapdeck.proxy.store.no_follow import open_no_follow
from tapdeck.runner.process_group import signal_group, wait_group_gone

AGENTS_DIR_ENV = "TAPDECK_AGENTS_DIR"
RECORD = "install.json"
# Host settings an install needs to reach the registries (mirrors, proxies, CA bundles).
_KEPT_ENV = re.compile(
    r"^(npm_config_|NPM_CONFIG_|PIP_|UV_|HTTPS?_PROXY$|NO_PROXY$|https?_proxy$|"
    r"no_proxy$|NODE_EXTRA_CA_CERTS$|SSL_CERT_|REQUESTS_CA_BUNDLE$|CURL_CA_BUNDLE$)"
)
_NETWORK_MARKERS = (
    "ENOTFOUND",
    "EAI_AGAIN",
    "ETIMEDOUT",
    "ECONNREFUSED",
    "ECONNRESET",
    "network",
    "Could not find a version",
    "No matching distribution",
    "Temporary failure in name resolution",
    "Failed to establish a new connection",
)


@dataclass(frozen=True)
class AgentPackage:
    """One agent CLI: where it comes from and what to run once installed."""

    name: str
    """tapdeck's harness name."""
    registry: str
    """`npm` or `pypi`."""
    package: str
    version: str
    entry: str
    """The executable, relative to the install folder."""

    @property
    def spec(self) -> str:
        """The registry's package@version (npm) or package==version (pip) spelling."""
        return (
            f"{self.package}@{self.version}" if self.registry == "npm" else f"{self.package}=={self.version}"
        )


PACKAGES: dict[str, AgentPackage] = {
    p.name: p
    for p in (
        AgentPackage("codex", "npm", "@openai/codex", "0.169.0", "node_modules/.bin/codex"),
        AgentPackage(
            "claude-code", "npm", "@anthropic-ai/claude-code", "2.1.328", "node_modules/.bin/claude"
        ),
        AgentPackage("gemini-cli", "npm", "@google/gemini-cli", "0.61.0", "node_modules/.bin/gemini"),
        AgentPackage("opencode", "npm", "opencode-ai", "1.18.33", "node_modules/.bin/opencode"),
        AgentPackage("qwen-code", "npm", "@qwen-code/qwen-code", "0.24.4", "node_modules/.bin/qwen"),
        AgentPackage("mini-swe-agent", "pypi", "mini-swe-agent", "2.4.6", "venv/bin/mini"),
    )
}


class InstallRecord(BaseModel):
    """What `install.json` holds for one finished install."""

    name: str
    package: str
    version: str
    registry: str
    path: str
    entry: str
    size_bytes: int
    install_seconds: float
    installed_at: float


class InstallError(RuntimeError):
    """An install that failed; `network` is True when the registry could not be reached."""

    def __init__(self, message: str, *, network: bool = False) -> None:
        super().__init__(message)
        self.network = network


def agents_dir() -> Path:
    """Where agent installs live: `$TAPDECK_AGENTS_DIR`, else `~/.cache/tapdeck/agents`."""
    return Path(os.environ.get(AGENTS_DIR_ENV) or Path.home() / ".cache" / "tapdeck" / "agents")


def get_package(name: str) -> AgentPackage:
    """The pinned package for harness `name`; KeyError naming the installable ones otherwise."""
    try:
        return PACKAGES[name]
    except KeyError:
        raise KeyError(f"no pinned install for {name!r}; installable: {', '.join(PACKAGES)}") from None


def install_dir(package: AgentPackage, root: Path | None = None) -> Path:
    """The folder one pinned version installs into."""
    return (root or agents_dir()) / f"{package.name}-{package.version}"


def installed(name: str, root: Path | None = None) -> InstallRecord | None:
    """The record of a complete install of `name`'s pinned version, or None."""
    package = get_package(name)
    folder = install_dir(package, root)
    try:
        record = InstallRecord.model_validate_json((folder / RECORD).read_text())
    except (OSError, ValueError):
        return None
    if record.version != package.version or not (folder / package.entry).exists():
        return None
    return record.model_copy(update={"path": str(folder)})


def installed_all(root: Path | None = None) -> dict[str, InstallRecord]:
    """Every agent whose pinned version is installed."""
    return {name: record for name in PACKAGES if (record := installed(name, root)) is not None}


def entry_path(name: str, root: Path | None = None) -> Path | None:
    """The installed executable of `name`, or None when it is not installed."""
    record = installed(name, root)
    return Path(record.path) / record.entry if record else None


@contextlib.contextmanager
def _locked(root: Path, name: str) -> Iterator[None]:
    root.mkdir(parents=True, exist_ok=True)
    with os.fdopen(open_no_follow(root / f".{name}.lock", os.O_RDWR | os.O_CREAT), "r+b") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def install(
    name: str,
    *,
    root: Path | None = None,
    on_progress: Callable[[str], None] | None = None,
    timeout_s: float = 900.0,
) -> InstallRecord:
    """Install `name`'s pinned version unless it already is; returns its record.

    `on_progress` gets one line at a time (what is being done, then the installer's own output).
    Raises InstallError (with `network=True` when the registry was unreachable).
    """
    package = get_package(name)
    root = root or agents_dir()
    say = on_progress or (lambda _line: None)
    with _locked(root, name):
        if (record := installed(name, root)) is not None:
            say(f"{name} {package.version} already installed at {record.path}")
            return record
        final = install_dir(package, root)
        scratch = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=root))
        started = time.monotonic()
        try:
            # Installed in place (a venv's scripts name their own path); complete only once the
            # record is written, so a half-done folder is redone.
            shutil.rmtree(final, ignore_errors=True)
            final.mkdir(parents=True)
            say(f"installing {package.spec} from {package.registry} into {final}")
            _run_installer(package, final, scratch, say, timeout_s)
            _fix_permissions(package, final)
            if not (final / package.entry).exists():
                raise InstallError(f"{package.spec} installed, but {package.entry} is missing")
            seconds = time.monotonic() - started
            record = InstallRecord(
                name=name,
                package=package.package,
                version=package.version,
                registry=package.registry,
                path=str(final),
                entry=package.entry,
                size_bytes=folder_size(final),
                install_seconds=round(seconds, 1),
                installed_at=time.time(),
            )
            (final / RECORD).write_text(record.model_dump_json(indent=2))
            say(f"{name} {package.version} installed: {record.size_bytes / 1e6:.0f} MB in {seconds:.0f} s")
            return record
        except BaseException:
            shutil.rmtree(final, ignore_errors=True)
            raise
        finally:
            shutil.rmtree(scratch, ignore_errors=True)


def _installer_env(scratch: Path) -> dict[str, str]:
    """A scratch HOME and TMPDIR, with the host's registry, proxy and CA settings kept.

    npm reads its global config from `<prefix>/etc/npmrc`, so with `--prefix` the host's global
    and user npmrc (registry, cafile) are named explicitly.
    """
    home = scratch / "home"
    tmp = scratch / "tmp"
    home.mkdir(exist_ok=True)
    tmp.mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k in ("PATH", "LANG", "LC_ALL") or _KEPT_ENV.search(k)}
    real_home = Path.home()
    for name in (".npmrc",):
        if (real_home / name).is_file():
            env["npm_config_userconfig"] = str(real_home / name)
    if (pip_conf := real_home / ".config" / "pip" / "pip.conf").is_file():
        env.setdefault("PIP_CONFIG_FILE", str(pip_conf))
    if (global_npmrc := _npm_global_config()) is not None:
        env["npm_config_globalconfig"] = global_npmrc
    # The npm cache is shared between installs (and kept), the rest is scratch.
    env.update(
        HOME=str(home),
        TMPDIR=str(tmp),
        npm_config_cache=str(agents_dir_cache()),
        npm_config_update_notifier="false",
        npm_config_fund="false",
        npm_config_audit="false",
        PIP_DISABLE_PIP_VERSION_CHECK="1",
    )
    return env


def _npm_global_config() -> str | None:
    """The global npmrc npm reads without `--prefix` (registry, cafile), when there is one."""
    if shutil.which("npm") is None:
        return None
    try:
        found = subprocess.run(
            ["npm", "config", "get", "globalconfig"], capture_output=True, text=True, timeout=30, check=False
        ).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return None
    return found if found and Path(found).is_file() else None


def agents_dir_cache() -> Path:
    """npm's download cache for agent installs (kept, so a reinstall downloads nothing)."""
    return Path.home() / ".cache" / "tapdeck" / "npm-cache"


def _run_installer(
    package: AgentPackage, target: Path, scratch: Path, say: Callable[[str], None], timeout_s: float
) -> None:
    env = _installer_env(scratch)
    if package.registry == "npm":
        if shutil.which("npm") is None:
            raise InstallError(f"installing {package.name} needs npm (Node.js 20 or newer) on PATH")
        steps = [
            [
                "npm",
                "install",
                "--prefix",
                str(target),
                "--no-audit",
                "--no-fund",
                "--loglevel=http",
                package.spec,
            ]
        ]
    else:
        python = sys.executable  # tapdeck's own, >= 3.12 (requires-python), as mini-swe-agent needs
        venv = target / "venv"
        steps = [
            [python, "-m", "venv", str(venv)],
            [str(venv / "bin" / "python"), "-m", "pip", "install", "--progress-bar", "off", package.spec],
        ]
    deadline = time.monotonic() + timeout_s
    for argv in steps:
        _stream(argv, env, scratch, say, deadline, package)


def _stream(
    argv: list[str],
    env: dict[str, str],
    cwd: Path,
    say: Callable[[str], None],
    deadline: float,
    package: AgentPackage,
) -> None:
    """Run one installer step, passing its output on line by line; InstallError on failure."""
    process = subprocess.Popen(
        argv,
        env=env,
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",
        start_new_session=True,
    )
    timed_out = threading.Event()

    def stop() -> None:
        if process.poll() is None:  # an installer that just ended is not killed late
            timed_out.set()
            signal_group(process.pid)

    # A timer, not a check per line: a stalled download prints nothing for as long as it stalls.
    watchdog = threading.Timer(max(0.0, deadline - time.monotonic()), stop)
    watchdog.daemon = True
    watchdog.start()
    tail: list[str] = []
    assert process.stdout is not None
    try:
        for line in process.stdout:
            line = line.rstrip()
            if line:
                tail = (tail + [line])[-40:]
                say(line)
        code = process.wait()
    finally:
        watchdog.cancel()
        if process.poll() is None:  # the caller gave up (an error, a cancelled rollout)
            signal_group(process.pid)
            process.wait()
    if timed_out.is_set() and code != 0:
        wait_group_gone(process.pid)  # what it started is gone before the error says it was stopped
        raise InstallError(
            f"installing {package.spec} took longer than allowed; stopped it "
            f"(its last line: {tail[-1] if tail else 'none'})"
        )
    if code != 0:
        text = "\n".join(tail)
        network = any(marker.lower() in text.lower() for marker in _NETWORK_MARKERS)
        raise InstallError(
            f"installing {package.spec} failed (exit {code}):\n{text[-2000:]}", network=network
        )


def _fix_permissions(package: AgentPackage, target: Path) -> None:
    """qwen-code 0.24.4 ships its vendored ripgrep without the exec bit (`spawn rg EACCES`)."""
    if package.name != "qwen-code":
        return
    for rg in target.glob("node_modules/@qwen-code/qwen-code/vendor/ripgrep/*/rg"):
        rg.chmod(rg.stat().st_mode | 0o111)


def folder_size(path: Path) -> int:
    """Bytes on disk under `path`, each hard-linked file counted once."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for dirpath, _dirs, files in os.walk(path):
        for file in files:
            with contextlib.suppress(OSError):
                st = os.lstat(os.path.join(dirpath, file))
                if (st.st_dev, st.st_ino) in seen:
                    continue
                seen.add((st.st_dev, st.st_ino))
                total += st.st_blocks * 512
    return total
